package redlocktest

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores/redlockstore"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// skippedCalls returns how many calls the Store did not send because their
// node was skipped, per node.
func skippedCalls(s *redlockstore.Store) []uint64 {
	var out []uint64
	for _, st := range s.NodeStats() {
		out = append(out, st.Skipped)
	}
	return out
}

// ShortTimeoutsSkipNoNode: calls of a 10ms TTL (3ms each) that run out
// on slow but answering nodes, as they do on a loaded machine, skip no
// node: the next calls are all sent, and a longer TTL is granted once the
// nodes are quick again.
func ShortTimeoutsSkipNoNode(t *testing.T, c Client) {
	s, proxies, _ := proxiedNodes(t, c, redlockstore.WithNodeTimeout(time.Second))
	warm(t, s)
	for _, p := range proxies {
		p.Delay(faultproxy.Both, 100*time.Millisecond)
	}
	for range 5 {
		k := []string{uniqueKey("shortttl")}
		g, err := s.Acquire(t.Context(), k, "t1", redlockstore.MinTTL)
		if err == nil && g.OK {
			t.Fatalf("granted through nodes 100ms slow with a 10ms TTL")
		}
		if errors.Is(err, redlockstore.ErrNodeSkipped) {
			t.Fatalf("a call of a 10ms TTL was not sent, its node skipped by the timeouts of such calls: %v", err)
		}
	}
	if n := skippedCalls(s); anyPositive(n) {
		t.Fatalf("calls not sent, per node: %v, want none", n)
	}
	for _, p := range proxies {
		p.Heal()
	}
	k := []string{uniqueKey("shortttl")}
	if g, err := s.Acquire(t.Context(), k, "t2", time.Second); err != nil || !g.OK {
		t.Fatalf("Acquire after the nodes are quick again: %+v, %v", g, err)
	}
	if n := skippedCalls(s); anyPositive(n) {
		t.Fatalf("calls not sent, per node: %v, want none", n)
	}
}

func anyPositive(n []uint64) bool {
	for _, v := range n {
		if v > 0 {
			return true
		}
	}
	return false
}

