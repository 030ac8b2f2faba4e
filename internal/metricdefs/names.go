// Package metricdefs holds the definitions that package
// github.com/reqlock/reqlock/metrics and the Prometheus adapter
// github.com/reqlock/reqlock/metrics/prometheus share, so that both export
// the same metrics: names, HELP texts and labels, the outcomes that get
// series of their own and the reasons of the others, the naming and cap of
// routes, and the defaults and checks of the options.
//
// It is internal: users see only the defaults that each package re-exports.
package metricdefs

// The names of the metric families without the namespace (a namespace
// prefixes them with itself and an underscore), and their HELP texts.
const (
	NameSuccess  = "lock_success_total"  // counter; labels route
	NameFailure  = "lock_failure_total"  // counter; labels route and reason
	NameWait     = "lock_wait_seconds"   // histogram; labels route and result
	NameHold     = "lock_hold_seconds"   // histogram; label route
	NameLost     = "lock_lost_total"     // counter; label route
	NameHandoffs = "lock_handoffs_total" // counter; label route

	HelpSuccess = "Lock attempts (calls of Obtain or ObtainAll, reentrant ones included) that acquired the lock, by route."
	HelpFailure = "Lock attempts (calls of Obtain or ObtainAll) that did not acquire the lock, by route and reason: " +
		"timeout (the key stayed held until the wait or the caller's deadline ran out, or a try-once attempt found it held), " +
		"store_error (the store failed, or did not answer before the wait ended with no sign that the key was held), " +
		"bad_key (no key could be derived from the request), " +
		"canceled (the caller cancelled while waiting), " +
		"invalid (invalid arguments or configuration, such as keys the store cannot lock together), " +
		"lock_lost (the request's own lock on a key it asked for again was lost)."
	HelpWait = "Seconds a lock attempt took, from the call until it returned, by route and result " +
		"(acquired, or the reason of lock_failure_total)."
	HelpHold = "Seconds a lock was held, from acquiring it until its holder let go of it " +
		"(a release in the store, or a handoff to a waiter of the same process), by route."
	HelpLost = "Locks found lost while they were held (their validity ran out without a renewal, " +
		"or a renewal found them gone), by route."
	HelpHandoffs = "Held grants passed to a waiter of the same process without a store round trip, by route."
)

// The families of a store's outages and of pending releases (see
// reqlock.OutageMetrics), without the namespace, and their HELP texts.
const (
	NamePendingReleases = "lock_pending_releases_total"    // counter; label event
	NameStoreDown       = "lock_store_down"                // gauge
	NameStoreDownFor    = "lock_store_down_seconds_total"  // counter
	NameStoreOutages    = "lock_store_outages_total"       // counter
	NameStoreRejected   = "lock_store_down_rejected_total" // counter; label route

	HelpPendingReleases = "Releases that failed for a store reason and were retried in the background, by event: " +
		"queued (entered the set), released, not_held (the keys no longer held the token), " +
		"expired (the grant's TTL passed first), dropped (the set was full, or the Locker closed), " +
		"unreleased (Close's last try failed)."
	HelpStoreDown     = "1 while the Locker's breaker counts the store down, else 0."
	HelpStoreDownFor  = "Seconds the store was counted down, summed over the outages that ended."
	HelpStoreOutages  = "Times the Locker's breaker counted the store down."
	HelpStoreRejected = "Lock attempts refused without a store call while the store was counted down, by route."
)

// LabelEvent is the label of NamePendingReleases: a reqlock.PendingEvent.
const LabelEvent = "event"

// The label names of the metrics.
const (
	// LabelRoute is the label of every metric: the route of the event, as
	// RouteName makes it of the event's label, or OverflowRoute.
	LabelRoute = "route"
	// LabelReason is the label of NameFailure: the reason of the failure,
	// as Reasons gives it.
	LabelReason = "reason"
	// LabelResult is the label of NameWait: reqlock.OutcomeAcquired or a
	// reason of NameFailure.
	LabelResult = "result"
)
