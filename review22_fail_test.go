package reqlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
)

// TestTryOnceWriterLeavesReadersIn: an exclusive Obtain that does not wait
// (wait 0) and is refused by readers gives up at once; it must not keep
// new readers out after the readers it met have left (issue 22 review). A
// writer preference helps only a writer that comes back.
func TestTryOnceWriterLeavesReadersIn(t *testing.T) {
	l, _ := newLocker(t)
	ctx := context.Background()
	r, err := l.ObtainShared(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Obtain(ctx, "k", time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
		t.Fatalf("a try-once writer over a reader: %v, want ErrHeld", err)
	}
	mustRelease(t, r)
	// Nobody holds the key and nobody waits for it.
	r2, err := l.ObtainShared(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatalf("a reader of a free key after a try-once writer gave up: %v", err)
	}
	mustRelease(t, r2)
}

// TestLimitChangeDoesNotLockOut: while the holders of a key run under a
// limit of 3, an instance configured with 4 (a rolling change of the
// limit) is refused a place although only one of 3 is taken; under steady
// demand the old instances never let the key drain and the new ones
// answer 429 throughout the roll-out (issue 22 review).
func TestLimitChangeDoesNotLockOut(t *testing.T) {
	l, _ := newLocker(t)
	old, err := l.ObtainLimited(context.Background(), "tenant", 3, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer mustRelease(t, old)
	lock, err := l.ObtainLimited(context.Background(), "tenant", 4, time.Minute, 0)
	if err != nil {
		t.Fatalf("a place under a limit of 4 while 1 of 3 is taken: %v", err)
	}
	mustRelease(t, lock)
}
