package reqlock_test

// Store outages on a private Redis that the tests freeze (SIGSTOP), kill and
// restart: failed releases retried in the background, a store failure
// shared with the local queue, the breaker, one log line per state change.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// outageRedis is a private Redis for one test, the Store on it (through a
// spy that counts the calls), and a client of its own to look at keys
// behind the Locker's back.
type outageRedis struct {
	server *testservers.Server
	spy    *spyStore
	client *redis.Client // the Store's
	probe  *redis.Client
}

// newOutageRedis starts the server; poolSize bounds the Store's client's
// connections (0: go-redis's default).
func newOutageRedis(t *testing.T, poolSize int) *outageRedis {
	t.Helper()
	server := testservers.RedisNodes(t, 1)[0]
	client := redis.NewClient(&redis.Options{Addr: server.Addr(), DialTimeout: 250 * time.Millisecond,
		ContextTimeoutEnabled: true, PoolSize: poolSize})
	store, err := redisstore.New(client)
	if err != nil {
		t.Fatal(err)
	}
	probe := redis.NewClient(&redis.Options{Addr: server.Addr(), DialTimeout: 250 * time.Millisecond, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() {
		_ = store.Close()
		_ = client.Close()
		_ = probe.Close()
	})
	return &outageRedis{server: server, spy: newSpyStore(store), client: client, probe: probe}
}

// busyPool takes the Store's one pooled connection with an Obtain that the
// frozen server does not answer (it ends within 2s).
func (r *outageRedis) busyPool(t *testing.T, l *reqlock.Locker) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = l.Obtain(context.Background(), "busy-pool", time.Second, 2*time.Second)
	}()
	t.Cleanup(func() { <-done })
	eventually(t, "the pool's connection busy", func() bool {
		s := r.client.PoolStats()
		return s.TotalConns == 1 && s.IdleConns == 0
	})
}

// pause freezes the server until the test ends or resume.
func (r *outageRedis) pause(t *testing.T) {
	t.Helper()
	r.server.Pause()
	t.Cleanup(r.server.Resume) // a stopped process would not stop
}

// exists reports whether the server holds key, or an error.
func (r *outageRedis) exists(key string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	n, err := r.probe.Exists(ctx, key).Result()
	return n > 0, err
}

// awaitFree polls until the server holds key no more, failing after limit;
// it returns how long that took.
func (r *outageRedis) awaitFree(t *testing.T, key string, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		held, err := r.exists(key)
		if err == nil && !held {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("%s still held (or unreadable: %v) %v after the store was back", key, err, limit)
		}
		time.Sleep(10 * time.Millisecond) // a poll, not a wait for an event
	}
}

// outageMetrics counts the OutageMetrics events.
type outageMetrics struct {
	nopMetrics
	mu       sync.Mutex
	downs    int
	backs    int
	rejected int64 // as StoreBack reported
	refused  atomic.Int64
	pending  map[reqlock.PendingEvent]int
}

type nopMetrics struct{}

func (nopMetrics) Obtained(string, reqlock.Outcome, time.Duration) {}
func (nopMetrics) Held(string, time.Duration)                      {}
func (nopMetrics) Lost(string)                                     {}
func (nopMetrics) HandedOff(string)                                {}

func (m *outageMetrics) StoreDown() { m.mu.Lock(); m.downs++; m.mu.Unlock() }
func (m *outageMetrics) StoreBack(_ time.Duration, rejected int64) {
	m.mu.Lock()
	m.backs++
	m.rejected = rejected
	m.mu.Unlock()
}
func (m *outageMetrics) RejectedStoreDown(string) { m.refused.Add(1) }
func (m *outageMetrics) PendingRelease(e reqlock.PendingEvent) {
	m.mu.Lock()
	if m.pending == nil {
		m.pending = map[reqlock.PendingEvent]int{}
	}
	m.pending[e]++
	m.mu.Unlock()
}

func (m *outageMetrics) events(e reqlock.PendingEvent) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pending[e]
}

const outagePrefix = "reqlock:"

