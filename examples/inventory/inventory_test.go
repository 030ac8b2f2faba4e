package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/testredis"
)

// deductRoute is one way to deduct 1 from a SKU.
type deductRoute struct {
	name string
	req  func(base, sku string) (method, url, body string)
}

// send deducts 1 from sku on the service at base.
func (r deductRoute) send(t *testing.T, base, sku string) answer {
	t.Helper()
	method, url, body := r.req(base, sku)
	return mustDo(t, method, url, body)
}

// deductRoutes are the two ways to deduct; both lock sku:<id>.
var deductRoutes = []deductRoute{
	{"deduct", func(base, sku string) (string, string, string) {
		return http.MethodPost, base + "/skus/" + sku + "/deduct", `{"qty":1}`
	}},
	{"orders", func(base, sku string) (string, string, string) {
		return http.MethodPost, base + "/orders", fmt.Sprintf(`{"sku":%q,"qty":1}`, sku)
	}},
}

// TestNoOversellUnderContention sends 200 concurrent deductions of 1 to a SKU
// with stock 100, on each framework and through both routes, with 2ms of
// work between the read and the write. The lock must serialize them: exactly
// 100 succeed, leaving 99 … 0 with distinct fences, the other 100 answer 409
// insufficient stock, and the stock ends at 0, never below.
func TestNoOversellUnderContention(t *testing.T) {
	for _, fw := range frameworks {
		for _, route := range deductRoutes {
			t.Run(fw+"/"+route.name, func(t *testing.T) {
				t.Parallel()
				cfg := testConfig(fw)
				cfg.work = 2 * time.Millisecond
				cfg.wait = 30 * time.Second
				_, srv := startApp(t, cfg)
				checkNoOversell(t, srv.URL, route, do)
			})
		}
	}
}

// checkNoOversell sends 200 concurrent deductions of 1 through route to the
// SKU X, whose stock is 100, on the service at base: exactly 100 must
// succeed, one at a time, the other 100 answer 409 insufficient stock, and
// the stock end at 0. Each request is sent with send.
func checkNoOversell(t *testing.T, base string, route deductRoute, send func(method, url, body string) (answer, error)) {
	t.Helper()
	answers := concurrentlyVia(t, 200, send, func(int) (string, string, string) {
		return route.req(base, "X")
	})
	ok, conflicts := tally(t, answers)
	if len(ok) != 100 || conflicts != 100 {
		t.Fatalf("%d answered 200 and %d answered 409, want 100 and 100", len(ok), conflicts)
	}
	checkSerialized(t, ok, 100)
	if got := stockOf(t, base, "X"); got != 0 {
		t.Fatalf("stock ended at %d, want 0", got)
	}
}

// TestNoOversellAcrossInstances runs two service instances, each with its own
// Redis client, lock store and stock store, over one real Redis, and
// alternates 200 deductions between them (and between the two routes). The
// lock and the stock are shared through Redis, so exactly 100 succeed and
// the stock ends at 0 whichever instance answered.
func TestNoOversellAcrossInstances(t *testing.T) {
	url := "redis://" + testredis.Addr(t)
	sku := redisSKU(t, "X")
	var bases [2]string
	for i, fw := range []string{frameworkGin, frameworkEcho} {
		cfg := testConfig(fw)
		cfg.redisURL = url
		cfg.work = 2 * time.Millisecond
		cfg.wait = 30 * time.Second
		_, srv := startApp(t, cfg)
		bases[i] = srv.URL
	}

	answers := concurrently(t, 200, func(i int) (string, string, string) {
		return deductRoutes[(i/2)%2].req(bases[i%2], sku)
	})
	ok, conflicts := tally(t, answers)
	if len(ok) != 100 || conflicts != 100 {
		t.Fatalf("%d answered 200 and %d answered 409, want 100 and 100", len(ok), conflicts)
	}
	checkSerialized(t, ok, 100)
	var served [2]int
	for i, a := range answers {
		if a.status == http.StatusOK {
			served[i%2]++
		}
	}
	t.Logf("successful deductions per instance: %v", served)
	for i, base := range bases {
		if got := stockOf(t, base, sku); got != 0 {
			t.Fatalf("instance %d reports stock %d, want 0", i, got)
		}
	}
}

