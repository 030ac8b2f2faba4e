package etcdstore

import (
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/reqlock/reqlock/stores"
)

// TestLateRefreshCannotShortenALaterOne (issue 18, from review): a Refresh
// R1 whose request is held up in the network (built as Refresh builds it
// at its start s1, sent later) reaches etcd after a later Refresh R2 (or a
// Release with keep) of the same grant succeeded. R1 still finds the
// token, and used to move the keys back to its own lease, which lasts from
// s1, so that they expired before the validity the Locker confirmed from
// R2 (s2 plus the TTL): another process could then take them while the
// holder still worked. Each holder key now keeps the sequence of the call
// that set it, and R1, older, changes nothing.
func TestLateRefreshCannotShortenALaterOne(t *testing.T) {
	t.Parallel()
	s := newInternalStore(t)
	ctx := t.Context()
	const ttl = 4 * time.Second // a lease of 5s
	refreshed, kept := []string{"refreshed"}, []string{"kept"}
	for _, k := range [][]string{refreshed, kept} {
		if g, err := s.Acquire(ctx, k, "t-"+k[0], ttl); err != nil || !g.OK {
			t.Fatalf("Acquire of %s: %+v, %v", k[0], g, err)
		}
	}
	// R1 of each key, as Refresh builds them at s1.
	s1, seq1 := s.begin()
	lease1, err := s.leases.get(ctx, s1, ttl)
	if err != nil {
		t.Fatal(err)
	}
	late := func(k []string) clientv3.Txn {
		return s.refreshTxn(ctx, []string{holderKey(s.dir(k[0]))}, holderValue("t-"+k[0], seq1, ttl), "t-"+k[0], seq1, lease1)
	}
	r1Refreshed, r1Kept := late(refreshed), late(kept)
	<-time.After(ttl / 2) // R1 held up in the network
	s2 := time.Now()
	if err := s.Refresh(ctx, refreshed, "t-refreshed", ttl); err != nil {
		t.Fatalf("R2: %v", err)
	}
	if err := s.Release(ctx, kept, "t-kept", ttl); err != nil {
		t.Fatalf("Release with keep: %v", err)
	}
	for name, r1 := range map[string]clientv3.Txn{"refreshed": r1Refreshed, "kept": r1Kept} {
		resp, err := r1.Commit()
		if err != nil {
			t.Fatalf("the late R1 of %s: %v", name, err)
		}
		if resp.Succeeded {
			t.Errorf("the late R1 of %s changed the key after a later call", name)
		}
	}
	// Both keys stay held until s2 plus the TTL; R1's lease ends about
	// 1.5s before.
	<-time.After(time.Until(s2.Add(ttl - 100*time.Millisecond))) // the later call's validity itself
	for _, k := range [][]string{refreshed, kept} {
		resp, err := s.client.Get(ctx, holderKey(s.dir(k[0])), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count != 1 {
			t.Errorf("%s expired %v after the later call's start, before its TTL %v", k[0], time.Since(s2).Round(time.Millisecond), ttl)
		}
	}
}

// TestOvertakenRefresh: a Refresh that finds its keys set by a later call
// of its token returns nil when that call keeps them at least as long as
// it would have, ErrOvertaken (a store failure, not stores.ErrNotHeld)
// when not, and stores.ErrNotHeld when a key does not hold the token.
func TestOvertakenRefresh(t *testing.T) {
	t.Parallel()
	s := newInternalStore(t)
	ctx := t.Context()
	keys, token := []string{"a", "b"}, "t1"
	if g, err := s.Acquire(ctx, keys, token, time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	start, older := s.begin()
	if err := s.Refresh(ctx, keys, token, 30*time.Second); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	if err := s.refresh(ctx, start, older, keys, s.holderKeys(keys), token, 20*time.Second); err != nil {
		t.Errorf("an older Refresh to 20s after a later one to 30s: %v; want nil", err)
	}
	if err := s.refresh(ctx, start, older, keys, s.holderKeys(keys), token, 40*time.Second); !errors.Is(err, ErrOvertaken) || errors.Is(err, stores.ErrNotHeld) || errors.Is(err, stores.ErrInvalid) {
		t.Errorf("an older Refresh to 40s after a later one to 30s: %v; want ErrOvertaken", err)
	}
	if err := s.Release(ctx, keys[1:], token, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.refresh(ctx, start, older, keys, s.holderKeys(keys), token, 20*time.Second); !errors.Is(err, stores.ErrNotHeld) {
		t.Errorf("an older Refresh with a key released: %v; want stores.ErrNotHeld", err)
	}
	// A Release with keep refused by a later call's sequence.
	_, oldest := s.begin()
	if err := s.Refresh(ctx, keys[:1], token, time.Minute); err != nil {
		t.Fatal(err)
	}
	release := func(keep time.Duration) error {
		return s.release(ctx, time.Now(), oldest, keys[:1], s.holderKeys(keys[:1]), true, token, keep)
	}
	if err := release(2 * time.Minute); !errors.Is(err, ErrOvertaken) {
		t.Errorf("an older Release keeping 2m after a Refresh to 1m: %v; want ErrOvertaken", err)
	}
	if err := release(30 * time.Second); err != nil {
		t.Errorf("an older Release keeping 30s after a Refresh to 1m: %v; want nil", err)
	}
}
