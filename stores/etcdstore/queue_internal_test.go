package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// countingKV counts the transactions a Store sends, and those of them
// with no condition (the undo queue's), and tells when one compares a
// given key first (see sentOn).
type countingKV struct {
	pb.KVClient
	txns, unconditional atomic.Int64
	sent                sync.Map // key compared first: chan struct{} to close
}

func (c *countingKV) Txn(ctx context.Context, in *pb.TxnRequest, opts ...grpc.CallOption) (*pb.TxnResponse, error) {
	c.txns.Add(1)
	if len(in.Compare) == 0 {
		c.unconditional.Add(1)
	} else if ch, ok := c.sent.LoadAndDelete(string(in.Compare[0].Key)); ok {
		close(ch.(chan struct{}))
	}
	return c.KVClient.Txn(ctx, in, opts...)
}

// sentOn returns a channel closed once a transaction that compares key
// first is sent.
func (c *countingKV) sentOn(key string) <-chan struct{} {
	ch := make(chan struct{})
	c.sent.Store(key, ch)
	return ch
}

// leaveOnceSent returns the context of a caller that leaves once its call
// has sent a transaction comparing holder first (a single-key release),
// while etcd has not answered. A fixed deadline would not do: on a loaded
// machine it can end before the call starts, and the call then returns
// ctx.Err() without acting, leaving the key held.
func leaveOnceSent(t *testing.T, kv *countingKV, holder string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(t.Context())
	sent := kv.sentOn(holder)
	go func() {
		defer cancel()
		select {
		case <-sent:
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Errorf("no transaction on %s within 10s", holder)
		}
	}()
	return ctx, cancel
}

// proxiedInternalStore returns a Store on the shared etcd through a
// faultproxy, with its transactions counted, a prefix of the test's own,
// and the given request timeout.
func proxiedInternalStore(t *testing.T, timeout time.Duration) (*Store, *faultproxy.Proxy, *countingKV) {
	t.Helper()
	p := faultproxy.New(t, strings.TrimPrefix(testservers.EtcdEndpoints(t)[0], "http://"))
	c := newTestClient(t, "http://"+p.Addr())
	s, err := New(c, WithPrefix("reqlock-test/"+t.Name()+time.Now().Format("150405.000000000")+"/"), WithRequestTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
	kv := &countingKV{KVClient: failFastKV{pb.NewKVClient(c.ActiveConnection())}}
	s.kv = clientv3.NewKVFromKVClient(kv, c)
	t.Cleanup(func() {
		p.Heal()
		_ = s.Close()
	})
	return s, p, kv
}

// warmUp makes s's lease of ttl and its connection ready, so that what a
// fault holds back is the transactions; tried again while a loaded machine
// makes the Store's short request timeout run out.
func warmUp(t *testing.T, s *Store, ttl time.Duration) {
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
		if time.Now().After(deadline) {
			t.Fatalf("warm-up Acquire: %+v, %v", g, err)
		}
		waitUndone(t, s, 10*time.Second) // of a warm-up that timed out
	}
}

