package reqlock

import (
	"context"
	"time"
)

// Metrics receives the Locker's events. Every event carries a label: the
// route template the middleware set with WithLabel (never a raw key, so the
// label's cardinality is that of the routes), or UnlabeledRoute.
//
// Implementations must be safe for concurrent use and fast: they run on the
// request path. Package reqlock depends on no metrics library; package
// metrics serves these events in the Prometheus text format, and the module
// github.com/reqlock/reqlock/metrics/prometheus adapts them to the
// Prometheus client library.
type Metrics interface {
	// Obtained is called once per Obtain or ObtainAll call (reentrant calls
	// included) with its outcome and how long it took.
	Obtained(label string, outcome Outcome, wait time.Duration)
	// Held is called when a holder lets go of a grant, with how long it
	// held it: at a release in the store, or a handoff to a local waiter.
	Held(label string, held time.Duration)
	// Lost is called when a lock is found lost while its holder works: its
	// validity ran out unrenewed, or a renewal found it gone.
	Lost(label string)
	// HandedOff is called when a held grant passes to a local waiter
	// without a store round trip.
	HandedOff(label string)
}

// UnlabeledRoute is the label of events whose context carries none.
const UnlabeledRoute = "unlabeled"

type labelContextKey struct{}

// WithLabel returns a copy of ctx whose locks report their Metrics events
// under label, such as the route template "POST /skus/{id}/deduct". The
// middleware sets it for every route; keep it of bounded cardinality. A
// context that carries a lock (NewContext) labels further locks with that
// lock's label unless WithLabel says otherwise.
func WithLabel(ctx context.Context, label string) context.Context {
	return context.WithValue(ctx, labelContextKey{}, label)
}

// labelOf returns ctx's label: its WithLabel value or, in its absence, the
// label of the innermost lock ctx carries; UnlabeledRoute without either.
func labelOf(ctx context.Context) string {
	if s, ok := ctx.Value(labelContextKey{}).(string); ok && s != "" {
		return s
	}
	if h, _ := ctx.Value(lockContextKey{}).(*heldLocks); h != nil && h.lock.label != "" {
		return h.lock.label
	}
	return UnlabeledRoute
}

// OutageMetrics is an optional interface of a Metrics: the Locker reports
// these events too when its Metrics implements it (a type assertion), so
// that Metrics written before them keep working.
type OutageMetrics interface {
	// StoreDown is called when the breaker opens: the store is counted
	// down (see WithBreaker).
	StoreDown()
	// StoreBack is called when the breaker closes again, with how long the
	// store was counted down and how many requests were refused with
	// ErrStoreDown meanwhile.
	StoreBack(downFor time.Duration, rejected int64)
	// RejectedStoreDown is called for each Obtain refused with
	// ErrStoreDown; it is also counted by Obtained, as a store error.
	RejectedStoreDown(label string)
	// PendingRelease is called when a release that failed for a store
	// reason enters the Locker's set of pending releases, and when it
	// leaves it, with how (see PendingEvent and WithPendingReleases).
	PendingRelease(event PendingEvent)
}

// ModeMetrics is an optional interface of a Metrics, as OutageMetrics is:
// package middleware reports these events of its routes too when the
// Locker's Metrics implements it.
type ModeMetrics interface {
	// Holding is called with delta +1 when a request of the route label
	// starts to hold its lock in mode, before its handler runs, and with -1
	// when the handler is done, so that the sum is the number of this
	// process's requests that hold the route's lock.
	Holding(label string, mode HolderMode, delta int)
	// LimitReached is called when a request to a route with a limit
	// stopped waiting with every place taken (answered 429 by default).
	// It is also counted by Obtained, as a timeout.
	LimitReached(label string)
}

// IdempotencyMetrics is an optional interface of a Metrics, as ModeMetrics
// is: package middleware reports the events of its idempotent routes (see
// middleware.Idempotency) when the Locker's Metrics implements it.
type IdempotencyMetrics interface {
	// Idempotency is called once for each event of a request to the
	// idempotent route label.
	Idempotency(label string, event IdempotencyEvent)
}

// IdempotencyEvent is what happened to a request with an idempotency key.
type IdempotencyEvent string

// The events of IdempotencyMetrics.
const (
	// IdempotencyReplayed: the request was answered with the response
	// recorded for its key; its handler did not run.
	IdempotencyReplayed IdempotencyEvent = "replayed"
	// IdempotencyConflict: a request with the key was still running when
	// the wait ended (409 Conflict).
	IdempotencyConflict IdempotencyEvent = "conflict"
	// IdempotencyMismatch: the key's record answers a different request
	// (422 Unprocessable Content).
	IdempotencyMismatch IdempotencyEvent = "mismatch"
	// IdempotencyRecorded: the handler's response was recorded for the
	// key.
	IdempotencyRecorded IdempotencyEvent = "recorded"
)

// HolderMode is how a route's requests hold its key, for ModeMetrics.
type HolderMode string

// The modes of ModeMetrics.Holding.
const (
	// HolderExclusive: Obtain, ObtainAll; one holder at a time.
	HolderExclusive HolderMode = "exclusive"
	// HolderShared: ObtainShared.
	HolderShared HolderMode = "shared"
	// HolderLimited: ObtainLimited.
	HolderLimited HolderMode = "limited"
)

// PendingEvent is what happened to a pending release (see
// WithPendingReleases).
type PendingEvent string

// Events of a pending release.
const (
	// PendingQueued: a release failed for a store reason and will be
	// retried.
	PendingQueued PendingEvent = "queued"
	// PendingReleased: a retry released the keys.
	PendingReleased PendingEvent = "released"
	// PendingNotHeld: a retry found the keys no longer held by the token.
	PendingNotHeld PendingEvent = "not_held"
	// PendingExpired: the grant's TTL passed before a retry succeeded; the
	// store has let the keys go by itself.
	PendingExpired PendingEvent = "expired"
	// PendingDropped: the set was full, and the oldest pending release was
	// dropped to make room (it expires with its TTL), or the Locker was
	// closed and the release was not retried.
	PendingDropped PendingEvent = "dropped"
	// PendingUnreleased: Close tried the release once more, and it failed.
	PendingUnreleased PendingEvent = "unreleased"
)
