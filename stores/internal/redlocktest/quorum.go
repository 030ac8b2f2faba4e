package redlocktest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redlockstore"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// proxiedNodes returns a Store whose every connection to the 5 shared nodes
// goes through a faultproxy of its own, the proxies, and direct clients of
// the nodes to look at what they hold.
func proxiedNodes(t *testing.T, c Client, opts ...redlockstore.Option) (*redlockstore.Store, []*faultproxy.Proxy, []redis.Scripter) {
	t.Helper()
	addrs := testservers.RedisNodeAddrs(t)
	direct := clients(t, addrs)
	admit(t, direct)
	proxies := make([]*faultproxy.Proxy, len(addrs))
	paddrs := make([]string, len(addrs))
	for i, a := range addrs {
		proxies[i] = faultproxy.New(t, a)
		paddrs[i] = proxies[i].Addr()
	}
	return newStore(t, c, clients(t, paddrs), opts...), proxies, direct
}

// heldButNode4Lost returns a Store on proxied nodes (see proxiedNodes)
// with the node timeout timeout, warmed, its proxies and direct clients, and
// the key uniqueKey(name), which the Store holds for token for 10s on every
// node but node 4: that one lost it (restarted empty, say), so that a
// Refresh on top of the quorum re-takes it.
func heldButNode4Lost(t *testing.T, c Client, timeout time.Duration, name, token string) (*redlockstore.Store, []*faultproxy.Proxy, []redis.Scripter, string) {
	t.Helper()
	s, proxies, direct := proxiedNodes(t, c, redlockstore.WithNodeTimeout(timeout))
	warm(t, s)
	ctx := context.Background()
	key := uniqueKey(name)
	if g, err := s.Acquire(ctx, []string{key}, token, 10*time.Second); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	if err := direct[4].(*redis.Client).Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	return s, proxies, direct, key
}

// uniqueKey returns a key no other test uses.
func uniqueKey(name string) string { return fmt.Sprintf("%s:%d", name, rand.Int64()) }

// holders returns, per node, the token key holds there ("" when absent): the
// value without the attempt that wrote it (TOKEN#ATTEMPT).
func holders(t *testing.T, nodes []redis.Scripter, key string) []string {
	t.Helper()
	out := make([]string, len(nodes))
	for i, n := range nodes {
		v, err := n.(*redis.Client).Get(context.Background(), key).Result()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			t.Fatalf("GET %s on node %d: %v", key, i, err)
		default:
			if j := strings.LastIndexByte(v, '#'); j >= 0 && strings.Trim(v[j+1:], "0123456789") == "" {
				v = v[:j]
			}
			out[i] = v
		}
	}
	return out
}

// freeSoon fails t unless key is free on every node within 5s. Release
// returns once a quorum released, after a short grace for the other nodes:
// under load, a node's release may land after it returns (or fail, and be
// sent again as owed). A renewal or re-take landing behind the release, the
// defect the callers look for, holds the key for its 10s TTL. The callers
// have waited for every write of the token to reach its node.
func freeSoon(t *testing.T, direct []redis.Scripter, key, after string) {
	t.Helper()
	if err := eventually(5*time.Second, func() error {
		if h := holders(t, direct, key); strings.Join(h, "") != "" {
			return fmt.Errorf("holders %q", h)
		}
		return nil
	}); err != nil {
		t.Fatalf("after %s, the key is held: %v", after, err)
	}
}

