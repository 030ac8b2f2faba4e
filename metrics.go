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
