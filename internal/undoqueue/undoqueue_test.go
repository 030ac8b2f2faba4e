package undoqueue

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// A debt whose tries fail is tried again until one succeeds; Close then
// returns at once.
func TestQueueRetriesUntilSettled(t *testing.T) {
	var tries atomic.Int32
	settled := make(chan int, 1)
	q := New(func(ctx context.Context, d int) bool {
		if tries.Add(1) < 3 {
			return false
		}
		settled <- d
		return true
	}, time.Second)
	q.Add(7)
	select {
	case d := <-settled:
		if d != 7 {
			t.Fatalf("settled %d, want 7", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("not settled after %d tries", tries.Load())
	}
	q.Close(time.Second)
	if n := tries.Load(); n != 3 {
		t.Errorf("%d tries, want 3", n)
	}
}

// Close gives a failing debt one more try within drain, then drops it; a
// debt added after Close is never tried.
func TestCloseDropsWhatIsLeft(t *testing.T) {
	var tries atomic.Int32
	q := New(func(ctx context.Context, d int) bool { tries.Add(1); return false }, time.Second)
	q.Add(1)
	start := time.Now()
	q.Close(2 * time.Second)
	if took := time.Since(start); took >= 2*time.Second {
		t.Errorf("Close took %v, want less than its drain", took)
	}
	n := tries.Load()
	if n < 1 {
		t.Fatalf("%d tries before Close returned, want at least 1", n)
	}
	q.Add(2)
	if got := tries.Load(); got != n {
		t.Errorf("a debt added after Close was tried (%d tries, was %d)", got, n)
	}
}

// SettleNow tries again after a failure, and gives up when ctx ends.
func TestSettleNow(t *testing.T) {
	var tries atomic.Int32
	ok := SettleNow(context.Background(), 0, func(context.Context, int) bool { return tries.Add(1) >= 2 }, time.Second)
	if !ok || tries.Load() != 2 {
		t.Fatalf("SettleNow = %v after %d tries, want true after 2", ok, tries.Load())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if SettleNow(ctx, 0, func(context.Context, int) bool { return false }, time.Second) {
		t.Fatal("SettleNow settled a debt whose every try fails")
	}
}
