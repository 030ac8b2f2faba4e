package bench_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/labstack/echo/v4"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/echolock"
	"github.com/reqlock/reqlock/ginlock"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
)

// idemSpec is the lock of the idempotent deduct route.
const idemSpec = "@lock key=sku:<id> idempotency=required"

// idemAdapters build a router serving POST /skus/{id}/deduct behind
// idemSpec, answering 200 "ok".
var idemAdapters = []adapter{
	{"nethttp", func(locker *reqlock.Locker) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("POST /skus/{id}/deduct", middleware.Must(middleware.NewFromSpec(locker, idemSpec)).HandlerFunc(deducted))
		return mux
	}},
	{"gin", func(locker *reqlock.Locker) http.Handler {
		r := gin.New()
		r.POST("/skus/:id/deduct", ginlock.Must(ginlock.FromSpec(locker, idemSpec)), gin.WrapF(deducted))
		return r
	}},
	{"echo", func(locker *reqlock.Locker) http.Handler {
		e := echo.New()
		e.POST("/skus/:id/deduct", echo.WrapHandler(http.HandlerFunc(deducted)), echolock.Must(echolock.FromSpec(locker, idemSpec)))
		return e
	}},
}

func deducted(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }

// idemRequest is a deduct of sku with the idempotency key key.
func idemRequest(sku int, key string) *http.Request {
	req := httptest.NewRequest(http.MethodPost, "/skus/"+strconv.Itoa(sku)+"/deduct", strings.NewReader(`{"qty":1}`))
	req.Header.Set("Idempotency-Key", key)
	return req
}

// TestRoundTripsPerIdempotentRequest pins the cost of idempotency on Redis:
// a request with a new key costs 4 round trips (claim the key, acquire,
// then record the answer and release the lock at the same time: see
// TestIdempotentFinishOverlapsRelease), so one more sequential round trip
// than a locked request's 2; a replay costs 1 (the claim, which finds the
// record) and runs neither the lock nor the handler.
func TestRoundTripsPerIdempotentRequest(t *testing.T) {
	for _, a := range idemAdapters {
		t.Run(a.name, func(t *testing.T) {
			locker, counter := redisLocker(t)
			h := a.build(locker)
			const requests = 30
			serve := func(sku int, key, want string) {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, idemRequest(sku, key))
				if rec.Code != http.StatusOK || rec.Body.String() != "ok" || rec.Header().Get(middleware.ReplayedHeader) != want {
					t.Fatalf("status %d, replayed %q (want %q): %s", rec.Code, rec.Header().Get(middleware.ReplayedHeader), want, rec.Body)
				}
			}
			before := counter.n.Load()
			for i := range requests {
				serve(i, "k-"+strconv.Itoa(i), "")
			}
			if got := counter.n.Load() - before; got != 4*requests {
				t.Fatalf("%d Redis round trips for %d requests with new keys, want exactly 4 per request", got, requests)
			}
			before = counter.n.Load()
			for i := range requests {
				serve(i, "k-"+strconv.Itoa(i), "true")
			}
			if got := counter.n.Load() - before; got != requests {
				t.Fatalf("%d Redis round trips for %d replays, want exactly 1 per replay", got, requests)
			}
		})
	}
}

// TestIdempotentFinishOverlapsRelease: after the handler, the record's
// FinishRecord and the route lock's Release are in flight at the same
// time, so that a new key costs one sequential round trip more than a
// locked request, not two. The store holds each of the two calls until the
// other has arrived (or 5s pass, which fails the test): calls made one
// after the other would never meet.
func TestIdempotentFinishOverlapsRelease(t *testing.T) {
	for _, a := range idemAdapters {
		t.Run(a.name, func(t *testing.T) {
			store := &meetingStore{Store: memstore.New()}
			h := a.build(reqlock.MustNew(store))
			for i := range 5 {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, idemRequest(i, "k-"+strconv.Itoa(i)))
				if rec.Code != http.StatusOK {
					t.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
			}
			store.mu.Lock()
			defer store.mu.Unlock()
			if store.met != 5 || store.missed != 0 {
				t.Fatalf("FinishRecord and the lock's Release met %d times and missed each other %d times in 5 requests, want 5 and 0",
					store.met, store.missed)
			}
		})
	}
}

// meetingStore is memstore whose FinishRecord and Release of a lock key
// (not a record key) each wait, up to 5s, for the other to arrive.
type meetingStore struct {
	*memstore.Store
	mu      sync.Mutex
	arrived chan struct{} // the first of a pair waits on it; nil when none waits
	met     int
	missed  int
}

