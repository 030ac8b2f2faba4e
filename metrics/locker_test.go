package metrics

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores/memstore"
)

// TestLocker reports through a real Locker over memstore: one lock
// obtained and released under the label "POST /x".
func TestLocker(t *testing.T) {
	reg := New()
	locker := reqlock.MustNew(memstore.New(), reqlock.WithMetrics(reg))
	if locker.Metrics() != reg {
		t.Fatal("Locker.Metrics is not the Registry")
	}
	ctx := reqlock.WithLabel(context.Background(), "POST /x")

	lock, err := locker.Obtain(ctx, "sku:1", time.Minute, 0)
	if err != nil {
		t.Fatalf("Obtain: %v", err)
	}
	if err := lock.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}

	_, fams := scrape(t, reg)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"reqlock_lock_success_total", []string{"route", "POST /x"}, 1},
		{"reqlock_lock_failure_total", []string{"reason", "timeout", "route", "POST /x"}, 0},
		{"reqlock_lock_wait_seconds_count", []string{"result", "acquired", "route", "POST /x"}, 1},
		{"reqlock_lock_hold_seconds_count", []string{"route", "POST /x"}, 1},
		{"reqlock_lock_lost_total", []string{"route", "POST /x"}, 0},
		{"reqlock_lock_handoffs_total", []string{"route", "POST /x"}, 0},
	} {
		if v, ok := value(fams, c.name, c.labels...); !ok || v != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, v, ok, c.want)
		}
	}
	if got := labelValues(fams, "reqlock_lock_success_total", "route"); len(got) != 1 {
		t.Errorf("routes %v, want only POST /x", got)
	}
}

// TestLockerTimeout: a try-once Obtain of a key held by another request
// is a failure with reason timeout, and not a success; served over HTTP.
func TestLockerTimeout(t *testing.T) {
	reg := New()
	locker := reqlock.MustNew(memstore.New(), reqlock.WithMetrics(reg))
	ctx := reqlock.WithLabel(context.Background(), "POST /x")

	lock, err := locker.Obtain(ctx, "sku:1", time.Minute, 0)
	if err != nil {
		t.Fatalf("Obtain: %v", err)
	}
	defer lock.Release(ctx)
	if _, err := locker.Obtain(ctx, "sku:1", time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
		t.Fatalf("second Obtain: %v, want ErrHeld", err)
	}

	_, fams := scrape(t, reg)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"reqlock_lock_failure_total", []string{"reason", "timeout", "route", "POST /x"}, 1},
		{"reqlock_lock_success_total", []string{"route", "POST /x"}, 1},
		{"reqlock_lock_wait_seconds_count", []string{"result", "timeout", "route", "POST /x"}, 1},
	} {
		if v, ok := value(fams, c.name, c.labels...); !ok || v != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, v, ok, c.want)
		}
	}
	if _, ok := value(fams, "reqlock_lock_hold_seconds_count", "route", "POST /x"); ok {
		t.Error("a hold is counted before any release")
	}

	rec := httptest.NewRecorder()
	reg.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if !strings.Contains(rec.Body.String(), "\n"+`reqlock_lock_failure_total{reason="timeout",route="POST /x"} 1`+"\n") {
		t.Errorf("GET /metrics:\n%s", rec.Body.String())
	}
}

// TestLockerInvalidAndLost: through a real Locker, invalid arguments count
// under reason invalid, not bad_key; a lock that a renewal finds gone
// counts in lock_lost_total; and a nested Obtain of a key whose lock turns
// out lost fails with reason lock_lost.
func TestLockerInvalidAndLost(t *testing.T) {
	reg := New()
	store := &flakyStore{Store: memstore.New()}
	locker := reqlock.MustNew(store, reqlock.WithMetrics(reg), reqlock.WithKeyPrefix("t:"),
		reqlock.WithLogger(slog.New(slog.DiscardHandler))) // the loss is expected
	bg := context.Background()
	ctx := reqlock.WithLabel(bg, "POST /x")
	check := func(cases ...metricCase) {
		t.Helper()
		_, fams := scrape(t, reg)
		for _, c := range cases {
			if v, ok := value(fams, c.name, c.labels...); !ok || v != c.want {
				t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, v, ok, c.want)
			}
		}
	}

	if _, err := locker.Obtain(ctx, "", time.Minute, 0); !errors.Is(err, reqlock.ErrInvalid) {
		t.Fatalf("Obtain of an empty key: %v, want ErrInvalid", err)
	}

	// The store loses the key behind its holder's back; a renewal finds it
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
	check(
		metricCase{"reqlock_lock_failure_total", []string{"reason", "invalid", "route", "POST /x"}, 1},
		metricCase{"reqlock_lock_failure_total", []string{"reason", "bad_key", "route", "POST /x"}, 0},
		metricCase{"reqlock_lock_wait_seconds_count", []string{"result", "invalid", "route", "POST /x"}, 1},
		metricCase{"reqlock_lock_lost_total", []string{"route", "POST /x"}, 1},
		metricCase{"reqlock_lock_failure_total", []string{"reason", "lock_lost", "route", "POST /x"}, 0},
	)

	// The same loss, but the renewal that would tell fails: a nested Obtain
	// renews the lock before it re-enters it, finds the key gone, and fails.
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
	check(
		metricCase{"reqlock_lock_failure_total", []string{"reason", "lock_lost", "route", "POST /x"}, 1},
		metricCase{"reqlock_lock_wait_seconds_count", []string{"result", "lock_lost", "route", "POST /x"}, 1},
		metricCase{"reqlock_lock_failure_total", []string{"reason", "canceled", "route", "POST /x"}, 0},
		metricCase{"reqlock_lock_failure_total", []string{"reason", "store_error", "route", "POST /x"}, 0},
		metricCase{"reqlock_lock_success_total", []string{"route", "POST /x"}, 2},
	)
}

type metricCase struct {
	name   string
	labels []string
	want   float64
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
