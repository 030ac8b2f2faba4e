package etcdstore

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/reqlock/reqlock/stores"
)

// TestWriterRecordOfSlowClockStands (issue 22 review): a waiting writer's
// record keeps new shared holders out while it stands, whatever the clocks
// of the writer's and the reader's hosts. The record's window end is
// written by the writer's clock and compared with the reader's: a record
// written by a Store whose clock runs 3s behind (as here, put the way
// writerWaits puts it), or read by one 3s ahead, already reads as lapsed,
// and readers stream in past the writer, which is starved.
func TestWriterRecordOfSlowClockStands(t *testing.T) {
	t.Parallel()
	s := newInternalStore(t)
	ctx := t.Context()
	const key = "k"
	if g, err := s.AcquireShared(ctx, key, "r1", 0, time.Minute); err != nil || !g.OK {
		t.Fatalf("AcquireShared r1: %+v, %v", g, err)
	}
	// The writer's refusal, by a Store whose clock is 3s behind this one.
	lease, err := s.client.Grant(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	skewed := time.Now().Add(-3 * time.Second).Add(stores.WriterWindow)
	h := holderKey(s.dir(key))
	if _, err := s.client.Put(ctx, writerKey(h, "w"), strconv.FormatInt(skewed.UnixMilli(), 10), clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	if g, err := s.AcquireShared(ctx, key, "r2", 0, time.Minute); err != nil || g.OK {
		t.Fatalf("AcquireShared of a new reader while a writer's record stands: %+v, %v; want refused", g, err)
	}
}

// TestWriterWithdrawalSignals (issue 22 review): a waiting writer that
// withdraws (a Release of a key it does not hold) signals the key's
// NotifyRelease subscribers, as memstore does, so that readers the
// writer's record refused come in at once rather than after their Wait.
func TestWriterWithdrawalSignals(t *testing.T) {
	t.Parallel()
	s := newInternalStore(t)
	ctx := t.Context()
	const key = "k"
	for _, r := range []string{"r0", "r1"} {
		if g, err := s.AcquireShared(ctx, key, r, 0, time.Minute); err != nil || !g.OK {
			t.Fatalf("AcquireShared %s: %+v, %v", r, g, err)
		}
	}
	if g, err := s.Acquire(ctx, []string{key}, "w", time.Minute); err != nil || g.OK || !g.SharedHeld {
		t.Fatalf("Acquire over readers: %+v, %v; want refused with SharedHeld", g, err)
	}
	released, stop := s.NotifyRelease(key, "r2")
	defer stop()
	if g, err := s.AcquireShared(ctx, key, "r2", 0, time.Minute); err != nil || g.OK {
		t.Fatalf("AcquireShared r2 while the writer waits: %+v, %v; want refused", g, err)
	}
	// The watch is live once it delivers the freed place of r1.
	if err := s.ReleaseShared(ctx, key, "r1", 0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-released:
	case <-time.After(5 * time.Second):
		t.Fatal("no signal within 5s of a freed place: the watch is not live")
	}
	for len(released) > 0 {
		<-released
	}
	if err := s.Release(ctx, []string{key}, "w", 0); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("Release by the waiting writer: %v, want ErrNotHeld", err)
	}
	select {
	case <-released:
	case <-time.After(5 * time.Second):
		t.Fatal("no signal within 5s of the waiting writer's withdrawal")
	}
}

// TestLimitNotReachedNeverRefuses (issue 22 review): callers of a limit of
// 100, never more than 18 at once, are refused nonetheless: each grant
// compares that no holder was created since its read, and callers coming
// and going fail each other's comparison four times over.
// TestReadersNeverRefusedByReaders (issue 22 review): readers (limit 0) of
// a key that no writer holds or waits for are never refused, however many
// come and go at once. AcquireShared compared, for every limit, that no
// holder was created since its read; with limit 0 that count serves
// nothing, and readers streaming in made each other fail it four times
// over, answering a refusal (Wait 10ms): 423 for a try-once reader.
func TestLimitNotReachedNeverRefuses(t *testing.T) {
	refusedBelowLimit(t, 100)
}

func TestReadersNeverRefusedByReaders(t *testing.T) {
	refusedBelowLimit(t, 0)
}

// refusedBelowLimit runs 18 callers of limit (0: readers) that come and go,
// never more than 18 at once, and fails on any refusal.
func refusedBelowLimit(t *testing.T, limit int) {
	t.Parallel()
	const stores, perStore = 3, 6
	ss := []*Store{newInternalStore(t)}
	for range stores - 1 {
		s, err := New(ss[0].client, WithPrefix(ss[0].prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		ss = append(ss, s)
	}
	var (
		wg               sync.WaitGroup
		refused, granted atomic.Int64
		firstErr         atomic.Value
	)
	end := time.Now().Add(2 * time.Second)
	for i := range stores * perStore {
		s := ss[i%stores]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; time.Now().Before(end); n++ {
				token := fmt.Sprintf("r%d-%d", i, n)
				g, err := s.AcquireShared(t.Context(), "k", token, limit, time.Minute)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				if !g.OK {
					refused.Add(1)
					continue
				}
				granted.Add(1)
				if err := s.ReleaseShared(t.Context(), "k", token, 0); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := firstErr.Load(); err != nil {
		t.Fatal(err)
	}
	if n := refused.Load(); n > 0 {
		t.Fatalf("%d refused (%d granted) under limit %d with no writer and never more than %d holders", n, granted.Load(), limit, stores*perStore)
	}
	t.Logf("%d readers granted", granted.Load())
}