// warm runs locks through s, 4 at once, so that its scripts are loaded and
// several connections per node open: a held-back request is then a script
// call itself, and a call made while another waits needs no new connection
// (whose handshake the faults would slow). It returns once no call of them
// is in flight: Acquire, Refresh and Release return once a quorum has
// answered, and a fault injected next must not catch a warm-up call.
func warm(t *testing.T, s *redlockstore.Store) {
	t.Helper()
	errs := make(chan error, 4)
	for range cap(errs) {
		go func() {
			ctx, key, token := context.Background(), []string{uniqueKey("warm")}, uniqueKey("warm")
			g, err := s.Acquire(ctx, key, token, time.Second)
			if err == nil && !g.OK {
				err = fmt.Errorf("refused: %+v", g)
			}
			if err == nil {
				err = s.Refresh(ctx, key, token, time.Second)
			}
			if err == nil {
				err = s.Release(ctx, key, token, 0)
			}
			errs <- err
		}()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Fatalf("warm-up lock: %v", err)
		}
	}
	if err := eventually(5*time.Second, func() error {
		if n := tokenStates(s); n > 0 {
			return fmt.Errorf("%d warm-up tokens with calls in flight", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// RefreshNeedsQuorumStillHeld (issue 18, defect 1): a holder whose lock
// expired on a majority, which another Store then took and released, must
// not revive it by Refresh through the one node that still held it.
func RefreshNeedsQuorumStillHeld(t *testing.T, c Client) {
	servers, s := privateNodes(t, c, redlockstore.WithNodeTimeout(300*time.Millisecond))
	other := newStore(t, c, clients(t, testservers.Addrs(servers)))
	direct := clients(t, testservers.Addrs(servers))
	ctx := context.Background()
	const key = "revive"
	if g, err := s.Acquire(ctx, []string{key}, "t1", time.Second); err != nil || !g.OK {
		t.Fatalf("T1's Acquire: %+v, %v", g, err)
	}
	for _, srv := range servers[1:] {
		srv.Pause()
	}
	// The renewal reaches node 0 alone, for long: T1 outlives the others
	// there.
	if err := s.Refresh(ctx, []string{key}, "t1", 10*time.Second); !errors.Is(err, redlockstore.ErrNoQuorum) {
		t.Fatalf("Refresh with 4 of 5 nodes paused: %v, want ErrNoQuorum", err)
	}
	for _, srv := range servers[1:] {
		srv.Resume()
	}
	if err := eventually(5*time.Second, func() error {
		h := holders(t, direct, key)
		if h[0] != "t1" || strings.Join(h[1:], "") != "" {
			return fmt.Errorf("holders %q: want t1 on node 0 alone", h)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if g, err := other.Acquire(ctx, []string{key}, "t2", time.Second); err != nil || !g.OK {
		t.Fatalf("T2's Acquire on the 4 free nodes: %+v, %v", g, err)
	}
	if err := other.Release(ctx, []string{key}, "t2", 0); err != nil {
		t.Fatalf("T2's Release: %v", err)
	}
	err := s.Refresh(ctx, []string{key}, "t1", time.Second)
	if !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("T1's Refresh after T2 held the lock: %v, want ErrNotHeld", err)
	}
	if h := holders(t, direct, key); strings.Join(h[1:], "") != "" {
		t.Fatalf("T1's failed Refresh re-took nodes: holders %q", h)
	}
}

// RefreshRacingReleaseRetakesNothing (issue 18, defect 2): a Refresh
// that re-takes a node while a Release runs (replies 150ms late, within the
// node timeout) must not leave the key held after Release returned.
func RefreshRacingReleaseRetakesNothing(t *testing.T, c Client) {
	s, proxies, direct, key := heldButNode4Lost(t, c, 3*time.Second, "refresh-release", "t1")
	ctx := context.Background()
	// 150ms: below minStall (200ms), after which a node whose call has no
	// answer while others answer is skipped (health.go), which would fail
	// the Release for want of a quorum rather than test the Refresh.
	reached := make([]func() int, len(proxies))
	for i, p := range proxies {
		p.Delay(faultproxy.ToClient, 150*time.Millisecond)
		reached[i] = p.Count(faultproxy.ToServer, []byte(key))
	}
	refreshed := make(chan error, 1)
	go func() { refreshed <- s.Refresh(ctx, []string{key}, "t1", 10*time.Second) }()
	// The Release starts once the Refresh's calls reached the nodes, while
	// it waits for their replies.
	if err := eventually(5*time.Second, func() error {
		for i, n := range reached {
			if n() == 0 {
				return fmt.Errorf("the Refresh's call to node %d has not reached it", i)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, []string{key}, "t1", 0); err != nil {
		t.Fatalf("Release: %v", err)
	}
	err := <-refreshed
	t.Logf("the Refresh racing the Release: %v", err)
	for _, p := range proxies {
		p.Heal()
	}
	freeSoon(t, direct, key, "Release returned nil")
}

// CancelledRefreshRetakeClosedByRelease (issue 18, defect 3): the
// re-take of a Refresh whose context ended must not land after the lock's
// Release.
func CancelledRefreshRetakeClosedByRelease(t *testing.T, c Client) {
	s, proxies, direct, key := heldButNode4Lost(t, c, 5*time.Second, "cancelled-refresh", "t1")
	ctx := context.Background()
	// Nodes 0-3 answer the Refresh 1s late (a Refresh decides once a
	// quorum answered, and re-takes only on nodes that answered by then);
	// node 4's next request after the Refresh's first, the re-take,
	// reaches it 2s late.
	p := proxies[4]
	seen := []chan struct{}{make(chan struct{}), make(chan struct{})} // the first request, the second
	requests := 0
	p.CutWhen(faultproxy.ToServer, func([]byte) bool { // watches, never cuts
		if requests < len(seen) {
			close(seen[requests])
		}
		requests++
		return false
	}, true)
	for _, q := range proxies[:4] {
		q.Delay(faultproxy.ToClient, time.Second)
	}
	rctx, cancel := context.WithCancel(ctx)
	refreshed := make(chan error, 1)
	go func() { refreshed <- s.Refresh(rctx, []string{key}, "t1", 10*time.Second) }()
	<-seen[0]
	answered := p.DelayNextRequest(2 * time.Second)
	<-seen[1] // the re-take, held back
	cancel()
	if err := <-refreshed; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled Refresh: %v, want context.Canceled", err)
	}
	if err := s.Release(ctx, []string{key}, "t1", 0); err != nil {
		t.Fatalf("Release: %v", err)
	}
	select {
	case <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("the re-take never reached node 4")
	}
	freeSoon(t, direct, key, "Release and the cancelled Refresh's re-take")
}

// LateAcquireClosedByUndo (issue 18, defect 4): an acquire whose calls
// to 3 of 5 nodes arrive after the node timeout is undone, and the late
// calls then write nothing.
func LateAcquireClosedByUndo(t *testing.T, c Client) {
	s, proxies, direct := proxiedNodes(t, c, redlockstore.WithNodeTimeout(200*time.Millisecond))
	warm(t, s)
	ctx := context.Background()
	key := uniqueKey("late-acquire")
	var answered []<-chan struct{}
	for _, p := range proxies[:3] {
		answered = append(answered, p.DelayNextRequest(time.Second))
	}
	_, err := s.Acquire(ctx, []string{key}, "t1", 10*time.Second)
	if !errors.Is(err, redlockstore.ErrNoQuorum) {
		t.Fatalf("Acquire with 3 of 5 calls late: %v, want ErrNoQuorum", err)
	}
	for i, ch := range answered {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("the late call never reached node %d", i)
		}
	}
	if h := holders(t, direct, key); strings.Join(h, "") != "" {
		t.Fatalf("after the undo, the late calls hold the key: holders %q", h)
	}
}

// DuplicateNodesRefused (issue 18, defect 5): one server given twice
// must not count as two votes.
func DuplicateNodesRefused(t *testing.T, c Client) {
	addrs := testservers.RedisNodeAddrs(t)
	a, b := addrs[0], addrs[1]
	_, port, _ := strings.Cut(a, ":")
	for _, url := range []string{
		"redlock://" + a + "," + a + "," + b,
		"redlock://localhost:" + port + ",127.0.0.1:" + port + "," + b,
		"redis://" + a + "/0,redis://" + a + "/1,redis://" + b + "/0",
	} {
		s, err := redlockstore.Open(context.Background(), url)
		if !errors.Is(err, stores.ErrInvalid) || !errors.Is(err, redlockstore.ErrDuplicateNode) {
			if s != nil {
				_ = s.Close()
			}
			t.Errorf("Open(%q): %v, want ErrInvalid and ErrDuplicateNode", url, err)
		}
	}

	// One server under two addresses New cannot tell apart: the first
	// Acquire finds it out by the server's run_id.
	p := faultproxy.New(t, a)
	nodes := clients(t, []string{a, p.Addr(), b})
	admit(t, nodes)
	s := newStore(t, c, nodes)
	key := uniqueKey("duplicate")
	g, err := s.Acquire(context.Background(), []string{key}, "t1", time.Second)
	if !errors.Is(err, stores.ErrInvalid) || !errors.Is(err, redlockstore.ErrDuplicateNode) {
		t.Fatalf("Acquire through one server twice: %+v, %v; want ErrInvalid and ErrDuplicateNode", g, err)
	}
	if h := holders(t, clients(t, []string{a, b}), key); strings.Join(h, "") != "" {
		t.Fatalf("the refused Acquire wrote: holders %q", h)
	}
}

// NodeOrderIrrelevant (issue 18, defect 6): two processes that list the
// nodes in different orders share each key's gate and release signals.
func NodeOrderIrrelevant(t *testing.T, c Client) {
	addrs := testservers.RedisNodeAddrs(t)
	reversed := make([]string, len(addrs))
	for i, a := range addrs {
		reversed[len(addrs)-1-i] = a
	}
	nodes := clients(t, addrs)
	admit(t, nodes)
	s1, s2 := newStore(t, c, nodes), newStore(t, c, clients(t, reversed))
	for i := range 20 {
		key := uniqueKey(fmt.Sprintf("order%d", i))
		if g1, g2 := gate(s1, key), gate(s2, key); addrs[g1] != reversed[g2] {
			t.Fatalf("key %q: gate %s in one order, %s in the other", key, addrs[g1], reversed[g2])
		}
	}
	ctx := context.Background()
	for i := range 5 {
		key := uniqueKey(fmt.Sprintf("order-signal%d", i))
		if g, err := s2.Acquire(ctx, []string{key}, "holder", 10*time.Second); err != nil || !g.OK {
			t.Fatalf("holder's Acquire: %+v, %v", g, err)
		}
		if g, err := s1.Acquire(ctx, []string{key}, "waiter", 10*time.Second); err != nil || g.OK {
			t.Fatalf("waiter's Acquire: %+v, %v; want a refusal", g, err)
		}
		released, stop := s1.NotifyRelease(key, "waiter")
		if released == nil {
			t.Fatal("NotifyRelease: nil channel")
		}
		// The subscription may start after NotifyRelease returns: release
		// again until the signal comes, as the conformance suite does.
		got := false
		for try := 0; try < 50 && !got; try++ {
			token := fmt.Sprintf("holder%d", try)
			if try > 0 {
				if g, err := s2.Acquire(ctx, []string{key}, token, 10*time.Second); err != nil || !g.OK {
					t.Fatalf("holder's Acquire: %+v, %v", g, err)
				}
			} else {
				token = "holder"
			}
			if err := s2.Release(ctx, []string{key}, token, 0); err != nil {
				t.Fatalf("holder's Release: %v", err)
			}
			select {
			case <-released:
				got = true
			case <-time.After(100 * time.Millisecond):
			}
		}
		stop()
		if !got {
			t.Fatalf("key %q: the waiter of one node order never heard the release of the other", key)
		}
	}
}

// GateAloneDoesNotRefuseForever (issue 18, defect 7): a waiter that the
// gate alone refuses, with the holder that refused it before, while the
// holder's release reached every node but the gate, gets the lock at once.
func GateAloneDoesNotRefuseForever(t *testing.T, c Client) {
	holder, proxies, direct := proxiedNodes(t, c, redlockstore.WithNodeTimeout(300*time.Millisecond))
	waiter := newStore(t, c, direct)
	warm(t, holder)
	ctx := context.Background()
	key := uniqueKey("gate-lost-release")
	gate := gate(holder, key)
	if g, err := holder.Acquire(ctx, []string{key}, "holder", 10*time.Second); err != nil || !g.OK {
		t.Fatalf("holder's Acquire: %+v, %v", g, err)
	}
	if g, err := waiter.Acquire(ctx, []string{key}, "waiter", 10*time.Second); err != nil || g.OK {
		t.Fatalf("waiter's first Acquire: %+v, %v; want a refusal", g, err)
	}
	// The holder's release is lost on the gate, and so are the holder
	// Store's retries of it while the gate stays cut off from it.
	proxies[gate].Blackhole(faultproxy.ToServer)
	if err := holder.Release(ctx, []string{key}, "holder", 0); err != nil {
		t.Fatalf("holder's Release, lost on the gate: %v", err)
	}
	if h := holders(t, direct, key); h[gate] != "holder" {
		t.Fatalf("the gate (node %d) let go: holders %q", gate, h)
	}
	g, err := waiter.Acquire(ctx, []string{key}, "waiter", 10*time.Second)
	if err != nil || !g.OK {
		t.Fatalf("waiter's retry with 4 of 5 nodes free: %+v, %v; want a grant", g, err)
	}
	if err := waiter.Release(ctx, []string{key}, "waiter", 0); err != nil {
		t.Fatalf("waiter's Release: %v", err)
	}
	// Once the gate is reachable again, the release the holder's Store
	// owes it lands.
	proxies[gate].Heal()
	if err := eventually(5*time.Second, func() error {
		if h := holders(t, direct, key); h[gate] != "" {
			return fmt.Errorf("the gate (node %d) still holds the key: holders %q", gate, h)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// QuarantineNotShortByUptimeRounding (issue 18, defect 22): a node
// restarted empty late in a second takes part in no grant before it has been
// up for the max TTL, although Redis rounds its uptime up by then.
func QuarantineNotShortByUptimeRounding(t *testing.T, c Client) {
	const maxTTL = 2 * time.Second
	servers, s := privateNodes(t, c, redlockstore.WithMaxTTL(maxTTL), redlockstore.WithNodeTimeout(300*time.Millisecond))
	ctx := context.Background()
	// Nodes 3 and 4 down: every grant needs node 0.
	servers[3].Kill()
	servers[4].Kill()
	// Restart node 0 late in a wall-clock second, and first reach it
	// early in the next: Redis then reports 1s of uptime for ~0.2s.
	now := time.Now()
	next := now.Truncate(time.Second).Add(800 * time.Millisecond)
	if next.Before(now) {
		next = next.Add(time.Second)
	}
	time.Sleep(time.Until(next))
	restarted := time.Now()
	servers[0].RestartEmpty()
	time.Sleep(time.Until(restarted.Truncate(time.Second).Add(time.Second + 50*time.Millisecond)))
	var granted time.Time
	if err := eventually(3*maxTTL, func() error {
		if _, err := grantOnce(ctx, s, "uptime", 100*time.Millisecond); err != nil {
			return err
		}
		granted = time.Now()
		return nil
	}); err != nil {
		t.Fatalf("no grant after the quarantine: %v", err)
	}
	if up := granted.Sub(restarted); up < maxTTL {
		t.Fatalf("node 0 took part in a grant %v after its restart, before the max TTL %v", up, maxTTL)
	}
}

// Bounds: the Store states its range and refuses arguments out of it
// itself, with ErrInvalid, before it acts.
func Bounds(t *testing.T, c Client) {
	nodes := clients(t, testservers.RedisNodeAddrs(t))
	admit(t, nodes)
	s := newStore(t, c, nodes, redlockstore.WithMaxTTL(30*time.Second))
	b := s.Bounds()
	if b.MaxKeyBytes != redlockstore.MaxKeyBytes || b.MinTTL != redlockstore.MinTTL || b.MaxTTL != 30*time.Second || b.Reason == "" {
		t.Fatalf("Bounds() = %+v", b)
	}
	ctx := context.Background()
	key := uniqueKey("bounds")
	long := strings.Repeat("k", redlockstore.MaxKeyBytes+1)
	for name, err := range map[string]error{
		"Acquire ttl below MinTTL":  func() error { _, err := s.Acquire(ctx, []string{key}, "t", time.Millisecond); return err }(),
		"Acquire ttl above MaxTTL":  func() error { _, err := s.Acquire(ctx, []string{key}, "t", time.Minute); return err }(),
		"Acquire key too long":      func() error { _, err := s.Acquire(ctx, []string{long}, "t", time.Second); return err }(),
		"Refresh ttl below MinTTL":  s.Refresh(ctx, []string{key}, "t", time.Millisecond),
		"Release keep below MinTTL": s.Release(ctx, []string{key}, "t", time.Millisecond),
		"Release keep above MaxTTL": s.Release(ctx, []string{key}, "t", time.Hour),
		"Release key too long":      s.Release(ctx, []string{long}, "t", 0),
	} {
		if !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		} else if len(err.Error()) > 1000 {
			t.Errorf("%s: a %d-byte error message quotes the key", name, len(err.Error()))
		}
	}
	if h := holders(t, nodes, key); strings.Join(h, "") != "" {
		t.Fatalf("a refused call wrote: holders %q", h)
	}
}
