package metricdefs

import (
	"slices"

	"github.com/reqlock/reqlock"
)

// The family of reqlock.IdempotencyMetrics, without the namespace, and its
// HELP text. Its label event is LabelEvent.
const (
	NameIdempotency = "lock_idempotency_total" // counter; labels event and route

	HelpIdempotency = "Requests with an idempotency key to routes with idempotency, by event and route: " +
		"replayed (answered with the response recorded for the key; the handler did not run), " +
		"conflict (a request with the key still ran when the wait ended: 409), " +
		"mismatch (the key's record answers a different request: 422), " +
		"recorded (the handler's response was recorded for the key)."
)

// NumIdempotencyEvents is the number of IdempotencyEvents.
const NumIdempotencyEvents = 4

// IdempotencyEvents are the events that get a series of NameIdempotency,
// in the order of their series.
var IdempotencyEvents = [NumIdempotencyEvents]reqlock.IdempotencyEvent{
	reqlock.IdempotencyConflict, reqlock.IdempotencyMismatch, reqlock.IdempotencyRecorded, reqlock.IdempotencyReplayed,
}

// IdempotencyIndex is the index of e in IdempotencyEvents, or -1.
func IdempotencyIndex(e reqlock.IdempotencyEvent) int { return slices.Index(IdempotencyEvents[:], e) }
