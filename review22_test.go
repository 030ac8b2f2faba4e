package reqlock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
)

// TestSharedInsideExclusiveOuterReleasedFirst: a request holding a key
// exclusively takes it shared (a hold on the exclusive grant); releasing
// the outer exclusive lock first leaves the key held, exclusively, until
// the inner shared lock is released.
func TestSharedInsideExclusiveOuterReleasedFirst(t *testing.T) {
	l, store := newLocker(t)
	w := mustObtain(t, context.Background(), l, "k")
	ctx := reqlock.NewContext(context.Background(), w)
	r := obtainWithin(t, func() (*reqlock.Lock, error) { return l.ObtainShared(ctx, "k", time.Minute, time.Hour) })
	mustRelease(t, w)
	if !heldInStore(t, store, "reqlock:k") {
		t.Fatal("the key is free while the inner shared lock holds it")
	}
	other, err := reqlock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.ObtainShared(context.Background(), "k", time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
		t.Fatalf("another reader while the request holds the key exclusively: %v, want ErrHeld", err)
	}
	mustRelease(t, r)
	if heldInStore(t, store, "reqlock:k") {
		t.Fatal("the key is held after both locks were released")
	}

	// The other order: the inner shared lock released first leaves the
	// outer exclusive one held.
	w = mustObtain(t, context.Background(), l, "k")
	ctx = reqlock.NewContext(context.Background(), w)
	r = obtainWithin(t, func() (*reqlock.Lock, error) { return l.ObtainShared(ctx, "k", time.Minute, time.Hour) })
	mustRelease(t, r)
	if !heldInStore(t, store, "reqlock:k") {
		t.Fatal("releasing the inner shared lock freed the outer exclusive one")
	}
	if w.Released() {
		t.Fatal("the outer exclusive lock reads released after the inner shared one was")
	}
	mustRelease(t, w)
}

// TestSharedCancelledObtainsLeaveNoHolder: shared and limited Obtains whose
// context is cancelled at any moment, some while granted, leave no holder
// behind once their background clean-up is done.
func TestSharedCancelledObtainsLeaveNoHolder(t *testing.T) {
	l, store := newLocker(t)
	blocker, err := l.ObtainLimited(context.Background(), "lim", 2, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		obtain := func(ctx context.Context) (*reqlock.Lock, error) {
			return l.ObtainShared(ctx, "sh", time.Minute, time.Second)
		}
		if i%2 == 1 {
			obtain = func(ctx context.Context) (*reqlock.Lock, error) {
				return l.ObtainLimited(ctx, "lim", 2, time.Minute, time.Second)
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			lock, err := obtain(ctx)
			if err == nil {
				_ = lock.Release(context.Background())
			}
		}()
		if rand.IntN(2) == 0 {
			cancel()
		} else {
			go cancel()
		}
		<-done
		cancel()
	}
	mustRelease(t, blocker)
	eventually(t, "no holder left", func() bool { return store.Len() == 0 })
}
