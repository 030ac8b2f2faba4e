package redlocktest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redlockstore"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// UndoSparesLaterAttempt: the undo of an attempt whose call timed out
// after the attempt returned (a refusal) must not release what a later
// attempt with the same token (the waiter's retry) has since been granted on
// that node.
func UndoSparesLaterAttempt(t *testing.T, c Client) {
	if c.Pipelined {
		// The retry's call to node 4 would wait behind the held-back call
		// on their one connection, time out and be undone: the late call
		// cannot land after the retry's, which is what this tests.
		t.Skipf("%s pipelines: a call sent after a held-back one reaches the node after it (see Client.Pipelined)", c.Name)
	}
	const timeout = 300 * time.Millisecond
	s, proxies, direct := proxiedNodes(t, c, redlockstore.WithNodeTimeout(timeout))
	warm(t, s)
	ctx := context.Background()
	key := uniqueKey("undo-spares")
	// Another holder on nodes 0-2: the first attempt is refused there.
	for _, n := range direct[:3] {
		if err := n.(*redis.Client).Set(ctx, key, "other", 10*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Node 4 gets the first attempt's call late, after it timed out.
	answered := proxies[4].DelayNextRequest(3 * timeout)
	g, err := s.Acquire(ctx, []string{key}, "t", 10*time.Second)
	if err != nil || g.OK {
		t.Fatalf("first attempt: %+v, %v; want a refusal", g, err)
	}
	if proxies[4].Armed() != 0 {
		t.Fatal("the first attempt's call to node 4 was not held back")
	}
	for _, n := range direct[:3] {
		if err := n.(*redis.Client).Del(ctx, key).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The retry, while the first attempt's call to node 4 is still out.
	if g, err := s.Acquire(ctx, []string{key}, "t", 10*time.Second); err != nil || !g.OK {
		t.Fatalf("retry: %+v, %v; want a grant", g, err)
	}
	if h := holders(t, direct, key); h[4] != "t" {
		t.Fatalf("the retry was granted without node 4: holders %q", h)
	}
	select {
	case <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first attempt's call never reached node 4")
	}
	// The first attempt's undo on node 4 ran when its call timed out, well
	// before the call reached the node.
	if h := holders(t, direct, key); h[4] != "t" {
		t.Fatalf("the first attempt's undo released the retry's grant on node 4: holders %q", h)
	}
	if err := s.Release(ctx, []string{key}, "t", 0); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// RefreshDuringReleaseWritesNothing: a Refresh that starts while a
// Release of its token is under way (the Release's calls held back on their
// way to the nodes) writes nothing, and above all does not re-take a node
// the Release has already passed.
func RefreshDuringReleaseWritesNothing(t *testing.T, c Client) {
	s, proxies, direct, key := heldButNode4Lost(t, c, 3*time.Second, "refresh-during-release", "t")
	ctx := context.Background()
	// The Release reaches node 4 at once, nodes 0-3 150ms late: below
	// minStall (200ms), after which a node whose call has no answer while
	// others answer is skipped (health.go), which would fail the Release
	// rather than test the Refresh.
	for _, p := range proxies[:4] {
		p.DelayNextRequest(150 * time.Millisecond)
	}
	released := make(chan error, 1)
	go func() { released <- s.Release(ctx, []string{key}, "t", 0) }()
	if err := eventually(5*time.Second, func() error {
		for i, p := range proxies[:4] {
			if p.Armed() != 0 {
				return fmt.Errorf("the Release's call to node %d has not left", i)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	err := s.Refresh(ctx, []string{key}, "t", 10*time.Second)
	t.Logf("the Refresh during the Release: %v", err)
	if err := <-released; err != nil {
		t.Fatalf("Release: %v", err)
	}
	if h := holders(t, direct, key); strings.Join(h, "") != "" {
		t.Fatalf("after Release returned nil, the key is held: holders %q", h)
	}
}

// AbandonedUndoRetriedAfterHeal (the conformance suite's
// Faults/AbandonedAcquire/ReplyLost): an Acquire whose replies are lost is
// abandoned, its undo runs into the fault and fails, and the undo is sent
// again once the network heals: the key is free on every node soon after,
// and stays free.
func AbandonedUndoRetriedAfterHeal(t *testing.T, c Client) {
	s, proxies, direct := proxiedNodes(t, c, redlockstore.WithNodeTimeout(300*time.Millisecond))
	warm(t, s)
	ctx := context.Background()
	key := uniqueKey("undo-retried")
	reached := make([]func() int, len(proxies))
	for i, p := range proxies {
		reached[i] = p.Count(faultproxy.ToServer, []byte(key))
		p.Blackhole(faultproxy.ToClient)
	}
	before := s.NodeStats()
	actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	acquired := make(chan error, 1)
	go func() {
		_, err := s.Acquire(actx, []string{key}, "t", 10*time.Second)
		acquired <- err
	}()
	// Once the Acquire's requests are through, nothing gets through: the
	// undo that follows is lost too.
	if err := eventually(5*time.Second, func() error {
		for i, r := range reached {
			if r() == 0 {
				return fmt.Errorf("the Acquire has not reached node %d", i)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, p := range proxies {
		p.Blackhole(faultproxy.ToServer)
	}
	if err := <-acquired; !errors.Is(err, stores.ErrAbandoned) {
		t.Fatalf("Acquire with every reply lost: %v, want ErrAbandoned", err)
	}
	// The undo's first call to each node fails (the Acquire's call failed
	// before it).
	if err := eventually(5*time.Second, func() error {
		for i, st := range s.NodeStats() {
			if st.Failures < before[i].Failures+2 {
				return fmt.Errorf("node %d: %d failures, want the undo's too", i, st.Failures-before[i].Failures)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if h := holders(t, direct, key); strings.Count(strings.Join(h, ","), "t") != len(h) {
		t.Fatalf("the Acquire did not set the key on every node, or the undo got through: holders %q", h)
	}
	for _, p := range proxies {
		p.Heal()
	}
	healed := time.Now()
	var freeSince time.Time
	for time.Since(freeSince) < time.Second || freeSince.IsZero() {
		free := strings.Join(holders(t, direct, key), "") == ""
		switch {
		case free && freeSince.IsZero():
			freeSince = time.Now()
			t.Logf("free %v after the heal", freeSince.Sub(healed))
		case !free && !freeSince.IsZero():
			t.Fatal("the key was held again after it was seen free")
		case !free && time.Since(healed) > 2*time.Second:
			t.Fatalf("2s after the heal, the abandoned Acquire still holds the key: holders %q", holders(t, direct, key))
		}
		<-time.After(20 * time.Millisecond) // poll interval
	}
	for i, st := range s.NodeStats() {
		if st.Owed != 0 || st.GivenUp != 0 {
			t.Errorf("node %d: %d releases owed, %d given up; want 0 and 0", i, st.Owed, st.GivenUp)
		}
	}
}

// OwedCleanupBoundedDuringOutage: while a node is cut off, the clean-up
// owed to it by many locks (late grants' undos, Releases) costs one call at
// a time, and no goroutine per lock; the debts of one token are one; once
// the node is back, every release lands.
func OwedCleanupBoundedDuringOutage(t *testing.T, c Client) {
	const locks, timeout = 40, 500 * time.Millisecond
	s, proxies, direct := proxiedNodes(t, c, redlockstore.WithNodeTimeout(timeout))
	warm(t, s)
	ctx := context.Background()
	proxies[4].Blackhole(faultproxy.Both)
	keys := make([]string, locks)
	errs := make(chan error, locks)
	sem := make(chan struct{}, 10) // 10 at a time, for a loaded machine
	for i := range keys {
		keys[i] = uniqueKey("outage")
		go func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			token := fmt.Sprintf("t%d", i)
			g, err := s.Acquire(ctx, keys[i:i+1], token, 10*time.Second)
			if err == nil && !g.OK {
				err = fmt.Errorf("refused: %+v", g)
			}
			if err == nil {
				err = s.Release(ctx, keys[i:i+1], token, 0)
			}
			errs <- err
		}()
	}
	for range locks {
		if err := <-errs; err != nil {
			t.Fatalf("lock with node 4 cut off: %v", err)
		}
	}
	// Every lock owes node 4 its undo (its call timed out) and its
	// release, as one debt.
	if err := eventually(5*time.Second, func() error {
		if st := s.NodeStats()[4]; st.Owed != locks {
			return fmt.Errorf("node 4: %d releases owed, want %d", st.Owed, locks)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The locks' calls have all ended: what runs from now on is the
	// clean-up (and the connections, which the proxies serve with
	// goroutines of their own).
	const window = 2 * time.Second
	start, baseline := s.NodeStats()[4].Calls, storeGoroutineCount()
	most := 0
	for deadline := time.Now().Add(window); time.Now().Before(deadline); {
		most = max(most, storeGoroutineCount()-baseline)
		<-time.After(10 * time.Millisecond) // sampling interval
	}
	calls := s.NodeStats()[4].Calls - start
	t.Logf("over %v of the outage: %d calls to node 4 for %d owed releases, at most %d more goroutines than at its start",
		window, calls, locks, most)
	// One call at a time, each lasting the node timeout, after a backoff.
	if limit := uint64(window/timeout) + 2; calls > limit {
		t.Errorf("%d calls to the cut-off node in %v, want at most %d", calls, window, limit)
	}
	if most > locks/2 { // the proxy serves each connection it keeps with goroutines of its own
		t.Errorf("%d more goroutines during the outage than at its start", most)
	}
	for i, st := range s.NodeStats()[:4] {
		if st.Owed != 0 {
			t.Errorf("node %d, which answers: %d releases owed", i, st.Owed)
		}
	}
	proxies[4].Heal()
	if err := eventually(5*time.Second, func() error {
		if st := s.NodeStats()[4]; st.Owed != 0 {
			return fmt.Errorf("node 4: %d releases still owed after the heal", st.Owed)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if h := holders(t, direct, k); strings.Join(h, "") != "" {
			t.Fatalf("after the heal, %s is held: holders %q", k, h)
		}
	}
	if st := s.NodeStats()[4]; st.GivenUp != 0 {
		t.Errorf("node 4: %d owed releases given up", st.GivenUp)
	}
}

// OwedCleanupGivenUpAtExpiry: a release owed to a node that stays cut
// off is given up once what it releases has expired, and the Store then
// sends the node nothing more and keeps no goroutine for it; Close gives up
// what is still owed and returns.
func OwedCleanupGivenUpAtExpiry(t *testing.T, c Client) {
	s, proxies, _ := proxiedNodes(t, c, redlockstore.WithNodeTimeout(100*time.Millisecond))
	warm(t, s)
	ctx := context.Background()
	baseline := storeGoroutineCount()
	proxies[4].Blackhole(faultproxy.Both)
	const ttl = 300 * time.Millisecond
	g, err := s.Acquire(ctx, []string{uniqueKey("expiry")}, "t", ttl)
	if err != nil || !g.OK {
		t.Fatalf("Acquire with node 4 cut off: %+v, %v", g, err)
	}
	if err := eventually(5*time.Second, func() error {
		if st := s.NodeStats()[4]; st.GivenUp != 1 || st.Owed != 0 {
			return fmt.Errorf("node 4: %d owed, %d given up; want 0 and 1", st.Owed, st.GivenUp)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := eventually(5*time.Second, func() error {
		if n := storeGoroutineCount(); n > baseline {
			return fmt.Errorf("%d goroutines running Store code, %d before", n, baseline)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	calls := s.NodeStats()[4].Calls
	// A new debt, which Close gives up: the release owed to node 4 (which
	// the Store skips by now, so that the Acquire did not call it).
	closedKey := []string{uniqueKey("closed")}
	g, err = s.Acquire(ctx, closedKey, "t2", 10*time.Second)
	if err != nil || !g.OK {
		t.Fatalf("Acquire with node 4 cut off: %+v, %v", g, err)
	}
	if err := s.Release(ctx, closedKey, "t2", 0); err != nil {
		t.Fatalf("Release with node 4 cut off: %v", err)
	}
	if err := eventually(5*time.Second, func() error {
		if st := s.NodeStats()[4]; st.Owed != 1 {
			return fmt.Errorf("node 4: %d owed, want 1", st.Owed)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	closed := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(closed); took > time.Second {
		t.Errorf("Close took %v", took)
	}
	if st := s.NodeStats()[4]; st.Owed != 0 || st.GivenUp != 2 {
		t.Errorf("after Close, node 4: %d owed, %d given up; want 0 and 2", st.Owed, st.GivenUp)
	}
	if n := s.NodeStats()[4].Calls - calls; n > 3 {
		t.Errorf("%d calls to node 4 for the second lock (its acquire, its undo's tries)", n)
	}
	if err := eventually(5*time.Second, func() error {
		if n := storeGoroutineCount(); n > baseline {
			return fmt.Errorf("after Close: %d goroutines running Store code, %d before", n, baseline)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// UncontendedRoundTrips: an uncontended lock costs one request per node
// to acquire and one to release, and owes nothing.
func UncontendedRoundTrips(t *testing.T, c Client) {
	s, proxies, _ := proxiedNodes(t, c)
	warm(t, s)
	ctx := context.Background()
	key := uniqueKey("uncontended")
	counts := make([]func() int, len(proxies))
	for i, p := range proxies {
		counts[i] = p.Count(faultproxy.ToServer, []byte(key))
	}
	before := s.NodeStats()
	g, err := s.Acquire(ctx, []string{key}, "t", time.Second)
	if err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	if err := s.Refresh(ctx, []string{key}, "t", time.Second); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	if err := s.Release(ctx, []string{key}, "t", 0); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// Release returns once a quorum answered: the others' calls land
	// a moment later.
	_ = eventually(2*time.Second, func() error {
		for i, st := range s.NodeStats() {
			if st.Calls-before[i].Calls < 3 {
				return fmt.Errorf("node %d: %d calls", i, st.Calls-before[i].Calls)
			}
		}
		return nil
	})
	for i, st := range s.NodeStats() {
		// Calls also counts the late replies of warm's calls: the
		// requests carrying the key are the exact cost.
		if calls := st.Calls - before[i].Calls; calls < 3 || counts[i]() != 3 {
			t.Errorf("node %d: %d calls, %d requests carrying the key; want 3 and 3 (acquire, refresh, release)",
				i, calls, counts[i]())
		}
		if st.Owed != 0 {
			t.Errorf("node %d: %d releases owed", i, st.Owed)
		}
	}
}
