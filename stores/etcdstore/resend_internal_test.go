package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// TestResend checks the rules of resend, which sends an idempotent
// transaction (a release, a refresh) again while etcd does not answer, on
// sends that answer as etcd would in each case (issue 19, item 5).
func TestResend(t *testing.T) {
	t.Parallel()
	newStore := func() *Store { return &Store{timeout: 5 * time.Second} }
	bound := newStore().attemptBound()
	okResp, refused := &clientv3.TxnResponse{Succeeded: true}, &clientv3.TxnResponse{}
	isOK := func(r *clientv3.TxnResponse) bool { return r.Succeeded }
	// copies returns a send whose n-th copy runs answer(ctx, n).
	copies := func(answer func(ctx context.Context, n int) (*clientv3.TxnResponse, error)) (func(context.Context) (*clientv3.TxnResponse, error), *atomic.Int32) {
		var n atomic.Int32
		return func(ctx context.Context) (*clientv3.TxnResponse, error) {
			return answer(ctx, int(n.Add(1))-1)
		}, &n
	}
	unanswered := func(ctx context.Context) (*clientv3.TxnResponse, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}

	t.Run("RefusalWaitsForAnEarlierCopy", func(t *testing.T) {
		t.Parallel()
		s := newStore() // a round trip of its own: the bound follows it
		// The first copy was applied, and its answer comes late; the
		// second finds the key released by it, and is refused.
		send, _ := copies(func(ctx context.Context, n int) (*clientv3.TxnResponse, error) {
			if n == 0 {
				<-time.After(3 * bound) // the late answer
				return okResp, nil
			}
			return refused, nil
		})
		answers, err := s.resend(t.Context(), send, isOK)
		if err != nil || len(answers) != 1 || !answers[0].Succeeded {
			t.Fatalf("resend: %v, %v; want the first copy's success", answers, err)
		}
	})
	t.Run("RefusalSettlesWhenNoCopyIsLeft", func(t *testing.T) {
		t.Parallel()
		s := newStore() // a round trip of its own: the bound follows it
		send, n := copies(func(ctx context.Context, n int) (*clientv3.TxnResponse, error) { return refused, nil })
		start := time.Now()
		answers, err := s.resend(t.Context(), send, isOK)
		if err != nil || len(answers) != 1 || answers[0].Succeeded || n.Load() != 1 || time.Since(start) > bound {
			t.Fatalf("resend: %v, %v after %d copies and %v; want one refusal at once", answers, err, n.Load(), time.Since(start))
		}
	})
	t.Run("UnansweredIsSentAgain", func(t *testing.T) {
		t.Parallel()
		s := newStore() // a round trip of its own: the bound follows it
		// Copies forwarded to a dead leader until the third.
		send, n := copies(func(ctx context.Context, n int) (*clientv3.TxnResponse, error) {
			if n < 2 {
				return unanswered(ctx)
			}
			return okResp, nil
		})
		start := time.Now()
		answers, err := s.resend(t.Context(), send, isOK)
		if err != nil || len(answers) != 1 || !answers[0].Succeeded || n.Load() != 3 {
			t.Fatalf("resend: %v, %v after %d copies; want the third copy's success", answers, err, n.Load())
		}
		if took := time.Since(start); took < 2*bound || took > 2*bound+time.Second {
			t.Fatalf("the third copy answered after %v; want after twice the bound %v", took, bound)
		}
	})
	t.Run("CopiesBeyondTheCapGiveUpTheOldest", func(t *testing.T) {
		t.Parallel()
		s := newStore() // a round trip of its own: the bound follows it
		var given atomic.Int32
		send, n := copies(func(ctx context.Context, n int) (*clientv3.TxnResponse, error) {
			if n < maxAttemptsInFlight+2 {
				_, err := unanswered(ctx)
				given.Add(1)
				return nil, err
			}
			return okResp, nil
		})
		answers, err := s.resend(t.Context(), send, isOK)
		if err != nil || len(answers) != 1 || !answers[0].Succeeded || n.Load() != maxAttemptsInFlight+3 {
			t.Fatalf("resend: %v, %v after %d copies; want copy %d's success", answers, err, n.Load(), maxAttemptsInFlight+3)
		}
		if g := given.Load(); g < 2 {
			t.Fatalf("%d copies given up before the success; want at least the 2 beyond the cap", g)
		}
	})
	t.Run("TransientIsSentAgainSoon", func(t *testing.T) {
		t.Parallel()
		s := newStore() // a round trip of its own: the bound follows it
		send, n := copies(func(ctx context.Context, n int) (*clientv3.TxnResponse, error) {
			if n < 3 {
				return nil, rpctypes.ErrNoLeader
			}
			return okResp, nil
		})
		start := time.Now()
		answers, err := s.resend(t.Context(), send, isOK)
		if err != nil || len(answers) != 1 || n.Load() != 4 || time.Since(start) >= bound {
			t.Fatalf("resend: %v, %v after %d copies and %v; want the fourth copy's success within the bound", answers, err, n.Load(), time.Since(start))
		}
	})
	t.Run("UnreachableFailsAtOnce", func(t *testing.T) {
		t.Parallel()
		s := newStore() // a round trip of its own: the bound follows it
		noConn := status.Error(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused\"")
		send, n := copies(func(ctx context.Context, n int) (*clientv3.TxnResponse, error) { return nil, noConn })
		_, err := s.resend(t.Context(), send, isOK)
		if !unreachable(err) || n.Load() != 1 {
			t.Fatalf("resend: %v after %d copies; want the unreachable error of the one copy", err, n.Load())
		}
	})
	t.Run("UnknownWhenACopyMayHaveLanded", func(t *testing.T) {
		t.Parallel()
		s := newStore() // a round trip of its own: the bound follows it
		// The first copy broke after it was sent; the second reached no
		// member: the outcome is unknown, not "nothing changed".
		send, _ := copies(func(ctx context.Context, n int) (*clientv3.TxnResponse, error) {
			if n == 0 {
				return nil, rpctypes.ErrLeaderChanged
			}
			return nil, status.Error(codes.Unavailable, "no connection available")
		})
		_, err := s.resend(t.Context(), send, isOK)
		if err == nil || unreachable(err) {
			t.Fatalf("resend: %v; want an error that is not unreachable", err)
		}
	})
	t.Run("ContextEnds", func(t *testing.T) {
		t.Parallel()
		s := newStore() // a round trip of its own: the bound follows it
		send, _ := copies(func(ctx context.Context, n int) (*clientv3.TxnResponse, error) { return unanswered(ctx) })
		ctx, cancel := context.WithTimeout(t.Context(), 3*bound)
		defer cancel()
		_, err := s.resend(ctx, send, isOK)
		if !errors.Is(err, context.DeadlineExceeded) || unreachable(err) {
			t.Fatalf("resend: %v; want the context's error", err)
		}
	})
}

