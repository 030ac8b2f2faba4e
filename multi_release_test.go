package reqlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores/memstore"
)

// releaseFailStore is a plain Store (no MultiStore) over memstore whose
// Release fails with a store error for one key.
type releaseFailStore struct {
	mem     *memstore.Store // not embedded: the Locker must not see a MultiStore
	failKey string
}

var errReleaseDown = errors.New("release path down")

func (s *releaseFailStore) Acquire(ctx context.Context, key, token string, ttl time.Duration) (reqlock.Grant, error) {
	return s.mem.Acquire(ctx, key, token, ttl)
}

func (s *releaseFailStore) Release(ctx context.Context, key, token string, lastFence int64) error {
	if key == s.failKey {
		return errReleaseDown
	}
	return s.mem.Release(ctx, key, token, lastFence)
}

func (s *releaseFailStore) Refresh(ctx context.Context, key, token string, ttl time.Duration) error {
	return s.mem.Refresh(ctx, key, token, ttl)
}

// TestObtainAllFallbackReleaseReportsStoreFailure checks that a key-by-key
// release where one key had expired and another's release failed reports
// the store failure (ErrStore), not only ErrNotHeld.
func TestObtainAllFallbackReleaseReportsStoreFailure(t *testing.T) {
	mem := memstore.New()
	store := &releaseFailStore{mem: mem, failKey: "reqlock:b"}
	locker, err := reqlock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lock, err := locker.ObtainAll(ctx, []string{"a", "b"}, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	// "a" is taken over behind the lock's back: its release finds it gone.
	if err := mem.Release(ctx, "reqlock:a", lock.Token(), 0); err != nil {
		t.Fatal(err)
	}
	err = lock.Release(ctx)
	if !errors.Is(err, reqlock.ErrStore) || !errors.Is(err, errReleaseDown) || !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("release = %v, want ErrStore wrapping the failure, joined with ErrNotHeld", err)
	}
}
