package reqlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores/memstore"
)

// TestReentryAfterExpiryChecksTheStore: a request whose lock outlived its
// TTL (no watchdog) and was taken over must not get a reentrant view while
// the new owner holds the key; it learns its lock was lost.
func TestReentryAfterExpiryChecksTheStore(t *testing.T) {
	store := memstore.New()
	locker := reqlock.MustNew(store)
	other := reqlock.MustNew(store)
	bg := context.Background()
	outer, err := locker.Obtain(bg, "k", 30*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Another process takes the key once the outer lock's TTL has run out.
	var taker *reqlock.Lock
	waitUntil(t, func() bool {
		taker, err = other.Obtain(bg, "k", time.Minute, 0)
		return err == nil
	})
	defer taker.Release(bg)

	ctx := reqlock.NewContext(bg, outer)
	for name, obtain := range map[string]func() (*reqlock.Lock, error){
		"Obtain":    func() (*reqlock.Lock, error) { return locker.Obtain(ctx, "k", time.Second, 0) },
		"ObtainAll": func() (*reqlock.Lock, error) { return locker.ObtainAll(ctx, []string{"k", "j"}, time.Second, 0) },
	} {
		view, err := obtain()
		if view != nil || !errors.Is(err, reqlock.ErrLockLost) || !errors.Is(err, reqlock.ErrNotHeld) {
			t.Fatalf("%s: view %v, err %v; want ErrLockLost and ErrNotHeld while another owner holds the key", name, view != nil, err)
		}
	}
	if _, err := other.Obtain(bg, "j", time.Second, 0); err != nil {
		t.Fatalf("the failed ObtainAll left j held: %v", err)
	}
}

// TestReentryAfterExpiryRenewsAStillHeldLock: past its validity but still
// the key's owner (nobody took it), the lock is renewed and re-entered.
func TestReentryAfterExpiryRenewsAStillHeldLock(t *testing.T) {
	store := &expireNeverStore{mem: memstore.New()}
	locker := reqlock.MustNew(store)
	bg := context.Background()
	outer, err := locker.Obtain(bg, "k", 20*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { return outer.Validity() == 0 })
	view, err := locker.Obtain(reqlock.NewContext(bg, outer), "k", time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if view.Fence() != outer.Fence() || outer.Validity() == 0 || store.refreshes.Load() != 1 {
		t.Fatalf("fence %d vs %d, validity %v, %d refreshes; want the same fence after one renewal",
			view.Fence(), outer.Fence(), outer.Validity(), store.refreshes.Load())
	}
	_ = view.Release(bg)
	_ = outer.Release(bg)
}

// TestNestedObtainOfALostLockFailsAtOnce: once the request's own lock is
// known lost, a nested Obtain of its key fails at once instead of waiting
// for itself in the local queue.
func TestNestedObtainOfALostLockFailsAtOnce(t *testing.T) {
	store := memstore.New()
	locker := reqlock.MustNew(store)
	bg := context.Background()
	outer, err := locker.Obtain(bg, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Release(bg)
	if err := store.Release(bg, outer.StoreKey(), outer.Token(), 0); err != nil {
		t.Fatal(err)
	}
	if err := outer.Refresh(bg, 0); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("refresh: %v", err)
	}
	start := time.Now()
	_, err = locker.Obtain(reqlock.NewContext(bg, outer), "k", time.Minute, 5*time.Second)
	if !errors.Is(err, reqlock.ErrLockLost) || time.Since(start) > time.Second {
		t.Fatalf("after %v: %v; want ErrLockLost at once", time.Since(start), err)
	}
}

// expireNeverStore is memstore whose keys never expire, so a lock past its
// validity is still its owner's; it counts refreshes.
type expireNeverStore struct {
	mem       *memstore.Store
	refreshes atomic.Int64
}

func (s *expireNeverStore) Acquire(ctx context.Context, key, token string, ttl time.Duration) (reqlock.Grant, error) {
	return s.mem.Acquire(ctx, key, token, time.Hour)
}

func (s *expireNeverStore) Release(ctx context.Context, key, token string, lastFence int64) error {
	return s.mem.Release(ctx, key, token, lastFence)
}

func (s *expireNeverStore) Refresh(ctx context.Context, key, token string, ttl time.Duration) error {
	s.refreshes.Add(1)
	return s.mem.Refresh(ctx, key, token, time.Hour)
}
