package bench_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores/redlockstore"
)

var (
	phaseFlag   = flag.Duration("phase", 500*time.Millisecond, "TestHTTPLoad: length of each phase")
	roundsFlag  = flag.Int("rounds", 1, "TestHTTPLoad: rounds of all phases, alternating which library goes first")
	skusFlag    = flag.Int("skus", 16, "TestHTTPLoad: SKUs each phase's clients deduct from, at random")
	dialsFlag   = flag.Int("dials", 1, "TestHTTPLoad: go-redis DialerRetries of every client (0: go-redis's default, 5 dials 100ms apart)")
	handoffFlag = flag.Bool("handoff", true, "TestHTTPLoad: reqlock passes a grant to the next waiter of the process without a store round trip (false: every grant from the store, as between processes)")
	retryFlag   = flag.Int("retries", -1, "TestHTTPLoad: go-redis MaxRetries of every client (-1: none, as Redlock retries across nodes; 0: go-redis's default, 3)")
)

const (
	initialStock = 1 << 40 // never sold out: every request deducts one
	httpWait     = 2 * time.Second
	httpTTL      = 10 * time.Second
	// statusStale answers a write that the shop refused for its stale fence.
	statusStale = http.StatusConflict
)

// sku is one SKU's stock in the shop, with the largest fence a write to it
// carried.
type sku struct {
	stock, fence int64
}

// shop is the protected resource: stock in an in-process map. A deduction
// reads the stock and writes it back in two steps, as a service does with a
// database, so that two holders at once lose a sale (oversell: sold more
// than the stock went down). Writes may carry a fence: then a write whose
// fence is not above the last accepted one is refused.
type shop struct {
	mu    sync.Mutex
	skus  map[string]*sku
	sold  map[string]int64
	stale atomic.Int64 // writes refused for their fence
}

func newShop() *shop { return &shop{skus: map[string]*sku{}, sold: map[string]int64{}} }

func (s *shop) read(id string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.skus[id]
	if !ok {
		k = &sku{stock: initialStock}
		s.skus[id] = k
	}
	return k.stock
}

// write sets id's stock and counts a sale, unless fenced and fence is not
// above the last fence written (then it reports false).
func (s *shop) write(id string, stock int64, fenced bool, fence int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.skus[id]
	if fenced {
		if fence <= k.fence {
			s.stale.Add(1)
			return false
		}
		k.fence = fence
	}
	k.stock = stock
	s.sold[id]++
	return true
}

// oversold returns the sales the stock does not account for, over the SKUs
// whose id starts with prefix.
func (s *shop) oversold(prefix string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var over int64
	for id, k := range s.skus {
		if strings.HasPrefix(id, prefix) {
			over += s.sold[id] - (initialStock - k.stock)
		}
	}
	return over
}

// deduct sells one unit of id: read, yield (the database round trip), write.
func (s *shop) deduct(w http.ResponseWriter, id string, fenced bool, fence int64) {
	stock := s.read(id)
	runtime.Gosched()
	if !s.write(id, stock-1, fenced, fence) {
		http.Error(w, "stale fence", statusStale)
		return
	}
	_, _ = io.WriteString(w, "ok\n")
}

// redsyncStatus maps redsync's lock error to the status the reqlock
// middleware answers for the same situation: 423 for a key that stayed held
// (redsync answers ErrFailed alone when the wait ended, whatever the last
// attempt met), 503 when nodes failed.
func redsyncStatus(err error) int {
	var redisErr *redsync.RedisError
	switch {
	case errors.As(err, &redisErr):
		return http.StatusServiceUnavailable
	case errors.Is(err, redsync.ErrFailed), errors.As(err, new(*redsync.ErrTaken)), errors.As(err, new(*redsync.ErrNodeTaken)):
		return http.StatusLocked
	}
	return http.StatusServiceUnavailable
}

// service is the HTTP service under test: POST /reqlock/skus/{id}/deduct and
// POST /redsync/skus/{id}/deduct over one shop.
// Unlocks that redsync reported failed (a quorum no longer held the lock,
// as when the killed nodes held part of it) go to unlockFailures.
func service(t *testing.T, locker *reqlock.Locker, rs *redsync.Redsync, s *shop, unlockFailures *atomic.Int64) http.Handler {
	t.Helper()
	guard, err := middleware.New(locker, "sku:<id>", middleware.WithWait(httpWait), middleware.WithTTL(httpTTL))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /reqlock/skus/{id}/deduct", guard.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lock, _ := reqlock.FromContext(r.Context())
		s.deduct(w, r.PathValue("id"), true, lock.Fence())
	}))
	mux.HandleFunc("POST /redsync/skus/{id}/deduct", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		m := rs.NewMutex("redsync:sku:"+id, redsync.WithExpiry(httpTTL))
		ctx, cancel := context.WithTimeout(r.Context(), httpWait)
		defer cancel()
		if err := m.LockContext(ctx); err != nil {
			http.Error(w, err.Error(), redsyncStatus(err))
			return
		}
		s.deduct(w, id, false, 0)
		if ok, err := m.UnlockContext(context.Background()); !ok || err != nil {
			unlockFailures.Add(1)
		}
	})
	return mux
}

