package reqlockprom

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores/memstore"
)

// TestLocker reports through a real Locker over memstore: one lock obtained
// and released under the label "POST /x".
func TestLocker(t *testing.T) {
	m := New()
	reg := registered(t, m)
	locker := reqlock.MustNew(memstore.New(), reqlock.WithMetrics(m))
	ctx := reqlock.WithLabel(context.Background(), "POST /x")

	lock, err := locker.Obtain(ctx, "sku:1", time.Minute, 0)
	if err != nil {
		t.Fatalf("Obtain: %v", err)
	}
	if err := lock.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}

	route := map[string]string{"route": "POST /x"}
	if v, ok := counter(t, reg, "reqlock_lock_success_total", route); !ok || v != 1 {
		t.Errorf("reqlock_lock_success_total{route=\"POST /x\"} = %v (present %v), want 1", v, ok)
	}
	if count, _, ok := histogram(t, reg, "reqlock_lock_wait_seconds",
		map[string]string{"route": "POST /x", "result": "acquired"}); !ok || count != 1 {
		t.Errorf("reqlock_lock_wait_seconds{route=\"POST /x\",result=\"acquired\"} count %d (present %v), want 1", count, ok)
	}
	if count, _, ok := histogram(t, reg, "reqlock_lock_hold_seconds", route); !ok || count != 1 {
		t.Errorf("reqlock_lock_hold_seconds{route=\"POST /x\"} count %d (present %v), want 1", count, ok)
	}
}

// TestLockerTimeout: a try-once Obtain of a key held by another request
// is a failure with reason timeout, and not a success.
func TestLockerTimeout(t *testing.T) {
	m := New()
	reg := registered(t, m)
	locker := reqlock.MustNew(memstore.New(), reqlock.WithMetrics(m))
	ctx := reqlock.WithLabel(context.Background(), "POST /x")

	lock, err := locker.Obtain(ctx, "sku:1", time.Minute, 0)
	if err != nil {
		t.Fatalf("Obtain: %v", err)
	}
	defer lock.Release(ctx)
	if _, err := locker.Obtain(ctx, "sku:1", time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
		t.Fatalf("second Obtain: %v, want ErrHeld", err)
	}

	if v, ok := counter(t, reg, "reqlock_lock_failure_total",
		map[string]string{"route": "POST /x", "reason": "timeout"}); !ok || v != 1 {
		t.Errorf("reqlock_lock_failure_total{route=\"POST /x\",reason=\"timeout\"} = %v (present %v), want 1", v, ok)
	}
	if v, ok := counter(t, reg, "reqlock_lock_success_total", map[string]string{"route": "POST /x"}); !ok || v != 1 {
		t.Errorf("reqlock_lock_success_total{route=\"POST /x\"} = %v (present %v), want 1", v, ok)
	}
}