// A release that fails while Redis is frozen is retried: once Redis answers
// again the key is free within about a second, not at its TTL (30s). As
// under load, the release never leaves the client: the one connection of
// its pool is busy with a call the frozen Redis does not answer (a release
// written to the socket would run when Redis resumes).
func TestFailedReleaseIsRetried(t *testing.T) {
	for _, holdAtLeast := range []time.Duration{0, 300 * time.Millisecond} {
		t.Run(fmt.Sprintf("holdAtLeast=%v", holdAtLeast), func(t *testing.T) {
			r := newOutageRedis(t, 1)
			m := new(outageMetrics)
			l := reqlock.MustNew(r.spy, reqlock.WithReleaseTimeout(300*time.Millisecond), reqlock.WithMetrics(m),
				reqlock.WithBreaker(0, 0))
			lock, err := l.Obtain(context.Background(), "sku:1", 30*time.Second, 0)
			if err != nil {
				t.Fatal(err)
			}
			lock.HoldAtLeast(holdAtLeast)
			r.pause(t)
			r.busyPool(t, l)
			if err := lock.Release(context.Background()); !errors.Is(err, reqlock.ErrStore) {
				t.Fatalf("Release on a frozen Redis: %v, want ErrStore", err)
			}
			time.Sleep(300 * time.Millisecond) // the outage goes on: the retries fail
			r.server.Resume()
			took := r.awaitFree(t, outagePrefix+"sku:1", 1500*time.Millisecond)
			t.Logf("free %v after Redis was resumed", took.Round(time.Millisecond))
			eventually(t, "the pending release settled", func() bool {
				return m.events(reqlock.PendingReleased)+m.events(reqlock.PendingNotHeld) == 1
			})
			if q := m.events(reqlock.PendingQueued); q != 1 {
				t.Errorf("%d releases queued, want 1", q)
			}
			if err := l.Close(context.Background()); err != nil {
				t.Errorf("Close with nothing pending: %v", err)
			}
		})
	}
}

