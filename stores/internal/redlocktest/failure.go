package redlocktest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redlockstore"
)

// privateNodes starts 5 Redis servers of the test's own, admitted, and a
// Store over them.
func privateNodes(t *testing.T, c Client, opts ...redlockstore.Option) ([]*testservers.Server, *redlockstore.Store) {
	t.Helper()
	servers := testservers.RedisNodes(t, 5)
	nodes := clients(t, testservers.Addrs(servers))
	admit(t, nodes)
	return servers, newStore(t, c, nodes, opts...)
}

// eventually polls f every 20ms until it returns nil or limit passes, and
// returns its last error.
func eventually(limit time.Duration, f func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		timer := time.NewTimer(20 * time.Millisecond)
		<-timer.C
	}
}

// grantOnce acquires and releases key with a fresh token and returns the
// grant's fence, or an error when it is refused or fails.
func grantOnce(ctx context.Context, s *redlockstore.Store, key string, ttl time.Duration) (int64, error) {
	token := fmt.Sprintf("t%d", rand.Int64())
	g, err := s.Acquire(ctx, []string{key}, token, ttl)
	if err != nil {
		return 0, err
	}
	if !g.OK {
		return 0, fmt.Errorf("refused: %+v", g)
	}
	if err := s.Release(ctx, []string{key}, token, 0); err != nil {
		return 0, err
	}
	return g.Fences[0], nil
}

// QuorumLoss: with 3 of 5 nodes down, acquisitions fail with an error
// that names the nodes (a store failure, not a refusal) within the wait;
// once the nodes return, the same Store grants again.
func QuorumLoss(t *testing.T, c Client) {
	var hookMu sync.Mutex
	hooked := map[string]int{}
	servers, s := privateNodes(t, c, redlockstore.WithNodeTimeout(500*time.Millisecond),
		redlockstore.WithNodeFailureHook(func(node string, _ error) {
			hookMu.Lock()
			hooked[node]++
			hookMu.Unlock()
		}))
	ctx := context.Background()
	const key = "quorum-loss"
	if _, err := grantOnce(ctx, s, key, time.Second); err != nil {
		t.Fatalf("before the failure: %v", err)
	}
	before := s.NodeStats()
	down := servers[1:4]
	for _, srv := range down {
		srv.Kill()
	}

	_, err := s.Acquire(ctx, []string{key}, "t-down", time.Second)
	if !errors.Is(err, redlockstore.ErrNoQuorum) {
		t.Fatalf("Acquire with 3 of 5 nodes down: %v, want ErrNoQuorum", err)
	}
	for _, srv := range down {
		if !strings.Contains(err.Error(), srv.Addr()) {
			t.Errorf("error %q does not name the failed node %s", err, srv.Addr())
		}
	}
	for _, srv := range []*testservers.Server{servers[0], servers[4]} {
		if strings.Contains(err.Error(), "node "+srv.Addr()) {
			t.Errorf("error %q names the live node %s", err, srv.Addr())
		}
	}

	locker, err := reqlock.New(s)
	if err != nil {
		t.Fatal(err)
	}
	const wait = 2 * time.Second
	start := time.Now()
	_, err = locker.Obtain(ctx, key, time.Second, wait)
	elapsed := time.Since(start)
	switch {
	case !errors.Is(err, reqlock.ErrStore) || !errors.Is(err, redlockstore.ErrNoQuorum):
		t.Fatalf("Obtain with 3 of 5 nodes down: %v, want ErrStore wrapping ErrNoQuorum", err)
	case errors.Is(err, reqlock.ErrHeld):
		t.Fatalf("Obtain with 3 of 5 nodes down: %v, a refusal; want a store failure", err)
	case elapsed > wait:
		t.Fatalf("Obtain with 3 of 5 nodes down took %v, beyond its wait %v", elapsed, wait)
	}

	after := s.NodeStats()
	hookMu.Lock()
	for _, srv := range down {
		if hooked[srv.Addr()] == 0 {
			t.Errorf("the failure hook never reported the failed node %s", srv.Addr())
		}
	}
	hookMu.Unlock()
	for i := range after {
		failures := after[i].Failures - before[i].Failures
		isDown := i >= 1 && i <= 3
		if isDown && failures == 0 {
			t.Errorf("node %d (%s) is down but NodeStats counts no failure", i, after[i].Node)
		}
		if !isDown && failures != 0 {
			t.Errorf("node %d (%s) is up but NodeStats counts %d failures", i, after[i].Node, failures)
		}
	}

	for _, srv := range down {
		srv.Restart()
	}
	if err := eventually(5*time.Second, func() error {
		_, err := grantOnce(ctx, s, key, time.Second)
		return err
	}); err != nil {
		t.Fatalf("after the nodes returned: %v", err)
	}
}

// obtainRecord is one Obtain of TestKillTwoUnderLoad: when it started and
// ended, and whether it was a store failure.
type obtainRecord struct {
	start, end   time.Time
	storeFailure bool
}

