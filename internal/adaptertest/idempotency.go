package adaptertest

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
)

// idemRequest is a POST to /items/{id} with body and, when key is not "",
// the idempotency key key.
func idemRequest(id, key, body string) *http.Request {
	req := post("/items/"+id, body)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return req
}

// idemAnswer is the first answer of the suite's idempotent handler, which a
// replay repeats byte for byte.
const idemAnswer = `{"order":"o-1","status":"created"}` + "\n"

// idemHandler answers 201 with idemAnswer, the headers Content-Type,
// Location and X-Order, and counts its runs.
func idemHandler(runs *atomic.Int32) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Location", "/orders/o-1")
		h.Add("X-Order", "a")
		h.Add("X-Order", "b")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(idemAnswer))
	}
}

// expectProblem fails unless rec is the problem body want with status,
// application/problem+json, nosniff and Retry-After retryAfter.
func (s *suite) expectProblem(t *testing.T, rec *httptest.ResponseRecorder, status int, retryAfter, want string) {
	t.Helper()
	h := rec.Header()
	if rec.Code != status || rec.Body.String() != want || h.Get("Content-Type") != "application/problem+json" ||
		h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Retry-After") != retryAfter || h.Get(middleware.ReplayedHeader) != "" {
		t.Fatalf("%s: got %d %v\n%s\nwant %d, application/problem+json, nosniff, Retry-After %q:\n%s",
			s.a.Name, rec.Code, h, rec.Body, status, retryAfter, want)
	}
}

