package adaptertest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/routetable"
)

// Table builds Routes from route and spec pairs with routetable.ParseEntry,
// the i-th pair (from 1) with Source "code:i".
func Table(t testing.TB, locker *reqlock.Locker, pairs ...string) *middleware.Routes {
	t.Helper()
	return TableWith(t, locker, nil, pairs...)
}

func (s *suite) serveRoutes(t *testing.T, rt *middleware.Routes, routes ...Endpoint) http.Handler {
	t.Helper()
	h, err := s.a.ServeRoutes(rt, routes)
	if err != nil {
		t.Fatalf("%s: ServeRoutes: %v", s.a.Name, err)
	}
	return h
}

// unlocked is the body reportLock writes when the request holds no lock.
const unlocked = "unlocked"

// reportLock is a handler that answers 200 with the keys of the lock its
// request holds, space-separated, or "unlocked". It answers 500 when the
// lock's Keys are not sorted and distinct, Key is not the first of them, a
// key has no positive FenceOf (the first's being Fence), FenceOf knows a key
// the lock lacks, or another owner can obtain one of its keys: the lock
// must really be held.
func reportLock(locker *reqlock.Locker) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		lock, ok := reqlock.FromContext(r.Context())
		if !ok {
			_, _ = fmt.Fprint(w, unlocked)
			return
		}
		keys := lock.Keys()
		if lock.Key() != keys[0] {
			http.Error(w, fmt.Sprintf("Key %q is not the first of Keys %q", lock.Key(), keys), http.StatusInternalServerError)
			return
		}
		for i, k := range keys {
			if i > 0 && keys[i-1] >= k {
				http.Error(w, fmt.Sprintf("Keys %q are not sorted and distinct", keys), http.StatusInternalServerError)
				return
			}
			fence, ok := lock.FenceOf(k)
			if !ok || fence <= 0 || (i == 0 && fence != lock.Fence()) {
				http.Error(w, fmt.Sprintf("FenceOf(%q) = %d, %v; Fence() = %d", k, fence, ok, lock.Fence()), http.StatusInternalServerError)
				return
			}
			if other, err := locker.Obtain(context.Background(), k, time.Second, 0); !errors.Is(err, reqlock.ErrHeld) {
				if other != nil {
					_ = other.Release(context.Background())
				}
				http.Error(w, fmt.Sprintf("key %q is not held during the handler: %v", k, err), http.StatusInternalServerError)
				return
			}
		}
		if _, ok := lock.FenceOf("reqlock-test:not-a-key"); ok {
			http.Error(w, "FenceOf reports a key the lock does not hold", http.StatusInternalServerError)
			return
		}
		_, _ = fmt.Fprint(w, strings.Join(keys, " "))
	}
}

// Do serves a request with method and path and no body, and returns the
// recorded response: for an adapter's own tests.
func Do(h http.Handler, method, path string) *httptest.ResponseRecorder {
	return do(h, request(method, path, ""))
}

func request(method, path, body string) *http.Request {
	return httptest.NewRequest(method, path, strings.NewReader(body))
}

// expectBody fails unless the request answers 200 with body want.
func expectBody(t *testing.T, h http.Handler, req *http.Request, want string) {
	t.Helper()
	rec := do(h, req)
	if rec.Code != http.StatusOK || rec.Body.String() != want {
		t.Fatalf("%s %s: got %d %q, want 200 %q", req.Method, req.URL, rec.Code, rec.Body, want)
	}
}

