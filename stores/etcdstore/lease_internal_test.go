package etcdstore

import (
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// TestFairLeaseNotFoundKeepsQueueLease (issue 18, from review): when the
// holder lease of a fair attempt is gone (expired in flight, or revoked)
// while its queue lease lives, the Store stops sharing both but keeps both
// among its leases, so Close still revokes the queue lease and the places
// on it. It used to forget the queue lease, whose waiters then kept their
// places for its whole TTL after Close.
func TestFairLeaseNotFoundKeepsQueueLease(t *testing.T) {
	t.Parallel()
	s := newInternalStore(t)
	ctx := t.Context()
	ttl, lease := time.Minute, 30*time.Second
	if g, err := s.Acquire(ctx, []string{"held"}, "holder", 2*time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	if g, err := s.AcquireFair(ctx, "held", "w1", ttl, lease); err != nil || g.OK {
		t.Fatalf("AcquireFair behind the holder: %+v, %v; want queued", g, err)
	}
	hl, err := s.leases.get(ctx, time.Now(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	ql, err := s.leases.get(ctx, time.Now(), lease)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.Revoke(ctx, hl); err != nil { // gone early
		t.Fatal(err)
	}
	if g, err := s.AcquireFair(ctx, "free", "w2", ttl, lease); err != nil || !g.OK {
		t.Fatalf("AcquireFair of a free key with its holder lease gone: %+v, %v; want granted", g, err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	resp, err := s.client.TimeToLive(ctx, ql)
	if err != nil {
		t.Fatal(err)
	}
	if resp.TTL > 0 {
		t.Fatalf("the queue lease %x outlives Close (%ds left): w1 keeps its place", ql, resp.TTL)
	}
	expectAbsent(t, s, "after Close", queueDir(s.dir("held"))+"w1")
}

// TestMaxTTLSharesLeases (issue 18, from review): calls of MaxTTL share a
// lease as calls of other TTLs do: MaxTTL leaves the lease its margin of
// an eighth below etcd's longest lease. At etcd's longest lease itself, a
// lease served only the calls that began before its grant was sent: each
// call granted one more 285-year lease, kept in etcd until Close.
func TestMaxTTLSharesLeases(t *testing.T) {
	t.Parallel()
	s := newInternalStore(t)
	ctx := t.Context()
	if got := leaseSeconds(MaxTTL); got != maxLeaseSeconds {
		t.Errorf("MaxTTL's lease is %ds, want etcd's longest, %ds", got, maxLeaseSeconds)
	}
	const n = 20
	for i := range n {
		k, tok := []string{fmt.Sprintf("k%d", i%2)}, fmt.Sprintf("t%d", i)
		if g, err := s.Acquire(ctx, k, tok, MaxTTL); err != nil || !g.OK {
			t.Fatalf("Acquire of MaxTTL: %+v, %v", g, err)
		}
		if err := s.Release(ctx, k, tok, 0); err != nil {
			t.Fatal(err)
		}
	}
	s.leases.mu.Lock()
	granted := len(s.leases.granted)
	s.leases.mu.Unlock()
	if granted > 2 {
		t.Errorf("%d sequential acquires of MaxTTL granted %d leases; want them shared", n, granted)
	}
}

// TestTooManyOpsIsInvalid: etcd's refusal of a transaction with more
// operations than its --max-txn-ops (a cluster with a limit below the
// default 128 refuses MaxKeys keys; here the default refuses a larger
// transaction) is stores.ErrInvalid, as etcd acted on nothing.
func TestTooManyOpsIsInvalid(t *testing.T) {
	t.Parallel()
	s := newInternalStore(t)
	ops := make([]clientv3.Op, 129)
	for i := range ops {
		ops[i] = clientv3.OpGet(fmt.Sprintf("%sk%d", s.prefix, i))
	}
	_, err := s.kv.Txn(t.Context()).Then(ops...).Commit()
	if err == nil {
		t.Fatal("etcd took a transaction of 129 operations; the test needs its default --max-txn-ops")
	}
	if err := s.failed("acquire", []string{"k"}, err); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("a transaction of too many operations: %v; want stores.ErrInvalid", err)
	}
}

// TestUnusedHedgedGrantsRevoked: while etcd answers slowly (every reply
// 1.2s late), one Acquire's lease grant is joined by another every bound;
// the first answer serves the call, and the grants answered after it
// serve none. Each is a lease of the TTL asked (here 60s) that etcd would
// keep for that TTL, since the pool revokes a lease only once spent, or
// at Close: it is revoked as soon as it is answered.
func TestUnusedHedgedGrantsRevoked(t *testing.T) {
	s, p, _ := proxiedInternalStore(t, 5*time.Second)
	ctx := t.Context()
	warmUp(t, s, 2*time.Second) // the connection up, and no lease of 60s yet
	p.Delay(faultproxy.ToClient, 1200*time.Millisecond)
	const ttl = 60 * time.Second
	g, err := s.Acquire(ctx, []string{"k"}, "tok", ttl)
	p.Heal()
	if err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	// Every grant answered, and its revocation (each within the request
	// timeout).
	done := make(chan struct{})
	go func() { s.leases.grants.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("grants still in flight after 15s")
	}
	s.leases.mu.Lock()
	var ids []clientv3.LeaseID
	for id := range s.leases.granted {
		ids = append(ids, id)
	}
	s.leases.mu.Unlock()
	alive := 0
	for _, id := range ids {
		resp, err := s.client.TimeToLive(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if resp.TTL > 30 { // a lease of the 60s bucket
			alive++
		}
	}
	t.Logf("leases known: %d; of 60s alive: %d", len(ids), alive)
	if alive != 1 {
		t.Errorf("%d leases of 60s alive in etcd for one Acquire (want 1: the others served no call)", alive)
	}
	// The lease that serves the key is alive, and serves the next call.
	if err := s.Refresh(ctx, []string{"k"}, "tok", ttl); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
}