// frozenThree stalls nodes 0, 1 and 2 of s, acquiring with ttl, (the stall check never ends
// their calls: most of the live nodes do not answer either) and returns
// once a failed Acquire no longer sent them anything. It checks that the
// first Acquire did send to them, and that the node is skipped only after
// its calls timed out.
func frozenThree(t *testing.T, s *redlockstore.Store, proxies []*faultproxy.Proxy, timeout, ttl time.Duration) {
	t.Helper()
	for _, p := range proxies[:3] {
		p.Stall(faultproxy.Both)
	}
	start := time.Now()
	_, err := s.Acquire(t.Context(), []string{uniqueKey("frozen")}, "t0", ttl)
	if !errors.Is(err, redlockstore.ErrNoQuorum) || errors.Is(err, redlockstore.ErrNodeSkipped) {
		t.Fatalf("first Acquire with 3 of 5 nodes frozen: %v, want ErrNoQuorum, no node skipped yet", err)
	}
	if took := time.Since(start); took < timeout {
		t.Fatalf("first Acquire with 3 of 5 nodes frozen returned after %v, before the node timeout %v", took, timeout)
	}
	if err := eventually(10*time.Second, func() error {
		start := time.Now()
		_, err := s.Acquire(t.Context(), []string{uniqueKey("frozen")}, "t0", ttl)
		took := time.Since(start)
		if !errors.Is(err, redlockstore.ErrNoQuorum) {
			t.Fatalf("Acquire with 3 of 5 nodes frozen: %v, want ErrNoQuorum", err)
		}
		if !errors.Is(err, redlockstore.ErrNodeSkipped) {
			return fmt.Errorf("no node skipped after %v: %v", time.Since(start), err)
		}
		if took > timeout/2 {
			t.Fatalf("Acquire with the frozen nodes skipped took %v, want well within the node timeout %v", took, timeout)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	st := s.NodeStats()
	for i, n := range st {
		switch {
		case i < 3 && (n.Skipped == 0 || n.Failures < 2):
			t.Fatalf("frozen node %d: %+v, want calls not sent after at least 2 failures", i, n)
		case i >= 3 && n.Skipped > 0:
			t.Fatalf("live node %d skipped: %+v", i, n)
		}
	}
}

// TimingOutNodeSkipped: a node whose calls time out twice is skipped
// (its calls fail at once with ErrNodeSkipped, counted in
// NodeStat.Skipped), and its probe brings it back as soon as it answers.
func TimingOutNodeSkipped(t *testing.T, c Client) {
	const timeout = 500 * time.Millisecond
	s, proxies, _ := proxiedNodes(t, c, redlockstore.WithNodeTimeout(timeout))
	warm(t, s)
	// A TTL that gives each call the node timeout, and whose owed releases
	// (of the failed Acquires) are given up soon: such a release, sent to
	// a skipped node too, brings it back when it answers.
	frozenThree(t, s, proxies, timeout, 3*timeout)
	if err := eventually(10*time.Second, func() error {
		for i, st := range s.NodeStats()[:3] {
			if st.Owed > 0 {
				return fmt.Errorf("node %d: %d releases owed", i, st.Owed)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, p := range proxies[:3] {
		p.Heal()
	}
	healed := time.Now()
	// Back: an Acquire is granted and sent to every node.
	if err := eventually(5*time.Second, func() error {
		before := skippedCalls(s)
		g, err := s.Acquire(t.Context(), []string{uniqueKey("back")}, "t1", 10*time.Second)
		if err != nil || !g.OK {
			return fmt.Errorf("Acquire %v after the heal: %+v, %v", time.Since(healed), g, err)
		}
		if after := skippedCalls(s); !slices.Equal(before, after) {
			return fmt.Errorf("calls not sent %v after the heal: %v, then %v", time.Since(healed), before, after)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The probes run 50ms apart; one stalled at the heal answers then.
	if took := time.Since(healed); took > time.Second {
		t.Fatalf("the nodes were back %v after they answered again, want within 1s", took)
	}
}

// CloseStopsProbes: Close ends the probes of skipped nodes that do not
// answer, and leaves no goroutine of the Store behind.
func CloseStopsProbes(t *testing.T, c Client) {
	const timeout = 500 * time.Millisecond
	addrs := testservers.RedisNodeAddrs(t)
	admit(t, clients(t, addrs))
	proxies := make([]*faultproxy.Proxy, len(addrs))
	for i, a := range addrs {
		proxies[i] = faultproxy.New(t, a)
	}
	scripters := make([]redis.Scripter, len(addrs))
	for i, p := range proxies {
		c := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		scripters[i] = c
	}
	s, err := c.open(t, scripters, redlockstore.WithNodeTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
	warm(t, s)
	frozenThree(t, s, proxies, timeout, 10*time.Second)
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("Close still waiting 5s after it was called, the nodes still frozen\n%s", buf[:runtime.Stack(buf, true)])
	}
	// Close waited for its goroutines. One may still be returning (its
	// deferred WaitGroup.Done ran, its frame not yet gone), so they are
	// given a moment to exit; none may be left then (the nodes are still
	// frozen, so a goroutine still calling them would stay).
	deadline := time.Now().Add(time.Second)
	for {
		left := storeGoroutines()
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines of the Store left 1s after Close:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond) // polling the goroutines
	}
}

// storeGoroutines returns the stacks of the running goroutines that run
// code of the Store (not of its tests).
func storeGoroutines() []string {
	buf := make([]byte, 1<<22)
	var out []string
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "/stores/redlockstore.") {
			out = append(out, g)
		}
	}
	return out
}

// StalledCallEnded: an Acquire whose outcome needs a frozen node's
// answer (2 nodes grant, 2 refuse) gets it at the node's stall time, while
// the other nodes answer, not at the node timeout; the node is then
// skipped.
func StalledCallEnded(t *testing.T, c Client) {
	const timeout = 5 * time.Second
	s, proxies, direct := proxiedNodes(t, c, redlockstore.WithNodeTimeout(timeout))
	warm(t, s)
	key := uniqueKey("stalled")
	for _, n := range direct[3:] {
		if err := n.(*redis.Client).Set(t.Context(), key, "other#1", 10*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
	proxies[0].Stall(faultproxy.Both)
	start := time.Now()
	g, err := s.Acquire(t.Context(), []string{key}, "t1", 10*time.Second)
	took := time.Since(start)
	if g.OK {
		t.Fatalf("granted with 2 of 5 nodes held by another token and 1 frozen: %+v", g)
	}
	if took > timeout/2 {
		t.Fatalf("Acquire took %v (%v), want the frozen node's call ended well within the node timeout %v", took, err, timeout)
	}
	if err := eventually(5*time.Second, func() error {
		if g, err := s.Acquire(t.Context(), []string{uniqueKey("stalled")}, "t2", 10*time.Second); err != nil || !g.OK {
			t.Fatalf("Acquire of a free key with 1 node frozen: %+v, %v", g, err)
		}
		if n := s.NodeStats()[0].Skipped; n == 0 {
			return errors.New("the frozen node is not skipped")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > timeout/2 {
		t.Fatalf("the frozen node was skipped %v after its call, want well within the node timeout %v", took, timeout)
	}
}