// Close tries the pending releases once more: it frees the key when Redis
// is back within its deadline, and reports the release it could not make.
func TestCloseTriesPendingReleases(t *testing.T) {
	t.Run("back", func(t *testing.T) {
		r := newOutageRedis(t, 0)
		l := reqlock.MustNew(r.spy, reqlock.WithReleaseTimeout(200*time.Millisecond))
		lock := mustObtain(t, context.Background(), l, "sku:2")
		r.pause(t)
		if err := lock.Release(context.Background()); !errors.Is(err, reqlock.ErrStore) {
			t.Fatalf("Release on a frozen Redis: %v, want ErrStore", err)
		}
		go func() {
			time.Sleep(100 * time.Millisecond) // the outage lasts into Close
			r.server.Resume()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if held, err := r.exists(outagePrefix + "sku:2"); err != nil || held {
			t.Fatalf("after Close the key is held: %v, %v", held, err)
		}
		if err := l.Close(ctx); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})
	t.Run("still down", func(t *testing.T) {
		r := newOutageRedis(t, 0)
		m := new(outageMetrics)
		l := reqlock.MustNew(r.spy, reqlock.WithReleaseTimeout(200*time.Millisecond), reqlock.WithMetrics(m))
		lock := mustObtain(t, context.Background(), l, "sku:3")
		r.pause(t)
		_ = lock.Release(context.Background())
		ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := l.Close(ctx)
		if !errors.Is(err, reqlock.ErrStore) {
			t.Fatalf("Close with Redis frozen: %v, want ErrStore naming the release", err)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("Close took %v, past its deadline of 400ms", took)
		}
		if n := m.events(reqlock.PendingUnreleased); n != 1 {
			t.Errorf("%d releases reported unreleased, want 1 (%v)", n, err)
		}
	})
}

// The pending set is bounded: the oldest is dropped to make room.
func TestPendingReleasesBounded(t *testing.T) {
	r := newOutageRedis(t, 0)
	m := new(outageMetrics)
	l := reqlock.MustNew(r.spy, reqlock.WithReleaseTimeout(100*time.Millisecond), reqlock.WithMetrics(m),
		reqlock.WithPendingReleases(2))
	var locks []*reqlock.Lock
	for i := range 3 {
		locks = append(locks, mustObtain(t, context.Background(), l, "bounded:"+strconv.Itoa(i)))
	}
	r.pause(t)
	for _, lock := range locks {
		_ = lock.Release(context.Background())
	}
	if q, d := m.events(reqlock.PendingQueued), m.events(reqlock.PendingDropped); q != 3 || d != 1 {
		t.Fatalf("queued %d, dropped %d; want 3 and 1", q, d)
	}
	r.server.Resume()
	eventually(t, "the two pending releases settled", func() bool {
		return m.events(reqlock.PendingReleased)+m.events(reqlock.PendingNotHeld) == 2
	})
	for _, k := range []string{"bounded:1", "bounded:2"} {
		if held, err := r.exists(outagePrefix + k); held || err != nil {
			t.Errorf("%s held after its release settled: %v, %v", k, held, err)
		}
	}
}

// Waiters queued behind a request that meets a store failure on their key
// answer it at once: a store error (503), never ErrHeld (423), without each
// calling the dead store in turn.
func TestWaitersShareStoreFailure(t *testing.T) {
	for _, c := range []struct {
		fault      string
		n, atLeast int
	}{{"killed", 60, 57}, {"frozen", 20, 18}} {
		t.Run(c.fault, func(t *testing.T) {
			r := newOutageRedis(t, 0)
			// The breaker off: the queue alone shares the failure.
			l := reqlock.MustNew(r.spy, reqlock.WithBreaker(0, 0))
			mustRelease(t, mustObtain(t, context.Background(), l, "warm")) // a pooled connection
			if c.fault == "killed" {
				r.server.Kill()
			} else {
				r.pause(t)
			}
			before := r.spy.acquires.Load()
			const wait = time.Second
			var storeErrs, held atomic.Int32
			var slowest atomic.Int64
			start := time.Now()
			var wg sync.WaitGroup
			for range c.n {
				wg.Go(func() {
					_, err := l.Obtain(context.Background(), "hot", 10*time.Second, wait)
					took := time.Since(start)
					for {
						s := slowest.Load()
						if int64(took) <= s || slowest.CompareAndSwap(s, int64(took)) {
							break
						}
					}
					switch {
					case errors.Is(err, reqlock.ErrHeld):
						held.Add(1)
						t.Errorf("a request answered ErrHeld while Redis was %s: %v", c.fault, err)
					case errors.Is(err, reqlock.ErrStore):
						storeErrs.Add(1)
						if o := reqlock.OutcomeOf(context.Background(), err); o != reqlock.OutcomeStoreError {
							t.Errorf("outcome %q of %v", o, err)
						}
					case err == nil:
						t.Errorf("granted while Redis was %s", c.fault)
					default:
						t.Logf("other error: %v", err)
					}
				})
			}
			wg.Wait()
			calls := r.spy.acquires.Load() - before
			t.Logf("%d × ErrStore, %d × ErrHeld of %d; %d store calls; slowest %v",
				storeErrs.Load(), held.Load(), c.n, calls, time.Duration(slowest.Load()).Round(time.Millisecond))
			if int(storeErrs.Load()) < c.atLeast {
				t.Errorf("%d requests answered ErrStore, want at least %d", storeErrs.Load(), c.atLeast)
			}
			if s := time.Duration(slowest.Load()); s > wait+200*time.Millisecond+loadSlack {
				t.Errorf("the slowest answered after %v, above the wait %v + 200ms", s, wait)
			}
			if c.fault == "killed" && calls > int32(c.n/4) {
				t.Errorf("%d store calls for %d requests: the waiters called the dead store in turn", calls, c.n)
			}
		})
	}
}

// loadSlack is what a loaded machine under -race may add to a bound.
const loadSlack = 300 * time.Millisecond

// The breaker: after a short run of failures, requests answer ErrStoreDown
// without a store call; once Redis is back, a probe closes the breaker
// within about a second. Busy keys never open it.
func TestBreakerFailsFastAndHeals(t *testing.T) {
	r := newOutageRedis(t, 0)
	m := new(outageMetrics)
	l := reqlock.MustNew(r.spy, reqlock.WithMetrics(m))

	// A busy key is never a failure.
	held := mustObtain(t, context.Background(), l, "busy")
	other := reqlock.MustNew(r.spy)
	for range 20 {
		if _, err := other.Obtain(context.Background(), "busy", time.Second, 0); !errors.Is(err, reqlock.ErrHeld) {
			t.Fatalf("try-once on a held key: %v", err)
		}
	}
	mustRelease(t, held)
	if h := l.StoreHealth(); h.Down {
		t.Fatal("a busy key opened the breaker")
	}

	holder, err := l.Obtain(context.Background(), "held", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	r.server.Kill()
	var tripped bool
	for i := range 20 {
		_, err := l.Obtain(context.Background(), "k"+strconv.Itoa(i), time.Second, 0)
		if !errors.Is(err, reqlock.ErrStore) {
			t.Fatalf("Obtain on a dead Redis: %v, want ErrStore", err)
		}
		if errors.Is(err, reqlock.ErrStoreDown) {
			tripped = true
			t.Logf("tripped after %d failures", i)
			break
		}
	}
	if !tripped || !l.StoreHealth().Down {
		t.Fatalf("20 store failures in a row did not open the breaker: %+v", l.StoreHealth())
	}
	calls, undos := r.spy.acquires.Load(), r.spy.releases.Load()
	firstProbe := l.StoreHealth().NextProbe
	start := time.Now()
	const refused = 200
	for i := range refused {
		_, err := l.Obtain(context.Background(), "d"+strconv.Itoa(i), time.Second, time.Second)
		var down *reqlock.StoreDownError
		if !errors.As(err, &down) || !errors.Is(err, reqlock.ErrStore) {
			t.Fatalf("Obtain while the breaker is open: %v, want a *StoreDownError matching ErrStore", err)
		}
		if o := reqlock.OutcomeOf(context.Background(), err); o != reqlock.OutcomeStoreError {
			t.Fatalf("outcome %q of ErrStoreDown", o)
		}
	}
	took := time.Since(start)
	// The failed acquires' undos wait in the pending set: it calls a store
	// counted down no sooner than the breaker's probe.
	if n := r.spy.releases.Load() - undos; n != 0 && time.Now().Before(firstProbe) {
		t.Errorf("the pending set made %d release calls while the breaker was open, before its probe", n)
	}
	// A probe per 500ms at most, and no dial per request.
	if extra := r.spy.acquires.Load() - calls; extra > int32(took/(500*time.Millisecond))+1 {
		t.Errorf("%d store calls for %d requests refused in %v: the breaker does not spare the store", extra, refused, took)
	}
	if took > 200*time.Millisecond {
		t.Errorf("%d refused requests took %v: not at once", refused, took)
	}
	// A release while the store is known down goes to the pending set at
	// once, and is made when the store is back.
	// On a loaded machine the next probe may come due first: the release
	// may then be that probe, one store call.
	releases := r.spy.releases.Load()
	nextProbe := l.StoreHealth().NextProbe
	if err := holder.Release(context.Background()); !errors.Is(err, reqlock.ErrStoreDown) {
		t.Fatalf("Release while the breaker is open: %v, want ErrStoreDown", err)
	}
	beforeProbe := time.Now().Before(nextProbe)
	switch n := r.spy.releases.Load() - releases; {
	case beforeProbe && n != 0:
		t.Errorf("Release while the breaker is open, before its next probe, made %d store calls", n)
	case n > 1:
		t.Errorf("Release while the breaker is open made %d store calls, more than a probe", n)
	}

	r.server.Restart()
	back := time.Now()
	var healed time.Duration
	for i := 0; ; i++ {
		if _, err := l.Obtain(context.Background(), "h"+strconv.Itoa(i), time.Second, 0); err == nil {
			healed = time.Since(back)
			break
		} else if !errors.Is(err, reqlock.ErrStore) {
			t.Fatalf("Obtain after the restart: %v", err)
		}
		if time.Since(back) > 1500*time.Millisecond {
			t.Fatalf("not healed %v after Redis restarted: %+v", time.Since(back), l.StoreHealth())
		}
		time.Sleep(20 * time.Millisecond) // requests arrive; a poll
	}
	t.Logf("served again %v after Redis restarted", healed.Round(time.Millisecond))
	free := r.awaitFree(t, outagePrefix+"held", time.Second)
	t.Logf("the release made while the store was down landed %v after the breaker closed", free.Round(time.Millisecond))
	h := l.StoreHealth()
	if h.Down || h.Outages != 1 || h.Rejected < refused {
		t.Errorf("StoreHealth after the outage: %+v, want up, 1 outage, at least %d rejected", h, refused)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.downs != 1 || m.backs != 1 || m.rejected < refused || m.refused.Load() < refused {
		t.Errorf("metrics: %d down, %d back, %d rejected (%d counted): want 1, 1, at least %d",
			m.downs, m.backs, m.rejected, m.refused.Load(), refused)
	}
}

// countingHandler counts the records it receives, at Info and above.
type countingHandler struct {
	mu      sync.Mutex
	records []string
}

func (h *countingHandler) Enabled(_ context.Context, level slog.Level) bool {
	return level >= slog.LevelInfo
}
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.records = append(h.records, r.Level.String()+" "+r.Message)
	h.mu.Unlock()
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

// A 5s outage under steady load, on a fail-closed and a fail-open route,
// logs at most 4 lines from the library (3 here): store down, store back,
// and the fail-open route's warning. A request refused while the store is down is
// told to retry when the next probe is due.
func TestOutageLogsOncePerStateChange(t *testing.T) {
	r := newOutageRedis(t, 0)
	logs := new(countingHandler)
	l := reqlock.MustNew(r.spy, reqlock.WithLogger(slog.New(logs)))
	closed := middleware.Must(middleware.New(l, "sku:<id>", middleware.WithWait(200*time.Millisecond)))
	open := middleware.Must(middleware.New(l, "open:<id>", middleware.WithWait(200*time.Millisecond), middleware.WithFailOpen()))
	mux := http.NewServeMux()
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.Handle("/skus/{id}", closed.Handler(ok))
	mux.Handle("/open/{id}", open.Handler(ok))

	var statuses sync.Map // status -> *atomic.Int32
	var retryAfter atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				path := fmt.Sprintf("/skus/%d", i%3)
				if w == 3 {
					path = fmt.Sprintf("/open/%d", i%3)
				}
				rec := httptest.NewRecorder()
				mux.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, nil))
				c, _ := statuses.LoadOrStore(rec.Code, new(atomic.Int32))
				c.(*atomic.Int32).Add(1)
				if rec.Code == http.StatusServiceUnavailable {
					retryAfter.Store(rec.Header().Get("Retry-After"))
				}
				time.Sleep(5 * time.Millisecond) // steady load, not a spin
			}
		})
	}
	time.Sleep(300 * time.Millisecond) // healthy load first
	r.server.Kill()
	time.Sleep(5 * time.Second) // the outage
	r.server.Restart()
	eventually(t, "the store back", func() bool { return !l.StoreHealth().Down })
	time.Sleep(300 * time.Millisecond) // healthy load after
	close(stop)
	wg.Wait()

	statuses.Range(func(k, v any) bool {
		t.Logf("status %v: %d", k, v.(*atomic.Int32).Load())
		return true
	})
	logs.mu.Lock()
	defer logs.mu.Unlock()
	for _, rec := range logs.records {
		t.Log(rec)
	}
	if n := len(logs.records); n > 3 || n < 2 {
		t.Errorf("the outage logged %d lines, want store down, store back and at most the fail-open warning", n)
	}
	if ra, _ := retryAfter.Load().(string); ra != "1" {
		t.Errorf("Retry-After of a refused request: %q, want 1 (the next probe is due within 500ms)", ra)
	}
}

