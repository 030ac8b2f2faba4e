package middleware_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores/memstore"
)

// TestNewFromSpec checks that an in-code spec configures the route: its
// key, its wait (none) and its timeout status (409) all take effect.
func TestNewFromSpec(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	g, err := middleware.NewFromSpec(locker, "@lock key=item:<id> wait=none on-timeout=409 ttl=5s")
	if err != nil {
		t.Fatal(err)
	}
	if cfg := g.Config(); cfg.TTL != 5*time.Second || cfg.Wait != middleware.NoWait || cfg.TimeoutStatus != http.StatusConflict {
		t.Fatalf("config %+v", cfg)
	}
	mux := http.NewServeMux()
	var fence int64
	mux.Handle("POST /items/{id}", g.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lock, _ := reqlock.FromContext(r.Context())
		fence = lock.Fence()
	}))

	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/items/7", nil))
	if rec.Code != http.StatusOK || fence <= 0 {
		t.Fatalf("free key: %d, fence %d", rec.Code, fence)
	}

	held, err := locker.Obtain(context.Background(), "item:7", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	start := time.Now()
	rec = httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/items/7", nil))
	if rec.Code != http.StatusConflict || time.Since(start) > time.Second {
		t.Fatalf("held key: %d after %v, want 409 at once (wait=none)", rec.Code, time.Since(start))
	}
}

func TestNewFromSpecErrors(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	_, err := middleware.NewFromSpec(locker, "@lock key=item:<id> wait=2x")
	if !errors.Is(err, middleware.ErrInvalidConfig) || !strings.Contains(err.Error(), `wait: "2x" is not a duration`) {
		t.Fatalf("err = %v", err)
	}
	if _, err := middleware.NewFromSpec(nil, "@lock key=item:<id>"); !errors.Is(err, middleware.ErrInvalidConfig) {
		t.Fatalf("nil locker: err = %v", err)
	}
}
