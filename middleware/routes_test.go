package middleware_test

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
	"github.com/reqlock/reqlock/stores/memstore"
)

// entry parses one route table entry into its Route, failing the test on
// an error.
func entry(t testing.TB, route, spec, source string) middleware.Route {
	t.Helper()
	e, err := routetable.ParseEntry(route, spec, source)
	if err != nil {
		t.Fatal(err)
	}
	return middleware.RouteOf(e)
}

// newRoutes builds Routes from route and spec pairs, the i-th (from 1)
// with Source "code:i".
func newRoutes(t testing.TB, locker *reqlock.Locker, pairs ...string) *middleware.Routes {
	t.Helper()
	var routes []middleware.Route
	for i := 0; i+1 < len(pairs); i += 2 {
		routes = append(routes, entry(t, pairs[i], pairs[i+1], fmt.Sprintf("code:%d", i/2+1)))
	}
	rt, err := middleware.NewRoutesWithConfig(locker, routes)
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// keysHandler answers the keys of the request's lock in the X-Lock header
// (a HEAD answer has no body), or "unlocked".
func keysHandler(w http.ResponseWriter, r *http.Request) {
	v := "unlocked"
	if lock, ok := reqlock.FromContext(r.Context()); ok {
		v = strings.Join(lock.Keys(), " ")
	}
	w.Header().Set("X-Lock", v)
}

func serveRec(h http.Handler, method, path string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec
}

func expectLock(t *testing.T, h http.Handler, method, path, want string) {
	t.Helper()
	rec := serveRec(h, method, path)
	if rec.Code != http.StatusOK || rec.Header().Get("X-Lock") != want {
		t.Errorf("%s %s: got %d lock %q, want 200 lock %q (body %s)", method, path, rec.Code, rec.Header().Get("X-Lock"), want, rec.Body)
	}
}

func holdKey(t *testing.T, locker *reqlock.Locker, key string) {
	t.Helper()
	lock, err := locker.Obtain(context.Background(), key, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lock.Release(context.Background()) })
}

func TestNewRoutesJoinsEveryError(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	routes := []middleware.Route{
		// Reads a path parameter the route lacks.
		entry(t, "POST /a/{id}", "key=a:<sku>", "code:1"),
		// A key template that does not parse.
		{Method: http.MethodPost, Path: "/b", Config: middleware.Config{Key: "b:<x"}, Source: "code:2"},
		// Fine.
		entry(t, "PUT /c/{id}", "key=c:<id>", "code:3"),
		// code:3 again, spelled differently.
		entry(t, "PUT /c/:other", "key=c:<other>", "code:4"),
		// An invalid configuration.
		{Method: http.MethodPost, Path: "/e", Config: middleware.Config{Key: "e", TTL: -time.Second}, Source: "code:5"},
	}
	_, err := middleware.NewRoutesWithConfig(locker, routes)
	if !errors.Is(err, middleware.ErrInvalidConfig) {
		t.Fatalf("err = %v, want ErrInvalidConfig", err)
	}
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("err %T is not a join of errors: %v", err, err)
	}
	want := []struct{ source, problem string }{
		{"code:1", `reads path parameter "sku"`},
		{"code:2", "b:<x"},
		{"code:4", "listed twice (first at code:3)"},
		{"code:5", "ttl"},
	}
	errs := joined.Unwrap()
	if len(errs) != len(want) {
		t.Fatalf("%d errors, want %d:\n%v", len(errs), len(want), err)
	}
	for i, w := range want {
		msg := errs[i].Error()
		prefix := middleware.ErrInvalidConfig.Error() + ": " + w.source + ": "
		if !strings.HasPrefix(msg, prefix) || !strings.Contains(msg, w.problem) || !errors.Is(errs[i], middleware.ErrInvalidConfig) {
			t.Errorf("error %d = %q, want ErrInvalidConfig starting %q naming %q", i, msg, prefix, w.problem)
		}
	}
	if strings.Contains(err.Error(), "code:3:") {
		t.Errorf("the valid entry is reported: %v", err)
	}
}