// TestNoLockOversells is the baseline that shows what the lock prevents. A
// barrier in the deduction holds every request after its read until all 50
// have read: without the lock all 50 read 100 and write 99, so 50 succeed
// yet the stock dropped by 1 (lost updates: stock + sold != 100). The same
// load with the lock (and no barrier, which it would deadlock) sells 50 and
// leaves 50.
func TestNoLockOversells(t *testing.T) {
	const n = 50
	for _, fw := range frameworks {
		t.Run(fw, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(fw)
			cfg.work = 5 * time.Millisecond
			cfg.wait = 30 * time.Second

			run := func(t *testing.T, cfg config, withBarrier bool) (sold int, stock int64) {
				a, srv := startApp(t, cfg)
				if withBarrier {
					a.shop.testHookAfterRead = newBarrier(n).wait
				}
				answers := concurrently(t, n, func(int) (string, string, string) {
					return deductRoutes[0].req(srv.URL, "X")
				})
				ok, conflicts := tally(t, answers)
				if conflicts != 0 {
					t.Errorf("%d answered 409, want none: the stock suffices", conflicts)
				}
				return len(ok), stockOf(t, srv.URL, "X")
			}

			nolock := cfg
			nolock.noLock = true
			sold, stock := run(t, nolock, true)
			t.Logf("-nolock: %d sold, stock %d: %d units sold that the stock does not account for", sold, stock, int64(sold)+stock-100)
			if int64(sold)+stock == 100 {
				t.Fatalf("-nolock: %d sold and stock %d add up to 100: the baseline shows no lost update", sold, stock)
			}

			sold, stock = run(t, cfg, false)
			if sold != n || stock != 100-n {
				t.Fatalf("with the lock: %d sold and stock %d, want %d and %d", sold, stock, n, 100-n)
			}
		})
	}
}

// TestExpiredLeaseEndsTheRequest forces a request to outlive its lock:
// request A reads the stock (100) and stalls past its 50ms lease. Its
// handler's context ends with the lease (reqlock.ErrLockLost), so A stops
// before it writes and answers 409 "lock lost"; request B, queued behind A,
// gets the lock and deducts.
func TestExpiredLeaseEndsTheRequest(t *testing.T) {
	for _, fw := range frameworks {
		for _, store := range []string{"memory", "redis"} {
			t.Run(fw+"/"+store, func(t *testing.T) {
				t.Parallel()
				cfg := testConfig(fw)
				// A lease long enough for A to reach its read on a loaded
				// machine; A then works until it ends.
				cfg.ttl = 300 * time.Millisecond
				cfg.wait = 30 * time.Second
				sku := "X"
				if store == "redis" {
					cfg.redisURL = "redis://" + testredis.Addr(t)
					sku = redisSKU(t, "X")
				}
				a, srv := startApp(t, cfg)

				var reads atomic.Int32
				aRead := make(chan struct{})
				a.shop.testHookAfterRead = func(ctx context.Context) {
					if reads.Add(1) == 1 {
						close(aRead)
						<-ctx.Done() // A: works until its lease ends
					}
				}
				first := doAsync(deductRoutes[0].req(srv.URL, sku))
				awaitHook(t, aRead, first)
				second := doAsync(deductRoutes[1].req(srv.URL, sku))
				ra, rb := <-first, <-second
				if ra.err != nil || rb.err != nil {
					t.Fatal(errors.Join(ra.err, rb.err))
				}
				if ra.a.status != http.StatusConflict || !strings.HasPrefix(ra.a.Error, "lock lost") {
					t.Errorf("A, whose lease expired: %v, want 409 lock lost", ra.a)
				}
				if rb.a.status != http.StatusOK || *rb.a.Stock != 99 {
					t.Errorf("B: %v, want 200 with stock 99", rb.a)
				}
				if got := stockOf(t, srv.URL, sku); got != 99 {
					t.Errorf("stock %d, want 99: one sale", got)
				}
			})
		}
	}
}

