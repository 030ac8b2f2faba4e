// Package adaptertest is the behaviour suite every HTTP adapter (net/http,
// gin, echo) must pass: the same request flow, statuses and release
// guarantees, driven through the adapter's own router.
package adaptertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// Route is the route every adapter serves: POST /items/{id}, with the path
// parameter named id.
const Route = "POST /items/{id}"

// Adapter builds one adapter's router for the suite.
type Adapter struct {
	// Name names the adapter in failures.
	Name string
	// Serve returns a router that serves Route (and the same path for any
	// method the test sends) behind a lock built by the adapter's
	// constructor from locker, key and opts, running h as the handler. It
	// returns the constructor's error unchanged.
	Serve func(locker *reqlock.Locker, key string, opts []middleware.Option, h http.HandlerFunc) (http.Handler, error)
	// ServeSpec is Serve for the adapter's FromSpec constructor: the lock is
	// configured by the one-line spec. It returns the constructor's error
	// unchanged. When nil, the suite uses middleware.NewFromSpec and
	// Guard.Handler on a ServeMux: the net/http adapter.
	ServeSpec func(locker *reqlock.Locker, spec string, h http.HandlerFunc) (http.Handler, error)
	// ProblemContentType is the Content-Type of a default rejection.
	ProblemContentType string

	// ServeRoutes returns a router with the router-level Routes middleware
	// of rt installed once for the whole router (gin and echo: Use before
	// the routes are registered; net/http: rt.Handler around the ServeMux)
	// and routes registered on it in the router's own syntax (see
	// ColonPath), each behind its route-level Guard when it has one. It
	// returns the adapter's start-up check unchanged: ginlock.Verify,
	// echolock.CheckRoutes, or the error of Routes.Handler.
	ServeRoutes func(rt *middleware.Routes, routes []Endpoint) (http.Handler, error)

	// InstallRoutes returns a router with rt installed once for the whole
	// router and routes registered on it as ServeRoutes does, but without
	// the adapter's explicit start-up check (CheckRoutes): what a user who
	// forgets it gets. With late, the routes are registered first and the
	// table installed after them. It returns the install's own error, if
	// any (net/http's Routes.Handler always checks).
	InstallRoutes func(rt *middleware.Routes, routes []Endpoint, late bool) (http.Handler, error)

	// Skipper and Responder return the adapter's framework-native skipper
	// and responder options (ginlock.WithSkipper, echolock.WithResponder;
	// on net/http, middleware's): the skipper skips a request that has the
	// header X-Skip, the responder answers a rejection with status and the
	// body "<body>:<reason>".
	Skipper   func() middleware.Option
	Responder func(status int, body string) middleware.Option

	// ServeNested returns a router that serves Route with two guards: outer
	// at the group level (gin RouterGroup.Use, an echo Group's middleware,
	// the outer of two net/http wrappers) and inner on the route itself.
	// Between the two it calls around with the request as the outer guard
	// passes it on and next, which runs the inner guard and h; around must
	// call next once.
	ServeNested func(outer, inner *middleware.Guard, around func(r *http.Request, next func()), h http.HandlerFunc) http.Handler
}

// Endpoint is one route ServeRoutes registers.
type Endpoint struct {
	// Method and Path name the route. Path writes its parameters {id} and
	// {rest...}; gin and echo adapters register ColonPath(Path).
	Method, Path string
	// Guard, when not nil, locks this route alone, inside the router-level
	// Routes middleware: gin and echo route middleware, a net/http wrapper.
	Guard *middleware.Guard
	// Group, when not empty, is a prefix of Path ("/v1" of "/v1/items/{id}"):
	// gin and echo register the route in a group with that prefix, Path's
	// rest under it, so Routes must match the group's prefix too; net/http,
	// which has no groups, registers Path as it is.
	Group string
	// Handler runs the request.
	Handler http.HandlerFunc
}

// ColonPath writes a path's {id} and {rest...} parameters as gin and echo
// write them: :id and *rest.
func ColonPath(path string) string {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		if name, ok := strings.CutPrefix(s, "{"); ok && strings.HasSuffix(name, "}") {
			name = strings.TrimSuffix(name, "}")
			if rest, ok := strings.CutSuffix(name, "..."); ok {
				segs[i] = "*" + rest
			} else {
				segs[i] = ":" + name
			}
		}
	}
	return strings.Join(segs, "/")
}

