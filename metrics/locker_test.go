package metrics

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
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