func TestNewRoutesDuplicateAcrossSpellings(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	cases := []struct {
		a, b [2]string
		dup  bool
	}{
		{[2]string{"POST /items/{id}", "key=i:<id>"}, [2]string{"POST /items/:id", "key=i:<id>"}, true},
		{[2]string{"POST /items/{id}", "key=i:<id>"}, [2]string{"POST /items/:sku", "key=i:<sku>"}, true},
		{[2]string{"GET /files/{path...}", "key=f:<path>"}, [2]string{"GET /files/*rest", "key=f:<rest>"}, true},
		{[2]string{"PUT /a/:x/b/{y}", "key=a:<x>"}, [2]string{"PUT /a/{p}/b/:q", "key=a:<p>"}, true},
		{[2]string{"POST /items/{id}", "key=i:<id>"}, [2]string{"PUT /items/:id", "key=i:<id>"}, false},
		{[2]string{"POST /items/{id}", "key=i:<id>"}, [2]string{"POST /items/{id}/x", "key=i:<id>"}, false},
		{[2]string{"GET /files/{path...}", "key=f:<path>"}, [2]string{"GET /files/{id}", "key=f:<id>"}, false},
		{[2]string{"GET /items/{$}", "key=all"}, [2]string{"GET /items/{id}", "key=i:<id>"}, false},
	}
	for _, tc := range cases {
		_, err := middleware.NewRoutesWithConfig(locker, []middleware.Route{
			entry(t, tc.a[0], tc.a[1], "code:1"), entry(t, tc.b[0], tc.b[1], "code:2"),
		})
		switch {
		case tc.dup && (!errors.Is(err, middleware.ErrInvalidConfig) ||
			!strings.HasPrefix(err.Error(), middleware.ErrInvalidConfig.Error()+": code:2: ") || !strings.Contains(err.Error(), "listed twice (first at code:1)")):
			t.Errorf("%s and %s: err = %v, want code:2 listed twice (first at code:1)", tc.a[0], tc.b[0], err)
		case !tc.dup && err != nil:
			t.Errorf("%s and %s: err = %v, want two routes", tc.a[0], tc.b[0], err)
		}
	}
}

func TestRoutesGuardLookup(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	rt := newRoutes(t, locker,
		"POST /items/:id", "key=item:<id>",
		"GET /files/{path...}", "key=file:<path>",
		"DELETE /a/{x}/b/:y", "key=ab:<x>:<y> name=delete-ab")
	for _, tc := range []struct {
		method   string
		spelling []string
		name     string
	}{
		{http.MethodPost, []string{"/items/{id}", "/items/:id"}, "POST /items/{id}"},
		{http.MethodGet, []string{"/files/{path...}", "/files/*path"}, "GET /files/{path...}"},
		{http.MethodDelete, []string{"/a/{x}/b/{y}", "/a/:x/b/:y"}, "delete-ab"},
	} {
		first := rt.Guard(tc.method, tc.spelling[0])
		if first == nil {
			t.Errorf("Guard(%s, %s) = nil", tc.method, tc.spelling[0])
			continue
		}
		if got := first.Config().Name; got != tc.name {
			t.Errorf("Guard(%s, %s) is named %q, want %q", tc.method, tc.spelling[0], got, tc.name)
		}
		for _, sp := range tc.spelling[1:] {
			if g := rt.Guard(tc.method, sp); g != first {
				t.Errorf("Guard(%s, %s) = %p, want the guard of %s, %p", tc.method, sp, g, tc.spelling[0], first)
			}
		}
	}
	for _, miss := range [][2]string{
		{http.MethodPut, "/items/{id}"},   // another method
		{http.MethodPost, "/items/{sku}"}, // another parameter name
		{http.MethodPost, "/items"},
		{http.MethodGet, "/files/{path}"}, // not the rest of the path
		{http.MethodGet, "/files/:path"},
	} {
		if g := rt.Guard(miss[0], miss[1]); g != nil {
			t.Errorf("Guard(%s, %s) = %p, want nil", miss[0], miss[1], g)
		}
	}
	var got []string
	for _, sp := range rt.Routes() {
		got = append(got, sp.Source+" "+sp.Method+" "+sp.Path)
	}
	if want := "code:1 POST /items/{id}, code:2 GET /files/{path...}, code:3 DELETE /a/{x}/b/{y}"; strings.Join(got, ", ") != want {
		t.Errorf("Routes = %s, want %s", strings.Join(got, ", "), want)
	}
}

