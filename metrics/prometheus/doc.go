// Package reqlockprom reports the events of a reqlock.Locker as Prometheus
// metrics.
//
// It lives in its own module, github.com/reqlock/reqlock/metrics/prometheus,
// so that programs using the core module github.com/reqlock/reqlock do not
// inherit the Prometheus client library and its dependencies: only programs
// that import this package do.
//
// A *Metrics implements reqlock.Metrics and reqlock.OutageMetrics and is
// itself a prometheus.Collector:
//
//	m := reqlockprom.New()
//	prometheus.MustRegister(m)
//	locker := reqlock.MustNew(store, reqlock.WithMetrics(m))
//
// With the default namespace "reqlock" it exports:
//
//	reqlock_lock_success_total{route}          counter
//	reqlock_lock_failure_total{route,reason}   counter; reason is timeout, store_error, bad_key, canceled, invalid or lock_lost
//	reqlock_lock_wait_seconds{route,result}    histogram; result is acquired or one of the reasons
//	reqlock_lock_hold_seconds{route}           histogram
//	reqlock_lock_lost_total{route}             counter
//	reqlock_lock_handoffs_total{route}         counter
//
// and, from reqlock.ModeMetrics (reported by package middleware for its
// routes; they appear with a route's first event of a mode):
//
//	reqlock_lock_holders{mode,route}           gauge; this process's requests holding the route's lock, mode exclusive, shared or limited
//	reqlock_lock_limit_reached_total{route}    counter; over-limit answers (429 by default; also counted as timeout)
//
// and, from reqlock.IdempotencyMetrics (reported by package middleware for
// its routes with idempotency; a route's series of every event appear, at
// zero, with its first event):
//
//	reqlock_lock_idempotency_total{event,route}  counter; event is replayed, conflict (409), mismatch (422) or recorded
//
// and, from reqlock.OutageMetrics (the Locker's breaker, see
// reqlock.WithBreaker, and its pending releases, see
// reqlock.WithPendingReleases):
//
//	reqlock_lock_store_down                    gauge; 1 while the breaker counts the store down
//	reqlock_lock_store_outages_total           counter; times the store was counted down
//	reqlock_lock_store_down_seconds_total      counter; seconds down, summed over the outages that ended
//	reqlock_lock_store_down_rejected_total{route}  counter; Obtains refused with ErrStoreDown (also counted as store_error)
//	reqlock_lock_pending_releases_total{event} counter; event is queued, released, not_held, expired, dropped or unreleased
//
// The reasons are the failed outcomes of reqlock.OutcomeOf, the
// classification the middleware maps to HTTP statuses: invalid counts
// invalid arguments or configuration (such as Redis Cluster keys in
// different slots), lock_lost a nested Obtain of a key whose lock the
// request held and lost. lock_lost_total counts the locks found lost while
// held: their validity ran out without a renewal, or a renewal found them
// gone.
//
// The route label is the label of the event, a route template set with
// reqlock.WithLabel such as "POST /skus/{id}/deduct", never a raw key. No
// route is known in advance: a route's series appear when its first event
// is seen. Its counters then appear at once, at zero, for every reason, so
// that rate() and increase() count its first failure; its histograms
// appear with their first observation. The outage families appear with
// the first outage or pending-release event, as a whole: the gauge and
// the counters at their value, a series for every event, and
// lock_store_down_rejected_total for every route seen.
//
// The number of distinct routes is capped (WithMaxRoutes, default
// DefaultMaxRoutes): events of routes beyond the cap are counted under
// route="other", so that a label of unbounded cardinality set by mistake
// cannot grow the series without bound.
//
// The names, HELP texts, labels, default buckets, route names and cap and
// the reasons of outcomes come from one internal definition shared with
// the core package github.com/reqlock/reqlock/metrics, whose Registry
// serves the same metrics with the standard library alone: for the same
// events, the text exposition promhttp serves for a Metrics is byte for
// byte the one a metrics.Registry writes, so that dashboards and alerts
// work with either.
//
// Reporting an event of a route already seen does not allocate.
package reqlockprom