// result is one request: when it started, how long it took, its status (0
// for a transport error).
type result struct {
	start   time.Time
	latency time.Duration
	status  int
}

// phaseStats is one row of the table.
type phaseStats struct {
	lib, phase  string
	clients     int
	requests    int
	qps         float64 // 200 answers per second
	p50, p99    time.Duration
	byStatus    map[int]int
	killed      bool
	recovery    time.Duration // from the kill to the start of the last request answered 503
	recoveryAll time.Duration // from the kill to the start of the last request not answered 200
	okBefore    float64       // 200 answers per second before the kill
	okAfter     float64       // and from recovery to the end
	oversell    int64
}

// drive runs clients that POST to base+"/skus/<prefix><n>/deduct" until
// d has passed; kill, if not nil, runs on the calling goroutine at half of d
// and returns when it did.
func drive(t *testing.T, client *http.Client, base, prefix string, clients, skus int, d time.Duration, kill func()) ([]result, time.Time, time.Time) {
	t.Helper()
	start := time.Now()
	end := start.Add(d)
	per := make([][]result, clients)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), uint64(start.UnixNano())))
			for time.Now().Before(end) {
				url := fmt.Sprintf("%s/skus/%s%d/deduct", base, prefix, rng.IntN(skus))
				t0 := time.Now()
				status := 0
				resp, err := client.Post(url, "text/plain", nil)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					status = resp.StatusCode
				}
				per[c] = append(per[c], result{start: t0, latency: time.Since(t0), status: status})
			}
		})
	}
	var killedAt time.Time
	if kill != nil {
		timer := time.NewTimer(d / 2) // the phase's schedule, not a wait for an event
		<-timer.C
		killedAt = time.Now()
		kill()
	}
	wg.Wait()
	return slices.Concat(per...), start, killedAt
}

// summarize turns a phase's results into a row. QPS counts the 200 answers that came before the phase's end, over its
// length d; the requests still in flight then count in the other columns.
func summarize(rs []result, start, killedAt time.Time, d time.Duration) phaseStats {
	st := phaseStats{requests: len(rs), byStatus: map[int]int{}}
	end := start.Add(d)
	var okInPhase int
	lat := make([]time.Duration, 0, len(rs))
	for _, r := range rs {
		st.byStatus[r.status]++
		lat = append(lat, r.latency)
		if r.status == http.StatusOK && !r.start.Add(r.latency).After(end) {
			okInPhase++
		}
		if !killedAt.IsZero() && r.status != http.StatusOK && r.start.Add(r.latency).After(killedAt) {
			if r.status == http.StatusServiceUnavailable {
				st.recovery = max(st.recovery, r.start.Sub(killedAt))
			}
			st.recoveryAll = max(st.recoveryAll, r.start.Sub(killedAt))
		}
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		st.p50, st.p99 = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
	}
	st.qps = float64(okInPhase) / d.Seconds()
	if !killedAt.IsZero() {
		st.killed = true
		recovered := killedAt.Add(st.recovery)
		var before, after int
		for _, r := range rs {
			if r.status != http.StatusOK {
				continue
			}
			done := r.start.Add(r.latency)
			switch {
			case done.Before(killedAt):
				before++
			case r.start.After(recovered) && !done.After(end):
				after++
			}
		}
		st.okBefore = float64(before) / killedAt.Sub(start).Seconds()
		st.okAfter = float64(after) / end.Sub(recovered).Seconds()
	}
	return st
}