func (s *suite) testRoutesLockListed(t *testing.T) {
	locker, store := newMemLocker(t)
	rt := Table(t, locker,
		"POST /items/{id}", "key=item:<id> wait=none",
		"PUT /items/{id}", "key=item:<id> wait=none")
	report := reportLock(locker)
	srv := s.serveRoutes(t, rt,
		Endpoint{Method: http.MethodPost, Path: "/items/{id}", Handler: report},
		Endpoint{Method: http.MethodPut, Path: "/items/{id}", Handler: report},
		Endpoint{Method: http.MethodGet, Path: "/items/{id}", Handler: report},  // same path, not listed
		Endpoint{Method: http.MethodPost, Path: "/notes/{id}", Handler: report}, // same method, not listed
	)
	expectBody(t, srv, request(http.MethodPost, "/items/1", ""), "item:1")
	expectBody(t, srv, request(http.MethodPut, "/items/1", ""), "item:1")
	expectBody(t, srv, request(http.MethodGet, "/items/1", ""), unlocked)
	expectBody(t, srv, request(http.MethodPost, "/notes/1", ""), unlocked)
	if n := store.Len(); n != 0 {
		t.Fatalf("store holds %d entries after the requests", n)
	}

	// While another owner holds item:1 the listed routes wait (here: not
	// at all), and the unlisted ones run as if nothing were locked.
	hold(t, locker, "item:1")
	s.expectRejection(t, do(srv, request(http.MethodPost, "/items/1", "")), http.StatusLocked, middleware.ReasonTimeout, true)
	s.expectRejection(t, do(srv, request(http.MethodPut, "/items/1", "")), http.StatusLocked, middleware.ReasonTimeout, true)
	expectBody(t, srv, request(http.MethodGet, "/items/1", ""), unlocked)
	expectBody(t, srv, request(http.MethodPost, "/notes/1", ""), unlocked)
	expectBody(t, srv, request(http.MethodPost, "/items/2", ""), "item:2")
}

// yamlTable is a route table file; its entries are on lines 4 and 5.
const yamlTable = `# Lock specs of the test routes.
routes:
  # item writes
  POST /items/{id}: "@lock key=item:<id> wait=none on-timeout=409"
  PUT /items/:id: key=item:<id> wait=30ms
`

func (s *suite) testRoutesYAML(t *testing.T) {
	locker, store := newMemLocker(t)
	specs, err := routetable.Parse("routes.yaml", []byte(yamlTable))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := middleware.NewRoutes(locker, specs)
	if err != nil {
		t.Fatal(err)
	}
	var sources []string
	for _, sp := range rt.Routes() {
		sources = append(sources, sp.Method+" "+sp.Path+" "+sp.Source)
	}
	if got, want := strings.Join(sources, ", "), "POST /items/{id} routes.yaml:4, PUT /items/{id} routes.yaml:5"; got != want {
		t.Fatalf("entries = %s, want %s", got, want)
	}
	report := reportLock(locker)
	srv := s.serveRoutes(t, rt,
		Endpoint{Method: http.MethodPost, Path: "/items/{id}", Handler: report},
		Endpoint{Method: http.MethodPut, Path: "/items/{id}", Handler: report},
		Endpoint{Method: http.MethodGet, Path: "/items/{id}", Handler: report},
	)
	expectBody(t, srv, request(http.MethodPost, "/items/5", ""), "item:5")
	expectBody(t, srv, request(http.MethodPut, "/items/5", ""), "item:5")
	expectBody(t, srv, request(http.MethodGet, "/items/5", ""), unlocked)
	if n := store.Len(); n != 0 {
		t.Fatalf("store holds %d entries after the requests", n)
	}
	hold(t, locker, "item:5")
	s.expectRejection(t, do(srv, request(http.MethodPost, "/items/5", "")), http.StatusConflict, middleware.ReasonTimeout, true)
	s.expectRejection(t, do(srv, request(http.MethodPut, "/items/5", "")), http.StatusLocked, middleware.ReasonTimeout, true)
	expectBody(t, srv, request(http.MethodGet, "/items/5", ""), unlocked)
}

func (s *suite) testRoutesOwnStatus(t *testing.T) {
	locker, _ := newMemLocker(t)
	const wait = 60 * time.Millisecond
	rt := Table(t, locker,
		"POST /items/{id}", "key=item:<id> wait=none on-timeout=409",
		"PUT /items/{id}", "key=item:<id> wait="+wait.String())
	var ran []string
	h := func(w http.ResponseWriter, r *http.Request) { ran = append(ran, r.Method) }
	srv := s.serveRoutes(t, rt,
		Endpoint{Method: http.MethodPost, Path: "/items/{id}", Handler: h},
		Endpoint{Method: http.MethodPut, Path: "/items/{id}", Handler: h},
	)
	hold(t, locker, "item:3")

	start := time.Now()
	s.expectRejection(t, do(srv, request(http.MethodPost, "/items/3", "")), http.StatusConflict, middleware.ReasonTimeout, true)
	if d := time.Since(start); d >= wait {
		t.Errorf("the wait=none route answered after %v, as if it waited like the other route", d)
	}
	start = time.Now()
	s.expectRejection(t, do(srv, request(http.MethodPut, "/items/3", "")), http.StatusLocked, middleware.ReasonTimeout, true)
	if d := time.Since(start); d < wait {
		t.Errorf("the wait=%v route answered after %v: it did not wait", wait, d)
	}
	if len(ran) != 0 {
		t.Fatalf("handlers ran without the lock: %v", ran)
	}
}