var _ stores.RecordStore = (*meetingStore)(nil)

// meet waits for the other call of a pair, or 5s.
func (s *meetingStore) meet() {
	s.mu.Lock()
	if s.arrived != nil {
		close(s.arrived)
		s.arrived = nil
		s.met++
		s.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	s.arrived = ch
	s.mu.Unlock()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		s.mu.Lock()
		if s.arrived == ch {
			s.arrived = nil
			s.missed++
		}
		s.mu.Unlock()
	}
}

func (s *meetingStore) FinishRecord(ctx context.Context, key, token string, rec stores.Record, retention time.Duration) error {
	s.meet()
	return s.Store.FinishRecord(ctx, key, token, rec, retention)
}

func (s *meetingStore) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	if !strings.Contains(keys[0], reqlock.RecordKeyPrefix) {
		s.meet()
	}
	return s.Store.Release(ctx, keys, token, keep)
}

// BenchmarkIdempotentRequest measures a request to the idempotent deduct
// route on the in-memory store, through each adapter: with a new key each
// time (claim, lock, handler, record and release), and a replay of a
// recorded key.
func BenchmarkIdempotentRequest(b *testing.B) {
	for _, a := range idemAdapters {
		b.Run(a.name+"/new-key", func(b *testing.B) {
			h := a.build(reqlock.MustNew(memstore.New()))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, idemRequest(i%1024, "k-"+strconv.Itoa(i)))
				if rec.Code != http.StatusOK {
					b.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
				i++
			}
		})
		b.Run(a.name+"/replay", func(b *testing.B) {
			h := a.build(reqlock.MustNew(memstore.New()))
			h.ServeHTTP(httptest.NewRecorder(), idemRequest(1, "k"))
			b.ReportAllocs()
			for b.Loop() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, idemRequest(1, "k"))
				if rec.Header().Get(middleware.ReplayedHeader) != "true" {
					b.Fatalf("status %d, not a replay: %s", rec.Code, rec.Body)
				}
			}
		})
	}
}

// idemAllocs pins the allocations of an idempotent request beyond those of
// a locked one on the same adapter, on the in-memory store: with a new key
// (the claim, the recording of the answer and its record) and a replay
// (the claim that finds the record, and the recorded answer written back;
// no lock). Measured when the pin was set, plus a margin of 2.
var idemAllocs = map[bool]map[string][2]float64{ // race build -> adapter -> {new key, replay}
	false: {"nethttp": {62, 19}, "gin": {59, 17}, "echo": {58, 19}},
	true:  {"nethttp": {63, 19}, "gin": {60, 17}, "echo": {59, 19}},
}

// TestAllocsPerIdempotentRequest pins what idempotency adds to a locked
// request's allocations (see idemAllocs), so that a change that allocates
// more on either path fails here. The requests are built beforehand.
func TestAllocsPerIdempotentRequest(t *testing.T) {
	for i, a := range idemAdapters {
		t.Run(a.name, func(t *testing.T) {
			locked := allocsPerRequest(t, adapters[i].build(reqlock.MustNew(memstore.New())))
			h := a.build(reqlock.MustNew(memstore.New()))
			measure := func(req func(n int) *http.Request, replayed string) float64 {
				const runs = 200
				reqs := make([]*http.Request, runs+1) // AllocsPerRun runs once more to warm up
				for n := range reqs {
					reqs[n] = req(n)
				}
				n := 0
				return testing.AllocsPerRun(runs, func() {
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, reqs[n])
					if rec.Code != http.StatusOK || rec.Header().Get(middleware.ReplayedHeader) != replayed {
						t.Fatalf("status %d, replayed %q (want %q): %s", rec.Code, rec.Header().Get(middleware.ReplayedHeader), replayed, rec.Body)
					}
					n++
				})
			}
			newKey := measure(func(n int) *http.Request { return idemRequest(n%64, "new-"+strconv.Itoa(n)) }, "")
			h.ServeHTTP(httptest.NewRecorder(), idemRequest(1, "recorded"))
			replay := measure(func(int) *http.Request { return idemRequest(1, "recorded") }, "true")
			want := idemAllocs[raceEnabled][a.name]
			t.Logf("locked %v, idempotent with a new key %v (+%v), replay %v (+%v)", locked, newKey, newKey-locked, replay, replay-locked)
			if newKey-locked > want[0] || replay-locked > want[1] {
				t.Fatalf("idempotency adds %v allocations with a new key and %v on a replay to a locked request's %v, want at most %v and %v (race build: %v)",
					newKey-locked, replay-locked, locked, want[0], want[1], raceEnabled)
			}
		})
	}
}
