// Package metrics keeps the events of a reqlock.Locker as metrics in
// process and serves them in the Prometheus text exposition format
// (version 0.0.4), with nothing but the standard library.
//
// A *Registry implements reqlock.Metrics and http.Handler:
//
//	reg := metrics.New()
//	locker := reqlock.MustNew(store, reqlock.WithMetrics(reg))
//	mux.Handle("GET /metrics", reg)
//
// # This package or metrics/prometheus
//
// Use this package when the service has no Prometheus client library and
// wants none: it is part of the core module github.com/reqlock/reqlock,
// adds no dependency, and serves only reqlock's metrics.
//
// Use the adapter github.com/reqlock/reqlock/metrics/prometheus, a module
// of its own that depends on github.com/prometheus/client_golang, when the
// service already exports metrics with that library: its *Metrics is a
// prometheus.Collector, registered next to the service's other metrics
// and the Go runtime's, served by promhttp with content negotiation,
// compression and the protobuf and OpenMetrics formats, and told apart
// from a second Locker's by constant labels. This package serves one
// Registry per handler; to give a process's several Lockers metrics in one
// scrape, use the adapter.
//
// The two produce the same metrics, so that dashboards and alerts work
// with either: the same names, HELP texts, types, labels, default buckets,
// cardinality cap and order of the series. With the default namespace
// "reqlock":
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
// The reasons are the failed outcomes of reqlock.OutcomeOf, the
// classification the middleware maps to HTTP statuses: invalid counts
// invalid arguments or configuration (such as Redis Cluster keys in
// different slots), lock_lost a nested Obtain of a key whose lock the
// request held and lost. lock_lost_total counts the locks found lost while
// held: their validity ran out without a renewal, or a renewal found them
// gone.
//
// Both implementations build on one internal definition of the names, HELP
// texts, labels, outcomes and reasons, route naming and cap, and defaults,
// and a test of the adapter compares their expositions of the same events
// byte for byte.
//
// The route label is the label of the event, a route template set with
// reqlock.WithLabel such as "POST /skus/{id}/deduct", never a raw key. No
// route is known in advance: a route's series appear when its first event
// is seen. Its counters then appear at once, at zero, for every reason, so
// that rate() and increase() count its first failure; its histograms
// appear with their first observation. A family without series is left
// out of the exposition, HELP and TYPE lines included.
//
// The number of distinct routes is capped (WithMaxRoutes, default
// DefaultMaxRoutes): events of routes beyond the cap are counted under
// route="other", so that a label of unbounded cardinality set by mistake
// cannot grow the series without bound.
//
// Reporting an event of a route already seen takes a map load and atomic
// adds, and does not allocate. A scrape reads each histogram consistently
// (its buckets add up to its count, and its sum is that of the counted
// observations) without stopping the events.
package metrics