// Run runs the whole suite against a.
func Run(t *testing.T, a Adapter) {
	s := &suite{a: a}
	t.Run("acquired: handler runs holding the lock, released after", s.testAcquired)
	t.Run("wait exhausted answers 423 with Retry-After", s.testTimeout)
	t.Run("timeout status 409 per route", s.testTimeoutStatus)
	t.Run("no wait answers at once", s.testNoWait)
	t.Run("waiter runs after the holder releases", s.testWaiterGetsLock)
	t.Run("panic releases then re-panics", s.testPanic)
	t.Run("cancelled request still releases", s.testCancelledRequest)
	t.Run("client disconnect stops the wait and leaves nothing", s.testDisconnect)
	t.Run("store down answers 503 and handler never runs", s.testStoreDown)
	t.Run("stalled store answers 503 within the wait", s.testStoreStalled)
	t.Run("fail open runs unlocked and logs", s.testFailOpen)
	t.Run("bad input", s.testBadInput)
	t.Run("rejections are the same bytes on every adapter", s.testProblemBytes)
	t.Run("json key leaves the body readable", s.testBodyReadable)
	t.Run("path values are unescaped like json values", s.testEscapedPath)
	t.Run("request deadline is a timeout, not a store failure", s.testRequestDeadline)
	t.Run("invalid configuration fails at start-up", s.testInvalidConfig)
	t.Run("skipper lets requests through unlocked", s.testSkipper)
	t.Run("a lock spec configures the route", s.testFromSpec)
	t.Run("custom responder replaces the answer", s.testResponder)
	t.Run("concurrent requests on one key never overlap", s.testMutualExclusion)
	t.Run("contention is a timeout, never a store failure or an unlocked run", s.testContentionIsATimeout)
	t.Run("watchdog cancels the handler's context when the lock is lost", s.testWatchdogLost)
	t.Run("watchdog keeps a long handler's lock", s.testWatchdogKeeps)
	t.Run("a lapsed lease cancels the handler's context", s.testLeaseEndsHandlerContext)
	t.Run("shared: readers together, a writer waits and times out like any wait", s.testSharedReaders)
	t.Run("limit: the next request answers 429 with Retry-After, or the route's status", s.testLimitAnswers429)
	t.Run("limit: concurrent requests over two instances never exceed it", s.testLimitConcurrent)
	t.Run("limit: the watchdog keeps a long handler's place", s.testLimitWatchdogKeeps)
	t.Run("limit: hold-at-least keeps the place for its window", s.testLimitHoldAtLeast)
	t.Run("limit: a store failure fails open or answers 503", s.testLimitFailOpen)
	t.Run("shared and limited routes fail at start-up on stores without them, and in invalid combinations", s.testSharedStartUp)

	if a.ServeRoutes == nil || a.ServeNested == nil || a.InstallRoutes == nil || a.Skipper == nil || a.Responder == nil {
		t.Fatalf("%s: Adapter.ServeRoutes, ServeNested, InstallRoutes, Skipper and Responder are required", a.Name)
	}
	t.Run("routes: listed routes are locked, others run unlocked", s.testRoutesLockListed)
	t.Run("routes: a YAML table locks the same way", s.testRoutesYAML)
	t.Run("routes: each route answers its own timeout status", s.testRoutesOwnStatus)
	t.Run("routes: :id and {id} spellings both match", s.testRoutesSpellings)
	t.Run("routes: rest-of-path parameter locks one key on every adapter", s.testRoutesRestParam)
	t.Run("routes: rest-of-path key is the same for the table and a route guard", s.testRoutesRestParamGuard)
	t.Run("routes: routes in a group are matched by their whole path", s.testRoutesGroup)
	t.Run("routes: an entry matching no route fails at start-up with its source", s.testRoutesUnmatched)
	t.Run("routes: a template reading a missing path parameter fails NewRoutes", s.testRoutesMissingParam)
	t.Run("routes: a table installed after the routes never leaves them unlocked", s.testRoutesInstalledLate)
	t.Run("routes: a typo without a check call never runs unlocked", s.testRoutesTypoUnchecked)
	t.Run("routes: every problem of a table in one start-up error", s.testRoutesEveryProblem)
	t.Run("routes: table-wide skipper, responder, logger and name", s.testRoutesTableOptions)
	t.Run("routes: an entry's own skipper replaces both of the table's", s.testRoutesEntrySkipperWins)
	t.Run("native skipper and responder on a route and a table", s.testNativeOptions)
	t.Run("reentrant: group and route guard on one key share the lock", s.testReentrantNested)
	t.Run("reentrant: routes middleware and route guard on one key share the lock", s.testReentrantRoutesAndGuard)
	t.Run("hold-at-least: memstore", func(t *testing.T) { s.testHoldAtLeast(t, memLockerFor) })
	t.Run("hold-at-least: redis", func(t *testing.T) { s.testHoldAtLeast(t, redisLockerFor) })
	t.Run("multi-key: cart keys sorted, deduplicated, each fenced", s.testMultiKeyCart)
	t.Run("multi-key: two templates", s.testMultiKeyTwoTemplates)
	t.Run("multi-key: too many keys answers 413", s.testMultiKeyTooMany)
	t.Run("multi-key: empty cart answers 400", s.testMultiKeyEmpty)
	t.Run("multi-key: overlapping carts on redis neither deadlock nor lose updates", s.testMultiKeyConcurrentRedis)
	t.Run("metrics: table routes are labelled by route", s.testMetricsRoutes)
	t.Run("metrics: code-built guards are labelled by template or name", s.testMetricsGuards)
	t.Run("idempotency: a retry replays the first answer byte for byte; 422 and 400 alike on every adapter", s.testIdempotencyReplay)
	t.Run("idempotency: a duplicate waits for the first and replays it, or gets 409", s.testIdempotencyConcurrent)
	t.Run("idempotency: 5xx, 401, 429, an oversized body and a panic are not recorded", s.testIdempotencyNotRecorded)
	t.Run("idempotency: scope, optional keys, and stores without records", s.testIdempotencyScopeAndOptional)
	t.Run("idempotency: a guard's rejection inside the route is not recorded", s.testIdempotencyInnerRejection)
	t.Run("idempotency: a hijacked connection is not recorded", s.testIdempotencyHijacked)
	t.Run("idempotency: a replay has the first answer's Content-Type, sniffed or none", s.testIdempotencyContentType)
}