// TestHTTPLoad is the source documents' load table redone over HTTP: a
// "deduct the stock of a SKU" endpoint locked by reqlock's middleware over
// redlockstore (writes fenced), and the same endpoint locked by redsync by
// hand (lock, deduct, unlock; no fence), on the same 5 private Redis nodes.
// For each library in turn it runs 50 clients for a phase, then 100 clients
// for a phase during which 2 of the nodes are killed (and restarted after
// it). It reports per library and phase QPS, p50/p99 latency, answers by
// status, the time from the kill until no request that started later was
// answered 503 (or anything but 200), and oversell, and fails on any
// oversell or a phase without a sale.
//
// Phases last 500ms by default: the CI-sized run. The full run is
//
//	cd stores/redlockstore/bench && go test -run '^TestHTTPLoad$' -count=1 -v . -args -phase=5s -rounds=2
//
// (rounds alternate which library goes first). Every go-redis client dials
// a node once and does not retry a command (-dials=1 -retries=-1): Redlock
// tolerates a failed node by asking the others, while go-redis's defaults
// (-dials=0 -retries=0: 5 dials 100ms apart, 3 retries) make each call to a
// killed node last hundreds of milliseconds, which both libraries wait for
// (reqlock's Release waits for every node's answer, redsync's lock and
// unlock too), so that throughput after the kill falls to a few percent of
// what it was, without any error.
func TestHTTPLoad(t *testing.T) {
	servers := testservers.RedisNodes(t, 5)
	newClients := func() []*redis.Client {
		out := make([]*redis.Client, len(servers))
		for i, srv := range servers {
			out[i] = redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, PoolSize: 128,
				DialerRetries: *dialsFlag, MaxRetries: *retryFlag})
			t.Cleanup(func() { _ = out[i].Close() })
		}
		return out
	}
	nodes := make([]redis.Scripter, len(servers))
	for i, c := range newClients() {
		// Nodes started just now: admit them (see redlockstore's Restarts).
		if err := c.Set(context.Background(), redlockstore.MarkerKey, 0, 0).Err(); err != nil {
			t.Fatal(err)
		}
		nodes[i] = c
	}
	store, err := redlockstore.New(nodes, redlockstore.WithNodeTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	var lockerOpts []reqlock.Option
	if !*handoffFlag {
		lockerOpts = append(lockerOpts, reqlock.WithHandoff(0, 0))
	}
	locker, err := reqlock.New(store, lockerOpts...)
	if err != nil {
		t.Fatal(err)
	}
	var pools []redsyncredis.Pool
	for _, c := range newClients() {
		pools = append(pools, goredis.NewPool(c))
	}
	sh := newShop()
	var unlockFailures atomic.Int64
	srv := httptest.NewServer(service(t, locker, redsync.New(pools...), sh, &unlockFailures))
	t.Cleanup(srv.Close)
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 200},
	}
	t.Cleanup(client.CloseIdleConnections)

	down := []*testservers.Server{servers[0], servers[3]} // node 0 carries reqlock's release notifications
	kill := func() {
		for _, s := range down {
			s.Kill()
		}
	}
	libs := []string{"reqlock", "redsync"}
	var rows []phaseStats
	for round := range *roundsFlag {
		order := libs
		if round%2 == 1 {
			order = []string{libs[1], libs[0]}
		}
		for _, ph := range []struct {
			name    string
			clients int
			kill    bool
		}{{"50 clients", 50, false}, {"100 clients, 2 of 5 killed", 100, true}} {
			for _, lib := range order {
				prefix := fmt.Sprintf("r%d-%s-%d-", round, lib, ph.clients)
				var killFn func()
				if ph.kill {
					killFn = kill
				}
				rs, start, killedAt := drive(t, client, srv.URL+"/"+lib, prefix, ph.clients, *skusFlag, *phaseFlag, killFn)
				if ph.kill {
					for _, s := range down {
						s.Restart()
					}
				}
				st := summarize(rs, start, killedAt, *phaseFlag)
				st.lib, st.phase, st.clients = lib, ph.name, ph.clients
				st.oversell = sh.oversold(prefix)
				rows = append(rows, st)
			}
		}
	}
	t.Logf("phase %v, %d SKUs, reqlock handoff %v, go-redis DialerRetries %d MaxRetries %d, %d cores (GOMAXPROCS %d)",
		*phaseFlag, *skusFlag, *handoffFlag, *dialsFlag, *retryFlag, runtime.NumCPU(), runtime.GOMAXPROCS(0))
	t.Logf("%-8s %-27s %8s %9s %9s %-26s %9s %9s %17s %8s", "library", "phase", "QPS(200)", "p50", "p99",
		"answers by status", "no 503", "all 200", "QPS before/after", "oversell")
	for _, st := range rows {
		var statuses []string
		for _, code := range slices.Sorted(maps.Keys(st.byStatus)) {
			statuses = append(statuses, fmt.Sprintf("%d:%d", code, st.byStatus[code]))
		}
		recovery, recoveryAll, split := "-", "-", "-"
		if st.killed {
			recovery = st.recovery.Round(time.Millisecond).String()
			recoveryAll = st.recoveryAll.Round(time.Millisecond).String()
			split = fmt.Sprintf("%.0f/%.0f", st.okBefore, st.okAfter)
		}
		t.Logf("%-8s %-27s %8.0f %9v %9v %-26s %9s %9s %17s %8d", st.lib, st.phase, st.qps,
			st.p50.Round(10*time.Microsecond), st.p99.Round(10*time.Microsecond), strings.Join(statuses, " "),
			recovery, recoveryAll, split, st.oversell)
		if st.oversell != 0 {
			t.Errorf("%s, %s: %d units oversold", st.lib, st.phase, st.oversell)
		}
		if st.byStatus[http.StatusOK] == 0 {
			t.Errorf("%s, %s: no sale at all (%v)", st.lib, st.phase, st.byStatus)
		}
	}
	t.Logf("stale writes the fence refused (reqlock): %d; redsync unlocks that found no quorum holding the lock: %d",
		sh.stale.Load(), unlockFailures.Load())
	t.Logf("recovery columns: from the kill to the start of the last request answered 503 (no 503), or not 200 (all 200); " +
		"QPS before/after: 200 answers per second before the kill, and from the all-200 recovery to the phase's end")
}
