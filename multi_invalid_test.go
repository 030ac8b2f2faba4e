package reqlock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores/memstore"
)

// refusingStore is a MultiStore that refuses every multi-key call before
// acting, as redisstore does for Redis Cluster keys in different slots.
type refusingStore struct{ *memstore.Store }

var errSlots = errors.New("keys in different slots")

func (s *refusingStore) AcquireAll(context.Context, []string, string, time.Duration) (reqlock.MultiGrant, error) {
	return reqlock.MultiGrant{}, fmt.Errorf("%w: %w", reqlock.ErrInvalid, errSlots)
}

// TestObtainAllStoreRefusalIsNotAStoreFailure: a refusal of the keys (a
// configuration mistake) comes back as ErrInvalid, never ErrStore, so a
// fail-open route cannot run unlocked on it.
func TestObtainAllStoreRefusalIsNotAStoreFailure(t *testing.T) {
	store := &refusingStore{Store: memstore.New()}
	locker := reqlock.MustNew(store)
	_, err := locker.ObtainAll(context.Background(), []string{"a", "b"}, time.Second, time.Second)
	if !errors.Is(err, reqlock.ErrInvalid) || !errors.Is(err, errSlots) || errors.Is(err, reqlock.ErrStore) {
		t.Fatalf("err = %v, want ErrInvalid wrapping the refusal, not ErrStore", err)
	}
}

// keepLessStore is a plain Store over memstore: no KeepReleaser, no
// MultiStore, no ReleaseNotifier.
type keepLessStore struct{ mem *memstore.Store }

func (s keepLessStore) Acquire(ctx context.Context, key, token string, ttl time.Duration) (reqlock.Grant, error) {
	return s.mem.Acquire(ctx, key, token, ttl)
}
func (s keepLessStore) Release(ctx context.Context, key, token string, lastFence int64) error {
	return s.mem.Release(ctx, key, token, lastFence)
}
func (s keepLessStore) Refresh(ctx context.Context, key, token string, ttl time.Duration) error {
	return s.mem.Refresh(ctx, key, token, ttl)
}

// TestHoldAtLeastOnAHandedOffLockWithoutKeepReleaser: on a store that
// cannot record a handoff fence except by Release, a handed-off lock with
// HoldAtLeast is released at once, so the next grant's fence stays above
// every fence used.
func TestHoldAtLeastOnAHandedOffLockWithoutKeepReleaser(t *testing.T) {
	mem := memstore.New()
	locker := reqlock.MustNew(keepLessStore{mem})
	bg := context.Background()
	first, err := locker.Obtain(bg, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lock *reqlock.Lock
		err  error
	}
	got := make(chan result, 1)
	go func() {
		l, err := locker.Obtain(bg, "k", time.Minute, 5*time.Second)
		got <- result{l, err} // reported by the test, never after it ends
	}()
	waitUntil(t, func() bool { return reqlock.LocalWaiters(locker, "reqlock:k") == 1 })
	if err := first.Release(bg); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("the local waiter: %v", r.err)
	}
	second := r.lock
	if second.Fence() != first.Fence()+1 {
		t.Fatalf("want a local handoff with fence %d", first.Fence()+1)
	}
	second.HoldAtLeast(time.Minute)
	if err := second.Release(bg); err != nil {
		t.Fatal(err)
	}
	third, err := reqlock.MustNew(mem).Obtain(bg, "k", time.Minute, 0)
	if err != nil {
		t.Fatalf("the key is still held (%v): the hold was kept without recording the handoff fence", err)
	}
	if third.Fence() <= second.Fence() {
		t.Fatalf("fence %d after a used fence %d", third.Fence(), second.Fence())
	}
}
