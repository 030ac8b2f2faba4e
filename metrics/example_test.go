package metrics_test

import (
	"net/http"
	"os"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/metrics"
	"github.com/reqlock/reqlock/stores/memstore"
)

func Example() {
	reg := metrics.New()
	locker := reqlock.MustNew(memstore.New(), reqlock.WithMetrics(reg))
	_ = locker // the service's middleware obtains its locks

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", reg)
	// http.ListenAndServe(":8080", mux)
}

func ExampleRegistry_WriteTo() {
	reg := metrics.New(metrics.WithBuckets(nil, []float64{0.1, 1}))
	reg.Held("POST /skus/{id}/deduct", 250*time.Millisecond)
	reg.WriteTo(os.Stdout)
	// Output:
	// # HELP reqlock_lock_failure_total Lock attempts (calls of Obtain or ObtainAll) that did not acquire the lock, by route and reason: timeout (the key stayed held until the wait or the caller's deadline ran out, or a try-once attempt found it held), store_error (the store failed, or did not answer before the wait ended with no sign that the key was held), bad_key (no key could be derived from the request), canceled (the caller cancelled while waiting), invalid (invalid arguments or configuration, such as keys the store cannot lock together), lock_lost (the request's own lock on a key it asked for again was lost).
	// # TYPE reqlock_lock_failure_total counter
	// reqlock_lock_failure_total{reason="bad_key",route="POST /skus/{id}/deduct"} 0
	// reqlock_lock_failure_total{reason="canceled",route="POST /skus/{id}/deduct"} 0
	// reqlock_lock_failure_total{reason="invalid",route="POST /skus/{id}/deduct"} 0
	// reqlock_lock_failure_total{reason="lock_lost",route="POST /skus/{id}/deduct"} 0
	// reqlock_lock_failure_total{reason="store_error",route="POST /skus/{id}/deduct"} 0
	// reqlock_lock_failure_total{reason="timeout",route="POST /skus/{id}/deduct"} 0
	// # HELP reqlock_lock_handoffs_total Held grants passed to a waiter of the same process without a store round trip, by route.
	// # TYPE reqlock_lock_handoffs_total counter
	// reqlock_lock_handoffs_total{route="POST /skus/{id}/deduct"} 0
	// # HELP reqlock_lock_hold_seconds Seconds a lock was held, from acquiring it until its holder let go of it (a release in the store, or a handoff to a waiter of the same process), by route.
	// # TYPE reqlock_lock_hold_seconds histogram
	// reqlock_lock_hold_seconds_bucket{route="POST /skus/{id}/deduct",le="0.1"} 0
	// reqlock_lock_hold_seconds_bucket{route="POST /skus/{id}/deduct",le="1"} 1
	// reqlock_lock_hold_seconds_bucket{route="POST /skus/{id}/deduct",le="+Inf"} 1
	// reqlock_lock_hold_seconds_sum{route="POST /skus/{id}/deduct"} 0.25
	// reqlock_lock_hold_seconds_count{route="POST /skus/{id}/deduct"} 1
	// # HELP reqlock_lock_lost_total Locks found lost while they were held (their validity ran out without a renewal, or a renewal found them gone), by route.
	// # TYPE reqlock_lock_lost_total counter
	// reqlock_lock_lost_total{route="POST /skus/{id}/deduct"} 0
	// # HELP reqlock_lock_success_total Lock attempts (calls of Obtain or ObtainAll, reentrant ones included) that acquired the lock, by route.
	// # TYPE reqlock_lock_success_total counter
	// reqlock_lock_success_total{route="POST /skus/{id}/deduct"} 0
}
