package adaptertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
)

// blocking is a handler that signals each entry on entered and returns once
// release is closed, answering 202; a request context that ends first
// answers 500.
type blocking struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newBlocking(t *testing.T, n int) *blocking {
	b := &blocking{entered: make(chan struct{}, n), release: make(chan struct{})}
	t.Cleanup(b.done)
	return b
}

func (b *blocking) done() { b.once.Do(func() { close(b.release) }) }

func (b *blocking) handler(w http.ResponseWriter, r *http.Request) {
	b.entered <- struct{}{}
	select {
	case <-b.release:
		w.WriteHeader(http.StatusAccepted)
	case <-r.Context().Done():
		http.Error(w, "context ended: "+errString(context.Cause(r.Context())), http.StatusInternalServerError)
	}
}

// start serves n requests in the background and waits until all n are in
// their handler; it returns their answers' channel.
func (b *blocking) start(t *testing.T, srv http.Handler, n int) <-chan *httptest.ResponseRecorder {
	t.Helper()
	done := make(chan *httptest.ResponseRecorder, n)
	for range n {
		go func() { done <- do(srv, post("/items/1", "")) }()
	}
	timeout := time.After(10 * time.Second)
	for i := range n {
		select {
		case <-b.entered:
		case rec := <-done:
			t.Fatalf("request %d answered %d before all %d were in: %s", i+1, rec.Code, n, rec.Body)
		case <-timeout:
			t.Fatalf("only %d of %d requests entered their handler together", i, n)
		}
	}
	return done
}

// finish releases the blocked handlers and checks that n of them answered 202.
func (b *blocking) finish(t *testing.T, done <-chan *httptest.ResponseRecorder, n int) {
	t.Helper()
	b.done()
	for range n {
		if rec := <-done; rec.Code != http.StatusAccepted {
			t.Errorf("held request: status %d: %s", rec.Code, rec.Body)
		}
	}
}

// testSharedReaders: shared requests run together; an exclusive one
// waiting for them ends 423 (reason timeout), and a shared one waiting for
// an exclusive holder ends with the route's timeout status, as an
// exclusive wait does.
func (s *suite) testSharedReaders(t *testing.T) {
	locker, _ := newMemLocker(t)
	b := newBlocking(t, 3)
	reader := s.serve(t, locker, "item:<id>", b.handler, middleware.WithShared())
	var wrote atomic.Bool
	writer := s.serve(t, locker, "item:<id>", func(http.ResponseWriter, *http.Request) { wrote.Store(true) },
		middleware.WithWait(30*time.Millisecond))
	done := b.start(t, reader, 3)
	s.expectRejection(t, do(writer, post("/items/1", "")), http.StatusLocked, middleware.ReasonTimeout, true)
	if wrote.Load() {
		t.Fatal("an exclusive handler ran alongside shared ones")
	}
	b.finish(t, done, 3)
	if rec := do(writer, post("/items/1", "")); rec.Code != http.StatusOK || !wrote.Load() {
		t.Fatalf("exclusive request after the readers: status %d, ran %v", rec.Code, wrote.Load())
	}

	release := hold(t, locker, "item:1")
	late := s.serve(t, locker, "item:<id>", func(http.ResponseWriter, *http.Request) {
		t.Error("a shared handler ran while the key was held exclusively")
	},
		middleware.WithShared(), middleware.WithWait(30*time.Millisecond), middleware.WithTimeoutStatus(http.StatusConflict))
	s.expectRejection(t, do(late, post("/items/1", "")), http.StatusConflict, middleware.ReasonTimeout, true)
	release()
}

// testLimitAnswers429: at most Limit requests run; the next one's wait ends
// 429 with Retry-After and reason limit, or the route's own status; a place
// freed lets the next request in.
func (s *suite) testLimitAnswers429(t *testing.T) {
	locker, _ := newMemLocker(t)
	b := newBlocking(t, 2)
	limited := s.serve(t, locker, "item:<id>", b.handler, middleware.WithLimit(2))
	var ran atomic.Int32
	over := s.serve(t, locker, "item:<id>", func(http.ResponseWriter, *http.Request) { ran.Add(1) },
		middleware.WithLimit(2), middleware.WithWait(30*time.Millisecond))
	own := s.serve(t, locker, "item:<id>", func(http.ResponseWriter, *http.Request) { ran.Add(1) },
		middleware.WithLimit(2), middleware.WithWait(0), middleware.WithTimeoutStatus(http.StatusServiceUnavailable))
	done := b.start(t, limited, 2)
	s.expectRejection(t, do(over, post("/items/1", "")), http.StatusTooManyRequests, middleware.ReasonLimit, true)
	s.expectRejection(t, do(own, post("/items/1", "")), http.StatusServiceUnavailable, middleware.ReasonLimit, true)
	if ran.Load() != 0 {
		t.Fatal("a handler ran over the limit")
	}
	// Another key has its own places.
	if rec := do(over, post("/items/2", "")); rec.Code != http.StatusOK {
		t.Fatalf("another key: status %d: %s", rec.Code, rec.Body)
	}
	b.finish(t, done, 2)
	if rec := do(over, post("/items/1", "")); rec.Code != http.StatusOK {
		t.Fatalf("after the holders left: status %d: %s", rec.Code, rec.Body)
	}
}

