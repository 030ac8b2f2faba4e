package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
)

// TestMaxKeysBelowTemplatesFailsAtStartUp: a route whose every request
// would be refused is a configuration error.
func TestMaxKeysBelowTemplatesFailsAtStartUp(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	_, err := middleware.NewFromSpec(locker, "@lock key=a:<id> key=b:<id> max-keys=1")
	if !errors.Is(err, middleware.ErrInvalidConfig) || !strings.Contains(err.Error(), "spec column 29: max-keys: 1 is below the 2 key templates") {
		t.Fatalf("err = %v", err)
	}
	_, err = middleware.NewWithConfig(locker, middleware.Config{Key: "a:<id>", Keys: []string{"b:<id>"}, MaxKeys: 1})
	if !errors.Is(err, middleware.ErrInvalidConfig) || !strings.Contains(err.Error(), "max keys 1 is below the 2 key templates") {
		t.Fatalf("NewWithConfig: err = %v", err)
	}
}

// labelRecorder records the labels of Obtained events.
type labelRecorder struct {
	mu     sync.Mutex
	labels []string
}

func (r *labelRecorder) Obtained(label string, _ reqlock.Outcome, _ time.Duration) {
	r.mu.Lock()
	r.labels = append(r.labels, label)
	r.mu.Unlock()
}
func (r *labelRecorder) Held(string, time.Duration) {}
func (r *labelRecorder) Lost(string)                {}
func (r *labelRecorder) HandedOff(string)           {}

// TestHandlerObtainCountsUnderTheRoute: an Obtain the handler makes on its
// request's context is labelled with the route, not "unlabeled".
func TestHandlerObtainCountsUnderTheRoute(t *testing.T) {
	rec := &labelRecorder{}
	locker := reqlock.MustNew(memstore.New(), reqlock.WithMetrics(rec))
	g, err := middleware.New(locker, "item:<id>", middleware.WithName("POST /items/{id}"))
	if err != nil {
		t.Fatal(err)
	}
	h := g.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inner, err := locker.Obtain(r.Context(), "item:7", time.Second, 0) // reentrant
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if err := inner.Release(r.Context()); err != nil {
			http.Error(w, "release of the reentrant lock: "+err.Error(), http.StatusInternalServerError)
		}
	})
	mux := http.NewServeMux()
	mux.Handle("POST /items/{id}", h)
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/items/7", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if got := strings.Join(rec.labels, ","); got != "POST /items/{id},POST /items/{id}" {
		t.Fatalf("labels %q, want the route for both the middleware's and the handler's Obtain", got)
	}
}

// refusingMulti refuses every multi-key call as a Redis Cluster store does
// for keys in different slots.
type refusingMulti struct{ *memstore.Store }

func (s refusingMulti) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	if len(keys) == 1 {
		return s.Store.Acquire(ctx, keys, token, ttl)
	}
	return stores.Grant{}, fmt.Errorf("%w: keys in different slots", reqlock.ErrInvalid)
}

// TestRefusedKeysNeverFailOpen: a store refusing a request's keys is a
// configuration mistake: 500, and a fail-open route does not run unlocked.
func TestRefusedKeysNeverFailOpen(t *testing.T) {
	locker := reqlock.MustNew(refusingMulti{memstore.New()})
	g, err := middleware.NewFromSpec(locker, "@lock key=sku:<json:items[*]> on-store-error=fail-open")
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	h := g.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran = true })
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"items":["a","b"]}`)))
	if ran || w.Code != http.StatusInternalServerError {
		t.Fatalf("status %d, handler ran %v; want 500 and no unlocked run", w.Code, ran)
	}
}