// TestLostLockIsFenced is the case fences exist for: a holder whose lock is
// gone from the store while it still believes it holds it (a failover that
// lost the key, a clock that ran slow). Two instances share Redis. Request A,
// on the first, reads the stock (100); its lock key vanishes from Redis;
// request B, on the second, gets the lock with a higher fence, reads and
// deducts (99); then A writes. A's fence is stale, so the stock store
// refuses the write: A answers 409 "stale fence" and changes nothing, for a
// deduction and for a checkout alike (which changes none of its SKUs).
func TestLostLockIsFenced(t *testing.T) {
	for _, fw := range frameworks {
		for _, route := range []string{"deduct", "checkout"} {
			t.Run(fw+"/"+route, func(t *testing.T) {
				t.Parallel()
				cfg := testConfig(fw)
				cfg.redisURL = "redis://" + testredis.Addr(t)
				cfg.wait = 30 * time.Second
				X, Y := redisSKU(t, "X"), redisSKU(t, "Y")
				one, srv1 := startApp(t, cfg)
				_, srv2 := startApp(t, cfg)
				client := testredis.Client(t)
				keys := skuKeysOf(one.routes, routeDeduct)

				aRead, bDone := make(chan struct{}), make(chan struct{})
				one.shop.testHookAfterRead = func(ctx context.Context) {
					// A's lock vanishes from Redis behind its back.
					k, err := keys.key(Y)
					if err == nil {
						err = client.Del(ctx, "reqlock:"+k).Err()
					}
					if err != nil {
						t.Error(err)
					}
					close(aRead)
					select {
					case <-bDone:
					case <-ctx.Done():
					}
				}
				method, url, body := deductRoutes[0].req(srv1.URL, Y)
				if route == "checkout" {
					method, url, body = http.MethodPost, srv1.URL+"/carts/checkout", cartBody(cartItem{X, 1}, cartItem{Y, 1})
				}
				first := doAsync(method, url, body)
				awaitHook(t, aRead, first)
				rb := mustDo(t, http.MethodPost, srv2.URL+"/skus/"+Y+"/deduct", `{"qty":1}`)
				close(bDone)
				ra := <-first
				if ra.err != nil {
					t.Fatal(ra.err)
				}
				if ra.a.status != http.StatusConflict || !strings.HasPrefix(ra.a.Error, "stale fence") || ra.a.SKU != Y {
					t.Errorf("A, whose lock was lost: %v, want 409 stale fence naming %s", ra.a, Y)
				}
				if rb.status != http.StatusOK || *rb.Stock != 99 {
					t.Errorf("B: %v, want 200 with stock 99", rb)
				}
				if got := stockOf(t, srv1.URL, Y); got != 99 {
					t.Errorf("stock of Y %d, want 99: B's sale only", got)
				}
				if got := stockOf(t, srv1.URL, X); got != 100 {
					t.Errorf("stock of X %d, want 100: the stale checkout changed it", got)
				}
			})
		}
	}
}