// recoveryBound is how long after 2 of 5 nodes are killed an Obtain may still
// fail: one that starts later must not be a store failure (the source
// documents' "lock success back to 100% within 500 ms").
const recoveryBound = 500 * time.Millisecond

// fastFailClients returns a client per address, closed when the test ends,
// that dials once and never retries a command: a call to a killed node fails
// at once instead of after go-redis's 5 dials 100ms apart, which Release
// (waiting for every node's answer) would wait for on each lock.
func fastFailClients(t testing.TB, addrs []string) []redis.Scripter {
	t.Helper()
	out := make([]redis.Scripter, len(addrs))
	for i, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true, PoolSize: 64,
			MaxRetries: -1, DialerRetries: 1})
		t.Cleanup(func() { _ = c.Close() })
		out[i] = c
	}
	return out
}

// KillTwoUnderLoad: 2 of 5 nodes killed while workers take turns on one
// key: no two holders ever, no lost update of a non-atomic counter, every
// Obtain that starts more than recoveryBound after the kill succeeds or ends
// by contention, never by a store failure, until the nodes return; then the
// Store uses them again. Its clients fail fast on a killed node
// (fastFailClients), as a Redlock deployment configures go-redis.
func KillTwoUnderLoad(t *testing.T, c Client) {
	servers := testservers.RedisNodes(t, 5)
	nodes := fastFailClients(t, testservers.Addrs(servers))
	admit(t, nodes)
	s := newStore(t, c, nodes, redlockstore.WithNodeTimeout(500*time.Millisecond))
	locker, err := reqlock.New(s)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const (
		workers, key = 10, "kill-two"
		downFor      = 4 * recoveryBound // how long the 2 nodes stay down, at least
	)
	var (
		wg                sync.WaitGroup
		counter, grants   atomic.Int64
		inside            atomic.Int32
		afterKill         atomic.Int64
		killed, restarted atomic.Bool
		stop              = make(chan struct{})
		overlaps, relErrs atomic.Int64
		firstErr          atomic.Value
		recordsMu         sync.Mutex
		records           []obtainRecord
		releaseDownMax    atomic.Int64 // longest Release while the nodes were down, ns
	)
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				lock, err := locker.Obtain(ctx, key, 2*time.Second, 2*time.Second)
				rec := obtainRecord{start: start, end: time.Now(),
					storeFailure: err != nil && reqlock.OutcomeOf(ctx, err) == reqlock.OutcomeStoreError}
				recordsMu.Lock()
				records = append(records, rec)
				recordsMu.Unlock()
				if err != nil {
					if rec.storeFailure {
						firstErr.CompareAndSwap(nil, err)
					}
					continue
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				v := counter.Load() // a deliberately non-atomic increment
				time.Sleep(time.Millisecond)
				counter.Store(v + 1)
				inside.Add(-1)
				grants.Add(1)
				if killed.Load() {
					afterKill.Add(1)
				}
				releaseStart := time.Now()
				if err := lock.Release(ctx); err != nil {
					relErrs.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
				if killed.Load() && !restarted.Load() {
					d := int64(time.Since(releaseStart))
					for old := releaseDownMax.Load(); d > old && !releaseDownMax.CompareAndSwap(old, d); old = releaseDownMax.Load() {
					}
				}
			}
		})
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		if err := eventually(10*time.Second, func() error {
			if cond() {
				return nil
			}
			return errors.New(what)
		}); err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("timed out waiting: %v", err)
		}
	}
	waitFor("grants before the kill", func() bool { return grants.Load() >= 30 })
	killedAt := time.Now()
	servers[0].Kill() // the notify node too: waiters fall back to polling
	servers[3].Kill()
	killed.Store(true)
	waitFor("grants after the kill", func() bool {
		return afterKill.Load() >= 30 && time.Since(killedAt) >= downFor
	})
	restartedAt := time.Now()
	restarted.Store(true)
	servers[0].Restart()
	servers[3].Restart()
	n := grants.Load()
	waitFor("grants after the nodes returned", func() bool { return grants.Load() >= n+30 })
	close(stop)
	wg.Wait()

	if o := overlaps.Load(); o != 0 {
		t.Errorf("%d times two holders were inside the lock at once", o)
	}
	if c, g := counter.Load(), grants.Load(); c != g {
		t.Errorf("counter %d after %d grants: %d lost updates", c, g, g-c)
	}
	if e := relErrs.Load(); e != 0 {
		t.Errorf("%d failed Releases (first error: %v)", e, firstErr.Load())
	}

	// Lock success back to 100% within recoveryBound of the kill: no store
	// failure of an Obtain that started later, while the nodes were down.
	var (
		failures, late, checked int
		lastFailure             time.Duration // end of the last failure, from the kill
		lastFailureStart        time.Duration
	)
	for _, r := range records {
		if r.end.Before(killedAt) || !r.start.Before(restartedAt) {
			continue
		}
		after := r.start.Sub(killedAt)
		if after > recoveryBound {
			checked++
		}
		if !r.storeFailure {
			continue
		}
		failures++
		lastFailure = max(lastFailure, r.end.Sub(killedAt))
		lastFailureStart = max(lastFailureStart, after)
		if after > recoveryBound {
			late++
		}
	}
	t.Logf("after the kill: %d store failures among the Obtains; the last started %v and ended %v after the kill (first: %v)",
		failures, lastFailureStart.Round(time.Millisecond), lastFailure.Round(time.Millisecond), firstErr.Load())
	if late != 0 {
		t.Errorf("%d of %d Obtains started more than %v after the kill failed with a store error; the last started %v after it",
			late, checked, recoveryBound, lastFailureStart)
	}
	for _, i := range []int{0, 3} { // the kill was real: the Store met it
		if st := s.NodeStats()[i]; st.Failures == 0 {
			t.Errorf("killed node %d counts no failed call: %+v", i, st)
		}
	}
	if checked < 50 {
		t.Errorf("only %d Obtains started between %v after the kill and the restart: too few to tell", checked, recoveryBound)
	}
	// Release waits for every node's answer, so while nodes are down it
	// takes their failure's time (go-redis's dial retries, bounded by the
	// node timeout), and the local queue's next turn waits for it.
	t.Logf("%d grants, %d in the %v the nodes were down; %d Obtains checked; longest Release while they were down: %v",
		grants.Load(), afterKill.Load(), restartedAt.Sub(killedAt).Round(time.Millisecond), checked,
		time.Duration(releaseDownMax.Load()).Round(time.Millisecond))
}