func (s *suite) testRoutesSpellings(t *testing.T) {
	locker, _ := newMemLocker(t)
	rt := Table(t, locker,
		"POST /a/:id", "key=a:<id>",
		"POST /b/{id}", "key=b:<id>",
		"PUT /c/:x/d/{y}", "key=c:<x>:<y>",
		"DELETE /e/*rest", "key=e:<rest>")
	report := reportLock(locker)
	srv := s.serveRoutes(t, rt,
		Endpoint{Method: http.MethodPost, Path: "/a/{id}", Handler: report},
		Endpoint{Method: http.MethodPost, Path: "/b/{id}", Handler: report},
		Endpoint{Method: http.MethodPut, Path: "/c/{x}/d/{y}", Handler: report},
		Endpoint{Method: http.MethodDelete, Path: "/e/{rest...}", Handler: report},
	)
	expectBody(t, srv, request(http.MethodPost, "/a/1", ""), "a:1")
	expectBody(t, srv, request(http.MethodPost, "/b/2", ""), "b:2")
	expectBody(t, srv, request(http.MethodPut, "/c/3/d/4", ""), "c:3:4")
	expectBody(t, srv, request(http.MethodDelete, "/e/5", ""), "e:5")
}

func (s *suite) testRoutesRestParam(t *testing.T) {
	locker, _ := newMemLocker(t)
	rt := Table(t, locker, "GET /files/{path...}", "key=file:<path>")
	srv := s.serveRoutes(t, rt, Endpoint{Method: http.MethodGet, Path: "/files/{path...}", Handler: reportLock(locker)})
	// The rest of the path is "a/b/c" as net/http's PathValue gives it: the
	// same key as the JSON value "a/b/c", whatever the router.
	tmpl, err := keyfunc.Parse("file:<json:path>")
	if err != nil {
		t.Fatal(err)
	}
	want, err := tmpl.Key(keyfunc.HTTPRequest(post("/", `{"path":"a/b/c"}`)))
	if err != nil {
		t.Fatal(err)
	}
	expectBody(t, srv, request(http.MethodGet, "/files/a/b%2Fc", ""), want)
}

// A rest-of-path parameter is the rest of the path without a leading slash
// on every router (gin gives its catch-all one), so a table entry and a
// route guard on the same template lock the same key, the second
// reentrantly, and one file is one key whatever the router.
func (s *suite) testRoutesRestParamGuard(t *testing.T) {
	locker, _ := newMemLocker(t)
	rt := Table(t, locker, "GET /files/{path...}", "key=file:<path> wait=none")
	srv := s.serveRoutes(t, rt, Endpoint{Method: http.MethodGet, Path: "/files/{path...}",
		Guard: mustGuard(t, locker, "file:<path>", middleware.WithWait(0)), Handler: reportLock(locker)})
	for path, want := range map[string]string{
		"/files/a":          "file:a",
		"/files/a/b":        "file:a%2Fb",
		"/files/a%2Fb/c":    "file:a%2Fb%2Fc",
		"/files/dir/":       "file:dir%2F",
		"/files/%2Fleading": "file:%2Fleading",
	} {
		expectBody(t, srv, request(http.MethodGet, path, ""), want)
	}
	// Nothing after the prefix: no value.
	if rec := do(srv, request(http.MethodGet, "/files/", "")); rec.Code != http.StatusBadRequest {
		t.Errorf("GET /files/: status %d, want 400", rec.Code)
	}
}