type suite struct{ a Adapter }

func (s *suite) serve(t *testing.T, locker *reqlock.Locker, key string, h http.HandlerFunc, opts ...middleware.Option) http.Handler {
	t.Helper()
	srv, err := s.a.Serve(locker, key, opts, h)
	if err != nil {
		t.Fatalf("%s: building route: %v", s.a.Name, err)
	}
	return srv
}

// serveSpec is Adapter.ServeSpec, or its net/http form when it is nil.
func (s *suite) serveSpec(locker *reqlock.Locker, spec string, h http.HandlerFunc) (http.Handler, error) {
	if s.a.ServeSpec != nil {
		return s.a.ServeSpec(locker, spec, h)
	}
	g, err := middleware.NewFromSpec(locker, spec)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(Route, g.Handler(h))
	return mux, nil
}

func newMemLocker(t *testing.T) (*reqlock.Locker, *memstore.Store) {
	t.Helper()
	store := memstore.New()
	return reqlock.MustNew(store), store
}

func post(path, body string) *http.Request {
	return httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
}

// do serves req and returns the recorded response.
func do(h http.Handler, req *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// mustBeFree fails unless key can be obtained at once, then releases it.
func mustBeFree(t *testing.T, locker *reqlock.Locker, key string) {
	t.Helper()
	lock, err := locker.Obtain(context.Background(), key, time.Second, 0)
	if err != nil {
		t.Fatalf("key %q should be free: %v", key, err)
	}
	if err := lock.Release(context.Background()); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// hold obtains key for the test and returns its release.
func hold(t *testing.T, locker *reqlock.Locker, key string) func() {
	t.Helper()
	lock, err := locker.Obtain(context.Background(), key, time.Minute, 0)
	if err != nil {
		t.Fatalf("holding %q: %v", key, err)
	}
	var once sync.Once
	release := func() { once.Do(func() { _ = lock.Release(context.Background()) }) }
	t.Cleanup(release)
	return release
}

type problem struct {
	Status int    `json:"status"`
	Title  string `json:"title"`
	Reason string `json:"reason"`
	Detail string `json:"detail"`
}

func (s *suite) expectRejection(t *testing.T, rec *httptest.ResponseRecorder, status int, reason middleware.Reason, retryAfter bool) {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status = %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, s.a.ProblemContentType) {
		t.Errorf("Content-Type = %q, want %q", ct, s.a.ProblemContentType)
	}
	var p problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("body is not JSON: %v: %s", err, rec.Body)
	}
	if p.Status != status || p.Reason != string(reason) || p.Title == "" || p.Detail == "" {
		t.Errorf("problem = %+v, want status %d reason %q, a title and a detail", p, status, reason)
	}
	// The detail is for the client: no Go package prefix, no placeholder
	// syntax (issue 10 item 4).
	for _, leak := range []string{"keyfunc:", "reqlock:", "reqlock/", "<"} {
		if strings.Contains(p.Detail, leak) {
			t.Errorf("detail %q holds %q", p.Detail, leak)
		}
	}
	if s.a.ProblemContentType == "application/problem+json" {
		if strings.Contains(rec.Body.String(), `\u00`) {
			t.Errorf("problem body escapes HTML: %s", rec.Body)
		}
		if got := rec.Header().Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("X-Content-Type-Options = %q, want nosniff", got)
		}
	}
	if got := rec.Header().Get("Retry-After"); (got != "") != retryAfter {
		t.Errorf("Retry-After = %q, want present=%v", got, retryAfter)
	} else if retryAfter && got != "1" {
		t.Errorf("Retry-After = %q, want the default 1", got)
	}
}

