package middleware_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores/memstore"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// recordPrefixLockers are a memstore Locker and one on the test Redis.
func recordPrefixLockers(t *testing.T) map[string]*reqlock.Locker {
	store, err := redisstore.New(testredis.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	return map[string]*reqlock.Locker{
		"memstore": reqlock.MustNew(memstore.New()),
		"redis":    reqlock.MustNew(store, reqlock.WithKeyPrefix(testredis.Prefix(t))),
	}
}

// TestLockKeysNeverRecordKeys: a lock key never falls among the keys of
// idempotency records (reqlock.RecordKeyPrefix): a template that starts
// with the prefix fails at start-up, and a request whose values render a
// key with it is 400, so that no request can hold, or wait on, another
// request's idempotency record or claim.
func TestLockKeysNeverRecordKeys(t *testing.T) {
	for name, locker := range recordPrefixLockers(t) {
		t.Run(name, func(t *testing.T) {
			for _, key := range []string{reqlock.RecordKeyPrefix + "<id>", reqlock.RecordKeyPrefix + "items:1"} {
				if _, err := middleware.New(locker, key); !errors.Is(err, middleware.ErrInvalidConfig) ||
					!strings.Contains(err.Error(), reqlock.RecordKeyPrefix) {
					t.Fatalf("template %q: %v, want a start-up error naming %q", key, err, reqlock.RecordKeyPrefix)
				}
			}

			idem := middleware.WithIdempotency(middleware.Idempotency{Mode: middleware.IdempotencyRequired})
			var runs atomic.Int32
			answer := func(w http.ResponseWriter, r *http.Request) { runs.Add(1); _, _ = w.Write([]byte("ok")) }
			recorded := middleware.Must(middleware.New(locker, "item:<id>", idem, middleware.WithName("items"),
				middleware.WithWait(100*time.Millisecond)))
			tenant := middleware.Must(middleware.New(locker, "<header:X-Tenant>:{<header:X-Hash>}:<id>",
				middleware.WithWait(100*time.Millisecond)))
			mux := http.NewServeMux()
			mux.Handle("POST /items/{id}", recorded.HandlerFunc(answer))
			mux.Handle("POST /tenants/{id}", tenant.HandlerFunc(answer))

			// The record key of the key "k" on the route "items" without a
			// scope: the SHA-256 of the scope's length (0) and the key, in
			// braces, and the route's name.
			req := httptest.NewRequest(http.MethodPost, "/items/1", strings.NewReader("x"))
			req.Header.Set("Idempotency-Key", "k")
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				t.Fatalf("first request: %d", rec.Code)
			}
			sum := sha256.Sum256([]byte("\x00k"))
			hash := hex.EncodeToString(sum[:])
			req = httptest.NewRequest(http.MethodPost, "/tenants/items", nil)
			req.Header.Set("X-Tenant", "idem")
			req.Header.Set("X-Hash", hash)
			rec = httptest.NewRecorder()
			mux.ServeHTTP(rec, req)
			if rec.Code != http.StatusBadRequest || runs.Load() != 1 {
				t.Fatalf("a request whose lock key is the record key %q: %d %q (runs %d), want 400 and the handler not run",
					reqlock.RecordKeyPrefix+"{"+hash+"}:items", rec.Code, rec.Body, runs.Load())
			}
		})
	}
}