// TestLockWaitRunsOut holds a SKU's key with the app's own Locker, as another
// request or instance would, and sends deductions that may wait 50ms: both
// routes and a checkout of the SKU answer 423 with Retry-After, and the
// stock is untouched. Once the key is released a deduction succeeds with a
// fence above the holder's.
func TestLockWaitRunsOut(t *testing.T) {
	for _, fw := range frameworks {
		t.Run(fw, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(fw)
			cfg.wait = 50 * time.Millisecond
			a, srv := startApp(t, cfg)
			counter := &countingStore{stockStore: a.shop.store}
			a.shop.store = counter

			held, err := a.locker.Obtain(context.Background(), "sku:X", 10*time.Second, 0)
			if err != nil {
				t.Fatalf("Obtain: %v", err)
			}
			released := false
			t.Cleanup(func() {
				if !released {
					_ = held.Release(context.Background())
				}
			})

			for _, route := range lockedRoutes {
				got := route.send(t, srv.URL, "X")
				if got.status != http.StatusLocked || got.retryAfter == "" {
					t.Errorf("%s while the key is held: %v (Retry-After %q), want 423 with Retry-After",
						route.name, got, got.retryAfter)
				}
			}
			if r, w := counter.reads.Load(), counter.writes.Load(); r != 0 || w != 0 {
				t.Errorf("the stock store saw %d reads and %d writes from rejected requests, want none", r, w)
			}

			if err := held.Release(context.Background()); err != nil {
				t.Fatalf("Release: %v", err)
			}
			released = true
			got := deductRoutes[0].send(t, srv.URL, "X")
			if got.status != http.StatusOK || *got.Stock != 99 || got.Fence <= held.Fence() {
				t.Errorf("after release: %v, want 200, stock 99, fence above %d", got, held.Fence())
			}
		})
	}
}

// TestLockStoreDown points the service at a Redis address where nothing
// listens, started anyway (connect=lazy; without it start-up fails): every
// locked route answers 503 with Retry-After (fail closed), and the handler
// never ran: the stock store saw no read and no write.
func TestLockStoreDown(t *testing.T) {
	addr := testredis.DownClient(t).Options().Addr
	for _, fw := range frameworks {
		t.Run(fw, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(fw)
			cfg.redisURL = "redis://" + addr + "?dial_timeout=200ms&max_retries=-1&connect=lazy"
			a, srv := startApp(t, cfg)
			counter := &countingStore{stockStore: a.shop.store}
			a.shop.store = counter

			for _, route := range lockedRoutes {
				got := route.send(t, srv.URL, "X")
				if got.status != http.StatusServiceUnavailable || got.retryAfter == "" {
					t.Errorf("%s with the store down: %v (Retry-After %q), want 503 with Retry-After",
						route.name, got, got.retryAfter)
				}
			}
			got := mustDo(t, http.MethodPut, srv.URL+"/skus/X", `{"stock":5}`)
			if got.status != http.StatusServiceUnavailable {
				t.Errorf("PUT with the store down: %v, want 503", got)
			}
			if r, w := counter.reads.Load(), counter.writes.Load(); r != 0 || w != 0 {
				t.Errorf("the stock store saw %d reads and %d writes, want none: the handler must not run", r, w)
			}
		})
	}
}

// failingStore is a stock store that is down.
type failingStore struct{}

// errDown is failingStore's failure.
var errDown = errors.New("stock store down")

// Read implements stockStore.
func (failingStore) Read(context.Context, string, int64) (int64, bool, error) {
	return 0, false, fmt.Errorf("%w: %w", errStockStore, errDown)
}

// Write implements stockStore.
func (failingStore) Write(context.Context, string, int64, int64) error {
	return fmt.Errorf("%w: %w", errStockStore, errDown)
}

// DeductAll implements stockStore.
func (failingStore) DeductAll(context.Context, []deduction, int64) ([]int64, error) {
	return nil, fmt.Errorf("%w: %w", errStockStore, errDown)
}

// TestStockStoreDown keeps the lock store up and takes the stock store down:
// the handler itself answers 503 with Retry-After, and the lock is released
// (the next request obtains it at once).
func TestStockStoreDown(t *testing.T) {
	for _, fw := range frameworks {
		t.Run(fw, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(fw)
			cfg.wait = 0 // try once: a lock left behind would answer 423
			a, srv := startApp(t, cfg)
			a.shop.store = failingStore{}
			for range 2 {
				for _, route := range lockedRoutes {
					got := route.send(t, srv.URL, "X")
					if got.status != http.StatusServiceUnavailable || got.retryAfter == "" || got.Error == "" {
						t.Errorf("%s: %v (Retry-After %q), want 503 with Retry-After", route.name, got, got.retryAfter)
					}
				}
			}
			if got := mustDo(t, http.MethodGet, srv.URL+"/skus/X", ""); got.status != http.StatusServiceUnavailable {
				t.Errorf("GET: %v, want 503", got)
			}
		})
	}
}