func (s *suite) testAcquired(t *testing.T) {
	locker, store := newMemLocker(t)
	var ran atomic.Bool
	srv := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) {
		ran.Store(true)
		lock, ok := reqlock.FromContext(r.Context())
		if !ok {
			http.Error(w, "no lock in context", http.StatusInternalServerError)
			return
		}
		if lock.Key() != "item:42" || lock.Fence() <= 0 || time.Until(lock.ValidUntil()) <= 0 || len(lock.Token()) < 20 {
			http.Error(w, "bad lock handle", http.StatusInternalServerError)
			return
		}
		// Another request (here a context without the lock) finds the key
		// held; the request's own context holds it reentrantly.
		if _, err := locker.Obtain(context.Background(), "item:42", time.Second, 0); !errors.Is(err, reqlock.ErrHeld) {
			http.Error(w, "key not held during handler: "+errString(err), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	rec := do(srv, post("/items/42", ""))
	if rec.Code != http.StatusCreated || !ran.Load() {
		t.Fatalf("status = %d (ran=%v), body %s", rec.Code, ran.Load(), rec.Body)
	}
	mustBeFree(t, locker, "item:42")
	if n := store.Len(); n != 0 {
		t.Fatalf("store holds %d entries after the request", n)
	}
}

func (s *suite) testTimeout(t *testing.T) {
	locker, _ := newMemLocker(t)
	hold(t, locker, "item:7")
	var ran atomic.Bool
	srv := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) { ran.Store(true) },
		middleware.WithWait(30*time.Millisecond))
	rec := do(srv, post("/items/7", ""))
	s.expectRejection(t, rec, http.StatusLocked, middleware.ReasonTimeout, true)
	if ran.Load() {
		t.Fatal("handler ran without the lock")
	}
}

func (s *suite) testTimeoutStatus(t *testing.T) {
	locker, _ := newMemLocker(t)
	hold(t, locker, "item:7")
	srv := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) {},
		middleware.WithWait(10*time.Millisecond), middleware.WithTimeoutStatus(http.StatusConflict))
	s.expectRejection(t, do(srv, post("/items/7", "")), http.StatusConflict, middleware.ReasonTimeout, true)
}

func (s *suite) testNoWait(t *testing.T) {
	locker, _ := newMemLocker(t)
	hold(t, locker, "item:7")
	srv := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) {},
		middleware.WithWait(0))
	start := time.Now()
	rec := do(srv, post("/items/7", ""))
	s.expectRejection(t, rec, http.StatusLocked, middleware.ReasonTimeout, true)
	// The default wait is 2s; a try-once answer takes a store call.
	if d := time.Since(start); d > time.Second {
		t.Fatalf("try-once took %v", d)
	}
}

func (s *suite) testWaiterGetsLock(t *testing.T) {
	locker, _ := newMemLocker(t)
	entered := make(chan struct{}, 2)
	proceed := make(chan struct{})
	var inside, overlaps atomic.Int32
	srv := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) {
		if inside.Add(1) > 1 {
			overlaps.Add(1)
		}
		entered <- struct{}{}
		<-proceed
		inside.Add(-1)
	}, middleware.WithWait(10*time.Second))

	codes := make(chan int, 2)
	go func() { codes <- do(srv, post("/items/1", "")).Code }()
	<-entered // the first request holds the lock
	go func() { codes <- do(srv, post("/items/1", "")).Code }()
	close(proceed)
	for range 2 {
		if c := <-codes; c != http.StatusOK {
			t.Fatalf("status %d, want 200 for both", c)
		}
	}
	if len(entered) != 1 || overlaps.Load() != 0 {
		t.Fatalf("second request entered %d times, %d overlaps", len(entered), overlaps.Load())
	}
	mustBeFree(t, locker, "item:1")
}

func (s *suite) testPanic(t *testing.T) {
	locker, _ := newMemLocker(t)
	srv := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) {
		panic("boom")
	})
	recovered := func() (v any) {
		defer func() { v = recover() }()
		do(srv, post("/items/9", ""))
		return nil
	}()
	if recovered != "boom" && !strings.Contains(errString(asError(recovered)), "boom") {
		t.Fatalf("panic value = %v, want the handler's panic to continue", recovered)
	}
	mustBeFree(t, locker, "item:9")
}

func (s *suite) testCancelledRequest(t *testing.T) {
	locker, store := newMemLocker(t)
	ctx, cancel := context.WithCancel(context.Background())
	srv := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) {
		cancel()
		<-r.Context().Done() // the handler sees its request cancelled and gives up
	})
	do(srv, post("/items/5", "").WithContext(ctx))
	// memstore refuses calls on an ended context: the release must have run
	// on an uncancellable one.
	if n := store.Len(); n != 0 {
		t.Fatalf("store holds %d entries after a cancelled request", n)
	}
	mustBeFree(t, locker, "item:5")
}

// signalStore passes calls to a real store and reports each Acquire.
type signalStore struct {
	stores.Store
	acquires chan string
}

func (s signalStore) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	g, err := s.Store.Acquire(ctx, keys, token, ttl)
	select {
	case s.acquires <- token:
	default:
	}
	return g, err
}

// NotifyRelease forwards to the wrapped store, so wrapping keeps wake-ups.
func (s signalStore) NotifyRelease(key, token string) (<-chan struct{}, func()) {
	if n, ok := s.Store.(stores.Notifier); ok {
		return n.NotifyRelease(key, token)
	}
	return nil, func() {}
}

