package redlocktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redlockstore"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// RetryingClientNotUnreachable: on clients that retry a command
// (go-redis's default MaxRetries), an acquire whose request reached every
// node before its connection was cut, and whose client's retry then found
// the nodes refusing connections, may have granted: it is not
// ErrUnreachable, and the Store undoes it once the nodes can be reached.
func RetryingClientNotUnreachable(t *testing.T, c Client) {
	if !c.Retries {
		t.Skipf("%s sends a script once: there is no retry to find the nodes refusing", c.Name)
	}
	addrs := testservers.RedisNodeAddrs(t)
	direct := clients(t, addrs)
	admit(t, direct)
	proxies := make([]*faultproxy.Proxy, len(addrs))
	nodes := make([]redis.Scripter, len(addrs))
	for i, a := range addrs {
		proxies[i] = faultproxy.New(t, a)
		// One connection, which the cut closes: a retry must dial.
		c := redis.NewClient(&redis.Options{Addr: proxies[i].Addr(), ContextTimeoutEnabled: true, PoolSize: 1}) // retries 3 times
		t.Cleanup(func() { _ = c.Close() })
		nodes[i] = c
	}
	s := newStore(t, c, nodes)
	warm(t, s)
	ctx := context.Background()
	key := uniqueKey("retrying-client")
	for _, p := range proxies {
		p.Refuse()
		p.CutWhen(faultproxy.ToServer, func(chunk []byte) bool { return bytes.Contains(chunk, []byte(key)) }, true)
	}
	_, err := s.Acquire(ctx, []string{key}, "t", 10*time.Second)
	if err == nil || errors.Is(err, stores.ErrUnreachable) {
		t.Fatalf("Acquire whose requests reached the nodes: %v; want a failure, not ErrUnreachable", err)
	}
	if h := holders(t, direct, key); strings.Count(strings.Join(h, ","), "t") != len(h) {
		t.Fatalf("the requests did not reach every node: holders %q", h)
	}
	for _, p := range proxies {
		p.Heal()
	}
	if err := eventually(3*time.Second, func() error {
		if h := holders(t, direct, key); strings.Join(h, "") != "" {
			return errors.New("held: " + strings.Join(h, ","))
		}
		return nil
	}); err != nil {
		t.Fatalf("after the heal, the failed Acquire still holds the key: %v", err)
	}
}

