package adaptertest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores/memstore"
	"github.com/reqlock/reqlock/stores/redisstore"
)

func memLockerFor(t *testing.T) *reqlock.Locker {
	return reqlock.MustNew(memstore.New())
}

// redisLockerFor returns a Locker on the test Redis whose keys carry a
// prefix of their own.
func redisLockerFor(t *testing.T) *reqlock.Locker {
	locker, _, _ := redisLocker(t)
	return locker
}

// redisLocker returns a Locker on the test Redis, its client and its key
// prefix, unique to the test.
func redisLocker(t *testing.T, opts ...reqlock.Option) (*reqlock.Locker, *redis.Client, string) {
	t.Helper()
	client := testredis.Client(t)
	store, err := redisstore.New(client)
	if err != nil {
		t.Fatal(err)
	}
	prefix := testredis.Prefix(t)
	return reqlock.MustNew(store, append([]reqlock.Option{reqlock.WithKeyPrefix(prefix)}, opts...)...), client, prefix
}

// redisLeftovers returns the keys under prefix in Redis, fence keys aside:
// those are meant to outlive their locks (redisstore's fence retention).
func redisLeftovers(t *testing.T, client *redis.Client, prefix string) []string {
	t.Helper()
	var left []string
	iter := client.Scan(context.Background(), 0, "*"+prefix+"*", 1000).Iterator()
	for iter.Next(context.Background()) {
		if k := iter.Val(); !strings.HasSuffix(k, ":fence") {
			left = append(left, k)
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("scanning Redis: %v", err)
	}
	return left
}

func (s *suite) testHoldAtLeast(t *testing.T, newLocker func(*testing.T) *reqlock.Locker) {
	locker := newLocker(t)
	const window = 300 * time.Millisecond
	rt := Table(t, locker, "POST /items/{id}", "key=item:<id> wait=none hold-at-least="+window.String())
	var runs atomic.Int32
	srv := s.serveRoutes(t, rt, Endpoint{Method: http.MethodPost, Path: "/items/{id}",
		Handler: func(w http.ResponseWriter, r *http.Request) { runs.Add(1) }})

	start := time.Now()
	if rec := do(srv, post("/items/1", "")); rec.Code != http.StatusOK {
		t.Fatalf("first request: status %d: %s", rec.Code, rec.Body)
	}
	if d := time.Since(start); d >= window/2 {
		t.Fatalf("the first request took %v, too much of the %v window to test it", d, window)
	}
	// A double submit right after is refused, with Retry-After.
	rec := do(srv, post("/items/1", ""))
	if d := time.Since(start); d >= window {
		t.Fatalf("the second request answered %v after the first began, after the %v window: cannot test it", d, window)
	}
	s.expectRejection(t, rec, http.StatusLocked, middleware.ReasonTimeout, true)
	// Another key is not held.
	if rec := do(srv, post("/items/2", "")); rec.Code != http.StatusOK {
		t.Fatalf("another key during the window: status %d", rec.Code)
	}

	// Once the window is over (and well before the 10s TTL) it succeeds.
	deadline := start.Add(window + 5*time.Second)
	for {
		rec := do(srv, post("/items/1", ""))
		if rec.Code == http.StatusOK {
			break
		}
		if rec.Code != http.StatusLocked {
			t.Fatalf("polling: status %d: %s", rec.Code, rec.Body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the key is still held %v after the first request", time.Since(start))
		}
		time.Sleep(5 * time.Millisecond) // poll interval within the deadline
	}
	if elapsed := time.Since(start); elapsed < window {
		t.Fatalf("a double submit succeeded %v after the first request began, within the %v window", elapsed, window)
	}
	if n := runs.Load(); n != 3 {
		t.Fatalf("handler ran %d times, want 3 (first, other key, after the window)", n)
	}
}

// cart is a JSON body with items of the given SKUs.
func cart(skus ...string) string {
	type item struct {
		SKU string `json:"sku"`
		Qty int    `json:"qty"`
	}
	items := make([]item, len(skus))
	for i, s := range skus {
		items[i] = item{SKU: s, Qty: 1}
	}
	b, _ := json.Marshal(map[string]any{"items": items})
	return string(b)
}

func (s *suite) testMultiKeyCart(t *testing.T) {
	locker, store := newMemLocker(t)
	body := cart("c", "a", "c", "b")
	srv := s.serve(t, locker, "sku:<json:items[*].sku>", func(w http.ResponseWriter, r *http.Request) {
		// The body was read for the keys and is whole for the handler.
		got, err := io.ReadAll(r.Body)
		if err != nil || string(got) != body {
			http.Error(w, "body: "+string(got), http.StatusInternalServerError)
			return
		}
		reportLock(locker)(w, r)
	}, middleware.WithMaxKeys(4))
	expectBody(t, srv, post("/items/1", body), "sku:a sku:b sku:c")
	if n := store.Len(); n != 0 {
		t.Fatalf("store holds %d entries after the request", n)
	}
	// Each key has its own fence (memstore issues every grant of every key
	// a fence of its own), and the same keys again get new fences.
	fences := map[string]int64{}
	srv = s.serve(t, locker, "sku:<json:items[*].sku>", func(w http.ResponseWriter, r *http.Request) {
		lock, _ := reqlock.FromContext(r.Context())
		seen := map[int64]string{}
		for _, k := range lock.Keys() {
			fences[k], _ = lock.FenceOf(k)
			if other, dup := seen[fences[k]]; dup {
				http.Error(w, fmt.Sprintf("%s and %s have one fence, %d", other, k, fences[k]), http.StatusInternalServerError)
			}
			seen[fences[k]] = k
		}
	})
	for range 2 {
		before := maps.Clone(fences)
		if rec := do(srv, post("/items/1", cart("b", "a"))); rec.Code != http.StatusOK {
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		for k, f := range before {
			if fences[k] <= f {
				t.Fatalf("fence of %s went from %d to %d", k, f, fences[k])
			}
		}
	}
}

func (s *suite) testMultiKeyTwoTemplates(t *testing.T) {
	locker, store := newMemLocker(t)
	srv := s.serve(t, locker, "b:<id>", reportLock(locker), middleware.WithKeys("a:<json:x>"))
	expectBody(t, srv, post("/items/7", `{"x":"q"}`), "a:q b:7")
	// Templates that yield one key twice lock it once.
	srv = s.serve(t, locker, "k:<id>", reportLock(locker), middleware.WithKeys("k:<json:x>"))
	expectBody(t, srv, post("/items/7", `{"x":"7"}`), "k:7")
	// A template with [*] beside a plain one.
	srv = s.serve(t, locker, "a:<id>", reportLock(locker), middleware.WithKeys("sku:<json:items[*].sku>"))
	expectBody(t, srv, post("/items/7", cart("q", "p")), "a:7 sku:p sku:q")
	if n := store.Len(); n != 0 {
		t.Fatalf("store holds %d entries after the requests", n)
	}
	// All or none: one held key keeps the handler from running and takes
	// none of the others.
	hold(t, locker, "b:7")
	srv = s.serve(t, locker, "b:<id>", reportLock(locker), middleware.WithKeys("a:<json:x>"), middleware.WithWait(0))
	s.expectRejection(t, do(srv, post("/items/7", `{"x":"q"}`)), http.StatusLocked, middleware.ReasonTimeout, true)
	mustBeFree(t, locker, "a:q")
}

func (s *suite) testMultiKeyTooMany(t *testing.T) {
	cases := []struct {
		name   string
		key    string
		opts   []middleware.Option
		body   string
		detail string // keyfunc's words for one template, the route's for several
	}{
		{"array longer than max-keys", "sku:<json:items[*].sku>", []middleware.Option{middleware.WithMaxKeys(3)},
			cart("a", "b", "c", "d"), `the JSON body array "items" has more than 3 elements`},
		{"templates yield more than max-keys", "a:<id>", []middleware.Option{middleware.WithKeys("b:<json:x[*]>"), middleware.WithMaxKeys(2)},
			`{"x":["p","q"]}`, "the request names more than 2 lock keys, the most this route locks at once"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			locker, store := newMemLocker(t)
			var ran atomic.Bool
			srv := s.serve(t, locker, tc.key, func(w http.ResponseWriter, r *http.Request) { ran.Store(true) }, tc.opts...)
			rec := do(srv, post("/items/1", tc.body))
			s.expectRejection(t, rec, http.StatusRequestEntityTooLarge, middleware.ReasonTooManyKeys, false)
			var p problem
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Detail != tc.detail {
				t.Errorf("detail %q (%v), want %q", p.Detail, err, tc.detail)
			}
			if ran.Load() || store.Len() != 0 {
				t.Fatalf("handler ran (%v) or keys were taken (%d)", ran.Load(), store.Len())
			}
		})
	}
	// At the limit it runs.
	locker, _ := newMemLocker(t)
	srv := s.serve(t, locker, "sku:<json:items[*].sku>", reportLock(locker), middleware.WithMaxKeys(3))
	expectBody(t, srv, post("/items/1", cart("a", "b", "c")), "sku:a sku:b sku:c")
}

func (s *suite) testMultiKeyEmpty(t *testing.T) {
	for _, body := range []string{`{"items":[]}`, `{}`, `{"items":[{"sku":"a"},{"qty":1}]}`} {
		t.Run(body, func(t *testing.T) {
			locker, store := newMemLocker(t)
			var ran atomic.Bool
			srv := s.serve(t, locker, "sku:<json:items[*].sku>", func(w http.ResponseWriter, r *http.Request) { ran.Store(true) })
			s.expectRejection(t, do(srv, post("/items/1", body)), http.StatusBadRequest, middleware.ReasonBadKey, false)
			if ran.Load() || store.Len() != 0 {
				t.Fatalf("handler ran (%v) or keys were taken (%d)", ran.Load(), store.Len())
			}
		})
	}
}

func (s *suite) testMultiKeyConcurrentRedis(t *testing.T) {
	locker, client, prefix := redisLocker(t)
	const (
		requests = 50
		nSKUs    = 8
	)
	skus := make([]string, nSKUs)
	for i := range skus {
		skus[i] = fmt.Sprintf("s%d", i)
	}
	// Overlapping carts of 1 to 4 SKUs, duplicates and all, in any order.
	rng := rand.New(rand.NewPCG(1, 2))
	carts := make([][]string, requests)
	want := map[string]int64{}
	for i := range carts {
		for range 1 + rng.IntN(4) {
			carts[i] = append(carts[i], skus[rng.IntN(nSKUs)])
		}
		distinct := slices.Compact(slices.Sorted(slices.Values(carts[i])))
		for _, sku := range distinct {
			want[sku]++
		}
	}

	// counters and last fences per SKU, read and written without atomicity
	// (load, yield, store): only the lock keeps updates from being lost.
	var counters, lastFence [nSKUs]atomic.Int64
	index := func(key string) int {
		var i int
		if _, err := fmt.Sscanf(key, "sku:s%d", &i); err != nil || i < 0 || i >= nSKUs {
			return -1
		}
		return i
	}
	srv := s.serve(t, locker, "sku:<json:items[*].sku>", func(w http.ResponseWriter, r *http.Request) {
		lock, ok := reqlock.FromContext(r.Context())
		if !ok {
			http.Error(w, "no lock", http.StatusInternalServerError)
			return
		}
		var problems []string
		for _, k := range lock.Keys() {
			i := index(k)
			if i < 0 {
				problems = append(problems, "unexpected key "+k)
				continue
			}
			fence, _ := lock.FenceOf(k)
			last := lastFence[i].Load()
			n := counters[i].Load()
			runtime.Gosched()
			if fence <= last {
				problems = append(problems, fmt.Sprintf("fence of %s is %d, not above the last, %d", k, fence, last))
			}
			lastFence[i].Store(fence)
			counters[i].Store(n + 1)
		}
		if problems != nil {
			http.Error(w, strings.Join(problems, "; "), http.StatusInternalServerError)
		}
	}, middleware.WithWait(30*time.Second))

	start := make(chan struct{})
	codes := make(chan string, requests)
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() {
			<-start
			rec := do(srv, post("/items/1", cart(carts[i]...)))
			if rec.Code != http.StatusOK {
				codes <- fmt.Sprintf("cart %v: status %d: %s", carts[i], rec.Code, rec.Body)
			}
		})
	}
	close(start)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("requests still running after 60s: deadlock")
	}
	close(codes)
	for c := range codes {
		t.Error(c)
	}
	for i, sku := range skus {
		if got := counters[i].Load(); got != want[sku] {
			t.Errorf("counter of %s = %d, want %d: updates were lost", sku, got, want[sku])
		}
	}
	if left := redisLeftovers(t, client, prefix); len(left) != 0 {
		t.Fatalf("Redis still holds %v after every request answered", left)
	}
}