func (s *suite) testDisconnect(t *testing.T) {
	mem := memstore.New()
	acquires := make(chan string, 64)
	locker := reqlock.MustNew(signalStore{Store: mem, acquires: acquires})
	done := make(chan int, 1)
	var ran atomic.Bool
	h := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) { ran.Store(true) },
		middleware.WithWait(time.Minute))
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		done <- rec.Code
	}))
	defer ts.Close()
	// Another instance holds the key, so this one's waiter waits on the store.
	release := hold(t, reqlock.MustNew(mem), "item:3")

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	baseline := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/items/3", strings.NewReader(`{"qty":1}`))
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-acquires // the waiter tried and found the key held
	<-acquires // subscribed to releases, checked again, and now sleeps
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client error = %v, want context.Canceled", err)
	}
	select {
	case code := <-done:
		if code != middleware.StatusClientClosedRequest {
			t.Fatalf("server answered %d, want %d", code, middleware.StatusClientClosedRequest)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter kept waiting after its client left (wait limit is 1 minute)")
	}
	if ran.Load() {
		t.Fatal("handler ran for a client that left")
	}
	release()
	if n := mem.Len(); n != 0 {
		t.Fatalf("store holds %d entries after the waiter left", n)
	}
	client.CloseIdleConnections()
	waitForGoroutines(t, baseline)
}

// waitForGoroutines polls until the goroutine count is back to at most n.
func waitForGoroutines(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines left, want at most %d:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		runtime.Gosched()
		time.Sleep(5 * time.Millisecond) // poll interval inside a deadline
	}
}

func (s *suite) testStoreDown(t *testing.T) {
	store, err := redisstore.New(testredis.DownClient(t))
	if err != nil {
		t.Fatal(err)
	}
	locker := reqlock.MustNew(store, reqlock.WithLogger(discardLogger()))
	var ran atomic.Bool
	srv := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) { ran.Store(true) })
	s.expectRejection(t, do(srv, post("/items/1", "")), http.StatusServiceUnavailable, middleware.ReasonStoreError, true)
	if ran.Load() {
		t.Fatal("handler ran while the store was down")
	}
}

func (s *suite) testStoreStalled(t *testing.T) {
	client := redisClientFor(t, testredis.StalledAddr(t))
	store, err := redisstore.New(client)
	if err != nil {
		t.Fatal(err)
	}
	locker := reqlock.MustNew(store, reqlock.WithLogger(discardLogger()), reqlock.WithReleaseTimeout(50*time.Millisecond))
	var ran atomic.Bool
	srv := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) { ran.Store(true) },
		middleware.WithWait(100*time.Millisecond))
	start := time.Now()
	s.expectRejection(t, do(srv, post("/items/1", "")), http.StatusServiceUnavailable, middleware.ReasonStoreError, true)
	if ran.Load() {
		t.Fatal("handler ran while the store stalled")
	}
	// The wait (100ms) bounds the stalled call, plus the abandoned-grant
	// release (50ms); the client's own read timeout is 30s.
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("answer took %v", d)
	}
}

func (s *suite) testFailOpen(t *testing.T) {
	store, err := redisstore.New(testredis.DownClient(t))
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	locker := reqlock.MustNew(store, reqlock.WithLogger(logger))
	var ranUnlocked atomic.Bool
	srv := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) {
		_, locked := reqlock.FromContext(r.Context())
		ranUnlocked.Store(!locked)
	}, middleware.WithFailOpen())
	rec := do(srv, post("/items/1", ""))
	if rec.Code != http.StatusOK || !ranUnlocked.Load() {
		t.Fatalf("status %d, ran unlocked %v", rec.Code, ranUnlocked.Load())
	}
	if !strings.Contains(logs.String(), "WITHOUT the lock") {
		t.Fatalf("fail-open run was not logged: %q", logs.String())
	}
}