// testLimitConcurrent: many concurrent requests with a long wait all run,
// never more than the limit at once.
func (s *suite) testLimitConcurrent(t *testing.T) {
	const limit, requests = 3, 30
	store := memstore.New()
	lockers := []*reqlock.Locker{reqlock.MustNew(store), reqlock.MustNew(store)} // two instances
	var inside, maxInside, count atomic.Int32
	var srvs []http.Handler
	for _, l := range lockers {
		srvs = append(srvs, s.serve(t, l, "item:<id>", func(w http.ResponseWriter, r *http.Request) {
			n := inside.Add(1)
			for m := maxInside.Load(); n > m && !maxInside.CompareAndSwap(m, n); m = maxInside.Load() {
			}
			time.Sleep(time.Millisecond) // the work
			count.Add(1)
			inside.Add(-1)
		}, middleware.WithLimit(limit), middleware.WithWait(time.Minute)))
	}
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() {
			if rec := do(srvs[i%2], post("/items/1", "")); rec.Code != http.StatusOK {
				t.Errorf("status %d: %s", rec.Code, rec.Body)
			}
		})
	}
	wg.Wait()
	if maxInside.Load() > limit || count.Load() != requests {
		t.Fatalf("max handlers inside at once = %d (limit %d), ran %d (want %d)", maxInside.Load(), limit, count.Load(), requests)
	}
}

// testLimitWatchdogKeeps: the watchdog keeps a limited request's place past
// its TTL: the store refuses another holder all along.
func (s *suite) testLimitWatchdogKeeps(t *testing.T) {
	locker, store := newMemLocker(t)
	b := newBlocking(t, 1)
	long := s.serve(t, locker, "item:<id>", b.handler, middleware.WithLimit(1), middleware.WithWatchdog(), middleware.WithTTL(watchdogTTL))
	other := s.serve(t, locker, "item:<id>", func(http.ResponseWriter, *http.Request) {}, middleware.WithLimit(1), middleware.WithWait(0))
	done := b.start(t, long, 1)
	end := time.Now().Add(4 * watchdogTTL)
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(end) {
		<-tick.C
		if rec := do(other, post("/items/1", "")); rec.Code != http.StatusTooManyRequests {
			t.Fatalf("a request during the long handler got %d, want 429", rec.Code)
		}
		g, err := store.AcquireShared(context.Background(), "reqlock:item:1", "probe", 1, time.Minute)
		if err != nil || g.OK {
			t.Fatalf("the store let another token take the place: %+v %v", g, err)
		}
	}
	b.finish(t, done, 1)
	if rec := do(other, post("/items/1", "")); rec.Code != http.StatusOK {
		t.Fatalf("after the long handler: status %d", rec.Code)
	}
}

// testLimitHoldAtLeast: hold-at-least keeps a finished request's place for
// the window, so that the next request within it is refused.
func (s *suite) testLimitHoldAtLeast(t *testing.T) {
	locker, _ := newMemLocker(t)
	const window = 400 * time.Millisecond
	srv := s.serve(t, locker, "item:<id>", func(http.ResponseWriter, *http.Request) {},
		middleware.WithLimit(1), middleware.WithWait(0), middleware.WithHoldAtLeast(window))
	start := time.Now()
	if rec := do(srv, post("/items/1", "")); rec.Code != http.StatusOK {
		t.Fatalf("first: status %d", rec.Code)
	}
	rec := do(srv, post("/items/1", ""))
	if time.Since(start) < window {
		s.expectRejection(t, rec, http.StatusTooManyRequests, middleware.ReasonLimit, true)
	}
	deadline := time.Now().Add(10 * time.Second)
	for do(srv, post("/items/1", "")).Code != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("the place was not freed after the window")
		}
		time.Sleep(20 * time.Millisecond) // poll
	}
	if d := time.Since(start); d < window {
		t.Fatalf("the place was free after %v, before the %v window", d, window)
	}
}