// TestUndoQueueDuringPartition (issue 18, from review): acquires abandoned
// during a partition (a blackhole, which etcd never answers) leave their
// undos in the Store's queue, which one goroutine works through: no
// goroutine or gRPC stream per abandoned acquire (there were 3,000 for
// 3,000 acquires, each retrying its undo for about its TTL), and at the
// heal a few transactions undo them all. Nothing stays held.
func TestUndoQueueDuringPartition(t *testing.T) {
	t.Parallel()
	s, p, kv := proxiedInternalStore(t, 200*time.Millisecond)
	ctx := t.Context()
	warmUp(t, s, time.Hour)
	base := runtime.NumGoroutine()
	p.Blackhole(faultproxy.Both)
	var abandoned atomic.Int64
	var wg sync.WaitGroup
	for i := range 1000 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			// On a loaded machine the context may end before the call is
			// sent: context.DeadlineExceeded alone, and nothing to undo.
			if _, err := s.Acquire(ctx, []string{fmt.Sprintf("k%04d", i)}, fmt.Sprintf("t%04d", i), time.Hour); errors.Is(err, stores.ErrAbandoned) {
				abandoned.Add(1)
			}
		})
	}
	wg.Wait()
	n := int(abandoned.Load())
	if n < 100 {
		t.Fatalf("%d of 1000 acquires abandoned; the test needs more", n)
	}
	// The acquires end with their request timeout, and queue their undos
	// (but those that ran out of it before sending anything).
	deadline := time.Now().Add(20 * time.Second)
	for runtime.NumGoroutine() > base+20 {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines (%d before the partition) 20s after %d acquires were abandoned; want at most %d",
				runtime.NumGoroutine(), base, n, base+20)
		}
		time.Sleep(50 * time.Millisecond) // polling the goroutines
	}
	pending := s.PendingUndos()
	if pending > n || pending < n/2 {
		t.Fatalf("%d undos pending after %d acquires were abandoned during the partition", pending, n)
	}
	before := kv.unconditional.Load()
	p.Heal()
	waitUndone(t, s, 20*time.Second)
	// 63 undos of one key per transaction (a mark and a delete each), and
	// the tries while the client reconnects.
	sent := kv.unconditional.Load() - before
	t.Logf("%d acquires abandoned, %d undos; after the heal, %d undo transactions", n, pending, sent)
	if sent > 40 {
		t.Errorf("%d undo transactions after the heal for %d undos; want them batched", sent, pending)
	}
	resp, err := s.client.Get(ctx, s.prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if strings.HasSuffix(string(kv.Key), "/holder") {
			t.Fatalf("%s is held after the undos", kv.Key)
		}
	}
}

// TestUndoQueueLearnsMaxTxnOps: the undo queue halves its transactions
// while etcd refuses them for too many operations (a cluster with a lower
// --max-txn-ops than the default 128; here the queue starts above it).
func TestUndoQueueLearnsMaxTxnOps(t *testing.T) {
	t.Parallel()
	s := newInternalStore(t)
	ctx := t.Context()
	s.undos.mu.Lock()
	s.undos.maxOps = 500
	s.undos.mu.Unlock()
	const n = 200
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%03d", i)
		if g, err := s.Acquire(ctx, keys[i:i+1], "t"+keys[i], time.Minute); err != nil || !g.OK {
			t.Fatalf("Acquire: %+v, %v", g, err)
		}
	}
	lease, err := s.leases.get(ctx, time.Now(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		s.undos.add(s.newUndo([]string{k}, "t"+k, false, &flight{leases: []clientv3.LeaseID{lease}}))
	}
	waitUndone(t, s, 20*time.Second)
	s.undos.mu.Lock()
	maxOps := s.undos.maxOps
	s.undos.mu.Unlock()
	if maxOps > 128 {
		t.Errorf("the queue sends transactions of up to %d operations after etcd refused them", maxOps)
	}
	for _, k := range keys {
		expectAbsent(t, s, "after the undos", holderKey(s.dir(k)))
	}
}