// A caller that leaves while its store call hangs is no store failure; a
// call that runs out the wait bound with no sign of a held key is one.
func TestBreakerCountsTimeoutsNotCancellations(t *testing.T) {
	r := newOutageRedis(t, 0)
	l := reqlock.MustNew(r.spy, reqlock.WithBreaker(3, time.Minute))
	mustRelease(t, mustObtain(t, context.Background(), l, "warm"))
	r.pause(t)
	for i := range 6 {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(30*time.Millisecond, cancel) // the client leaves mid-call
		_, err := l.Obtain(ctx, "c"+strconv.Itoa(i), time.Second, 5*time.Second)
		cancel()
		if o := reqlock.OutcomeOf(ctx, err); o != reqlock.OutcomeCanceled {
			t.Fatalf("outcome %q of %v, want canceled", o, err)
		}
	}
	if h := l.StoreHealth(); h.Down {
		t.Fatalf("clients that left opened the breaker: %+v", h)
	}
	for i := range 3 {
		_, err := l.Obtain(context.Background(), "t"+strconv.Itoa(i), time.Second, 50*time.Millisecond)
		if !errors.Is(err, reqlock.ErrStore) || errors.Is(err, reqlock.ErrHeld) {
			t.Fatalf("a wait that ended on a frozen Redis: %v, want ErrStore without ErrHeld", err)
		}
	}
	if h := l.StoreHealth(); !h.Down {
		t.Fatalf("3 unanswered store calls did not open the breaker: %+v", h)
	}
	if _, err := l.Obtain(context.Background(), "x", time.Second, time.Second); !errors.Is(err, reqlock.ErrStoreDown) {
		t.Fatalf("Obtain with the breaker open: %v, want ErrStoreDown", err)
	}
}

