package metricdefs

import "github.com/reqlock/reqlock"

// NumPendingEvents is the number of PendingEvents.
const NumPendingEvents = 6

// PendingEvents are the events of a pending release (reqlock.PendingEvent)
// that get a series of NamePendingReleases, in the order of their series.
var PendingEvents = [NumPendingEvents]reqlock.PendingEvent{
	reqlock.PendingDropped, reqlock.PendingExpired, reqlock.PendingNotHeld,
	reqlock.PendingQueued, reqlock.PendingReleased, reqlock.PendingUnreleased,
}