// UnreachableOnlyWhenNoNodeReached: an Acquire that 3 of 5 nodes fail
// to take (their connections refused) and the other 2 refuse (held by
// another token) reached nodes: a store failure, but not ErrUnreachable,
// which says that the call never reached the store.
func UnreachableOnlyWhenNoNodeReached(t *testing.T, c Client) {
	s, proxies, direct := proxiedNodes(t, c, redlockstore.WithNodeTimeout(time.Second))
	warm(t, s)
	ctx := context.Background()
	key := uniqueKey("reached")
	for _, n := range direct[3:] {
		if err := n.(*redis.Client).Set(ctx, key, "other", 10*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range proxies[:3] {
		p.Refuse()
		p.Cut()
	}
	g, err := s.Acquire(ctx, []string{key}, "t", 10*time.Second)
	if !errors.Is(err, redlockstore.ErrNoQuorum) || errors.Is(err, stores.ErrUnreachable) {
		t.Fatalf("Acquire with 3 nodes refusing connections and 2 held: %+v, %v; want ErrNoQuorum, not ErrUnreachable", g, err)
	}
}

// ContextEndedDuringProbeSendsNothing: a first Acquire whose context
// ends while it waits for the nodes' identities (one node cut off) returns
// the context's error, sends no acquire, and owes nothing.
func ContextEndedDuringProbeSendsNothing(t *testing.T, c Client) {
	s, proxies, _ := proxiedNodes(t, c, redlockstore.WithNodeTimeout(2*time.Second))
	key := uniqueKey("probe-ctx")
	counts := make([]func() int, len(proxies))
	for i, p := range proxies {
		counts[i] = p.Count(faultproxy.ToServer, []byte(key))
	}
	proxies[4].Blackhole(faultproxy.Both)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := s.Acquire(ctx, []string{key}, "t", 10*time.Second)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, stores.ErrAbandoned) {
		t.Fatalf("Acquire whose context ended during the probe: %v; want context.DeadlineExceeded, not ErrAbandoned", err)
	}
	for i, st := range s.NodeStats() {
		if n := counts[i](); n != 0 || st.Owed != 0 {
			t.Errorf("node %d: %d requests carrying the key, %d releases owed; want none", i, n, st.Owed)
		}
	}
}

// UncertainRefreshForgotten: the Store forgets that a Refresh call's
// outcome was unknown (which a Release of the lock would need) once the
// refresh's TTL has passed, also when the lock is never released: the
// states of such tokens do not pile up.
func UncertainRefreshForgotten(t *testing.T, c Client) {
	if c.Pipelined {
		// The next lock's Acquire goes on the connection the heal cut
		// before the client noticed, fails on node 4, and its Refresh
		// then leaves node 4 out: fewer Refreshes of unknown outcome.
		t.Skipf("%s pipelines: the heal's cut fails the next call of node 4 (see Client.Pipelined)", c.Name)
	}
	// A TTL that outlasts the loop on a loaded machine: no state may be
	// swept before every Refresh is done.
	const locks, ttl = 5, 3 * time.Second
	s, proxies, _ := proxiedNodes(t, c, redlockstore.WithNodeTimeout(100*time.Millisecond))
	warm(t, s)
	ctx := context.Background()
	for i := range locks {
		key, token := uniqueKey("uncertain"), fmt.Sprintf("t%d", i)
		if g, err := s.Acquire(ctx, []string{key}, token, ttl); err != nil || !g.OK {
			t.Fatalf("Acquire: %+v, %v", g, err)
		}
		proxies[4].Blackhole(faultproxy.Both)
		if err := s.Refresh(ctx, []string{key}, token, ttl); err != nil {
			t.Fatalf("Refresh with node 4 cut off: %v", err)
		}
		proxies[4].Heal()
	}
	if n := tokenStates(s); n != locks {
		t.Fatalf("%d token states after %d Refreshes of unknown outcome on node 4, want %d", n, locks, locks)
	}
	// Once the TTL has passed, the next Refresh sweeps them.
	if err := eventually(3*ttl, func() error {
		key := uniqueKey("sweeper")
		if g, err := s.Acquire(ctx, []string{key}, "sweeper", time.Second); err != nil || !g.OK {
			return fmt.Errorf("Acquire: %+v, %v", g, err)
		}
		defer func() { _ = s.Release(ctx, []string{key}, "sweeper", 0) }()
		if err := s.Refresh(ctx, []string{key}, "sweeper", time.Second); err != nil {
			return err
		}
		if n := tokenStates(s); n > 1 {
			return fmt.Errorf("%d token states", n)
		}
		return nil
	}); err != nil {
		t.Fatalf("the states of locks whose TTL has passed are kept: %v", err)
	}
}

// UnidentifiedNodeDoesNotVote: a second address of one server that
// could not be reached when the Store asked the nodes for their run_ids
// (issue 18, defect 5) must not count as a second vote once it answers:
// with the third node down, that server alone grants nothing, and the
// duplicate is found.
func UnidentifiedNodeDoesNotVote(t *testing.T, c Client) {
	addrs := testservers.RedisNodeAddrs(t)
	alias, third := faultproxy.New(t, addrs[0]), faultproxy.New(t, addrs[1])
	nodes := clients(t, []string{addrs[0], alias.Addr(), third.Addr()})
	admit(t, nodes)
	s := newStore(t, c, nodes, redlockstore.WithNodeTimeout(time.Second))
	ctx := context.Background()
	alias.Refuse()
	alias.Cut()
	if _, err := grantOnce(ctx, s, uniqueKey("first"), time.Second); err != nil {
		t.Fatalf("the first lock, with the alias refusing connections: %v", err)
	}
	alias.Heal()
	third.Refuse()
	third.Cut()
	g, err := s.Acquire(ctx, []string{uniqueKey("alone")}, "t", time.Second)
	if err == nil && g.OK {
		t.Fatal("one server under two addresses granted the lock alone")
	}
	if err := eventually(5*time.Second, func() error {
		_, err := s.Acquire(ctx, []string{uniqueKey("found")}, "t2", time.Second)
		if !errors.Is(err, redlockstore.ErrDuplicateNode) {
			return fmt.Errorf("Acquire: %v, want ErrDuplicateNode", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// RefreshOnFreshStore: a Store that never acquired (another Store of
// the process did) renews a lock: its first Refresh learns the nodes'
// identities, whose grants then count.
func RefreshOnFreshStore(t *testing.T, c Client) {
	nodes := clients(t, testservers.RedisNodeAddrs(t))
	admit(t, nodes)
	a, b := newStore(t, c, nodes), newStore(t, c, nodes)
	ctx := context.Background()
	key := uniqueKey("fresh-refresh")
	if g, err := a.Acquire(ctx, []string{key}, "t", 10*time.Second); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	if err := b.Refresh(ctx, []string{key}, "t", 10*time.Second); err != nil {
		t.Fatalf("Refresh by a Store that never acquired: %v", err)
	}
	if err := b.Release(ctx, []string{key}, "t", 0); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// RefreshAfterCancelledReleaseWritesNothing: a Release whose context is
// cancelled while its calls are on their way (held back 500ms) returns, but
// the token stays ended until the calls are in: a Refresh started then
// writes nothing, and does not re-take a node behind the Release.
func RefreshAfterCancelledReleaseWritesNothing(t *testing.T, c Client) {
	s, proxies, direct, key := heldButNode4Lost(t, c, 3*time.Second, "cancelled-release", "t")
	ctx := context.Background()
	var answered []<-chan struct{}
	for _, p := range proxies[:4] {
		answered = append(answered, p.DelayNextRequest(500*time.Millisecond))
	}
	rctx, cancel := context.WithCancel(ctx)
	released := make(chan error, 1)
	go func() { released <- s.Release(rctx, []string{key}, "t", 0) }()
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
	cancel()
	if err := <-released; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled Release: %v, want context.Canceled", err)
	}
	err := s.Refresh(ctx, []string{key}, "t", 10*time.Second)
	t.Logf("the Refresh after the cancelled Release: %v", err)
	for _, ch := range answered {
		<-ch
	}
	freeSoon(t, direct, key, "the cancelled Release")
}

// NoGoroutineLeftAfterClose: after a Store has granted, renewed,
// refused, released and notified, with calls to a node it cannot reach still
// out, and owes clean-up to that node, Close ends every goroutine it started.
func NoGoroutineLeftAfterClose(t *testing.T, c Client) {
	addrs := testservers.RedisNodeAddrs(t)
	direct := clients(t, addrs)
	admit(t, direct)
	proxies := make([]*faultproxy.Proxy, len(addrs))
	for i, a := range addrs {
		proxies[i] = faultproxy.New(t, a)
	}
	baseline := runtime.NumGoroutine()
	nodes := make([]*redis.Client, len(addrs))
	scripters := make([]redis.Scripter, len(addrs))
	for i, p := range proxies {
		nodes[i] = redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
		scripters[i] = nodes[i]
	}
	s, closeClients, err := c.New(t, scripters, redlockstore.WithNodeTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := uniqueKey("leak")
	if g, err := s.Acquire(ctx, []string{key}, "t", 10*time.Second); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	if g, err := s.Acquire(ctx, []string{key}, "w", 10*time.Second); err != nil || g.OK {
		t.Fatalf("a waiter's Acquire: %+v, %v; want a refusal", g, err)
	}
	released, stop := s.NotifyRelease(key, "w")
	if err := s.Refresh(ctx, []string{key}, "t", 10*time.Second); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	proxies[4].Blackhole(faultproxy.Both)
	if err := s.Release(ctx, []string{key}, "t", 0); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if released != nil {
		select {
		case <-released:
		case <-time.After(time.Second): // a signal may be lost; no matter here
		}
	}
	stop()
	// A grant whose call to the cut-off node is still out as Acquire
	// returns: its reply is settled in the background.
	if g, err := s.Acquire(ctx, []string{uniqueKey("leak-late")}, "a", 10*time.Second); err != nil || !g.OK {
		t.Fatalf("Acquire with node 4 cut off: %+v, %v", g, err)
	}
	// The Release returned once the others answered; its call to the
	// cut-off node times out, and the Store owes it.
	if err := eventually(5*time.Second, func() error {
		if st := s.NodeStats()[4]; st.Owed == 0 {
			return errors.New("nothing owed to the cut-off node")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, n := range nodes {
		_ = n.Close()
	}
	closeClients()
	proxies[4].Heal()
	if err := eventually(5*time.Second, func() error {
		// The proxies serve open connections with goroutines of their
		// own; the clients are closed, so those end too.
		if n := runtime.NumGoroutine(); n > baseline {
			return fmt.Errorf("%d goroutines, %d before the Store", n, baseline)
		}
		return nil
	}); err != nil {
		buf := make([]byte, 1<<20)
		t.Fatalf("%v\n%s", err, buf[:runtime.Stack(buf, true)])
	}
}
