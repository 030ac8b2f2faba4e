package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/etcdstore"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// abandonAcquires makes n acquires of keys k00, k01, ... on s, each
// abandoned by its caller after 100ms, and returns how many returned
// stores.ErrAbandoned (on a loaded machine a context may end before its
// call is sent, which changes nothing).
func abandonAcquires(t *testing.T, s *etcdstore.Store, n int, ttl time.Duration) int {
	t.Helper()
	var abandoned atomic.Int64
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
			defer cancel()
			_, err := s.Acquire(ctx, []string{fmt.Sprintf("k%02d", i)}, fmt.Sprintf("t%02d", i), ttl)
			switch {
			case errors.Is(err, stores.ErrAbandoned):
				abandoned.Add(1)
			case !errors.Is(err, context.DeadlineExceeded):
				t.Errorf("Acquire on a stalled etcd: %v; want stores.ErrAbandoned", err)
			}
		})
	}
	wg.Wait()
	return int(abandoned.Load())
}

// warm makes s's lease of ttl and its connection ready, so that what a
// fault holds back is the transactions; tried again while a loaded machine
// makes a short request timeout run out.
func warm(t *testing.T, s *etcdstore.Store, ttl time.Duration) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		tok := fmt.Sprintf("warm%d", i)
		g, err := s.Acquire(t.Context(), []string{"warm"}, tok, ttl)
		if err == nil && g.OK {
			if err := s.Release(t.Context(), []string{"warm"}, tok, 0); err != nil {
				t.Fatal(err)
			}
			return
		}
		for s.PendingUndos() > 0 { // of a warm-up that timed out
			if time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond) // polling the undo queue
		}
		if time.Now().After(deadline) {
			t.Fatalf("warm-up Acquire: %+v, %v", g, err)
		}
	}
}

// TestCloseDuringStallReportsAbandoned (issue 18, from review): Close
// while etcd does not answer returns within twice the request timeout,
// and says how many abandoned acquires may still be granted: it neither
// got their undo nor the revocation of their leases through. It used to
// cancel the undos first, rely on the revocation, and return only the
// revocation's timeout, while those acquires, applied by etcd once it
// answered again, held their keys for their whole TTL.
func TestCloseDuringStallReportsAbandoned(t *testing.T) {
	t.Parallel()
	const timeout = 400 * time.Millisecond
	s, p := proxiedStore(t, etcdstore.WithRequestTimeout(timeout), etcdstore.WithPrefix("reqlock-test/"+uniqueKey(t)+"/"))
	warm(t, s, time.Minute)
	p.Stall(faultproxy.Both)
	t.Cleanup(p.Heal)
	n := abandonAcquires(t, s, 30, time.Minute)
	start := time.Now()
	err := s.Close()
	took := time.Since(start)
	if limit := 2*timeout + time.Second; took > limit {
		t.Errorf("Close with etcd stalled took %v, want at most twice the request timeout (%v) and a second", took, timeout)
	}
	if want := fmt.Sprintf("%d abandoned acquires", n); !errors.Is(err, etcdstore.ErrUndoPending) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Close with etcd stalled and %d acquires abandoned: %v; want etcdstore.ErrUndoPending saying %q", n, err, want)
	}
}

// TestCloseDuringStallThatHeals: Close while etcd stalls, and answers
// again within Close's time, undoes every abandoned acquire (or revokes
// its lease): no key is held after Close returned nil.
func TestCloseDuringStallThatHeals(t *testing.T) {
	t.Parallel()
	const timeout = time.Second
	prefix := "reqlock-test/" + uniqueKey(t) + "/"
	s, p := proxiedStore(t, etcdstore.WithRequestTimeout(timeout), etcdstore.WithPrefix(prefix))
	warm(t, s, time.Minute)
	p.Stall(faultproxy.Both)
	n := abandonAcquires(t, s, 30, time.Minute)
	time.AfterFunc(timeout+timeout/2, p.Heal) // the stall's end, within Close's second request timeout
	if err := s.Close(); err != nil {
		t.Fatalf("Close with etcd stalled and %d acquires abandoned, healed within its time: %v", n, err)
	}
	expectHoldersGone(t, newClient(t, testservers.EtcdEndpoints(t)), prefix, 0, "right after Close")
}

// TestCloseRevokesLeaseGrantedMeanwhile: a lease whose grant is in flight
// when Close begins (for a Refresh to a TTL the Store has no lease for)
// is revoked too: Close waits for the grant. It used to be missed, and
// the Refresh could put its key on it.
func TestCloseRevokesLeaseGrantedMeanwhile(t *testing.T) {
	t.Parallel()
	s, p := proxiedStore(t)
	direct := newClient(t, testservers.EtcdEndpoints(t))
	k := []string{uniqueKey(t)}
	if g, err := s.Acquire(t.Context(), k, "t1", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	const ttl = 777 * time.Second // a lease of 875s, this test's own
	// The grant's request: a TTL (field 1) of 875, as a varint.
	grants := p.Count(faultproxy.ToServer, []byte{0x08, 0xeb, 0x06})
	p.Delay(faultproxy.Both, 300*time.Millisecond)
	refreshed := make(chan error, 1)
	go func() { refreshed <- s.Refresh(t.Context(), k, "t1", ttl) }()
	deadline := time.Now().Add(10 * time.Second)
	for grants() == 0 { // Close once the grant reached etcd, before its answer
		if time.Now().After(deadline) {
			t.Fatal("the lease grant did not reach etcd within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	_ = s.Close()
	<-refreshed
	leases, err := direct.Leases(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases.Leases {
		resp, err := direct.TimeToLive(t.Context(), l.ID)
		if err == nil && resp.GrantedTTL == 875 {
			t.Fatalf("lease %x of 875s, granted as Close began, outlives Close (%ds left)", l.ID, resp.TTL)
		}
	}
	if g, err := newStore(t).Acquire(t.Context(), k, "t2", time.Second); err != nil || !g.OK {
		t.Fatalf("Acquire after the holder's Store closed: %+v, %v; want granted", g, err)
	}
}
