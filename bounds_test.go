package reqlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
)

// boundedStore is a spyStore that states bounds, as a store whose backend
// cannot hold every key or TTL does.
type boundedStore struct {
	*spyStore
	bounds stores.Bounds
}

func (s boundedStore) Bounds() stores.Bounds { return s.bounds }

func newBoundedStore() boundedStore {
	return boundedStore{newSpyStore(memstore.New()), stores.Bounds{
		MaxKeyBytes: 40, MinTTL: 100 * time.Millisecond, MaxTTL: time.Minute, Reason: "the test's limits",
	}}
}

// TestOutOfBoundsRefusedBeforeTheStore: keys and TTLs the store cannot honour
// are ErrInvalid, the outcome "invalid", and never reach the store.
func TestOutOfBoundsRefusedBeforeTheStore(t *testing.T) {
	s := newBoundedStore()
	l := reqlock.MustNew(s, reqlock.WithKeyPrefix("p:")) // 2 bytes of the 40
	ctx := context.Background()
	cases := []struct {
		name string
		keys []string
		ttl  time.Duration
		want string
	}{
		{"key one byte too long", []string{strings.Repeat("k", 39)}, time.Second, "41 bytes"},
		{"600KB key", []string{strings.Repeat("k", 600<<10)}, time.Second, "limit of 40 bytes"},
		{"one long key of several", []string{"a", strings.Repeat("k", 50)}, time.Second, "52 bytes"},
		{"ttl below the minimum", []string{"a"}, time.Nanosecond, "1ns is out of the store's range [100ms, 1m0s]"},
		{"ttl above the maximum", []string{"a"}, time.Duration(1<<63 - 1), "out of the store's range"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := s.acquires.Load()
			lock, err := l.ObtainAll(ctx, c.keys, c.ttl, time.Second)
			if !errors.Is(err, reqlock.ErrInvalid) {
				t.Fatalf("ObtainAll = %v, %v; want ErrInvalid", lock, err)
			}
			if got := reqlock.OutcomeOf(ctx, err); got != reqlock.OutcomeInvalid {
				t.Errorf("OutcomeOf = %q, want %q", got, reqlock.OutcomeInvalid)
			}
			if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "the test's limits") {
				t.Errorf("error %q does not say %q and the bounds' reason", err, c.want)
			}
			if len(err.Error()) > 400 {
				t.Errorf("error of %d bytes quotes the key whole", len(err.Error()))
			}
			if n := s.acquires.Load() - before; n != 0 {
				t.Errorf("the store was called %d times", n)
			}
		})
	}

	// In bounds, at the edges: granted.
	lock, err := l.Obtain(ctx, strings.Repeat("k", 38), time.Minute, 0)
	if err != nil {
		t.Fatalf("Obtain of a key at the limit with the longest TTL: %v", err)
	}
	if err := lock.Refresh(ctx, time.Hour); !errors.Is(err, reqlock.ErrInvalid) {
		t.Errorf("Refresh past MaxTTL = %v, want ErrInvalid", err)
	}
	if err := lock.Refresh(ctx, 100*time.Millisecond); err != nil {
		t.Errorf("Refresh at MinTTL = %v", err)
	}
	if err := lock.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// TestBoundsCheckedAtNew: a prefix that leaves no room for a key, or a fair
// lease out of range, fails New, naming the problem.
func TestBoundsCheckedAtNew(t *testing.T) {
	s := newBoundedStore()
	if _, err := reqlock.New(s, reqlock.WithKeyPrefix(strings.Repeat("p", 40))); !errors.Is(err, reqlock.ErrInvalid) ||
		!strings.Contains(err.Error(), "WithKeyPrefix") {
		t.Errorf("New with a 40-byte prefix = %v, want ErrInvalid naming WithKeyPrefix", err)
	}
	fair := boundedFairStore{s, memstore.New()}
	if _, err := reqlock.New(fair, reqlock.WithFairness(50*time.Millisecond)); !errors.Is(err, reqlock.ErrInvalid) ||
		!strings.Contains(err.Error(), "WithFairness") {
		t.Errorf("New with a fair lease below MinTTL = %v, want ErrInvalid naming WithFairness", err)
	}
	l := reqlock.MustNew(s)
	if err := l.CheckTTL(2 * time.Minute); !errors.Is(err, reqlock.ErrInvalid) || !strings.Contains(err.Error(), "reqlock_test.boundedStore") {
		t.Errorf("CheckTTL(2m) = %v, want ErrInvalid naming the store", err)
	}
	if got := l.Bounds(); got != s.bounds {
		t.Errorf("Bounds() = %+v, want %+v", got, s.bounds)
	}
}

// boundedFairStore is a bounded store with fair mode, for New's check of the
// fair lease.
type boundedFairStore struct {
	boundedStore
	fair *memstore.Store
}

func (s boundedFairStore) AcquireFair(ctx context.Context, key, token string, ttl, lease time.Duration) (stores.FairGrant, error) {
	return s.fair.AcquireFair(ctx, key, token, ttl, lease)
}

func (s boundedFairStore) LeaveFair(ctx context.Context, key, token string) error {
	return s.fair.LeaveFair(ctx, key, token)
}

// TestHoldAtLeastWithinBounds: a hold-at-least longer than the store's MaxTTL
// keeps the key for MaxTTL, never asks the store for more.
func TestHoldAtLeastWithinBounds(t *testing.T) {
	s := newBoundedStore()
	s.bounds.MaxTTL = 300 * time.Millisecond
	l := reqlock.MustNew(s)
	ctx := context.Background()
	lock, err := l.Obtain(ctx, "k", 200*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	lock.HoldAtLeast(time.Hour)
	if err := lock.Release(ctx); err != nil {
		t.Fatalf("Release with a hold past MaxTTL: %v", err)
	}
	if _, err := l.Obtain(ctx, "k", 200*time.Millisecond, 0); !errors.Is(err, reqlock.ErrHeld) {
		t.Fatalf("Obtain right after the held release = %v, want ErrHeld", err)
	}
	// Free once MaxTTL has passed, not after an hour.
	deadline := time.Now().Add(5 * time.Second)
	for {
		lock, err := l.Obtain(ctx, "k", 200*time.Millisecond, 100*time.Millisecond)
		if err == nil {
			_ = lock.Release(ctx)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the key is still held 5s after a hold capped at 300ms: %v", err)
		}
	}
}