// pauseAfterRelease freezes the server once armed, right after the next
// Release has reached the real store and returned.
type pauseAfterRelease struct {
	*spyStore
	server *testservers.Server
	armed  atomic.Bool
}

func (s *pauseAfterRelease) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	err := s.spyStore.Release(ctx, keys, token, keep)
	if s.armed.CompareAndSwap(true, false) {
		s.server.Pause()
	}
	return err
}

// Redis freezes just after a local holder's release of the hot key
// succeeded: the key is held by nobody, so the waiters queued behind the
// holder, whose store call the frozen Redis leaves unanswered, answer a
// store error (503), not ErrHeld (423), and the breaker counts the failure.
func TestFreezeAfterReleaseIsAStoreFailure(t *testing.T) {
	r := newOutageRedis(t, 0)
	store := &pauseAfterRelease{spyStore: r.spy, server: r.server}
	l := reqlock.MustNew(store, reqlock.WithHandoff(0, 0), reqlock.WithReleaseTimeout(300*time.Millisecond),
		reqlock.WithBreaker(1, time.Minute))
	holder := mustObtain(t, context.Background(), l, "hot")
	const n = 5
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := l.Obtain(context.Background(), "hot", 10*time.Second, time.Second)
			errs <- err
		}()
	}
	eventually(t, "the waiters queued", func() bool { return reqlock.LocalWaiters(l, outagePrefix+"hot") == n })
	t.Cleanup(r.server.Resume)
	store.armed.Store(true)
	if err := holder.Release(context.Background()); err != nil {
		t.Fatalf("the holder's release (before the freeze): %v", err)
	}
	for range n {
		err := <-errs
		if !errors.Is(err, reqlock.ErrStore) || errors.Is(err, reqlock.ErrHeld) {
			t.Errorf("a waiter on a key held by nobody, Redis frozen: %v (outcome %s), want a store error without ErrHeld",
				err, reqlock.OutcomeOf(context.Background(), err))
		}
	}
	if h := l.StoreHealth(); !h.Down {
		t.Errorf("the unanswered store call was not counted: the breaker (1 failure) is closed: %+v", h)
	}
}