// TestRequests checks the answers to single requests on each framework: bad
// bodies are 400 and change nothing, an unknown SKU has the default stock,
// PUT sets the stock, a deduction answers the remaining stock and its fence,
// and an insufficient stock is 409 with the current stock.
func TestRequests(t *testing.T) {
	type step struct {
		method, path, body string
		status             int
		stock              int64 // checked when not -1
	}
	steps := []step{
		{"GET", "/skus/new", "", 200, 7},
		{"POST", "/skus/X/deduct", `{"qty":`, 400, -1},
		{"POST", "/skus/X/deduct", `not json`, 400, -1},
		{"POST", "/skus/X/deduct", ``, 400, -1},
		{"POST", "/skus/X/deduct", `{}`, 400, -1},
		{"POST", "/skus/X/deduct", `{"qty":0}`, 400, -1},
		{"POST", "/skus/X/deduct", `{"qty":-3}`, 400, -1},
		{"POST", "/skus/X/deduct", `{"qty":1.5}`, 400, -1},
		{"POST", "/skus/X/deduct", `{"qty":1} {"qty":1}`, 400, -1},
		{"POST", "/orders", `{"qty":1}`, 400, -1},
		{"POST", "/orders", `{"sku":"","qty":1}`, 400, -1},
		{"POST", "/orders", `{"sku":"X"}`, 400, -1},
		{"POST", "/orders", `{"sku":"X","qty":0}`, 400, -1},
		{"PUT", "/skus/X", `{"stock":-1}`, 400, -1},
		{"PUT", "/skus/X", `{}`, 400, -1},
		{"GET", "/skus/X", "", 200, 7},
		{"POST", "/skus/X/deduct", `{"qty":3}`, 200, 4},
		{"POST", "/orders", `{"sku":"X","qty":4}`, 200, 0},
		{"POST", "/skus/X/deduct", `{"qty":1}`, 409, 0},
		{"PUT", "/skus/X", `{"stock":10}`, 200, 10},
		{"POST", "/orders", `{"sku":"X","qty":11}`, 409, 10},
		{"POST", "/orders", `{"sku":"X","qty":10}`, 200, 0},
		{"GET", "/skus/X", "", 200, 0},
	}
	for _, fw := range frameworks {
		t.Run(fw, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(fw)
			cfg.defaultStock = 7
			_, srv := startApp(t, cfg)
			var lastFence int64
			for _, s := range steps {
				got := mustDo(t, s.method, srv.URL+s.path, s.body)
				if got.status != s.status {
					t.Fatalf("%s %s %s: %v, want status %d", s.method, s.path, s.body, got, s.status)
				}
				if s.stock >= 0 && (got.Stock == nil || *got.Stock != s.stock) {
					t.Fatalf("%s %s %s: %v, want stock %d", s.method, s.path, s.body, got, s.stock)
				}
				if s.status == http.StatusOK && s.method == "POST" {
					if got.Fence <= lastFence {
						t.Fatalf("%s %s: fence %d, want above the previous %d", s.method, s.path, got.Fence, lastFence)
					}
					lastFence = got.Fence
				}
			}
		})
	}
}