// TestSlowLinkSendsEachCallOnce: on a healthy but distant cluster (every
// reply 500ms late, as a cross-region etcd, from the start), a fixed
// 250ms bound before another copy would send every Refresh and Release
// twice or more (each copy a raft proposal), and cancel each of the undo
// queue's tries before its answer. The bound follows twice the measured
// round trip (here 1s, the most it may be): one transaction per call, and
// per undo. Each round's Refresh asks for a TTL no lease of the Store's
// serves yet: its lease is granted before its first copy, whose bound is
// for the transaction alone (a copy that waited for the grant too took two
// round trips, and another was sent).
//
// On a loaded machine etcd itself may take another 500ms to answer, and
// another copy is then right. The test times every transaction to its
// answer (a copy the Store gave up included), and judges a round in which
// each answered within twice the link's delay, the Store's bound; a round
// with a slower answer proves nothing, and is run again.
func TestSlowLinkSendsEachCallOnce(t *testing.T) {
	s, p, kv := proxiedInternalStore(t, 5*time.Second)
	timed := &timedKV{KVClient: kv.KVClient}
	kv.KVClient = timed // before the Store's first call
	ctx := t.Context()
	const ttl, delay, rounds = 10 * time.Second, 500 * time.Millisecond, 8
	p.Delay(faultproxy.ToClient, delay)
	warmUp(t, s, ttl) // measures the round trip
	var undone []string
	defer func() {
		p.Heal()
		expectAbsent(t, s, "after the undo", undone...)
	}()
	for round := range rounds {
		k, u, tok := fmt.Sprintf("k%d", round), fmt.Sprintf("u%d", round), fmt.Sprintf("tok%d", round)
		if g, err := s.Acquire(ctx, []string{k}, tok, ttl); err != nil || !g.OK {
			t.Fatalf("Acquire: %+v, %v", g, err)
		}
		timed.reset()
		before := kv.txns.Load()
		refreshTTL := ttl + time.Duration(round+1)*2*time.Second // a lease to grant
		if err := s.Refresh(ctx, []string{k}, tok, refreshTTL); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		refreshTxns := kv.txns.Load() - before
		before = kv.txns.Load()
		if err := s.Release(ctx, []string{k}, tok, 0); err != nil {
			t.Fatalf("Release: %v", err)
		}
		releaseTxns := kv.txns.Load() - before
		if g, err := s.Acquire(ctx, []string{u}, tok, ttl); err != nil || !g.OK {
			t.Fatalf("Acquire: %+v, %v", g, err)
		}
		lease, err := s.leases.get(ctx, time.Now(), ttl)
		if err != nil {
			t.Fatal(err)
		}
		before = kv.unconditional.Load()
		s.undos.add(s.newUndo([]string{u}, tok, false, &flight{leases: []clientv3.LeaseID{lease}}))
		waitUndone(t, s, 10*time.Second)
		undoTxns := kv.unconditional.Load() - before
		undone = append(undone, holderKey(s.dir(u)))
		slowest := timed.slowest(t) // of the Refresh, the Release, the undo
		t.Logf("round %d: transactions sent: Refresh %d, Release %d, undo %d; slowest answer %v", round, refreshTxns, releaseTxns, undoTxns, slowest)
		if slowest >= 2*delay {
			continue // etcd was slow, not the link: another copy was right
		}
		if refreshTxns != 1 || releaseTxns != 1 || undoTxns != 1 {
			t.Errorf("a healthy %v round trip: Refresh sent %d transactions, Release %d, the undo queue %d (want 1 each)", delay, refreshTxns, releaseTxns, undoTxns)
		}
		return
	}
	t.Skipf("in each of %d rounds etcd answered a transaction after twice the link's delay (%v) or more: the machine is too loaded to judge", rounds, 2*delay)
}

