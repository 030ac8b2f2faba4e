package reqlockprom

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores"
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

// TestLockerInvalidAndLost: through a real Locker, invalid arguments count
// under reason invalid, not bad_key; a lock that a renewal finds gone
// counts in lock_lost_total; and a nested Obtain of a key whose lock turns
// out lost fails with reason lock_lost.
func TestLockerInvalidAndLost(t *testing.T) {
	m := New()
	reg := registered(t, m)
	store := &flakyStore{Store: memstore.New()}
	locker := reqlock.MustNew(store, reqlock.WithMetrics(m), reqlock.WithKeyPrefix("t:"),
		reqlock.WithLogger(slog.New(slog.DiscardHandler))) // the loss is expected
	bg := context.Background()
	ctx := reqlock.WithLabel(bg, "POST /x")

	if _, err := locker.Obtain(ctx, "", time.Minute, 0); !errors.Is(err, reqlock.ErrInvalid) {
		t.Fatalf("Obtain of an empty key: %v, want ErrInvalid", err)
	}

	// The store loses a's key behind its holder's back; a renewal finds it
	// gone.
	a, err := locker.Obtain(ctx, "a", time.Minute, 0)
	if err != nil {
		t.Fatalf("Obtain a: %v", err)
	}
	defer a.Release(bg)
	if err := store.Store.Release(bg, []string{"t:a"}, a.Token(), 0); err != nil {
		t.Fatalf("store.Release: %v", err)
	}
	if err := a.Refresh(bg, 0); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("Refresh a: %v, want ErrNotHeld", err)
	}
	if v, ok := counter(t, reg, "reqlock_lock_lost_total", map[string]string{"route": "POST /x"}); !ok || v != 1 {
		t.Errorf("reqlock_lock_lost_total = %v (present %v), want 1", v, ok)
	}

	// The same loss of b, but the renewal that would tell fails: a nested
	// Obtain renews the lock before it re-enters it, finds the key gone,
	// and fails.
	b, err := locker.Obtain(ctx, "b", time.Minute, 0)
	if err != nil {
		t.Fatalf("Obtain b: %v", err)
	}
	defer b.Release(bg)
	if err := store.Store.Release(bg, []string{"t:b"}, b.Token(), 0); err != nil {
		t.Fatalf("store.Release: %v", err)
	}
	store.down.Store(true)
	if err := b.Refresh(bg, 0); !errors.Is(err, reqlock.ErrStore) {
		t.Fatalf("Refresh b with the store down: %v, want ErrStore", err)
	}
	store.down.Store(false)
	if _, err := locker.Obtain(reqlock.NewContext(ctx, b), "b", time.Minute, 0); !errors.Is(err, reqlock.ErrLockLost) {
		t.Fatalf("nested Obtain of b: %v, want ErrLockLost", err)
	}

	for reason, want := range map[string]float64{"invalid": 1, "lock_lost": 1, "bad_key": 0, "canceled": 0, "store_error": 0} {
		if v, ok := counter(t, reg, "reqlock_lock_failure_total",
			map[string]string{"route": "POST /x", "reason": reason}); !ok || v != want {
			t.Errorf("reqlock_lock_failure_total{reason=%q} = %v (present %v), want %v", reason, v, ok, want)
		}
	}
	for _, result := range []string{"invalid", "lock_lost"} {
		if count, _, ok := histogram(t, reg, "reqlock_lock_wait_seconds",
			map[string]string{"route": "POST /x", "result": result}); !ok || count != 1 {
			t.Errorf("reqlock_lock_wait_seconds{result=%q} count %d (present %v), want 1", result, count, ok)
		}
	}
}

// flakyStore is memstore whose Refresh fails, without acting, while down
// is set.
type flakyStore struct {
	*memstore.Store
	down atomic.Bool
}

func (s *flakyStore) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	if s.down.Load() {
		return errors.New("connection refused")
	}
	return s.Store.Refresh(ctx, keys, token, ttl)
}

