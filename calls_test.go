package reqlock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/filestore"
)

// callCounter wraps a file store and counts the calls that reach it, as
// the Locker resolves them: a Store, Notifier and WaitReporter.
type callCounter struct {
	*filestore.Store
	calls atomic.Int64
}

func (c *callCounter) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	c.calls.Add(1)
	return c.Store.Acquire(ctx, keys, token, ttl)
}

func (c *callCounter) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	c.calls.Add(1)
	return c.Store.Release(ctx, keys, token, keep)
}

func (c *callCounter) ReleaseWaited(ctx context.Context, keys []string, token string, keep time.Duration) (bool, error) {
	c.calls.Add(1)
	return c.Store.ReleaseWaited(ctx, keys, token, keep)
}

func (c *callCounter) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	c.calls.Add(1)
	return c.Store.Refresh(ctx, keys, token, ttl)
}

// TestUncontendedLockCostsTwoStoreCalls: a lock nobody else wants costs
// its acquire and its release, on a store that reports waiters too: the
// report comes with the release.
func TestUncontendedLockCostsTwoStoreCalls(t *testing.T) {
	s, err := filestore.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	c := &callCounter{Store: s}
	l := reqlock.MustNew(c)
	for i := range 3 {
		before := c.calls.Load()
		lock, err := l.Obtain(context.Background(), "k", time.Second, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := lock.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := c.calls.Load() - before; n != 2 {
			t.Fatalf("lock %d cost %d store calls, want 2", i, n)
		}
	}
}
