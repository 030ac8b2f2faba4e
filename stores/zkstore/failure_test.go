package zkstore_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/zkstore"
)

// network is a Store's way to its server, which a test can cut (every
// connection closed, new ones refused) or stall (writes wait).
type network struct {
	mu      sync.Mutex
	cut     bool
	conns   []net.Conn
	stalled chan struct{} // closed while writes flow
}

func newNetwork() *network {
	n := &network{stalled: make(chan struct{})}
	close(n.stalled)
	return n
}

func (n *network) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut {
		return nil, errors.New("network cut by the test")
	}
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	n.conns = append(n.conns, c)
	return &stallConn{Conn: c, n: n}, nil
}

// Cut closes every connection and refuses new ones until Heal.
func (n *network) Cut() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut = true
	for _, c := range n.conns {
		_ = c.Close()
	}
	n.conns = nil
}

// Heal lets connections be made again.
func (n *network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut = false
}

// Stall makes writes wait until Flow.
func (n *network) Stall() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stalled = make(chan struct{})
}

// Flow lets stalled writes go.
func (n *network) Flow() {
	n.mu.Lock()
	defer n.mu.Unlock()
	close(n.stalled)
}

type stallConn struct {
	net.Conn
	n *network
}

func (c *stallConn) Write(b []byte) (int, error) {
	c.n.mu.Lock()
	gate := c.n.stalled
	c.n.mu.Unlock()
	<-gate
	return c.Conn.Write(b)
}

// pollUntil calls cond every 10ms until it reports true, and fails the test
// when limit passes first.
func pollUntil(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		<-tick.C
	}
}

// expectSignal fails the test unless ch receives within limit.
func expectSignal(t *testing.T, ch <-chan struct{}, limit time.Duration, what string) {
	t.Helper()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		t.Fatalf("no signal %s within %v", what, limit)
	}
}

// TestSessionExpiryLosesLock: when the holder's session expires behind a
// network cut, the server frees its lock and wakes the other Store's
// waiter; calls on the cut Store return within their context; once the
// network is back, the holder's Refresh returns ErrNotHeld.
func TestSessionExpiryLosesLock(t *testing.T) {
	net := newNetwork()
	holder := newStore(t, zkstore.WithSessionTimeout(time.Second), zkstore.WithDialer(net.dial))
	other := newStore(t)
	ctx := t.Context()
	keys := []string{"k"}
	// The two Stores have roots of their own: share the holder's.
	_ = other
	if g, err := holder.Acquire(ctx, keys, "t1", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	waiter := sameRootStore(t, holder)
	released, stop := waiter.NotifyRelease("k", "w")
	defer stop()
	if g, _ := waiter.Acquire(ctx, keys, "t2", time.Minute); g.OK {
		t.Fatal("the other Store was granted a held key")
	}
	oldSession := holder.SessionID()

	net.Cut()
	callCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	start := time.Now()
	err := holder.Refresh(callCtx, keys, "t1", time.Minute)
	cancel()
	if err == nil || errors.Is(err, stores.ErrNotHeld) || time.Since(start) > time.Second {
		t.Fatalf("Refresh on a cut network: %v after %v, want a store failure within its context", err, time.Since(start))
	}
	expectSignal(t, released, 15*time.Second, "to the other Store's waiter once the holder's session expired")
	if g, err := waiter.Acquire(ctx, keys, "t2", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire after the holder's session expired: %+v, %v", g, err)
	}

	net.Heal()
	pollUntil(t, 15*time.Second, "the holder's Refresh returns ErrNotHeld", func() bool {
		err := holder.Refresh(ctx, keys, "t1", time.Minute)
		t.Log(err)
		return errors.Is(err, stores.ErrNotHeld)
	})
	if holder.SessionID() == oldSession {
		t.Fatal("the holder kept its expired session")
	}
}

// sameRootStore returns a Store with another session on s's root.
func sameRootStore(t *testing.T, s *zkstore.Store) *zkstore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	o, err := zkstore.New(ctx, []string{testservers.ZooKeeperAddr(t)}, zkstore.WithRoot(s.Root()))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = o.Close() })
	return o
}