// TestAbandonedReleasesDuringPartitionAreBounded: during a partition (a
// blackhole, never answered), each Release whose caller leaves used to go
// on in the background for the request timeout, sending a copy every
// bound, up to 8 in flight: 300 callers that left cost about 2,600
// goroutines and as many transactions, with no bound on their number.
// Beyond maxBackgroundReleases they go to the undo queue (one goroutine,
// batched owner-checked deletes), and every key is free once etcd
// answers again. Each caller leaves once its Release was sent: with a
// deadline of 100ms, a loaded machine ended some contexts before their
// Release began, which then returned ctx.Err() without acting, as
// documented, and left their keys held.
func TestAbandonedReleasesDuringPartitionAreBounded(t *testing.T) {
	s, p, kv := proxiedInternalStore(t, 5*time.Second)
	ctx := t.Context()
	const n = 300
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
		if g, err := s.Acquire(ctx, keys[i:i+1], "tok", 30*time.Second); err != nil || !g.OK {
			t.Fatalf("Acquire: %+v, %v", g, err)
		}
	}
	base := runtime.NumGoroutine()
	p.Blackhole(faultproxy.Both)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			rctx, cancel := leaveOnceSent(t, kv, holderKey(s.dir(keys[i])))
			defer cancel()
			if err := s.Release(rctx, keys[i:i+1], "tok", 0); !errors.Is(err, context.Canceled) {
				t.Errorf("Release during the partition: %v (want the outcome unknown)", err)
			}
		})
	}
	wg.Wait() // every caller left
	// What the callers sent before they left depends on the machine's
	// load; what counts is what goes on after.
	sentBefore := kv.txns.Load()
	peak := 0
	tick := time.NewTicker(50 * time.Millisecond) // sampling for 2s
	defer tick.Stop()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); <-tick.C {
		peak = max(peak, runtime.NumGoroutine()-base)
	}
	sent := kv.txns.Load() - sentBefore
	t.Logf("%d Releases whose callers left: %d more goroutines at the peak, %d transactions sent in the next 2s of partition, %d undos pending",
		n, peak, sent, s.PendingUndos())
	if peak > n || sent > n {
		t.Errorf("abandoned releases during a partition: %d goroutines and %d transactions in 2s for %d releases (want a bounded background set, as the undo queue)", peak, sent, n)
	}
	p.Heal()
	waitUndone(t, s, 20*time.Second)
	c := newTestClient(t, "http://"+p.Upstream())
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := c.Get(ctx, s.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == 0 {
			break
		}
		if time.Now().After(deadline) {
			left, _ := c.Get(ctx, s.prefix, clientv3.WithPrefix())
			for _, kv := range left.Kvs {
				t.Logf("left: %s = %q lease %x", kv.Key, kv.Value, kv.Lease)
			}
			t.Fatalf("%d keys left 10s after the partition healed", resp.Count)
		}
		time.Sleep(20 * time.Millisecond) // polling etcd
	}
}

// TestBackgroundReleaseOutlivingItsTimeoutIsUndone: a release whose caller
// left goes on in the background for the request timeout; a partition
// longer than that used to end it unanswered, and its key stayed held
// until its TTL. It now goes to the undo queue, and the key is free soon
// after etcd answers again.
func TestBackgroundReleaseOutlivingItsTimeoutIsUndone(t *testing.T) {
	const timeout = time.Second
	s, p, kv := proxiedInternalStore(t, timeout)
	ctx := t.Context()
	const n = 4 // below maxBackgroundReleases: each goes on in the background
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
		if g, err := s.Acquire(ctx, keys[i:i+1], "tok", time.Minute); err != nil || !g.OK {
			t.Fatalf("Acquire: %+v, %v", g, err)
		}
	}
	p.Blackhole(faultproxy.Both)
	for i := range keys {
		rctx, cancel := leaveOnceSent(t, kv, holderKey(s.dir(keys[i])))
		err := s.Release(rctx, keys[i:i+1], "tok", 0)
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Release during the partition: %v (want the outcome unknown)", err)
		}
	}
	// The partition outlasts the background releases' request timeout.
	deadline := time.Now().Add(10 * time.Second)
	for s.PendingUndos() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d undos pending %v after the partition began: the background releases that etcd never answered were given up", s.PendingUndos(), 10*time.Second)
		}
		time.Sleep(20 * time.Millisecond) // polling the queue
	}
	p.Heal()
	waitUndone(t, s, 20*time.Second)
	c := newTestClient(t, "http://"+p.Upstream())
	resp, err := c.Get(ctx, s.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 0 {
		t.Fatalf("%d keys still held once the undo queue was empty (their TTL is a minute)", resp.Count)
	}
}
