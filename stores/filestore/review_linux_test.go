package filestore_test

import (
	"testing"
	"time"
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