// timedKV times each transaction until etcd answers it, also when its
// caller gave it up: the copy goes on, as it does in etcd once sent.
type timedKV struct {
	pb.KVClient
	wg  sync.WaitGroup
	max atomic.Int64 // the slowest answer since reset
}

func (k *timedKV) Txn(ctx context.Context, in *pb.TxnRequest, opts ...grpc.CallOption) (*pb.TxnResponse, error) {
	type answer struct {
		resp *pb.TxnResponse
		err  error
	}
	done := make(chan answer, 1)
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		sent := time.Now()
		callCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		resp, err := k.KVClient.Txn(callCtx, in, opts...)
		took := int64(time.Since(sent))
		for m := k.max.Load(); took > m && !k.max.CompareAndSwap(m, took); m = k.max.Load() {
		}
		done <- answer{resp, err}
	}()
	select {
	case a := <-done:
		return a.resp, a.err
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// reset starts a new measure.
func (k *timedKV) reset() { k.max.Store(0) }

// slowest waits for the transactions sent to be answered, and returns the
// slowest answer since reset.
func (k *timedKV) slowest(t *testing.T) time.Duration {
	t.Helper()
	done := make(chan struct{})
	go func() { k.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("transactions unanswered after a minute")
	}
	return time.Duration(k.max.Load())
}