// TestBodyTooLarge: a body above the handlers' limit answers 413, not a
// JSON error, on every framework and route that reads one; so does a body
// above the lock middleware's limit on the routes whose key it reads from
// the body (/orders and the checkout), before it locks. Nothing changes.
func TestBodyTooLarge(t *testing.T) {
	pad := func(n int) string { return `,"pad":"` + strings.Repeat("x", n) + `"}` }
	huge := `{"qty":1` + pad(maxBodyBytes)
	requests := []struct {
		method, path, body string
		reason             string // the middleware's problem details reason, if it answers
	}{
		{http.MethodPost, "/skus/big/deduct", huge, ""},
		{http.MethodPut, "/skus/big", `{"stock":1` + pad(maxBodyBytes), ""},
		{http.MethodPost, "/orders", `{"sku":"big","qty":1` + pad(maxBodyBytes), ""},
		{http.MethodPost, "/carts/checkout", `{"items":[{"sku":"big","qty":1}]` + pad(maxBodyBytes), ""},
		// Above the middleware's 1 MiB (keyfunc.DefaultMaxBodyBytes).
		{http.MethodPost, "/orders", `{"sku":"big","qty":1` + pad(1<<20), "body_too_large"},
		{http.MethodPost, "/carts/checkout", `{"items":[{"sku":"big","qty":1}]` + pad(1<<20), "body_too_large"},
	}
	for _, fw := range frameworks {
		t.Run(fw, func(t *testing.T) {
			_, srv := startApp(t, testConfig(fw))
			for _, r := range requests {
				if got := mustDo(t, r.method, srv.URL+r.path, r.body); got.status != http.StatusRequestEntityTooLarge || got.Reason != r.reason {
					t.Errorf("%s %s with %d bytes: %v, want 413 (reason %q)", r.method, r.path, len(r.body), got, r.reason)
				}
			}
			if stock := stockOf(t, srv.URL, "big"); stock != 100 {
				t.Errorf("stock %d, want 100", stock)
			}
		})
	}
}

// TestHotSKUBurstAcrossInstances is the flash sale of issue 8, as it was
// reported: two instances on one healthy Redis, one hot SKU, 200 concurrent
// deductions, 20ms of work each, the default 2s wait, so that most requests
// run out of wait. A request that does not get the lock is a timeout (423),
// never a store failure: no 503 on a fail-closed table, no run without the
// lock on a fail-open one. Every 200 sold one unit, and the stock says so.
func TestHotSKUBurstAcrossInstances(t *testing.T) {
	for _, policy := range []string{"503", "fail-open"} {
		t.Run(policy, func(t *testing.T) {
			table := filepath.Join(t.TempDir(), "routes.yaml")
			spec := `"@lock key=sku:<id> wait=2s ttl=10s on-timeout=423 on-store-error=` + policy + `"`
			if err := os.WriteFile(table, []byte("routes:\n  POST /skus/{id}/deduct: "+spec+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			var logs syncBuffer
			sku := redisSKU(t, "hot")
			var bases [2]string
			for i, fw := range []string{frameworkGin, frameworkNetHTTP} {
				cfg := testConfig(fw)
				cfg.redisURL = "redis://" + testredis.Addr(t)
				cfg.work = 20 * time.Millisecond
				cfg.routesFile = table
				cfg.logger = slog.New(slog.NewTextHandler(&logs, nil))
				_, srv := startApp(t, cfg)
				bases[i] = srv.URL
			}
			answers := concurrently(t, 200, func(i int) (string, string, string) {
				return deductRoutes[0].req(bases[i%2], sku)
			})
			codes := map[int]int{}
			for _, a := range answers {
				codes[a.status]++
			}
			if codes[http.StatusOK]+codes[http.StatusLocked] != 200 || codes[http.StatusLocked] == 0 {
				t.Errorf("answers %v, want only 200 and 423 (and some 423)", codes)
			}
			if n := strings.Count(logs.String(), "WITHOUT the lock"); n != 0 {
				t.Errorf("%d runs without the lock on a healthy Redis", n)
			}
			if sold := 100 - stockOf(t, bases[0], sku); sold != int64(codes[http.StatusOK]) {
				t.Errorf("sold %d units for %d answers 200", sold, codes[http.StatusOK])
			}
			t.Logf("answers %v", codes)
		})
	}
}