// TestLockerLosesLockOnSessionExpiry: a reqlock.Lock kept alive over the
// Store loses its context, with ErrLockLost and ErrNotHeld, when the
// Store's session expires.
func TestLockerLosesLockOnSessionExpiry(t *testing.T) {
	net := newNetwork()
	s := newStore(t, zkstore.WithSessionTimeout(time.Second), zkstore.WithDialer(net.dial))
	watcher := sameRootStore(t, s)
	locker, err := reqlock.New(s)
	if err != nil {
		t.Fatal(err)
	}
	lock, err := locker.Obtain(t.Context(), "k", 6*time.Second, 0)
	if err != nil {
		t.Fatalf("Obtain: %v", err)
	}
	held := lock.KeepAlive(t.Context())
	released, stop := watcher.NotifyRelease("reqlock:k", "w") // the Locker's default prefix
	defer stop()
	net.Cut()
	expectSignal(t, released, 15*time.Second, "once the holder's session expired")
	net.Heal()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	select {
	case <-held.Done():
	case <-timer.C:
		t.Fatal("the lock's context did not end after its session expired")
	}
	cause := context.Cause(held)
	if !errors.Is(cause, reqlock.ErrLockLost) || !errors.Is(cause, stores.ErrNotHeld) {
		t.Fatalf("cause %v, want ErrLockLost and ErrNotHeld", cause)
	}
}

// TestAbandonedAcquireIsUndone: an Acquire whose request stalls returns at
// once when its context ends, with ErrAbandoned and the context's error,
// and the grant the request makes once it goes through is released.
func TestAbandonedAcquireIsUndone(t *testing.T) {
	net := newNetwork()
	s := newStore(t, zkstore.WithDialer(net.dial))
	watcher := sameRootStore(t, s)
	released, stop := watcher.NotifyRelease("k", "w")
	defer stop()
	// The watch is set once a release signals: prime it.
	primeSignal(t, watcher, released, "k")

	net.Stall()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	start := time.Now()
	_, err := s.Acquire(ctx, []string{"k"}, "t1", time.Minute)
	cancel()
	if !errors.Is(err, stores.ErrAbandoned) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stalled Acquire: %v, want ErrAbandoned and context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("stalled Acquire returned after %v", d)
	}
	net.Flow()
	expectSignal(t, released, 5*time.Second, "for the undone grant")
	pollUntil(t, 5*time.Second, "the undo finishes", func() bool { return s.InFlight() == 0 })
	if g, err := watcher.Acquire(t.Context(), []string{"k"}, "t2", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire after the undo: %+v, %v", g, err)
	}
}

// primeSignal acquires and releases key on s until ch signals.
func primeSignal(t *testing.T, s *zkstore.Store, ch <-chan struct{}, key string) {
	t.Helper()
	pollUntil(t, 5*time.Second, "a first signal", func() bool {
		if g, err := s.Acquire(t.Context(), []string{key}, "prime", time.Minute); err != nil || !g.OK {
			t.Fatalf("prime Acquire: %+v, %v", g, err)
		}
		if err := s.Release(t.Context(), []string{key}, "prime", 0); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ch:
			return true
		case <-time.After(50 * time.Millisecond):
			return false
		}
	})
}

// TestAbandonedFairWaiterLeavesNoNode: a fair attempt whose request stalls
// returns at once when its context ends, and the queue node it makes once
// the request goes through is deleted.
func TestAbandonedFairWaiterLeavesNoNode(t *testing.T) {
	net := newNetwork()
	s := newStore(t, zkstore.WithDialer(net.dial))
	holder := sameRootStore(t, s)
	if g, err := holder.Acquire(t.Context(), []string{"k"}, "holder", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	net.Stall()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	_, err := s.AcquireFair(ctx, "k", "waiter", time.Minute, time.Minute)
	cancel()
	if !errors.Is(err, stores.ErrAbandoned) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stalled AcquireFair: %v, want ErrAbandoned and context.DeadlineExceeded", err)
	}
	net.Flow()
	pollUntil(t, 5*time.Second, "the undo finishes", func() bool { return s.InFlight() == 0 })
	if q := queueNodes(t, s.Root()+"/k"); len(q) != 0 {
		t.Fatalf("queue nodes left behind: %q", q)
	}
	// Nobody is queued: a try on the released key is granted.
	if err := holder.Release(t.Context(), []string{"k"}, "holder", 0); err != nil {
		t.Fatal(err)
	}
	if g, err := holder.AcquireFair(t.Context(), "k", "try", time.Minute, 0); err != nil || !g.OK {
		t.Fatalf("try after the waiter left: %+v, %v", g, err)
	}
}

// queueNodes lists the queue nodes under parent with a connection of its
// own.
func queueNodes(t *testing.T, parent string) []string {
	t.Helper()
	conn, _, err := zk.Connect([]string{testservers.ZooKeeperAddr(t)}, 10*time.Second, zk.WithLogger(discard{}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	children, _, err := conn.Children(parent)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		t.Fatal(err)
	}
	var q []string
	for _, c := range children {
		if strings.HasPrefix(c, "q-") {
			q = append(q, c)
		}
	}
	return q
}

type discard struct{}

func (discard) Printf(string, ...any) {}
