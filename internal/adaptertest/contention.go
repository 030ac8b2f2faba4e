package adaptertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// testContentionIsATimeout sends bursts on one hot key through one or two
// Lockers (two service instances) whose waits run out while the key is held.
// Every request either runs its handler holding the lock or is answered the
// timeout status: never 503, and, on a fail-open route, never an unlocked
// run.
func (s *suite) testContentionIsATimeout(t *testing.T) {
	for _, backend := range []string{"memstore", "redis"} {
		for _, instances := range []int{1, 2} {
			for _, failOpen := range []bool{false, true} {
				name := fmt.Sprintf("%s/%d instances/fail-open=%v", backend, instances, failOpen)
				t.Run(name, func(t *testing.T) {
					s.contentionBurst(t, contentionLockers(t, backend, instances), failOpen)
				})
			}
		}
	}
}

func (s *suite) contentionBurst(t *testing.T, lockers []*reqlock.Locker, failOpen bool) {
	var unlocked, ran, inside, overlaps atomic.Int32
	h := func(w http.ResponseWriter, r *http.Request) {
		if _, ok := reqlock.FromContext(r.Context()); !ok {
			unlocked.Add(1)
		}
		if inside.Add(1) != 1 {
			overlaps.Add(1)
		}
		time.Sleep(3 * time.Millisecond) // the work under the lock
		inside.Add(-1)
		ran.Add(1)
	}
	// 200 requests of 3ms of work need 600ms: a 250ms wait leaves many to
	// time out on the held key, and is long enough that a healthy Redis
	// answers every single store call within it even on a loaded machine
	// under -race (a call that takes the whole wait is a store failure).
	opts := []middleware.Option{middleware.WithWait(250 * time.Millisecond), middleware.WithLogger(discardLogger())}
	if failOpen {
		opts = append(opts, middleware.WithFailOpen())
	}
	var servers []http.Handler
	for _, l := range lockers {
		servers = append(servers, s.serve(t, l, "item:<id>", h, opts...))
	}
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for i := range 200 {
		srv := servers[i%len(servers)]
		wg.Go(func() {
			rec := do(srv, post("/items/hot", ""))
			mu.Lock()
			codes[rec.Code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[http.StatusOK]+codes[http.StatusLocked] != 200 || codes[http.StatusLocked] == 0 {
		t.Errorf("%s: answers %v, want only 200 and 423 (and some 423)", s.a.Name, codes)
	}
	if unlocked.Load() != 0 || overlaps.Load() != 0 {
		t.Errorf("%s: %d handler runs without the lock, %d overlapping runs; want none", s.a.Name, unlocked.Load(), overlaps.Load())
	}
	if int(ran.Load()) != codes[http.StatusOK] {
		t.Errorf("%s: %d handler runs for %d answers 200", s.a.Name, ran.Load(), codes[http.StatusOK])
	}
	// A grant that came as a wait ended is released in the background: let
	// that finish while the store is open.
	deadline := time.Now().Add(5 * time.Second)
	for {
		lock, err := lockers[0].Obtain(context.Background(), "item:hot", time.Second, 0)
		if err == nil {
			_ = lock.Release(context.Background())
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("item:hot still locked 5s after the burst: %v", err)
		}
		time.Sleep(time.Millisecond) // poll interval inside a deadline
	}
}

// contentionLockers returns n Lockers on one store: one memstore shared in
// memory, or n Redis stores on one server, as n service instances would be.
func contentionLockers(t *testing.T, backend string, n int) []*reqlock.Locker {
	t.Helper()
	mem := memstore.New()
	prefix := testredis.Prefix(t)
	var lockers []*reqlock.Locker
	for range n {
		var store stores.Store = mem
		if backend == "redis" {
			rs, err := redisstore.New(testredis.Client(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = rs.Close() })
			store = rs
		}
		lockers = append(lockers, reqlock.MustNew(store, reqlock.WithKeyPrefix(prefix)))
	}
	return lockers
}

// testLeaseEndsHandlerContext: on a route without the watchdog, a handler
// that outlives its lock's lease has its request context cancelled, with a
// cause wrapping reqlock.ErrLockLost, when the lease runs out; the loss is
// logged once, with its key.
func (s *suite) testLeaseEndsHandlerContext(t *testing.T) {
	var logs syncBuffer
	locker := reqlock.MustNew(memstore.New(), reqlock.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	const ttl = 100 * time.Millisecond
	srv := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
			http.Error(w, "the handler's context outlived the lease", http.StatusInternalServerError)
			return
		}
		// A second of slack for a loaded machine; a context the lease does
		// not end runs into the 5s above.
		if took := time.Since(start); took > ttl+time.Second {
			http.Error(w, "the context ended "+took.String()+" after the handler began, for a "+ttl.String()+" lease", http.StatusInternalServerError)
			return
		}
		if cause := context.Cause(r.Context()); !errors.Is(cause, reqlock.ErrLockLost) {
			http.Error(w, "cause: "+errString(cause), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}, middleware.WithTTL(ttl))
	if rec := do(srv, post("/items/9", "")); rec.Code != http.StatusAccepted {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if l := logs.String(); strings.Count(l, "lock lost while") != 1 || !strings.Contains(l, "key=item:9") {
		t.Fatalf("the lapsed lease was not logged once with its key: %s", l)
	}
	mustBeFree(t, locker, "item:9")
}