func (s *suite) testBadInput(t *testing.T) {
	cases := []struct {
		name   string
		key    string
		opts   []middleware.Option
		req    func() *http.Request
		status int
		reason middleware.Reason
		detail string // the client's words for what is wrong
	}{
		{"json field missing", "item:<json:sku>", nil,
			func() *http.Request { return post("/items/1", `{"qty":1}`) }, http.StatusBadRequest, middleware.ReasonBadKey,
			`the JSON body field "sku" is missing or empty`},
		{"json field empty", "item:<json:sku>", nil,
			func() *http.Request { return post("/items/1", `{"sku":""}`) }, http.StatusBadRequest, middleware.ReasonBadKey,
			`the JSON body field "sku" is missing or empty`},
		{"json body invalid", "item:<json:sku>", nil,
			func() *http.Request { return post("/items/1", `{"sku":`) }, http.StatusBadRequest, middleware.ReasonBadKey,
			`the request body is not valid JSON`},
		{"json field is an object", "item:<json:sku>", nil,
			func() *http.Request { return post("/items/1", `{"sku":{"a":1}}`) }, http.StatusBadRequest, middleware.ReasonBadKey,
			`the JSON body field "sku" is an object, not a string, number or boolean`},
		{"no body", "item:<json:sku>", nil,
			func() *http.Request { return post("/items/1", "") }, http.StatusBadRequest, middleware.ReasonBadKey,
			`the JSON body field "sku" is missing or empty`},
		{"body too large", "item:<json:sku>", []middleware.Option{middleware.WithMaxBodyBytes(16)},
			func() *http.Request { return post("/items/1", `{"sku":"a-rather-long-sku-value"}`) }, http.StatusRequestEntityTooLarge, middleware.ReasonBodyTooLarge,
			"the request body is over 16 bytes"},
		{"header missing", "tenant:<header:X-Tenant>:item:<id>", nil,
			func() *http.Request { return post("/items/1", "") }, http.StatusBadRequest, middleware.ReasonBadKey,
			`the header "X-Tenant" is missing or empty`},
		{"query missing", "item:<id>:<query:batch>", nil,
			func() *http.Request { return post("/items/1?other=1", "") }, http.StatusBadRequest, middleware.ReasonBadKey,
			`the query parameter "batch" is missing or empty`},
		{"ctx value missing", "user:<ctx:user>", nil,
			func() *http.Request { return post("/items/1", "") }, http.StatusBadRequest, middleware.ReasonBadKey,
			`the request has no "user" value`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			locker, store := newMemLocker(t)
			var ran atomic.Bool
			srv := s.serve(t, locker, tc.key, func(w http.ResponseWriter, r *http.Request) { ran.Store(true) }, tc.opts...)
			rec := do(srv, tc.req())
			s.expectRejection(t, rec, tc.status, tc.reason, false)
			var p problem
			_ = json.Unmarshal(rec.Body.Bytes(), &p)
			if !strings.Contains(p.Detail, tc.detail) {
				t.Errorf("detail %q does not say %q", p.Detail, tc.detail)
			}
			if ran.Load() {
				t.Fatal("handler ran for a request without a key")
			}
			if n := store.Len(); n != 0 {
				t.Fatalf("a lock was taken for a bad request (%d entries)", n)
			}
		})
	}
}

// Every adapter answers a rejection with the same bytes: the headers
// WriteProblem sets and its body, with "&" and quotes as JSON writes them
// unescaped for HTML (issue 10 item 4; on echo with its default error
// handler).
func (s *suite) testProblemBytes(t *testing.T) {
	locker, _ := newMemLocker(t)
	hold(t, locker, "item:7")
	for _, tc := range []struct {
		name, key, body, retryAfter string
		status                      int
	}{
		{"timeout", "item:<id>",
			`{"type":"about:blank","title":"Locked","status":423,"detail":"the resource is locked by another request; retry later","reason":"timeout"}` + "\n",
			"1", http.StatusLocked},
		{"bad key", "t:<header:X-A&B>:item:<id>",
			`{"type":"about:blank","title":"Bad Request","status":400,"detail":"the header \"X-A&b\" is missing or empty","reason":"bad_key"}` + "\n",
			"", http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := s.serve(t, locker, tc.key, func(http.ResponseWriter, *http.Request) {}, middleware.WithWait(0))
			rec := do(srv, post("/items/7", ""))
			h := rec.Header()
			if rec.Code != tc.status || rec.Body.String() != tc.body || h.Get("Content-Type") != "application/problem+json" ||
				h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Retry-After") != tc.retryAfter {
				t.Fatalf("%s: got %d %v\n%s\nwant %d, application/problem+json, nosniff, Retry-After %q:\n%s",
					s.a.Name, rec.Code, h, rec.Body, tc.status, tc.retryAfter, tc.body)
			}
		})
	}
}

func (s *suite) testBodyReadable(t *testing.T) {
	locker, _ := newMemLocker(t)
	const body = `{"sku":"A-1","qty":2}`
	srv := s.serve(t, locker, "item:<json:sku>", func(w http.ResponseWriter, r *http.Request) {
		lock, _ := reqlock.FromContext(r.Context())
		got, _ := io.ReadAll(r.Body)
		if string(got) != body || lock == nil || lock.Key() != "item:A%2D1" {
			http.Error(w, "body or key wrong: "+string(got), http.StatusInternalServerError)
		}
	})
	if rec := do(srv, post("/items/1", body)); rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
}

func (s *suite) testEscapedPath(t *testing.T) {
	locker, _ := newMemLocker(t)
	pathKey := make(chan string, 1)
	srv := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) {
		lock, _ := reqlock.FromContext(r.Context())
		pathKey <- lock.Key()
	})
	if rec := do(srv, post("/items/a%3Ab", "")); rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	jsonTemplate, err := keyfunc.Parse("item:<json:id>")
	if err != nil {
		t.Fatal(err)
	}
	jsonKey, err := jsonTemplate.Key(keyfunc.HTTPRequest(post("/", `{"id":"a:b"}`)))
	if err != nil {
		t.Fatal(err)
	}
	if got := <-pathKey; got != jsonKey {
		t.Fatalf("path /items/a%%3Ab locks %q, the JSON value \"a:b\" locks %q: one resource, two keys", got, jsonKey)
	}
}

