package etcdstore_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/etcdstore"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// fencedStock is the protected resource of the failure test: a stock that
// sellers decrement without atomicity (read, work, write), through a write
// that, like a database's "update ... where last_fence < my_fence", refuses
// a fence below the last one it accepted. Overlapping holders show up as
// more sales than the stock went down by.
type fencedStock struct {
	mu        sync.Mutex // the protected store's own atomicity, for the write only
	stock     int64
	lastFence int64
	sold      int64
	stale     int64 // writes refused for their fence

	third     chan struct{} // closed once a third of initial is sold
	thirdOnce sync.Once
	initial   int64
}

func (f *fencedStock) read() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stock
}

// write sets the stock to v unless fence is below the last accepted one.
func (f *fencedStock) write(v, fence int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fence < f.lastFence {
		f.stale++
		return false
	}
	f.stock, f.lastFence = v, fence
	f.sold++
	if f.sold >= f.initial/3 {
		f.thirdOnce.Do(func() { close(f.third) })
	}
	return true
}

// TestClusterMemberKilledUnderLoad: sellers in two processes (two Lockers,
// each on a Store with its own client to all three members of a private
// cluster) sell a fenced stock under the lock; the leader, which every
// client talks to, is killed in the middle. No sale is lost or doubled
// (sold equals what the stock went down by, never below zero), sales go on
// after the kill without anyone's help, and no lock is left behind.
func TestClusterMemberKilledUnderLoad(t *testing.T) {
	t.Parallel()
	members := testservers.EtcdCluster(t, 3)
	endpoints := make([]string, len(members))
	for i, m := range members {
		endpoints[i] = "http://" + m.Addr()
	}
	lockers := make([]*reqlock.Locker, 2)
	var store *etcdstore.Store
	for i := range lockers {
		s, err := etcdstore.New(newClient(t, endpoints), etcdstore.WithRequestTimeout(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		store = s
		if lockers[i], err = reqlock.New(s); err != nil {
			t.Fatal(err)
		}
	}

	const initial, sellers = 300, 8
	stock := &fencedStock{stock: initial, initial: initial, third: make(chan struct{})}
	key := "sku:" + strconv.FormatInt(time.Now().UnixNano(), 10)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var (
		killed, afterKill atomic.Int64
		storeErrs         atomic.Int64
		wg                sync.WaitGroup
	)
	for w := range sellers {
		wg.Go(func() {
			locker := lockers[w%len(lockers)]
			for ctx.Err() == nil {
				lock, err := locker.Obtain(ctx, key, 3*time.Second, 2*time.Second)
				if err != nil {
					if errors.Is(err, reqlock.ErrInvalid) {
						t.Errorf("Obtain: %v", err)
						return
					}
					storeErrs.Add(1) // a failover, or a wait that ran out behind it
					continue
				}
				v := stock.read()
				if v == 0 {
					_ = lock.Release(context.Background())
					return
				}
				time.Sleep(time.Millisecond) // the work between read and write
				if stock.write(v-1, lock.Fence()) && killed.Load() == 1 {
					afterKill.Add(1)
				}
				_ = lock.Release(context.Background())
			}
		})
	}

	// Kill the leader once a third is sold.
	select {
	case <-stock.third:
	case <-ctx.Done():
		t.Fatal("a third of the stock was not sold within a minute")
	}
	leader := leaderOf(t, members)
	leader.Kill()
	killed.Store(1)
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("the stock was not sold out within a minute after the leader was killed: %d left", stock.read())
	}

	t.Logf("sold %d, %d stale writes refused, %d failed or timed-out obtains, %d sales after the kill",
		stock.sold, stock.stale, storeErrs.Load(), afterKill.Load())
	if stock.stock != 0 || stock.sold != initial {
		t.Fatalf("oversold: %d sales took the stock from %d to %d", stock.sold, initial, stock.stock)
	}
	if afterKill.Load() == 0 {
		t.Fatal("no sale after the leader was killed")
	}
	g, err := store.Acquire(t.Context(), []string{key}, "probe", time.Second)
	if err != nil || !g.OK {
		t.Fatalf("probe after the sale: %+v, %v; want the key free", g, err)
	}
}

// leaderOf returns the member that leads the cluster.
func leaderOf(t *testing.T, members []*testservers.Server) *testservers.Server {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, m := range members {
			c := newClient(t, []string{"http://" + m.Addr()})
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			st, err := c.Status(ctx, "http://"+m.Addr())
			cancel()
			_ = c.Close()
			if err == nil && st.Leader == st.Header.MemberId {
				return m
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no leader within 10s")
		}
		time.Sleep(100 * time.Millisecond) // an election in progress
	}
}

// TestPausedMemberAbandonedAcquire: an Acquire whose context ends while
// etcd (a private single member, paused) has not answered returns at once
// with stores.ErrAbandoned and the context's error; once etcd applies the
// transaction, the Store releases the grant itself, long before its TTL.
// Then, with the member killed, a call fails with stores.ErrUnreachable.
func TestPausedMemberAbandonedAcquire(t *testing.T) {
	t.Parallel()
	member := testservers.EtcdCluster(t, 1)[0]
	endpoints := []string{"http://" + member.Addr()}
	s, err := etcdstore.New(newClient(t, endpoints), etcdstore.WithRequestTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	key := []string{"abandoned"}
	// A first grant makes the Store's lease and connection ready, so that
	// the paused call is the transaction itself.
	if g, err := s.Acquire(t.Context(), key, "warm", time.Minute); err != nil || !g.OK {
		t.Fatalf("warm-up Acquire: %+v, %v", g, err)
	}
	if err := s.Release(t.Context(), key, "warm", 0); err != nil {
		t.Fatal(err)
	}

	member.Pause()
	// SIGSTOP takes effect a moment later: wait until a read times out.
	probe := newClient(t, endpoints)
	stopped := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		_, err := probe.Get(ctx, "probe")
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if time.Now().After(stopped) {
			t.Fatalf("etcd still answers 5s after it was paused: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	start := time.Now()
	_, err = s.Acquire(ctx, key, "t1", time.Minute)
	took := time.Since(start)
	cancel()
	member.Resume()
	if !errors.Is(err, stores.ErrAbandoned) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire on a paused etcd: %v after %v; want stores.ErrAbandoned joined with context.DeadlineExceeded", err, took)
	}
	if took > time.Second {
		t.Fatalf("Acquire on a paused etcd returned after %v, want at its 300ms deadline", took)
	}
	// The abandoned grant (a minute long) is released once etcd answers.
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		g, err := s.Acquire(t.Context(), key, "t2", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if g.OK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the abandoned grant still holds the key 10s after etcd resumed (Wait %v)", g.Wait)
		}
		<-tick.C // polling for the background undo
	}

	member.Kill()
	deadline = time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		start := time.Now()
		_, err := s.Acquire(ctx, []string{"other"}, "t3", time.Minute)
		cancel()
		if errors.Is(err, stores.ErrUnreachable) {
			if d := time.Since(start); d > time.Second {
				t.Fatalf("unreachable etcd answered after %v, want at once", d)
			}
			break
		}
		if err == nil {
			t.Fatal("Acquire on a killed etcd succeeded")
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stores.ErrUnreachable within 10s of the kill; last error: %v", err)
		}
		<-tick.C // the client notices the dead connection
	}
}

// leaseOf returns the lease of key's holder key, held by token, through c.
func leaseOf(t *testing.T, c *clientv3.Client, prefix, key, token string) clientv3.LeaseID {
	t.Helper()
	resp, err := c.Get(t.Context(), prefix+key+"/holder")
	if err != nil || len(resp.Kvs) != 1 || !strings.HasPrefix(string(resp.Kvs[0].Value), token+"\x00") {
		t.Fatalf("Get of the holder key of %q: %v, %d keys", key, err, len(resp.Kvs))
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}

// TestFairAttemptUnreachableAfterQueueing (issue 18, from review): a fair
// attempt whose first transaction renewed its token's place (at the head
// of the queue of a free key, with another waiter behind) and whose second
// one, the grant, finds no member to dial, changed the queue: it fails as
// an unknown outcome, not stores.ErrUnreachable ("nothing changed").
func TestFairAttemptUnreachableAfterQueueing(t *testing.T) {
	t.Parallel()
	prefix := "reqlock-test/" + uniqueKey(t) + "/"
	s, p := proxiedStore(t, etcdstore.WithPrefix(prefix))
	other := newStore(t, etcdstore.WithPrefix(prefix))
	ctx := t.Context()
	k := "k"
	if g, err := other.Acquire(ctx, []string{k}, "holder", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	if g, err := s.AcquireFair(ctx, k, "first", time.Minute, time.Minute); err != nil || g.OK || g.Ahead != 0 {
		t.Fatalf("AcquireFair of the first waiter: %+v, %v; want queued first", g, err)
	}
	if g, err := other.AcquireFair(ctx, k, "second-waiter", time.Minute, time.Minute); err != nil || g.OK || g.Ahead != 1 {
		t.Fatalf("AcquireFair of the second waiter: %+v, %v; want queued second", g, err)
	}
	if err := other.Release(ctx, []string{k}, "holder", 0); err != nil {
		t.Fatal(err)
	}
	// The first transaction's reply reads the queue: once it has passed,
	// the connection goes, and no new one is accepted.
	p.Refuse()
	p.CutWhen(faultproxy.ToClient, func(chunk []byte) bool { return bytes.Contains(chunk, []byte("second-waiter")) }, true)
	t.Cleanup(p.Heal)
	g, err := s.AcquireFair(ctx, k, "first", time.Minute, time.Minute)
	if p.Armed() != 0 {
		t.Fatalf("AcquireFair of the head: %+v, %v; the cut did not catch its first reply", g, err)
	}
	if err == nil || errors.Is(err, stores.ErrUnreachable) || errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("AcquireFair of the head, cut off after its first transaction: %+v, %v; want an unknown outcome", g, err)
	}
}