func TestHandlerMethodlessPattern(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	rt := newRoutes(t, locker,
		"POST /items/{id}", "key=item:<id>",
		"PUT /items/:id", "key=put:<id>")
	mux := http.NewServeMux()
	mux.HandleFunc("/items/{id}", keysHandler) // every method
	h, err := rt.Handler(mux)
	if err != nil {
		t.Fatal(err)
	}
	expectLock(t, h, http.MethodPost, "/items/1", "item:1")
	expectLock(t, h, http.MethodPut, "/items/1", "put:1")
	expectLock(t, h, http.MethodGet, "/items/1", "unlocked")
	expectLock(t, h, http.MethodDelete, "/items/1", "unlocked")

	// A pattern that serves the path only as part of a wider one does not
	// count: the entry's route is not registered.
	mux = http.NewServeMux()
	mux.HandleFunc("/", keysHandler)
	mux.HandleFunc("/items/", keysHandler)
	if _, err := rt.Handler(mux); !errors.Is(err, middleware.ErrInvalidConfig) ||
		!strings.Contains(err.Error(), "code:1") || !strings.Contains(err.Error(), "code:2") {
		t.Fatalf("Handler on a mux with only / and /items/: err = %v, want both entries reported", err)
	}
}

func TestHandlerHEADServedByGETEntry(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	rt := newRoutes(t, locker,
		"GET /items/{id}", "key=item:<id> wait=none",
		"HEAD /heads/{id}", "key=head:<id> wait=none")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /items/{id}", keysHandler) // ServeMux serves HEAD with it
	mux.HandleFunc("GET /heads/{id}", keysHandler)
	h, err := rt.Handler(mux)
	if err != nil {
		t.Fatalf("a HEAD entry on a GET pattern: %v", err)
	}
	expectLock(t, h, http.MethodGet, "/items/1", "item:1")
	expectLock(t, h, http.MethodHead, "/items/1", "item:1")
	// The HEAD entry locks HEAD only; GET on that pattern has no entry.
	expectLock(t, h, http.MethodHead, "/heads/1", "head:1")
	expectLock(t, h, http.MethodGet, "/heads/1", "unlocked")

	holdKey(t, locker, "item:2")
	if rec := serveRec(h, http.MethodHead, "/items/2"); rec.Code != http.StatusLocked {
		t.Fatalf("HEAD on a held key: status %d, want 423", rec.Code)
	}
}

func TestHandlerPathValuesFromPattern(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	rt := newRoutes(t, locker,
		"POST /a/{id}/b/{rest...}", "key=id:<id> key=rest:<rest>",
		"POST /list/{$}", "key=list:<query:q>")
	idT := keyfunc.MustParse("id:<id>")
	restT := keyfunc.MustParse("rest:<rest>")
	mux := http.NewServeMux()
	mux.HandleFunc("POST /a/{id}/b/{rest...}", func(w http.ResponseWriter, r *http.Request) {
		// The keys the middleware derived before the mux routed the request
		// are those the mux's own path values render.
		lock, ok := reqlock.FromContext(r.Context())
		id, err1 := idT.Key(keyfunc.HTTPRequest(r))
		rest, err2 := restT.Key(keyfunc.HTTPRequest(r))
		if !ok || err1 != nil || err2 != nil {
			http.Error(w, fmt.Sprint("no lock or no key: ", ok, err1, err2), http.StatusInternalServerError)
			return
		}
		want := []string{id, rest}
		if strings.Join(lock.Keys(), " ") != strings.Join(want, " ") {
			http.Error(w, fmt.Sprintf("lock keys %q, the mux's path values give %q", lock.Keys(), want), http.StatusInternalServerError)
			return
		}
		w.Header().Set("X-Lock", strings.Join(lock.Keys(), " "))
	})
	mux.HandleFunc("POST /list/{$}", keysHandler)
	h, err := rt.Handler(mux)
	if err != nil {
		t.Fatal(err)
	}
	expectLock(t, h, http.MethodPost, "/a/x/b/c", "id:x rest:c")
	expectLock(t, h, http.MethodPost, "/a/x/b/c/d", "id:x rest:c%2Fd")
	expectLock(t, h, http.MethodPost, "/a/x%2Fy/b/c%20d/e%2Ff", "id:x%2Fy rest:c%20d%2Fe%2Ff")
	// {rest...} matches nothing after the slash: no value, as r.PathValue.
	if rec := serveRec(h, http.MethodPost, "/a/x/b/"); rec.Code != http.StatusBadRequest {
		t.Errorf("POST /a/x/b/: status %d, want 400 (empty rest): %s", rec.Code, rec.Body)
	}
	expectLock(t, h, http.MethodPost, "/list/?q=all", "list:all")
	if rec := serveRec(h, http.MethodPost, "/list/x?q=all"); rec.Code != http.StatusNotFound {
		t.Errorf("POST /list/x: status %d, want the mux's 404", rec.Code)
	}
}

