package filestore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores/filestore"
)

// drainSignals empties ch.
func drainSignals(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// TestSharedReleaseRingsAfterOwnRefusal: a place freed by Store A signals
// Store B's waiter, which B's refusal marked, even when a later refusal of
// A's own (another of its requests, refused the same full key) overwrote
// the key file's one waiter mark: with a limit, one process both holds and
// waits, and B's waiter must not sleep until its poll (issue 22 review).
func TestSharedReleaseRingsAfterOwnRefusal(t *testing.T) {
	dir := t.TempDir()
	a, b := newStore(t, dir), newStore(t, dir)
	ctx := t.Context()
	if g, err := a.AcquireShared(ctx, "k", "a1", 1, time.Minute); err != nil || !g.OK {
		t.Fatalf("AcquireShared a1: %+v, %v", g, err)
	}
	released, stop := b.NotifyRelease("k", "b")
	defer stop()
	if g, err := b.AcquireShared(ctx, "k", "b", 1, time.Minute); err != nil || g.OK {
		t.Fatalf("AcquireShared b on a full key: %+v, %v; want refused", g, err)
	}
	if g, err := a.AcquireShared(ctx, "k", "a2", 1, time.Minute); err != nil || g.OK {
		t.Fatalf("AcquireShared a2 on a full key: %+v, %v; want refused", g, err)
	}
	drainSignals(released)
	if err := a.ReleaseShared(ctx, "k", "a1", 0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-released:
	case <-time.After(5 * time.Second):
		t.Fatal("Store B's waiter got no signal within 5s of Store A's shared release")
	}
	if g, err := b.AcquireShared(ctx, "k", "b", 1, time.Minute); err != nil || !g.OK {
		t.Fatalf("AcquireShared b after the release: %+v, %v", g, err)
	}
}

// TestSharedNeverRefusesAFreeKey (issue 22 review): readers (limit 0) of
// several Stores on one directory, with no writer, are never refused:
// nothing in the contract refuses them. Each call takes the key file's
// flock for a moment; a call that finds it taken by another Store's call
// must wait for it, however long that call is descheduled, rather than
// answer a refusal (a try-once route's 423 for a key nobody holds
// exclusively) or, in ReleaseShared (or RefreshShared), fail and leave the
// place held until its TTL. The calls used to poll for 50ms, and then up
// to 1s while the file changed, and failed so under load.
func TestSharedNeverRefusesAFreeKey(t *testing.T) {
	dir := t.TempDir()
	const stores, perStore = 8, 2
	ss := make([]*filestore.Store, stores)
	for i := range ss {
		ss[i] = newStore(t, dir)
	}
	var (
		wg       sync.WaitGroup
		refused  atomic.Int64
		calls    atomic.Int64
		relErrs  atomic.Int64
		firstErr atomic.Value
	)
	end := time.Now().Add(2 * time.Second)
	for i := range stores * perStore {
		s := ss[i%stores]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; time.Now().Before(end); n++ {
				token := fmt.Sprintf("r%d-%d", i, n)
				g, err := s.AcquireShared(context.Background(), "k", token, 0, time.Minute)
				calls.Add(1)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				if !g.OK {
					refused.Add(1)
					continue
				}
				if err := s.ReleaseShared(context.Background(), "k", token, 0); err != nil {
					relErrs.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	if err := firstErr.Load(); err != nil {
		t.Errorf("%d of %d ReleaseShared calls failed, leaving their places until their TTL; the first: %v", relErrs.Load(), calls.Load(), err)
	}
	if n := refused.Load(); n > 0 {
		t.Fatalf("%d of %d AcquireShared calls of readers refused a key that no writer held or waited for", n, calls.Load())
	}
	t.Logf("%d calls", calls.Load())
}
