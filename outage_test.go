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
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/middleware"
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
	calls := r.spy.acquires.Load()
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
	// A probe per 500ms at most, and no dial per request.
	if extra := r.spy.acquires.Load() - calls; extra > int32(took/(500*time.Millisecond))+1 {
		t.Errorf("%d store calls for %d requests refused in %v: the breaker does not spare the store", extra, refused, took)
	}
	if took > 200*time.Millisecond {
		t.Errorf("%d refused requests took %v: not at once", refused, took)
	}
	// A release while the store is known down goes to the pending set at
	// once, and is made when the store is back.
	releases := r.spy.releases.Load()
	if err := holder.Release(context.Background()); !errors.Is(err, reqlock.ErrStoreDown) {
		t.Fatalf("Release while the breaker is open: %v, want ErrStoreDown", err)
	}
	if n := r.spy.releases.Load() - releases; n != 0 {
		t.Errorf("Release while the breaker is open made %d store calls", n)
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
	closed := middleware.Must(middleware.New(l, "sku:{id}", middleware.WithWait(200*time.Millisecond)))
	open := middleware.Must(middleware.New(l, "open:{id}", middleware.WithWait(200*time.Millisecond), middleware.WithFailOpen()))
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