// failKey makes, once armed, every acquire of a set of keys that contains
// key (as stored) run on the real store and then fail, as a lost reply or
// the down shard of a Redis Cluster would: a store failure of that key
// alone.
type failKey struct {
	*spyStore
	key   string
	armed atomic.Bool
}

var errShardDown = errors.New("injected: the shard of this key is down")

func (s *failKey) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	g, err := s.spyStore.Acquire(ctx, keys, token, ttl)
	if s.armed.Load() {
		for _, k := range keys {
			if strings.HasSuffix(k, s.key) {
				if g.OK {
					_ = s.spyStore.Release(context.Background(), keys, token, 0)
				}
				return stores.Grant{}, errShardDown
			}
		}
	}
	return g, err
}

// A store failure met on one key reaches only the waiters of that key: R
// contends for k2 (held by another process); M, for {k1, k2}, holds k1's
// local turn and waits for k2 behind R; W waits for k1 behind M. R meets a
// store failure on k2 and shares it with M, who needs k2; W, whose key k1
// is free and whose store calls succeed, gets k1.
func TestStoreFailureSharedOnlyWithItsKey(t *testing.T) {
	r := newOutageRedis(t, 0)
	store := &failKey{spyStore: r.spy, key: "k2"}
	l := reqlock.MustNew(store, reqlock.WithBreaker(0, 0))
	other := reqlock.MustNew(r.spy) // another process holds k2
	k2 := mustObtain(t, context.Background(), other, "k2")
	defer func() { _ = k2.Release(context.Background()) }()

	var wg sync.WaitGroup
	var errR, errM, errW error
	wg.Go(func() { _, errR = l.Obtain(context.Background(), "k2", 10*time.Second, 5*time.Second) })
	eventually(t, "R contends for k2", func() bool { return reqlock.LocalQueues(l) == 1 && r.spy.acquires.Load() >= 2 })
	wg.Go(func() {
		_, errM = l.ObtainAll(context.Background(), []string{"k1", "k2"}, 10*time.Second, 5*time.Second)
	})
	eventually(t, "M waits for k2 behind R", func() bool { return reqlock.LocalWaiters(l, outagePrefix+"k2") == 1 })
	lockW := make(chan *reqlock.Lock, 1)
	wg.Go(func() {
		lk, err := l.Obtain(context.Background(), "k1", 10*time.Second, 5*time.Second)
		errW = err
		lockW <- lk
	})
	eventually(t, "W waits for k1 behind M", func() bool { return reqlock.LocalWaiters(l, outagePrefix+"k1") == 1 })
	store.armed.Store(true) // k2's shard goes down; k1's is fine
	wg.Wait()
	if !errors.Is(errR, reqlock.ErrStore) || !errors.Is(errM, reqlock.ErrStore) {
		t.Fatalf("R and M should meet k2's store failure: %v / %v", errR, errM)
	}
	if errW != nil {
		t.Errorf("W wants k1 only, which is free and whose store calls succeed, yet it answered %v", errW)
	} else if lk := <-lockW; lk != nil {
		mustRelease(t, lk)
	}
}