// TestLockerOutage: through a real Locker whose store fails, the breaker's
// outage shows in the outage families: lock_store_down while it lasts,
// the refused Obtain in lock_store_down_rejected_total, the release made
// while the store was down in lock_pending_releases_total (queued, then
// released once the store is back), and the outage's count and length.
// The store is memstore, failing while downStore.down is set.
func TestLockerOutage(t *testing.T) {
	m := New()
	reg := registered(t, m)
	store := &downStore{s: memstore.New()}
	locker := reqlock.MustNew(store, reqlock.WithMetrics(m), reqlock.WithBreaker(1, 50*time.Millisecond),
		reqlock.WithLogger(slog.New(slog.DiscardHandler))) // the outage is expected
	defer locker.Close(context.Background())
	ctx := reqlock.WithLabel(context.Background(), "POST /x")
	if _, ok := value(t, reg, "reqlock_lock_store_down", nil); ok {
		t.Fatal("reqlock_lock_store_down before any outage")
	}

	held, err := locker.Obtain(ctx, "held", time.Minute, 0)
	if err != nil {
		t.Fatalf("Obtain: %v", err)
	}
	store.down.Store(true)
	if _, err := locker.Obtain(ctx, "a", time.Minute, 0); !errors.Is(err, reqlock.ErrStore) {
		t.Fatalf("Obtain with the store failing: %v, want ErrStore", err)
	}
	if !locker.StoreHealth().Down {
		t.Fatal("one store failure did not open the breaker of WithBreaker(1, ...)")
	}
	// Refused at once, unless a probe came due meanwhile on a loaded
	// machine: then it is a store failure, and the next is refused.
	refused := 0
	for deadline := time.Now().Add(10 * time.Second); refused == 0; {
		_, err := locker.Obtain(ctx, "b", time.Minute, 0)
		if errors.Is(err, reqlock.ErrStoreDown) {
			refused++
		} else if !errors.Is(err, reqlock.ErrStore) || time.Now().After(deadline) {
			t.Fatalf("Obtain with the breaker open: %v, want ErrStoreDown", err)
		}
	}
	if err := held.Release(context.Background()); !errors.Is(err, reqlock.ErrStore) {
		t.Fatalf("Release with the store down: %v, want a store error", err)
	}
	for name, want := range map[string]float64{"reqlock_lock_store_down": 1, "reqlock_lock_store_outages_total": 1} {
		if v, ok := value(t, reg, name, nil); !ok || v != want {
			t.Errorf("%s = %v (present %v) while down, want %v", name, v, ok, want)
		}
	}
	if v, ok := value(t, reg, "reqlock_lock_store_down_rejected_total", map[string]string{"route": "POST /x"}); !ok || v < 1 {
		t.Errorf("reqlock_lock_store_down_rejected_total{route=\"POST /x\"} = %v (present %v), want at least 1", v, ok)
	}
	// The release of held, and that of any grant the failed Obtain may
	// have left.
	if v, ok := value(t, reg, "reqlock_lock_pending_releases_total", map[string]string{"event": "queued"}); !ok || v < 1 {
		t.Errorf("pending releases queued = %v (present %v), want at least 1", v, ok)
	}

	store.down.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		lock, err := locker.Obtain(ctx, "c"+strconv.Itoa(i), time.Minute, 0)
		if err == nil {
			lock.Release(ctx)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Obtain 10s after the store came back: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // requests arrive; a poll
	}
	for {
		released, _ := value(t, reg, "reqlock_lock_pending_releases_total", map[string]string{"event": "released"})
		if released >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pending releases released = %v 10s after the store came back, want at least 1", released)
		}
		time.Sleep(10 * time.Millisecond) // a poll
	}
	if v, _ := value(t, reg, "reqlock_lock_store_down", nil); v != 0 {
		t.Errorf("reqlock_lock_store_down = %v after the store came back, want 0", v)
	}
	if v, _ := value(t, reg, "reqlock_lock_store_down_seconds_total", nil); !(v > 0) {
		t.Errorf("reqlock_lock_store_down_seconds_total = %v after the outage, want more than 0", v)
	}
	if v, _ := value(t, reg, "reqlock_lock_store_outages_total", nil); v != 1 {
		t.Errorf("reqlock_lock_store_outages_total = %v, want 1", v)
	}
}

// downStore is memstore whose Acquire and Release fail, without acting,
// while down is set. It implements stores.Store alone, so that the Locker
// calls these methods.
type downStore struct {
	s    *memstore.Store
	down atomic.Bool
}

var errDown = errors.New("connection refused")

func (s *downStore) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	if s.down.Load() {
		return stores.Grant{}, errDown
	}
	return s.s.Acquire(ctx, keys, token, ttl)
}

func (s *downStore) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	if s.down.Load() {
		return errDown
	}
	return s.s.Release(ctx, keys, token, keep)
}

func (s *downStore) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	return s.s.Refresh(ctx, keys, token, ttl)
}
