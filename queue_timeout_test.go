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

// slowAfterStore is memstore whose Acquire, once slow is set, answers only
// when the caller's context ends: the waiter's wait runs out during its
// first store call.
type slowAfterStore struct {
	mem  *memstore.Store
	slow atomic.Bool
}

func (s *slowAfterStore) Acquire(ctx context.Context, key, token string, ttl time.Duration) (reqlock.Grant, error) {
	if s.slow.Load() {
		<-ctx.Done()
		return reqlock.Grant{}, ctx.Err()
	}
	return s.mem.Acquire(ctx, key, token, ttl)
}

func (s *slowAfterStore) Release(ctx context.Context, key, token string, lastFence int64) error {
	return s.mem.Release(ctx, key, token, lastFence)
}

func (s *slowAfterStore) Refresh(ctx context.Context, key, token string, ttl time.Duration) error {
	return s.mem.Refresh(ctx, key, token, ttl)
}

// TestQueuedWaitEndingInStoreCallIsATimeout: a request that queued behind
// a local holder has seen the key held, so a wait that ends during its first
// store call reports ErrHeld (a timeout, 423), not a silent store (503).
// A request that never queued still reports the store's silence.
func TestQueuedWaitEndingInStoreCallIsATimeout(t *testing.T) {
	store := &slowAfterStore{mem: memstore.New()}
	locker, err := reqlock.New(store, reqlock.WithHandoff(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	holder, err := locker.Obtain(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := locker.Obtain(ctx, "k", time.Minute, 300*time.Millisecond)
		done <- err
	}()
	waitUntil(t, func() bool { return reqlock.LocalWaiters(locker, "reqlock:k") == 1 })
	store.slow.Store(true)
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	err = <-done
	if !errors.Is(err, reqlock.ErrWaitEnded) || !errors.Is(err, reqlock.ErrHeld) {
		t.Fatalf("queued waiter: %v, want ErrWaitEnded joined with ErrHeld", err)
	}

	// Not queued: the store never answered, and the error says so.
	_, err = locker.Obtain(ctx, "other", time.Minute, 50*time.Millisecond)
	if !errors.Is(err, reqlock.ErrWaitEnded) || errors.Is(err, reqlock.ErrHeld) {
		t.Fatalf("first contender: %v, want ErrWaitEnded without ErrHeld", err)
	}
}