// testIdempotencyReplay: the first request with a key runs and is
// recorded; a retry gets the same status, headers and bytes with
// Idempotent-Replayed: true, and the handler does not run again; a retry
// with another body is 422, a missing or malformed key 400: the same
// bytes on every adapter.
func (s *suite) testIdempotencyReplay(t *testing.T) {
	locker, store := newMemLocker(t)
	m := newRecordingMetrics()
	locker = reqlock.MustNew(store, reqlock.WithMetrics(m))
	var runs atomic.Int32
	srv := s.serve(t, locker, "item:<id>", idemHandler(&runs),
		middleware.WithIdempotency(middleware.Idempotency{Mode: middleware.IdempotencyRequired}), middleware.WithName("items"))

	first := do(srv, idemRequest("1", "k-1", `{"n":1}`))
	if first.Code != http.StatusCreated || first.Body.String() != idemAnswer || first.Header().Get(middleware.ReplayedHeader) != "" {
		t.Fatalf("%s: first answer %d %v %q", s.a.Name, first.Code, first.Header(), first.Body)
	}
	for range 2 {
		rec := do(srv, idemRequest("1", "k-1", `{"n":1}`))
		h := rec.Header()
		if rec.Code != http.StatusCreated || rec.Body.String() != idemAnswer || h.Get(middleware.ReplayedHeader) != "true" ||
			h.Get("Content-Type") != "application/json" || h.Get("Location") != "/orders/o-1" ||
			strings.Join(h.Values("X-Order"), ",") != "a,b" {
			t.Fatalf("%s: replay %d %v %q, want 201 with the first answer's headers and bytes, replayed", s.a.Name, rec.Code, h, rec.Body)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("%s: the handler ran %d times for one key, want 1", s.a.Name, n)
	}
	mustBeFree(t, locker, "item:1")
	if n := store.Len(); n != 1 {
		t.Fatalf("%s: the store holds %d entries, want the record alone", s.a.Name, n)
	}

	s.expectProblem(t, do(srv, idemRequest("1", "k-1", `{"n":2}`)), http.StatusUnprocessableEntity, "",
		`{"type":"about:blank","title":"Unprocessable Content","status":422,"detail":"the idempotency key was used for a different request (method, path, query or body)","reason":"idempotency_mismatch"}`+"\n")
	s.expectProblem(t, do(srv, idemRequest("2", "k-1", `{"n":1}`)), http.StatusUnprocessableEntity, "",
		`{"type":"about:blank","title":"Unprocessable Content","status":422,"detail":"the idempotency key was used for a different request (method, path, query or body)","reason":"idempotency_mismatch"}`+"\n")
	s.expectProblem(t, do(srv, idemRequest("1", "", `{"n":1}`)), http.StatusBadRequest, "",
		`{"type":"about:blank","title":"Bad Request","status":400,"detail":"the header \"Idempotency-Key\" is required on this route","reason":"idempotency_key_missing"}`+"\n")
	s.expectProblem(t, do(srv, idemRequest("1", strings.Repeat("k", 256), `{"n":1}`)), http.StatusBadRequest, "",
		`{"type":"about:blank","title":"Bad Request","status":400,"detail":"the header \"Idempotency-Key\" must be 1 to 255 characters","reason":"idempotency_key_invalid"}`+"\n")
	s.expectProblem(t, do(srv, idemRequest("1", "a b", `{"n":1}`)), http.StatusBadRequest, "",
		`{"type":"about:blank","title":"Bad Request","status":400,"detail":"the header \"Idempotency-Key\" must be visible ASCII characters (no spaces)","reason":"idempotency_key_invalid"}`+"\n")
	if n := runs.Load(); n != 1 {
		t.Fatalf("%s: the handler ran %d times, want 1", s.a.Name, n)
	}
	if got, want := m.idemString(), "items: mismatch=2 recorded=1 replayed=2"; got != want {
		t.Errorf("%s: idempotency metrics %q, want %q", s.a.Name, got, want)
	}
}

// testIdempotencyConcurrent: a duplicate that arrives while the first
// request runs waits for it and gets the replay; one whose wait runs out
// first is answered 409 with Retry-After, the same bytes on every adapter.
func (s *suite) testIdempotencyConcurrent(t *testing.T) {
	for backend, newLocker := range map[string]func(*testing.T) *reqlock.Locker{"memstore": memLockerFor, "redis": redisLockerFor} {
		t.Run(backend, func(t *testing.T) {
			locker := newLocker(t)
			var runs atomic.Int32
			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			h := func(w http.ResponseWriter, r *http.Request) {
				once.Do(func() { close(entered) })
				<-release
				idemHandler(&runs)(w, r)
			}
			idem := middleware.WithIdempotency(middleware.Idempotency{Mode: middleware.IdempotencyRequired})
			long := s.serve(t, locker, "item:<id>", h, idem, middleware.WithWait(30*time.Second))
			short := s.serve(t, locker, "item:<id>", h, idem, middleware.WithWait(30*time.Millisecond))
			firstDone := make(chan *httptest.ResponseRecorder, 1)
			go func() { firstDone <- do(long, idemRequest("3", "k-3", "x")) }()
			<-entered
			waiterDone := make(chan *httptest.ResponseRecorder, 1)
			go func() { waiterDone <- do(long, idemRequest("3", "k-3", "x")) }()
			s.expectProblem(t, do(short, idemRequest("3", "k-3", "x")), http.StatusConflict, "1",
				`{"type":"about:blank","title":"Conflict","status":409,"detail":"a request with the same idempotency key is still being processed; retry later","reason":"idempotency_conflict"}`+"\n")
			select {
			case rec := <-waiterDone:
				t.Fatalf("%s: the duplicate answered %d while the first still ran", s.a.Name, rec.Code)
			default:
			}
			close(release)
			if rec := <-firstDone; rec.Code != http.StatusCreated || rec.Header().Get(middleware.ReplayedHeader) != "" {
				t.Fatalf("%s: first %d %v", s.a.Name, rec.Code, rec.Header())
			}
			rec := <-waiterDone
			if rec.Code != http.StatusCreated || rec.Body.String() != idemAnswer || rec.Header().Get(middleware.ReplayedHeader) != "true" {
				t.Fatalf("%s: the waiting duplicate got %d %v %q, want the replay", s.a.Name, rec.Code, rec.Header(), rec.Body)
			}
			if n := runs.Load(); n != 1 {
				t.Fatalf("%s: the handler ran %d times, want 1", s.a.Name, n)
			}
		})
	}
}

// testIdempotencyNotRecorded: a 5xx answer, a response over the max body and
// a handler panic are not recorded: the claim is released, and a retry runs
// the handler again; nor are 401 and 429, nor the 409 of a guard inside the
// route (reqlock's own rejection).
func (s *suite) testIdempotencyNotRecorded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(w http.ResponseWriter, run int32)
	}{
		{"503", func(w http.ResponseWriter, run int32) { w.WriteHeader(http.StatusServiceUnavailable) }},
		{"429", func(w http.ResponseWriter, run int32) { w.WriteHeader(http.StatusTooManyRequests) }},
		{"401", func(w http.ResponseWriter, run int32) { w.WriteHeader(http.StatusUnauthorized) }},
		{"over max body", func(w http.ResponseWriter, run int32) { _, _ = w.Write([]byte(strings.Repeat("x", 65))) }},
		{"panic", func(w http.ResponseWriter, run int32) {
			if run == 1 {
				panic("boom")
			}
			w.WriteHeader(http.StatusInternalServerError)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			locker, store := newMemLocker(t)
			var runs atomic.Int32
			srv := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) {
				tc.write(w, runs.Add(1))
			}, middleware.WithIdempotency(middleware.Idempotency{Mode: middleware.IdempotencyRequired, MaxBodyBytes: 64}),
				middleware.WithLogger(discardLogger()))
			for i := range 2 {
				func() {
					defer func() {
						if v := recover(); v != nil && (tc.name != "panic" || i > 0) {
							t.Fatalf("%s: unexpected panic %v", s.a.Name, v)
						}
					}()
					rec := do(srv, idemRequest("4", "k-4", "x"))
					if rec.Header().Get(middleware.ReplayedHeader) != "" {
						t.Fatalf("%s: request %d was a replay", s.a.Name, i)
					}
				}()
			}
			if n := runs.Load(); n != 2 {
				t.Fatalf("%s: the handler ran %d times, want 2: the first answer must not be recorded", s.a.Name, n)
			}
			mustBeFree(t, locker, "item:4")
			if n := store.Len(); n != 0 {
				t.Fatalf("%s: the store holds %d entries, want none", s.a.Name, n)
			}
		})
	}
}