func TestHandlerUnlockedRoutesPassThrough(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	rt := newRoutes(t, locker, "POST /items/{id}", "key=item:<id> wait=none")
	mux := http.NewServeMux()
	mux.HandleFunc("POST /items/{id}", keysHandler)
	mux.HandleFunc("GET /items/{id}", keysHandler)
	mux.HandleFunc("POST /notes/{id}", keysHandler)
	h, err := rt.Handler(mux)
	if err != nil {
		t.Fatal(err)
	}
	holdKey(t, locker, "item:1")
	if rec := serveRec(h, http.MethodPost, "/items/1"); rec.Code != http.StatusLocked {
		t.Fatalf("listed route on a held key: status %d, want 423", rec.Code)
	}
	expectLock(t, h, http.MethodGet, "/items/1", "unlocked")
	expectLock(t, h, http.MethodPost, "/notes/1", "unlocked")
	if rec := serveRec(h, http.MethodPost, "/nothing"); rec.Code != http.StatusNotFound {
		t.Errorf("unknown path: status %d, want the mux's 404", rec.Code)
	}
	if rec := serveRec(h, http.MethodDelete, "/items/1"); rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") == "" {
		t.Errorf("unknown method: status %d Allow %q, want the mux's 405 with Allow", rec.Code, rec.Header().Get("Allow"))
	}
}

func TestHandlerReportsEveryUnmatchedEntry(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	rt := newRoutes(t, locker,
		"POST /items/{id}", "key=item:<id>", // served
		"POST /missing/{id}", "key=m:<id>", // no pattern
		"GET /items/{id}", "key=item:<id>", // pattern for another method
		"POST /things/{id}", "key=t:<id>", // only a wider prefix pattern
		"POST /named/{sku}", "key=n:<sku>") // the pattern names it {id}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /items/{id}", keysHandler)
	mux.HandleFunc("/things/", keysHandler)
	mux.HandleFunc("POST /named/{id}", keysHandler)
	_, err := rt.Handler(mux)
	if !errors.Is(err, middleware.ErrInvalidConfig) {
		t.Fatalf("err = %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{"code:2: ", "POST /missing/{id}", "code:3: ", "GET /items/{id}",
		"code:4: ", "POST /things/{id}", "code:5: ", "POST /named/{sku}"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "code:1") {
		t.Errorf("the served entry is reported:\n%v", err)
	}
}

// discard is a ResponseWriter that keeps nothing, so the benchmarks measure
// routing and not recording.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}

// BenchmarkRoutesUnlocked serves a route without an entry through a bare
// ServeMux and through Routes.Handler wrapping the same mux with a table of
// 20 other routes: the cost an unlocked route pays for the table.
func BenchmarkRoutesUnlocked(b *testing.B) {
	locker := reqlock.MustNew(memstore.New())
	mux := http.NewServeMux()
	var pairs []string
	for i := range 20 {
		path := fmt.Sprintf("/r%d/{id}", i)
		mux.HandleFunc("POST "+path, func(http.ResponseWriter, *http.Request) {})
		pairs = append(pairs, "POST "+path, "key=r:<id>")
	}
	mux.HandleFunc("GET /items/{id}", func(http.ResponseWriter, *http.Request) {})
	rt := newRoutes(b, locker, pairs...)
	wrapped, err := rt.Handler(mux)
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		h    http.Handler
	}{{"mux", mux}, {"routes", wrapped}} {
		b.Run(bc.name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, "/items/42", nil)
			w := &discard{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				bc.h.ServeHTTP(w, req)
			}
		})
	}
}