// gatedFailStore holds every Acquire until the test opens the gate, then
// fails it with a store error.
type gatedFailStore struct {
	stores.Store
	entered chan struct{} // one per Acquire that waits at the gate
	gate    chan struct{}
}

func (s *gatedFailStore) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	s.entered <- struct{}{}
	<-s.gate
	return stores.Grant{}, errors.New("injected: the store failed")
}

// leftContext is a context whose client has left (Err reports Canceled)
// while its Done channel has not fired yet: the moment a waiter's
// cancellation and its turn arrive together.
type leftContext struct {
	context.Context
	left atomic.Bool
}

func (c *leftContext) Err() error {
	if c.left.Load() {
		return context.Canceled
	}
	return nil
}

// A waiter whose client left as its turn came with the store failure of
// the request ahead answers that it left (canceled: no store error counted,
// no fail-open run for a client that is gone), not the shared failure.
func TestWaiterThatLeftDoesNotAnswerSharedFailure(t *testing.T) {
	store := &gatedFailStore{Store: memstore.New(), entered: make(chan struct{}, 1), gate: make(chan struct{})}
	l := reqlock.MustNew(store, reqlock.WithBreaker(0, 0))
	errR := make(chan error, 1)
	go func() {
		_, err := l.Obtain(context.Background(), "k", time.Minute, 5*time.Second)
		errR <- err
	}()
	<-store.entered // R calls the store
	ctx := &leftContext{Context: context.Background()}
	errW := make(chan error, 1)
	go func() {
		_, err := l.Obtain(ctx, "k", time.Minute, 5*time.Second)
		errW <- err
	}()
	eventually(t, "W waits behind R", func() bool { return reqlock.LocalWaiters(l, outagePrefix+"k") == 1 })
	ctx.left.Store(true)
	close(store.gate)
	if err := <-errR; !errors.Is(err, reqlock.ErrStore) {
		t.Fatalf("R: %v, want the store failure", err)
	}
	err := <-errW
	if o := reqlock.OutcomeOf(ctx, err); o != reqlock.OutcomeCanceled || errors.Is(err, reqlock.ErrStore) {
		t.Errorf("W, whose client left: %v (outcome %q), want canceled without ErrStore", err, o)
	}
}

