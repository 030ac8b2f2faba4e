package reqlock

import (
	"context"
	"errors"
	"time"
)

// Result is the outcome of one attempt to obtain a lock, as counted by
// Metrics.
type Result string

// Results of an attempt to obtain a lock.
const (
	// ResultAcquired: the lock was obtained.
	ResultAcquired Result = "acquired"
	// ResultTimeout: the key stayed held until the wait or the caller's
	// deadline ran out, or a try-once attempt found it held.
	ResultTimeout Result = "timeout"
	// ResultStoreError: the store failed or did not answer in time.
	ResultStoreError Result = "store_error"
	// ResultBadKey: no key could be derived from the request (the
	// middleware reports this one; Obtain reports it for invalid arguments).
	ResultBadKey Result = "bad_key"
	// ResultCanceled: the caller cancelled (the client left) while waiting.
	ResultCanceled Result = "canceled"
)

// Metrics receives the Locker's events. Every event carries a label: the
// route template the middleware set with WithLabel (never a raw key, so the
// label's cardinality is that of the routes), or UnlabeledRoute.
//
// Implementations must be safe for concurrent use and fast: they run on the
// request path. Package reqlock depends on no metrics library; the module
// github.com/reqlock/reqlock/metrics/prometheus adapts this to Prometheus.
type Metrics interface {
	// Obtained is called once per Obtain or ObtainAll call (reentrant calls
	// included) with its result and how long it took.
	Obtained(label string, result Result, wait time.Duration)
	// Held is called when a lock is released, with how long it was held.
	Held(label string, held time.Duration)
	// Lost is called when a lock's watchdog finds the lock lost.
	Lost(label string)
	// HandedOff is called when a held grant passes to a local waiter
	// without a store round trip.
	HandedOff(label string)
}

// UnlabeledRoute is the label of events whose context carries none.
const UnlabeledRoute = "unlabeled"

// WithMetrics makes the Locker report its events to m. Default: none.
func WithMetrics(m Metrics) Option { return func(l *Locker) { l.metrics = m } }

type labelContextKey struct{}

// WithLabel returns a copy of ctx whose locks report their Metrics events
// under label, such as the route template "POST /skus/{id}/deduct". The
// middleware sets it for every route; keep it of bounded cardinality.
func WithLabel(ctx context.Context, label string) context.Context {
	return context.WithValue(ctx, labelContextKey{}, label)
}

// LabelFrom returns the label ctx carries, or UnlabeledRoute.
func LabelFrom(ctx context.Context) string {
	if s, ok := ctx.Value(labelContextKey{}).(string); ok && s != "" {
		return s
	}
	return UnlabeledRoute
}

// resultOf classifies an error of Obtain or ObtainAll for Metrics. ctx is
// the caller's context, before the wait limit was applied to it.
func resultOf(ctx context.Context, err error) Result {
	switch {
	case err == nil:
		return ResultAcquired
	case errors.Is(err, ErrInvalid):
		return ResultBadKey
	case errors.Is(err, ErrStore):
		return ResultStoreError
	case errors.Is(err, context.Canceled):
		return ResultCanceled
	case errors.Is(err, ErrHeld), ctx.Err() != nil:
		// Held until the wait ran out, or the caller's own deadline
		// ended the wait.
		return ResultTimeout
	}
	// The wait limit ran out before the store answered at all.
	return ResultStoreError
}

// Metrics returns the Metrics the Locker reports to, or nil.
func (l *Locker) Metrics() Metrics { return l.metrics }