// testIdempotencyInnerRejection: a rejection by a guard inside an
// idempotent route (its 409 on a held key) is not recorded: once the key
// is free, a retry runs the handler.
func (s *suite) testIdempotencyInnerRejection(t *testing.T) {
	locker, store := newMemLocker(t)
	outer := mustGuard(t, locker, "order:<id>", middleware.WithIdempotency(middleware.Idempotency{Mode: middleware.IdempotencyRequired}))
	inner := mustGuard(t, locker, "stock:<id>", middleware.WithWait(0), middleware.WithTimeoutStatus(http.StatusConflict))
	var runs atomic.Int32
	srv := s.a.ServeNested(outer, inner, func(r *http.Request, next func()) { next() }, idemHandler(&runs))
	release := hold(t, locker, "stock:6")
	if rec := do(srv, idemRequest("6", "k-6", "x")); rec.Code != http.StatusConflict || runs.Load() != 0 {
		t.Fatalf("%s: with the inner key held: %d (runs %d), want the inner guard's 409", s.a.Name, rec.Code, runs.Load())
	}
	release()
	if rec := do(srv, idemRequest("6", "k-6", "x")); rec.Code != http.StatusCreated || rec.Header().Get(middleware.ReplayedHeader) != "" {
		t.Fatalf("%s: the retry got %d %v, want the handler's 201: the 409 was recorded", s.a.Name, rec.Code, rec.Header())
	}
	if rec := do(srv, idemRequest("6", "k-6", "x")); rec.Header().Get(middleware.ReplayedHeader) != "true" || runs.Load() != 1 {
		t.Fatalf("%s: the third request got %d %v (runs %d), want the replay", s.a.Name, rec.Code, rec.Header(), runs.Load())
	}
	if n := store.Len(); n != 1 {
		t.Fatalf("%s: the store holds %d entries, want the record alone", s.a.Name, n)
	}
}

// testIdempotencyScopeAndOptional: a scope keeps clients' keys apart; on an
// optional route a request without a key runs unrecorded; a route on a
// store without records fails at start-up.
func (s *suite) testIdempotencyScopeAndOptional(t *testing.T) {
	locker, _ := newMemLocker(t)
	var runs atomic.Int32
	srv := s.serve(t, locker, "item:<id>", idemHandler(&runs), middleware.WithIdempotency(middleware.Idempotency{
		Mode: middleware.IdempotencyOptional, Scope: "<header:Authorization>", Header: "X-Request-Key"}))
	send := func(auth, key string) *httptest.ResponseRecorder {
		req := post("/items/5", "x")
		req.Header.Set("Authorization", auth)
		if key != "" {
			req.Header.Set("X-Request-Key", key)
		}
		return do(srv, req)
	}
	send("alice", "k")
	send("bob", "k")
	if rec := send("alice", "k"); rec.Header().Get(middleware.ReplayedHeader) != "true" {
		t.Fatalf("%s: alice's retry was not replayed: %d %v", s.a.Name, rec.Code, rec.Header())
	}
	send("alice", "")
	send("alice", "")
	if n := runs.Load(); n != 4 {
		t.Fatalf("%s: the handler ran %d times, want 4 (alice, bob, and twice without a key)", s.a.Name, n)
	}
	if rec := send("", "k"); rec.Code != http.StatusBadRequest {
		t.Fatalf("%s: a request without its scope got %d, want 400", s.a.Name, rec.Code)
	}

	noRecords := reqlock.MustNew(struct{ stores.Store }{memstore.New()}) // locks alone, no records
	_, err := s.a.Serve(noRecords, "item:<id>", []middleware.Option{
		middleware.WithIdempotency(middleware.Idempotency{Mode: middleware.IdempotencyRequired})}, idemHandler(&runs))
	if !errors.Is(err, middleware.ErrInvalidConfig) || !errors.Is(err, reqlock.ErrInvalid) || !strings.Contains(err.Error(), "RecordStore") {
		t.Fatalf("%s: an idempotent route on a store without records: %v, want a start-up error naming RecordStore", s.a.Name, err)
	}
}