// RestartedEmptyNodeQuarantined: a node that held a lock and comes back
// empty must not let a second client take the lock through it; it takes
// part again once the max TTL has passed, and the fence still grows.
func RestartedEmptyNodeQuarantined(t *testing.T, c Client) {
	const maxTTL = 1500 * time.Millisecond
	servers, s := privateNodes(t, c, redlockstore.WithMaxTTL(maxTTL), redlockstore.WithNodeTimeout(500*time.Millisecond))
	ctx := context.Background()
	key := "restart-empty"
	gate := gate(s, key)
	// The holder's quorum is the gate and two more; the other two are down
	// while it is granted.
	var others []int
	for i := range servers {
		if i != gate {
			others = append(others, i)
		}
	}
	absent := others[2:]
	for _, i := range absent {
		servers[i].Stop()
	}
	g1, err := s.Acquire(ctx, []string{key}, "holder", maxTTL)
	if err != nil || !g1.OK {
		t.Fatalf("holder's Acquire on 3 of 5 nodes: %+v, %v", g1, err)
	}
	for _, i := range absent {
		servers[i].Restart()
	}
	servers[gate].RestartEmpty()

	// Without the quarantine, the gate and the two nodes that were away
	// would grant a second holder.
	g2, err := s.Acquire(ctx, []string{key}, "intruder", maxTTL)
	if g2.OK {
		t.Fatalf("a second holder was granted while the first holds the lock: %+v", g2)
	}
	if err != nil && !errors.Is(err, redlockstore.ErrQuarantined) {
		t.Fatalf("Acquire next to a restarted node: %v", err)
	}
	// The node's answer may come after the refusal was decided.
	if err := eventually(5*time.Second, func() error {
		if st := s.NodeStats()[gate]; st.Quarantines == 0 {
			return fmt.Errorf("the restarted node %d was not quarantined: %+v", gate, st)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// Once the holder's TTL and the quarantine have passed, the node takes
	// part again and the fence grows although it lost its fence key.
	var f2 int64
	if err := eventually(3*maxTTL, func() error {
		var err error
		f2, err = grantOnce(ctx, s, key, maxTTL)
		return err
	}); err != nil {
		t.Fatalf("after the quarantine: %v", err)
	}
	if f2 < g1.Fences[0]+stores.FenceStride {
		t.Fatalf("fence %d after %d across a restart empty, want a stride above", f2, g1.Fences[0])
	}
}

// FencesGrowAcrossQuorums: grants whose quorums differ (2 random nodes
// down each round, some nodes restarted empty) get strictly growing fences.
func FencesGrowAcrossQuorums(t *testing.T, c Client) {
	const maxTTL = 500 * time.Millisecond
	servers, s := privateNodes(t, c, redlockstore.WithMaxTTL(maxTTL), redlockstore.WithNodeTimeout(500*time.Millisecond))
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	const key = "fences"
	var last int64
	for round := range 6 {
		down := rng.Perm(len(servers))[:2]
		for _, i := range down {
			servers[i].Kill()
		}
		var fence int64
		if err := eventually(3*maxTTL, func() error {
			var err error
			fence, err = grantOnce(ctx, s, key, maxTTL)
			return err
		}); err != nil {
			t.Fatalf("round %d, nodes %v down: %v", round, down, err)
		}
		if last != 0 && fence < last+stores.FenceStride {
			t.Fatalf("round %d, nodes %v down: fence %d after %d, want a stride above", round, down, fence, last)
		}
		last = fence
		for j, i := range down {
			if round%2 == 1 && j == 0 {
				servers[i].RestartEmpty() // loses its fence keys, and is quarantined
			} else {
				servers[i].Restart()
			}
		}
	}
}
