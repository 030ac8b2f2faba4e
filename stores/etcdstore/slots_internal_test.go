package etcdstore

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/reqlock/reqlock/stores"
)

// TestPickSlotStaysBelowLimit: whatever holders a caller under limit n read
// (fewer than n, slots of any limit and readers), the slot it picks is
// free and below k, and k-1 plus the holders read from slot k on is below
// n: the count its grant compares.
func TestPickSlotStaysBelowLimit(t *testing.T) {
	t.Parallel()
	const h = "p/k/holder"
	for range 2000 {
		n := 1 + rand.IntN(8)
		var holders []*mvccpb.KeyValue
		used := map[int]bool{}
		for range rand.IntN(n) {
			if rand.IntN(4) == 0 {
				holders = append(holders, &mvccpb.KeyValue{Key: []byte(sharedKey(h, "r"+string(rune('a'+len(holders)))))})
				continue
			}
			j := rand.IntN(2 * n)
			if !used[j] {
				used[j] = true
				holders = append(holders, &mvccpb.KeyValue{Key: []byte(slotKey(h, j))})
			}
		}
		k, i := pickSlot(h, holders, n)
		above := 0
		for _, kv := range holders {
			if j, ok := slotIndex(h, string(kv.Key)); !ok || j >= k {
				above++
			}
		}
		if i < 0 || i >= k || used[i] || k-1+above >= n {
			t.Fatalf("limit %d, slots %v, %d holders: k %d, slot %d (%d from k on)", n, used, len(holders), k, i, above)
		}
	}
}

// TestSlotReleasedThroughAnotherStore: a holder under a limit holds a slot
// that only the Store that sent it knows; another Store's RefreshShared and
// ReleaseShared of the token find it by reading the holders, and free it.
func TestSlotReleasedThroughAnotherStore(t *testing.T) {
	t.Parallel()
	a := newInternalStore(t)
	b, err := New(a.client, WithPrefix(a.prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	ctx := t.Context()
	if g, err := a.AcquireShared(ctx, "k", "t", 1, time.Minute); err != nil || !g.OK {
		t.Fatalf("AcquireShared through a: %+v, %v", g, err)
	}
	if g, err := b.AcquireShared(ctx, "k", "u", 1, time.Minute); err != nil || g.OK {
		t.Fatalf("AcquireShared of another token under limit 1: %+v, %v; want refused", g, err)
	}
	if err := b.RefreshShared(ctx, "k", "t", time.Minute); err != nil {
		t.Fatalf("RefreshShared through b: %v", err)
	}
	if err := b.ReleaseShared(ctx, "k", "t", 0); err != nil {
		t.Fatalf("ReleaseShared through b: %v", err)
	}
	if err := a.ReleaseShared(ctx, "k", "t", 0); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("ReleaseShared through a after b's: %v, want ErrNotHeld", err)
	}
	if g, err := b.AcquireShared(ctx, "k", "u", 1, time.Minute); err != nil || !g.OK {
		t.Fatalf("AcquireShared of another token after the release: %+v, %v", g, err)
	}
}