// failingShared is a memstore whose shared calls fail as a store outage
// does.
type failingShared struct{ *memstore.Store }

var errSharedDown = errors.New("shared store down")

func (failingShared) AcquireShared(context.Context, string, string, int, time.Duration) (stores.Grant, error) {
	return stores.Grant{}, errSharedDown
}

// testLimitFailOpen: a store failure on a fail-open limited route runs the
// handler without the limit, warned; fail-closed answers 503 with reason
// store_error, not 429.
func (s *suite) testLimitFailOpen(t *testing.T) {
	var logs syncBuffer
	locker := reqlock.MustNew(failingShared{memstore.New()}, reqlock.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	var ranUnlocked atomic.Bool
	open := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) {
		_, locked := reqlock.FromContext(r.Context())
		ranUnlocked.Store(!locked)
	}, middleware.WithLimit(2), middleware.WithFailOpen())
	if rec := do(open, post("/items/1", "")); rec.Code != http.StatusOK || !ranUnlocked.Load() {
		t.Fatalf("fail-open: status %d, ran unlocked %v", rec.Code, ranUnlocked.Load())
	}
	if !strings.Contains(logs.String(), "WITHOUT the lock") {
		t.Fatalf("fail-open run was not logged: %q", logs.String())
	}
	closed := s.serve(t, locker, "item:<id>", func(http.ResponseWriter, *http.Request) { t.Error("handler ran on a failed store") },
		middleware.WithLimit(2))
	s.expectRejection(t, do(closed, post("/items/1", "")), http.StatusServiceUnavailable, middleware.ReasonStoreError, true)
}

// exclusiveOnly is a real store seen through the plain stores.Store
// interface alone: a store without shared locks.
type exclusiveOnly struct{ stores.Store }

// testSharedStartUp: a shared or limited route on a store without the
// capability, and invalid combinations, fail at start-up naming the route.
func (s *suite) testSharedStartUp(t *testing.T) {
	for _, store := range []stores.Store{exclusiveOnly{memstore.New()}} {
		locker := reqlock.MustNew(store)
		for mode, opt := range map[string]middleware.Option{"shared": middleware.WithShared(), "limited": middleware.WithLimit(3)} {
			_, err := s.a.Serve(locker, "item:<id>", []middleware.Option{opt, middleware.WithName("reports")}, func(http.ResponseWriter, *http.Request) {})
			want := fmt.Sprintf(`reqlock/middleware: invalid configuration: route "reports": a %s lock: `+
				`reqlock: invalid argument: shared and limited locks need a store that implements stores.SharedStore; %T does not`, mode, store)
			if err == nil || !errors.Is(err, middleware.ErrInvalidConfig) || !errors.Is(err, reqlock.ErrInvalid) || err.Error() != want {
				t.Errorf("a %s route on %T: %v\nwant an error wrapping ErrInvalidConfig and reqlock.ErrInvalid: %s", mode, store, err, want)
			}
		}
	}
	mem, _ := newMemLocker(t)
	for _, tc := range []struct {
		opts []middleware.Option
		want string
	}{
		{[]middleware.Option{middleware.WithShared(), middleware.WithLimit(2)}, `route "r": both Shared and a Limit are set`},
		{[]middleware.Option{middleware.WithLimit(0)}, `route "r": WithLimit(0): a limit lets at least 1 request in`},
		{[]middleware.Option{middleware.WithShared(), middleware.WithKeys("b")}, `route "r": a shared lock takes one key; this route has 2 key templates`},
		{[]middleware.Option{middleware.WithLimit(2), middleware.WithKeys("b")}, `route "r": a limited lock takes one key; this route has 2 key templates`},
		{[]middleware.Option{middleware.WithShared()}, `route "r": key template "<json:items[*]>" may yield several keys, and a shared lock takes one`},
	} {
		key := "item:<id>"
		if strings.Contains(tc.want, "[*]") {
			key = "<json:items[*]>"
		}
		_, err := s.a.Serve(mem, key, append(tc.opts, middleware.WithName("r")), func(http.ResponseWriter, *http.Request) {})
		if err == nil || !errors.Is(err, middleware.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want one that says %q", err, tc.want)
		}
	}
}
