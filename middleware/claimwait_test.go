package middleware_test

import (
	"context"
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
	"github.com/reqlock/reqlock/middleware"
)

// TestClaimOutlivesTheRouteLockWait: the claim of an idempotency key is
// taken before the route's lock, so a request may wait for the lock longer
// than the claim's TTL. On a route with the watchdog the claim is kept
// alive during that wait, so no duplicate can claim the key meanwhile; on
// a route without it, a request whose claim ran out while it waited never
// runs its handler (409 lock_lost), since a duplicate may have claimed the
// key and run it.
func TestClaimOutlivesTheRouteLockWait(t *testing.T) {
	const ttl = time.Second
	for name, locker := range recordPrefixLockers(t) {
		for _, watchdog := range []bool{true, false} {
			t.Run(name+map[bool]string{true: "/watchdog", false: "/no watchdog"}[watchdog], func(t *testing.T) {
				ctx := context.Background()
				id, key := "1", "k1"
				if !watchdog {
					id, key = "2", "k2"
				}
				sum := sha256.Sum256([]byte("\x00" + key))
				recordKey := "{" + hex.EncodeToString(sum[:]) + "}:items"
				var runs atomic.Int32
				opts := []middleware.Option{middleware.WithName("items"),
					middleware.WithIdempotency(middleware.Idempotency{Mode: middleware.IdempotencyRequired}),
					middleware.WithTTL(ttl), middleware.WithWait(30 * time.Second)}
				if watchdog {
					opts = append(opts, middleware.WithWatchdog())
				}
				g := middleware.Must(middleware.New(locker, "item:<id>", opts...))
				h := g.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1); _, _ = w.Write([]byte("ok")) })
				hold, err := locker.Obtain(ctx, "item:"+id, 30*time.Second, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer hold.Release(ctx)
				done := make(chan *httptest.ResponseRecorder, 1)
				go func() {
					req := httptest.NewRequest(http.MethodPost, "/items/"+id, strings.NewReader("x"))
					req.SetPathValue("id", id)
					req.Header.Set("Idempotency-Key", key)
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, req)
					done <- rec
				}()
				// Claim the key as a duplicate would, until the request's
				// claim is seen, then for 3 TTLs more (polled).
				var dup *reqlock.Lock
				seen := false
				poll := time.NewTicker(ttl / 20)
				defer poll.Stop()
				for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); <-poll.C {
					claim, rec, err := locker.ClaimRecord(ctx, recordKey, 30*time.Second, 0)
					if rec != nil {
						t.Fatalf("the key holds a record while the request waits")
					}
					if errors.Is(err, reqlock.ErrRecordInProgress) {
						if !seen {
							seen, deadline = true, time.Now().Add(3*ttl)
						}
						continue
					}
					if err != nil {
						t.Fatal(err)
					}
					if !seen {
						_ = claim.Release(ctx) // before the request's claim
						continue
					}
					dup = claim
					break
				}
				if dup != nil {
					defer dup.Release(ctx)
				}
				if watchdog && dup != nil {
					t.Fatalf("a duplicate claimed the key while the first request waited for the route's lock: the watchdog did not keep the claim")
				}
				if !watchdog && dup == nil {
					t.Fatalf("the claim did not run out while its request waited: the test proves nothing")
				}
				if err := hold.Release(ctx); err != nil {
					t.Fatal(err)
				}
				rec := <-done
				if dup != nil {
					if rec.Code != http.StatusConflict || runs.Load() != 0 {
						t.Fatalf("a request whose claim ran out while it waited: %d %q, handler runs %d; want 409 and no run, "+
							"since a duplicate holds the key's claim", rec.Code, rec.Body, runs.Load())
					}
					return
				}
				if rec.Code != http.StatusOK || runs.Load() != 1 {
					t.Fatalf("got %d %q, handler runs %d; want 200 and one run", rec.Code, rec.Body, runs.Load())
				}
			})
		}
	}
}

// TestClaimKeptWhileTheHandlerOutlivesItsClient: on a route with the
// watchdog, the claim of an idempotency key is kept while the handler runs
// after its client left (the client's retry is the duplicate idempotency
// is for): the retry waits for the handler, rather than claiming the key
// once the TTL ran out and running it a second time.
func TestClaimKeptWhileTheHandlerOutlivesItsClient(t *testing.T) {
	const ttl = time.Second
	sum := sha256.Sum256([]byte("\x00k3"))
	recordKey := "{" + hex.EncodeToString(sum[:]) + "}:items"
	for name, locker := range recordPrefixLockers(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			entered, finish := make(chan struct{}), make(chan struct{})
			g := middleware.Must(middleware.New(locker, "item:<id>", middleware.WithName("items"),
				middleware.WithIdempotency(middleware.Idempotency{Mode: middleware.IdempotencyRequired}),
				middleware.WithTTL(ttl), middleware.WithWatchdog(), middleware.WithWait(30*time.Second)))
			h := g.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				close(entered)
				<-finish // a write in flight, which the client's leaving does not stop
				_, _ = w.Write([]byte("ok"))
			})
			reqCtx, leave := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() {
				defer close(done)
				req := httptest.NewRequestWithContext(reqCtx, http.MethodPost, "/items/3", strings.NewReader("x"))
				req.SetPathValue("id", "3")
				req.Header.Set("Idempotency-Key", "k3")
				h.ServeHTTP(httptest.NewRecorder(), req)
			}()
			<-entered
			leave()
			poll := time.NewTicker(ttl / 20)
			defer poll.Stop()
			var claimed error
			for deadline := time.Now().Add(3 * ttl); time.Now().Before(deadline) && claimed == nil; <-poll.C {
				claim, _, err := locker.ClaimRecord(ctx, recordKey, 30*time.Second, 0)
				switch {
				case err == nil:
					_ = claim.Release(ctx)
					claimed = errors.New("a duplicate claimed the key while the first request's handler still ran, its client gone")
				case !errors.Is(err, reqlock.ErrRecordInProgress):
					claimed = err
				}
			}
			close(finish)
			<-done
			if claimed != nil {
				t.Fatal(claimed)
			}
		})
	}
}
