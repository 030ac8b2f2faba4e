package etcdstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// newInternalStore returns a Store on the shared etcd with a prefix of the
// test's own, closed when the test ends.
func newInternalStore(t *testing.T) *Store {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: testservers.EtcdEndpoints(t), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s, err := New(c, WithPrefix("reqlock-test/"+t.Name()+time.Now().Format("150405.000000000")+"/"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// expectAbsent fails the test if any of names exists in etcd.
func expectAbsent(t *testing.T, s *Store, what string, names ...string) {
	t.Helper()
	for _, n := range names {
		resp, err := s.client.Get(t.Context(), n, clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count != 0 {
			t.Fatalf("%s: %s exists", what, n)
		}
	}
}

// undoNow queues the undo of an acquire of keys by token (fair or not)
// that used leases, and waits until it is over.
func undoNow(t *testing.T, s *Store, keys []string, token string, fair bool, leases ...clientv3.LeaseID) {
	t.Helper()
	s.undos.add(s.newUndo(keys, token, fair, &flight{leases: leases}))
	waitUndone(t, s, 10*time.Second)
}

// waitUndone fails the test unless s has no pending undo within limit.
func waitUndone(t *testing.T, s *Store, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for s.PendingUndos() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d undos still pending after %v", s.PendingUndos(), limit)
		}
		time.Sleep(10 * time.Millisecond) // polling the queue
	}
}

// TestLateAcquireAfterItsUndo (issue 18, defect 12): the very transaction
// an abandoned acquire left in flight, applied by etcd after the Store's
// undo (as a member paused past the request timeout may apply it), grants
// nothing: its token's abandon mark fails it while its lease lives, and
// once the lease is gone (the mark with it) its put on the lease fails.
// TestAbandonedAcquireNeverOutlivesItsUndo meets this order in about 1
// acquire in 400; here it is forced.
func TestLateAcquireAfterItsUndo(t *testing.T) {
	t.Parallel()
	s := newInternalStore(t)
	ctx := t.Context()
	keys, token, ttl := []string{"a", "b"}, "t1", time.Minute
	holders := []string{holderKey(s.dir("a")), holderKey(s.dir("b"))}
	lease, err := s.leases.get(ctx, time.Now(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	late := func() (*clientv3.TxnResponse, error) {
		return s.acquireTxn(ctx, holders, []clientv3.Cmp{absent(holders[0]), absent(holders[1])}, token, 1, ttl, lease).Commit()
	}
	undoNow(t, s, keys, token, false, lease)
	resp, err := late()
	if err != nil || resp.Succeeded {
		t.Fatalf("the late acquire after its undo: succeeded %v, %v; want refused by the abandon mark", resp != nil && resp.Succeeded, err)
	}
	expectAbsent(t, s, "after the late acquire", holders...)
	if _, err := s.Acquire(ctx, keys, token, ttl); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("Acquire with the abandoned token: %v; want stores.ErrInvalid", err)
	}
	if g, err := s.Acquire(ctx, keys, "t2", ttl); err != nil || !g.OK {
		t.Fatalf("Acquire by another token: %+v, %v; want granted", g, err)
	}
	if err := s.Release(ctx, keys, "t2", 0); err != nil {
		t.Fatal(err)
	}

	// Once the lease is gone (revoked here, as at its expiry), the mark
	// is gone too, and the late transaction fails on the lease.
	if _, err := s.client.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	expectAbsent(t, s, "after the lease's revocation", s.abandonedKey(token, lease))
	if _, err := late(); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("the late acquire after its lease's end: %v; want %v", err, rpctypes.ErrLeaseNotFound)
	}
	expectAbsent(t, s, "after the late acquire on the lease gone", holders...)
}

// TestLateFairAcquireAfterItsUndo is TestLateAcquireAfterItsUndo for
// AcquireFair, whose transaction puts the holder key on one lease (hl) or,
// when another token holds the key, the queue key on another (ql): each
// lease carries a mark, so neither a grant nor a place in the queue lands
// after the undo, also once one of the leases is gone, and once both are,
// the put fails on its lease.
func TestLateFairAcquireAfterItsUndo(t *testing.T) {
	t.Parallel()
	s := newInternalStore(t)
	ctx := t.Context()
	key, ttl, fairLease := "k", time.Minute, 30*time.Second
	h := holderKey(s.dir(key))
	grant := func(secs int64) clientv3.LeaseID {
		resp, err := s.client.Grant(ctx, secs)
		if err != nil {
			t.Fatal(err)
		}
		return resp.ID
	}
	for _, tc := range []struct {
		name             string
		held             bool // another token holds the key: the late transaction would queue
		revokeH, revokeQ bool // before the late transaction
		wantErr          error
	}{
		{name: "free"},
		{name: "free-hl-gone", revokeH: true},
		{name: "held", held: true},
		{name: "held-hl-gone", held: true, revokeH: true},
		{name: "held-ql-gone", held: true, revokeQ: true},
		{name: "held-both-gone", held: true, revokeH: true, revokeQ: true, wantErr: rpctypes.ErrLeaseNotFound},
	} {
		token := "t-" + tc.name
		qk := queueDir(s.dir(key)) + token
		hl, ql := grant(60), grant(30)
		if tc.held {
			// On a lease of its own (another TTL), which stays.
			if g, err := s.Acquire(ctx, []string{key}, "holder", 2*ttl); err != nil || !g.OK {
				t.Fatalf("%s: Acquire by the holder: %+v, %v", tc.name, g, err)
			}
		}
		undoNow(t, s, []string{key}, token, true, hl, ql)
		for id, revoke := range map[clientv3.LeaseID]bool{hl: tc.revokeH, ql: tc.revokeQ} {
			if !revoke {
				continue
			}
			if _, err := s.client.Revoke(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		resp, err := s.fairTxn(ctx, key, token, 1, ttl, fairLease, hl, ql).Commit()
		switch {
		case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
			t.Fatalf("%s: the late fair acquire after its undo: %v; want %v", tc.name, err, tc.wantErr)
		case tc.wantErr == nil && (err != nil || resp.Succeeded):
			t.Fatalf("%s: the late fair acquire after its undo: succeeded %v, %v; want refused by an abandon mark", tc.name, resp != nil && resp.Succeeded, err)
		}
		expectAbsent(t, s, tc.name+": after the late fair acquire", qk)
		if tc.held {
			if err := s.Release(ctx, []string{key}, "holder", 0); err != nil {
				t.Fatalf("%s: Release by the holder: %v", tc.name, err)
			}
		}
		expectAbsent(t, s, tc.name+": after the late fair acquire", h)
	}
}

// TestAcquireTimedOutIsUndone: an acquire that runs out of the Store's
// request timeout while its caller still waits (etcd stalled) has left its
// transaction in flight just as one whose caller left: the Store queues
// its undo and says so with stores.ErrAbandoned, so that the caller does
// not release the keys itself (a plain release that the late transaction
// could overtake, then to hold the keys for their TTL), and the late
// transaction, applied after the undo, grants nothing.
func TestAcquireTimedOutIsUndone(t *testing.T) {
	t.Parallel()
	s, p, _ := proxiedInternalStore(t, 300*time.Millisecond)
	ctx := t.Context()
	keys, token, ttl := []string{"k"}, "t1", time.Minute
	warmUp(t, s, ttl)
	p.Stall(faultproxy.Both)
	callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	g, err := s.Acquire(callCtx, keys, token, ttl)
	if !errors.Is(err, stores.ErrAbandoned) || !errors.Is(err, context.DeadlineExceeded) || callCtx.Err() != nil {
		t.Fatalf("Acquire that ran out of the request timeout: %+v, %v; want stores.ErrAbandoned", g, err)
	}
	if n := s.PendingUndos(); n != 1 {
		t.Fatalf("%d undos pending after the timed-out Acquire, want 1", n)
	}
	p.Heal()
	waitUndone(t, s, 10*time.Second)
	lease, err := s.leases.get(ctx, time.Now(), ttl) // the lease the acquire used
	if err != nil {
		t.Fatal(err)
	}
	h := holderKey(s.dir(keys[0]))
	resp, err := s.acquireTxn(ctx, []string{h}, []clientv3.Cmp{absent(h)}, token, 1, ttl, lease).Commit()
	if err != nil || resp.Succeeded {
		t.Fatalf("the late acquire after the undo: succeeded %v, %v; want refused by the abandon mark", resp != nil && resp.Succeeded, err)
	}
	expectAbsent(t, s, "after the late acquire", h)
}