// A full pending set makes room of releases whose TTL has passed before it
// drops a live one: the goroutine retries only the oldest, so an expired
// release behind it stays until a new one needs its place.
func TestFullPendingSetDropsExpiredFirst(t *testing.T) {
	r := newOutageRedis(t, 0)
	m := new(outageMetrics)
	l := reqlock.MustNew(r.spy, reqlock.WithReleaseTimeout(100*time.Millisecond), reqlock.WithMetrics(m),
		reqlock.WithPendingReleases(2), reqlock.WithBreaker(0, 0))
	// The expiring grant must still be live when its release fails, or
	// the release is not queued: it is obtained last, just before the
	// pause, with a TTL that outlasts the pause and the failed release
	// before it on a loaded machine (300ms did not, now and then).
	const short = time.Second
	// The keys are free: a wait lets a loaded machine's first calls (a
	// fresh connection, the scripts loaded) take longer than a try-once's
	// bound.
	oldest, err := l.Obtain(context.Background(), "live:0", 10*time.Second, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	newest, err := l.Obtain(context.Background(), "live:1", 10*time.Second, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	expiring, err := l.Obtain(context.Background(), "expiring", short, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	obtained := time.Now()
	r.pause(t)
	_ = oldest.Release(context.Background())
	_ = expiring.Release(context.Background())
	time.Sleep(time.Until(obtained.Add(short))) // the expiring grant's TTL passes in the store
	_ = newest.Release(context.Background())
	if q, d, e := m.events(reqlock.PendingQueued), m.events(reqlock.PendingDropped), m.events(reqlock.PendingExpired); q != 3 || d != 0 || e != 1 {
		t.Fatalf("queued %d, dropped %d, expired %d; want 3, 0 (no live release dropped) and 1", q, d, e)
	}
	r.server.Resume()
	eventually(t, "the two live releases settled", func() bool {
		return m.events(reqlock.PendingReleased)+m.events(reqlock.PendingNotHeld) == 2
	})
	for _, k := range []string{"live:0", "live:1"} {
		if held, err := r.exists(outagePrefix + k); held || err != nil {
			t.Errorf("%s held after its release settled: %v, %v", k, held, err)
		}
	}
}

// The breaker's probe is bounded by the longer of the probe period and the
// release timeout, not by its request's wait: on a frozen Redis a probe
// with a 10s wait answers a store error within that bound, and the breaker
// opens again at once, rather than staying half-open, every other request
// refused, for the probe's whole wait.
func TestBreakerProbeIsBounded(t *testing.T) {
	r := newOutageRedis(t, 0)
	const probeAfter, releaseTimeout = 200 * time.Millisecond, 300 * time.Millisecond
	l := reqlock.MustNew(r.spy, reqlock.WithBreaker(1, probeAfter), reqlock.WithReleaseTimeout(releaseTimeout))
	mustRelease(t, mustObtain(t, context.Background(), l, "warm"))
	r.pause(t)
	if _, err := l.Obtain(context.Background(), "trip", time.Second, 100*time.Millisecond); !errors.Is(err, reqlock.ErrStore) {
		t.Fatalf("an unanswered call on a frozen Redis: %v, want a store error", err)
	}
	h := l.StoreHealth()
	if !h.Down {
		t.Fatalf("the breaker did not open: %+v", h)
	}
	eventually(t, "the probe due", func() bool { return !time.Now().Before(l.StoreHealth().NextProbe) })
	start := time.Now()
	_, err := l.Obtain(context.Background(), "probe", time.Second, 10*time.Second)
	took := time.Since(start)
	if !errors.Is(err, reqlock.ErrStore) || errors.Is(err, reqlock.ErrStoreDown) {
		t.Fatalf("the probe on a frozen Redis: %v, want a store error (not ErrStoreDown)", err)
	}
	if o := reqlock.OutcomeOf(context.Background(), err); o != reqlock.OutcomeStoreError {
		t.Errorf("the probe's outcome %q, want store_error", o)
	}
	if limit := releaseTimeout + loadSlack; took > limit {
		t.Errorf("the probe answered after %v, want within its bound %v (+ slack)", took, releaseTimeout)
	}
	if h := l.StoreHealth(); !h.Down || !h.NextProbe.After(start) {
		t.Errorf("after the failed probe the breaker should be open with a new probe time: %+v", h)
	}
}
