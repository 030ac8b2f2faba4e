package etcdstore

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// TestUndoOutlivesLeaderChange (issue 18, defect 12, from review): the
// undo of an abandoned acquire retries until etcd answers it, also past
// the end of the acquire's lease by the Store's clock, since a leader
// change renews every lease (to the new leader's time plus the election
// timeout plus the lease's TTL). Here the Store is cut off from etcd (a
// blackhole in front of its member) while the leader is killed, past the
// lease's local end; once the partition heals, the undo lands, and the
// acquire's transaction, should etcd apply it only then (a request held in
// a paused member), grants nothing. An undo that stopped at the lease's
// local end (grant + TTL + 1s) left the late acquire to hold its key, with
// no owner, for a whole renewed lease.
func TestUndoOutlivesLeaderChange(t *testing.T) {
	t.Parallel()
	members := testservers.EtcdCluster(t, 3)
	var eps []string
	for _, m := range members {
		eps = append(eps, "http://"+m.Addr())
	}
	direct := newTestClient(t, eps...)
	ctx := t.Context()
	leader, follower := -1, -1
	for i, ep := range eps {
		st, err := direct.Status(ctx, ep)
		if err != nil {
			t.Fatal(err)
		}
		if st.Leader == st.Header.MemberId {
			leader = i
		} else if follower < 0 {
			follower = i
		}
	}
	if leader < 0 || follower < 0 {
		t.Fatalf("no leader and follower among %d members", len(eps))
	}
	p := faultproxy.New(t, members[follower].Addr())
	prefix := "undo-leader/"
	s, err := New(newTestClient(t, "http://"+p.Addr()), WithPrefix(prefix), WithRequestTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Heal()
		_ = s.Close()
	})

	keys, token, ttl := []string{"k"}, "t-late", 2*time.Second
	granted := time.Now()
	lease, err := s.leases.get(ctx, granted, ttl)
	if err != nil {
		t.Fatal(err)
	}
	// By the Store's clock, the lease is surely gone by then.
	localEnd := granted.Add(time.Duration(leaseSeconds(ttl))*time.Second + time.Second)

	p.Blackhole(faultproxy.Both)
	s.undos.add(s.newUndo(keys, token, false, &flight{leases: []clientv3.LeaseID{lease}}))
	<-time.After(time.Until(localEnd.Add(-2 * time.Second))) // the partition's first part
	members[leader].Kill()
	<-time.After(time.Until(localEnd.Add(500 * time.Millisecond))) // the partition past the lease's local end
	if ttl, err := direct.TimeToLive(ctx, lease); err != nil || ttl.TTL <= 0 {
		t.Fatalf("lease %x past its local end: %+v, %v; the test needs the new leader to have renewed it", lease, ttl, err)
	}
	if s.PendingUndos() != 1 {
		t.Fatalf("%d undos pending past the lease's local end, want 1: it gave up on the local clock", s.PendingUndos())
	}
	p.Heal()
	waitUndone(t, s, 10*time.Second)

	// The acquire the undo was about, applied now.
	h := holderKey(s.dir(keys[0]))
	late := &Store{kv: direct, prefix: prefix}
	resp, err := late.acquireTxn(ctx, []string{h}, []clientv3.Cmp{absent(h)}, token, 1, ttl, lease).Commit()
	if err != nil {
		t.Fatalf("the late acquire: %v", err)
	}
	if ttl, err := direct.TimeToLive(ctx, lease); err != nil || ttl.TTL <= 0 {
		t.Fatalf("lease %x when the late acquire landed: %+v, %v; the test needs it alive", lease, ttl, err)
	}
	if resp.Succeeded {
		t.Fatalf("the late acquire landed after its undo and holds %q on a lease renewed by the leader change", keys[0])
	}
	expectAbsent(t, s, "after the late acquire", h)
}

// newTestClient returns a client of endpoints, closed when the test ends.
func newTestClient(t *testing.T, endpoints ...string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestUndoRidesOutLeaderKill (issue 19, item 5): an undo sent through a
// follower as the leader is killed is forwarded to the dead leader and
// never answered; the undo queue sends it again after a short bound, so it
// lands once a new leader is elected (its first try used to wait for the
// whole request timeout, 5s, while the abandoned acquire's key stayed
// held).
func TestUndoRidesOutLeaderKill(t *testing.T) {
	t.Parallel()
	members := testservers.EtcdCluster(t, 3)
	direct := newTestClient(t, "http://"+members[0].Addr(), "http://"+members[1].Addr(), "http://"+members[2].Addr())
	leader, follower := -1, -1
	for i, m := range members {
		st, err := direct.Status(t.Context(), "http://"+m.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if st.Leader == st.Header.MemberId {
			leader = i
		} else if follower < 0 {
			follower = i
		}
	}
	if leader < 0 || follower < 0 {
		t.Fatalf("no leader and follower among %d members", len(members))
	}
	s, err := New(newTestClient(t, "http://"+members[follower].Addr()), WithPrefix("undo-kill/"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	keys, token, ttl := []string{"k"}, "t-abandoned", 20*time.Second
	var fl flight
	if g, err := s.acquire(t.Context(), time.Now(), 1, keys, token, ttl, &fl, nil); err != nil || !g.OK {
		t.Fatalf("acquire: %+v, %v", g, err)
	}
	members[leader].Kill()
	killed := time.Now()
	s.undos.add(s.newUndo(keys, token, false, &fl))
	waitUndone(t, s, 4*time.Second)
	t.Logf("undo landed %v after the leader's kill", time.Since(killed).Round(time.Millisecond))
	expectAbsent(t, s, "after the undo", holderKey(s.dir(keys[0])))
}
