package bench_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/middleware"
)

// cartHandler serves POST /carts/checkout, locked on every SKU of the cart
// when locker is not nil.
func cartHandler(tb testing.TB, locker *reqlock.Locker) http.Handler {
	var h http.Handler = http.HandlerFunc(ok)
	if locker != nil {
		guard, err := middleware.NewFromSpec(locker, "@lock key=sku:<json:items[*].sku>")
		if err != nil {
			tb.Fatal(err)
		}
		h = guard.Handler(h)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /carts/checkout", h)
	return mux
}

// cartBody is a cart of n distinct SKUs, numbered from first.
func cartBody(first, n int) []byte {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf(`{"sku":"s%d","qty":1}`, first+i)
	}
	return []byte(`{"items":[` + strings.Join(items, ",") + `]}`)
}

// TestRoundTripsPerCartRequest pins the cost of an uncontended cart: two
// Redis round trips (one script to acquire every key, one to release them),
// whatever the cart's size.
func TestRoundTripsPerCartRequest(t *testing.T) {
	for _, size := range []int{1, 5, 20} {
		t.Run(fmt.Sprintf("%d-skus", size), func(t *testing.T) {
			locker, counter := redisLocker(t)
			h := cartHandler(t, locker)
			const requests = 20
			before := counter.n.Load()
			for i := range requests {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/carts/checkout", bytes.NewReader(cartBody(i*size, size))))
				if rec.Code != http.StatusNoContent {
					t.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
			}
			if got := counter.n.Load() - before; got != 2*requests {
				t.Fatalf("%d Redis round trips for %d carts of %d SKUs, want exactly 2 per cart", got, requests, size)
			}
		})
	}
}

// BenchmarkCartRequest measures one uncontended checkout locking every SKU
// of its cart on Redis, by cart size, against the same request unlocked.
func BenchmarkCartRequest(b *testing.B) {
	for _, size := range []int{1, 5, 20} {
		b.Run(fmt.Sprintf("unlocked/%d-skus", size), func(b *testing.B) { benchCart(b, cartHandler(b, nil), nil, size) })
		b.Run(fmt.Sprintf("redis/%d-skus", size), func(b *testing.B) {
			locker, counter := redisLocker(b)
			benchCart(b, cartHandler(b, locker), counter, size)
		})
	}
}

func benchCart(b *testing.B, h http.Handler, counter *commandCounter, size int) {
	bodies := make([][]byte, 256)
	for i := range bodies {
		bodies[i] = cartBody(i*size, size)
	}
	var before int64
	if counter != nil {
		before = counter.n.Load()
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/carts/checkout", bytes.NewReader(bodies[i%len(bodies)])))
		if rec.Code != http.StatusNoContent {
			b.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		i++
	}
	if counter != nil {
		b.ReportMetric(float64(counter.n.Load()-before)/float64(i), "redis-roundtrips/op")
	}
}