func (s *suite) testRequestDeadline(t *testing.T) {
	// A store that answers only after the request's own deadline passed.
	locker := reqlock.MustNew(slowStore{Store: memstore.New(), delay: time.Second}, reqlock.WithLogger(discardLogger()))
	var ran atomic.Bool
	srv := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) { ran.Store(true) },
		middleware.WithFailOpen())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	s.expectRejection(t, do(srv, post("/items/1", "").WithContext(ctx)), http.StatusLocked, middleware.ReasonTimeout, true)
	if ran.Load() {
		t.Fatal("a fail-open route ran unlocked because the request's own deadline passed")
	}
}

// slowStore answers Acquire after delay, or when ctx ends.
type slowStore struct {
	stores.Store
	delay time.Duration
}

func (s slowStore) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return stores.Grant{}, ctx.Err()
	}
	return s.Store.Acquire(ctx, keys, token, ttl)
}

func (s *suite) testInvalidConfig(t *testing.T) {
	locker, _ := newMemLocker(t)
	cases := []struct {
		key  string
		opts []middleware.Option
		want string
	}{
		{"item:<id", nil, "unclosed"},
		{"item:<nope:id>", nil, "nope"},
		{"", nil, "no key template"},
		{"item:<id>", []middleware.Option{middleware.WithTTL(-time.Second)}, "ttl"},
		{"item:<id>", []middleware.Option{middleware.WithWait(-time.Second)}, "wait"},
		{"item:<id>", []middleware.Option{middleware.WithTimeoutStatus(http.StatusTeapot)}, "418"},
		{"item:<id>", []middleware.Option{middleware.WithWatchdog(), middleware.WithTTL(20 * time.Millisecond)}, "watchdog"},
		// An explicit option given a meaningless zero (issue 10 item 8).
		{"item:<id>", []middleware.Option{middleware.WithTTL(0)}, "WithTTL(0s)"},
		{"item:<id>", []middleware.Option{middleware.WithMaxKeys(0)}, "WithMaxKeys(0)"},
	}
	for _, tc := range cases {
		_, err := s.a.Serve(locker, tc.key, tc.opts, func(http.ResponseWriter, *http.Request) {})
		if !errors.Is(err, middleware.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("key %q: err = %v, want ErrInvalidConfig naming %q", tc.key, err, tc.want)
		}
	}
	if _, err := s.a.Serve(nil, "item:<id>", nil, func(http.ResponseWriter, *http.Request) {}); !errors.Is(err, middleware.ErrInvalidConfig) {
		t.Errorf("nil locker: err = %v", err)
	}
}

func (s *suite) testSkipper(t *testing.T) {
	locker, _ := newMemLocker(t)
	hold(t, locker, "item:1")
	srv := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) {
		if _, locked := reqlock.FromContext(r.Context()); locked {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}, middleware.WithSkipper(func(r *http.Request) bool { return r.Header.Get("X-Skip") == "1" }),
		middleware.WithWait(0))
	req := post("/items/1", "")
	req.Header.Set("X-Skip", "1")
	if rec := do(srv, req); rec.Code != http.StatusOK {
		t.Fatalf("skipped request: status %d", rec.Code)
	}
	if rec := do(srv, post("/items/1", "")); rec.Code != http.StatusLocked {
		t.Fatalf("unskipped request: status %d, want 423", rec.Code)
	}
}

// The spec's key, wait (none) and timeout status (409) take effect; a bad
// spec fails at start-up.
func (s *suite) testFromSpec(t *testing.T) {
	locker, _ := newMemLocker(t)
	srv, err := s.serveSpec(locker, "@lock key=item:<id> wait=none on-timeout=409", reportLock(locker))
	if err != nil {
		t.Fatalf("%s: building route from spec: %v", s.a.Name, err)
	}
	expectBody(t, srv, post("/items/7", ""), "item:7")
	hold(t, locker, "item:7")
	start := time.Now()
	if rec := do(srv, post("/items/7", "")); rec.Code != http.StatusConflict || time.Since(start) > time.Second {
		t.Fatalf("held key: %d after %v, want the spec's 409 at once (wait=none)", rec.Code, time.Since(start))
	}
	if _, err := s.serveSpec(locker, "@lock key=item:<id> wiat=1s", reportLock(locker)); !errors.Is(err, middleware.ErrInvalidConfig) {
		t.Fatalf("a bad spec: err = %v, want ErrInvalidConfig", err)
	}
}