// Routes are found by their whole path, a group's prefix included: an entry
// written without the prefix matches nothing and fails the start-up check.
func (s *suite) testRoutesGroup(t *testing.T) {
	locker, _ := newMemLocker(t)
	rt := Table(t, locker,
		"POST /items/{id}", "key=item:<id>",
		"POST /v1/carts/{id}", "key=cart:<id>",
		"POST /v1/items/:id", "key=item:<id>")
	report := reportLock(locker)
	endpoints := []Endpoint{
		{Method: http.MethodPost, Path: "/items/{id}", Handler: report},
		{Method: http.MethodGet, Path: "/items/{id}", Handler: report},
		{Method: http.MethodPost, Path: "/v1/carts/{id}", Group: "/v1", Handler: report},
		{Method: http.MethodPost, Path: "/v1/items/{id}", Group: "/v1", Handler: report},
		{Method: http.MethodGet, Path: "/v1/items/{id}", Group: "/v1", Handler: report},
	}
	srv := s.serveRoutes(t, rt, endpoints...)
	for _, tc := range []struct{ method, path, want string }{
		{http.MethodPost, "/items/1", "item:1"},
		{http.MethodPost, "/v1/carts/2", "cart:2"},
		{http.MethodGet, "/items/1", unlocked},
		{http.MethodPost, "/v1/items/3", "item:3"},
		{http.MethodGet, "/v1/items/3", unlocked},
	} {
		expectBody(t, srv, request(tc.method, tc.path, ""), tc.want)
	}

	rt = Table(t, locker, "POST /carts/:id", "key=cart:<id>")
	_, err := s.a.ServeRoutes(rt, endpoints)
	if !errors.Is(err, middleware.ErrInvalidConfig) || !strings.Contains(err.Error(), "code:1") {
		t.Fatalf("ServeRoutes err = %v, want ErrInvalidConfig naming code:1", err)
	}
}

// unmatchedTable has one entry the test routes serve (line 2) and two they
// do not: another method (line 3) and another path (line 4).
const unmatchedTable = `routes:
  POST /items/{id}: key=item:<id>
  DELETE /items/:id: key=item:<id>
  POST /nowhere/{id}: key=nowhere:<id>
`

func (s *suite) testRoutesUnmatched(t *testing.T) {
	locker, _ := newMemLocker(t)
	specs, err := routetable.Parse("routes.yaml", []byte(unmatchedTable))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := middleware.NewRoutes(locker, specs)
	if err != nil {
		t.Fatal(err)
	}
	h := func(http.ResponseWriter, *http.Request) {}
	_, err = s.a.ServeRoutes(rt, []Endpoint{
		{Method: http.MethodPost, Path: "/items/{id}", Handler: h},
		{Method: http.MethodGet, Path: "/items/{id}", Handler: h},
	})
	if !errors.Is(err, middleware.ErrInvalidConfig) {
		t.Fatalf("ServeRoutes err = %v, want ErrInvalidConfig", err)
	}
	msg := err.Error()
	for _, want := range []string{"routes.yaml:3", "DELETE /items/{id}", "routes.yaml:4", "POST /nowhere/{id}"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not name %q: %v", want, msg)
		}
	}
	if strings.Contains(msg, "routes.yaml:2") {
		t.Errorf("error names the entry that matches a route: %v", msg)
	}

	// A table built in code names the source its entries were given.
	rt = Table(t, locker, "POST /items/{id}", "key=item:<id>", "PATCH /items/{id}", "key=item:<id>")
	_, err = s.a.ServeRoutes(rt, []Endpoint{{Method: http.MethodPost, Path: "/items/{id}", Handler: h}})
	if !errors.Is(err, middleware.ErrInvalidConfig) || !strings.Contains(err.Error(), "code:2") ||
		!strings.Contains(err.Error(), "PATCH /items/{id}") || strings.Contains(err.Error(), "code:1") {
		t.Fatalf("ServeRoutes err = %v, want ErrInvalidConfig naming code:2 PATCH /items/{id} alone", err)
	}

	// Every entry served: no error.
	if _, err := s.a.ServeRoutes(rt, []Endpoint{
		{Method: http.MethodPost, Path: "/items/{id}", Handler: h},
		{Method: http.MethodPatch, Path: "/items/{id}", Handler: h},
	}); err != nil {
		t.Fatalf("ServeRoutes with every entry registered: %v", err)
	}
}

func (s *suite) testRoutesMissingParam(t *testing.T) {
	locker, _ := newMemLocker(t)
	e, err := routetable.ParseEntry("POST /orders/:order", "key=order:<id>", "code:9")
	if err != nil {
		t.Fatal(err)
	}
	_, err = middleware.NewRoutes(locker, []routetable.Entry{e})
	if !errors.Is(err, middleware.ErrInvalidConfig) {
		t.Fatalf("NewRoutes err = %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{"code:9", `"id"`, "order:<id>", "it has: order"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %q: %v", want, err)
		}
	}
}
