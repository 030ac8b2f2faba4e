package adaptertest

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/middleware"
)

func mustGuard(t *testing.T, locker *reqlock.Locker, key string, opts ...middleware.Option) *middleware.Guard {
	t.Helper()
	g, err := middleware.New(locker, key, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// expectHeld fails unless another owner (a context without the request's
// locks) finds key held.
func expectHeld(t *testing.T, locker *reqlock.Locker, key, when string) {
	t.Helper()
	lock, err := locker.Obtain(context.Background(), key, time.Second, 0)
	if lock != nil {
		_ = lock.Release(context.Background())
	}
	if !errors.Is(err, reqlock.ErrHeld) {
		t.Errorf("%s: another owner's Obtain of %q = %v, want ErrHeld", when, key, err)
	}
}

func (s *suite) testReentrantNested(t *testing.T) {
	locker, store := newMemLocker(t)
	// Both try once: a guard that waited for its own request would answer
	// 423 at once instead of hanging.
	outer := mustGuard(t, locker, "sku:<id>", middleware.WithWait(0))
	inner := mustGuard(t, locker, "sku:<id>", middleware.WithWait(0))
	var (
		srv       http.Handler
		outerLock *reqlock.Lock
		ran       bool
	)
	around := func(r *http.Request, next func()) {
		outerLock, _ = reqlock.FromContext(r.Context())
		next()
		// The route-level guard has released its hold; the group-level
		// guard still holds the key.
		expectHeld(t, locker, "sku:1", "after the route-level guard's release")
	}
	srv = s.a.ServeNested(outer, inner, around, func(w http.ResponseWriter, r *http.Request) {
		if ran {
			// The probe request below got the key: do not recurse.
			t.Error("another request ran the handler while the first one held the key")
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		ran = true
		lock, ok := reqlock.FromContext(r.Context())
		switch {
		case outerLock == nil:
			t.Error("the group-level guard put no lock in the request's context")
		case !ok:
			t.Error("the route-level guard put no lock in the request's context")
		case lock.Key() != "sku:1" || lock.Fence() != outerLock.Fence():
			t.Errorf("route-level lock %q fence %d, group-level lock %q fence %d: want one key, one fence",
				lock.Key(), lock.Fence(), outerLock.Key(), outerLock.Fence())
		}

		// The handler obtains the key again through its request: at once
		// (although it may wait a second), with the same fence.
		start := time.Now()
		again, err := locker.Obtain(r.Context(), "sku:1", time.Second, time.Second)
		if err != nil {
			t.Errorf("reentrant Obtain in the handler: %v", err)
		} else {
			if d := time.Since(start); d > 500*time.Millisecond {
				t.Errorf("reentrant Obtain took %v: it waited for its own request", d)
			}
			if outerLock != nil && again.Fence() != outerLock.Fence() {
				t.Errorf("reentrant Obtain fence %d, want the request's %d", again.Fence(), outerLock.Fence())
			}
			if err := again.Release(context.Background()); err != nil {
				t.Errorf("releasing the reentrant hold: %v", err)
			}
		}
		// Its release did not free the key: the handler still runs.
		expectHeld(t, locker, "sku:1", "after the handler's reentrant release")
		// Another request is still refused.
		if rec := do(srv, post("/items/1", "")); rec.Code != http.StatusLocked {
			t.Errorf("another request during the handler: status %d, want 423", rec.Code)
		}
		w.WriteHeader(http.StatusAccepted)
	})
	rec := do(srv, post("/items/1", ""))
	if rec.Code != http.StatusAccepted || !ran {
		t.Fatalf("nested guards on one key: status %d (handler ran: %v), want 202; body %s", rec.Code, ran, rec.Body)
	}
	mustBeFree(t, locker, "sku:1")
	if n := store.Len(); n != 0 {
		t.Fatalf("store holds %d entries after the request", n)
	}
}

func (s *suite) testReentrantRoutesAndGuard(t *testing.T) {
	locker, store := newMemLocker(t)
	rt := Table(t, locker, "POST /items/{id}", "key=sku:<id> wait=none")
	// The route-level guard locks the router-level key again, and one more.
	inner := mustGuard(t, locker, "sku:<id>", middleware.WithKeys("audit:<id>"), middleware.WithWait(0))
	var ran bool
	srv := s.serveRoutes(t, rt, Endpoint{Method: http.MethodPost, Path: "/items/{id}", Guard: inner,
		Handler: func(w http.ResponseWriter, r *http.Request) {
			ran = true
			reportLock(locker)(w, r)
		}})
	rec := do(srv, post("/items/1", ""))
	if rec.Code != http.StatusOK || rec.Body.String() != "audit:1 sku:1" {
		t.Fatalf("got %d %q (handler ran: %v), want 200 \"audit:1 sku:1\"", rec.Code, rec.Body, ran)
	}
	mustBeFree(t, locker, "sku:1")
	mustBeFree(t, locker, "audit:1")
	if n := store.Len(); n != 0 {
		t.Fatalf("store holds %d entries after the request", n)
	}
}
