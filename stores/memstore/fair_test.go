package memstore

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestFairQueueFreed: a queue lives only while somebody waits in it.
func TestFairQueueFreed(t *testing.T) {
	s := New()
	ctx := context.Background()
	if g, _ := s.Acquire(ctx, one("k"), "holder", time.Minute); !g.OK {
		t.Fatal("holder refused")
	}
	for _, tok := range []string{"a", "b", "c"} {
		if g, err := s.AcquireFair(ctx, "k", tok, time.Minute, time.Minute); err != nil || g.OK {
			t.Fatalf("%s: %+v %v, want queued", tok, g, err)
		}
	}
	if got := s.FairWaiters("k"); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("queue %v", got)
	}
	if err := s.LeaveFair(ctx, "k", "b"); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, one("k"), "holder", 0); err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{"a", "c"} {
		if g, err := s.AcquireFair(ctx, "k", tok, time.Minute, time.Minute); err != nil || !g.OK {
			t.Fatalf("%s: %+v %v, want granted", tok, g, err)
		}
		if err := s.Release(ctx, one("k"), tok, 0); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	n := len(s.fair)
	s.mu.Unlock()
	if n != 0 || s.FairWaiters("k") != nil {
		t.Fatalf("%d queues left after every waiter was granted", n)
	}
}