func (s *suite) testResponder(t *testing.T) {
	locker, _ := newMemLocker(t)
	hold(t, locker, "item:1")
	srv := s.serve(t, locker, "item:<id>", func(http.ResponseWriter, *http.Request) {},
		middleware.WithWait(0),
		middleware.WithResponder(func(w http.ResponseWriter, r *http.Request, rej *middleware.Rejection) {
			w.Header().Set("Retry-After", rej.RetryAfterHeader())
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, "busy:"+string(rej.Reason))
		}))
	rec := do(srv, post("/items/1", ""))
	if rec.Code != http.StatusTooManyRequests || rec.Body.String() != "busy:timeout" || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("got %d %q %v", rec.Code, rec.Body, rec.Header())
	}
}

func (s *suite) testMutualExclusion(t *testing.T) {
	locker, _ := newMemLocker(t)
	var inside, maxInside, count atomic.Int32
	srv := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) {
		n := inside.Add(1)
		for {
			m := maxInside.Load()
			if n <= m || maxInside.CompareAndSwap(m, n) {
				break
			}
		}
		runtime.Gosched()
		count.Add(1)
		inside.Add(-1)
	}, middleware.WithWait(30*time.Second))
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if rec := do(srv, post("/items/1", "")); rec.Code != http.StatusOK {
				t.Errorf("status %d", rec.Code)
			}
		})
	}
	wg.Wait()
	if maxInside.Load() != 1 || count.Load() != 50 {
		t.Fatalf("max handlers inside at once = %d (want 1), ran %d (want 50)", maxInside.Load(), count.Load())
	}
}

// watchdogTTL is the TTL of the watchdog cases: renewals every 100ms.
const watchdogTTL = 300 * time.Millisecond

func (s *suite) testWatchdogLost(t *testing.T) {
	store := memstore.New()
	var logs syncBuffer
	locker := reqlock.MustNew(store, reqlock.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	baseline := runtime.NumGoroutine()
	srv := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		lock, ok := reqlock.FromContext(ctx)
		if !ok {
			http.Error(w, "no lock in context", http.StatusInternalServerError)
			return
		}
		// Delete the lock behind the holder's back, as an expiry and
		// another owner's release would.
		if err := store.Release(context.Background(), []string{"reqlock:" + lock.Key()}, lock.Token(), 0); err != nil {
			http.Error(w, "deleting the key: "+err.Error(), http.StatusInternalServerError)
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
			http.Error(w, "the handler's context was not cancelled", http.StatusInternalServerError)
			return
		}
		if cause := context.Cause(ctx); !errors.Is(cause, reqlock.ErrLockLost) {
			http.Error(w, "cause: "+errString(cause), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}, middleware.WithWatchdog(), middleware.WithTTL(watchdogTTL))
	rec := do(srv, post("/items/8", ""))
	if rec.Code != http.StatusAccepted {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if l := logs.String(); strings.Count(l, "lock lost while") != 1 || strings.Count(l, "level=WARN") != 1 ||
		!strings.Contains(l, "key=item:8") {
		t.Fatalf("the loss was not logged once, alone, with its key: %s", l)
	}
	mustBeFree(t, locker, "item:8")
	waitForGoroutines(t, baseline)
}

func (s *suite) testWatchdogKeeps(t *testing.T) {
	locker, store := newMemLocker(t)
	entered := make(chan struct{})
	proceed := make(chan struct{})
	var once sync.Once
	finish := func() { once.Do(func() { close(proceed) }) }
	t.Cleanup(finish)
	long := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		select {
		case <-proceed:
			w.WriteHeader(http.StatusAccepted)
		case <-r.Context().Done():
			http.Error(w, "context ended: "+errString(context.Cause(r.Context())), http.StatusInternalServerError)
		}
	}, middleware.WithWatchdog(), middleware.WithTTL(watchdogTTL))
	other := s.serve(t, locker, "item:<id>", func(w http.ResponseWriter, r *http.Request) {}, middleware.WithWait(0))

	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- do(long, post("/items/4", "")) }()
	<-entered
	end := time.Now().Add(4 * watchdogTTL)
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(end) {
		<-tick.C
		if rec := do(other, post("/items/4", "")); rec.Code != http.StatusLocked {
			t.Fatalf("a request during the long handler got %d, want 423", rec.Code)
		}
		// Ask the store too, not only the Locker.
		g, err := store.Acquire(context.Background(), []string{"reqlock:item:4"}, "probe", time.Minute)
		if err != nil || g.OK {
			t.Fatalf("the store let another token acquire the key: %+v %v", g, err)
		}
	}
	finish()
	if rec := <-done; rec.Code != http.StatusAccepted {
		t.Fatalf("long handler: status %d: %s", rec.Code, rec.Body)
	}
	mustBeFree(t, locker, "item:4")
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

func asError(v any) error {
	if err, ok := v.(error); ok {
		return err
	}
	return nil
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// redisClientFor returns a client that honours context deadlines, as the
// README tells users to configure theirs, with retries off.
func redisClientFor(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
