package middleware_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/metrics"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/routetable"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
)

// TestSharedAndLimitedMetrics: a route's holders show by mode while its
// handlers run, and each over-limit answer counts in
// lock_limit_reached_total (and as a timeout).
func TestSharedAndLimitedMetrics(t *testing.T) {
	reg := metrics.New()
	locker := reqlock.MustNew(memstore.New(), reqlock.WithMetrics(reg))
	rt, err := middleware.NewRoutes(locker, mustEntries(t, `routes:
  GET /reports/{id}: "@lock key=report:<id> mode=shared"
  POST /exports: "@lock key=tenant:<header:X-Tenant> limit=2 wait=none"
`))
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	mux := http.NewServeMux()
	block := func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
	}
	mux.HandleFunc("GET /reports/{id}", block)
	mux.HandleFunc("POST /exports", block)
	h, err := rt.Handler(mux)
	if err != nil {
		t.Fatal(err)
	}
	export := func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/exports", nil)
		r.Header.Set("X-Tenant", "acme")
		return r
	}
	done := make(chan int, 5)
	serve := func(r *http.Request) {
		go func() {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			done <- w.Code
		}()
		<-entered
	}
	serve(httptest.NewRequest(http.MethodGet, "/reports/1", nil))
	serve(httptest.NewRequest(http.MethodGet, "/reports/1", nil))
	serve(export())
	serve(export())
	w := httptest.NewRecorder()
	h.ServeHTTP(w, export())
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("third export: status %d, Retry-After %q; want 429 and 1", w.Code, w.Header().Get("Retry-After"))
	}
	expose := func() string {
		var b bytes.Buffer
		if _, err := reg.WriteTo(&b); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	text := expose()
	for _, want := range []string{
		`reqlock_lock_holders{mode="shared",route="GET /reports/{id}"} 2`,
		`reqlock_lock_holders{mode="limited",route="POST /exports"} 2`,
		`reqlock_lock_limit_reached_total{route="POST /exports"} 1`,
		`reqlock_lock_failure_total{reason="timeout",route="POST /exports"} 1`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("no %s in:\n%s", want, text)
		}
	}
	close(release)
	for range 4 {
		if code := <-done; code != http.StatusOK {
			t.Errorf("held request: status %d", code)
		}
	}
	text = expose()
	for _, want := range []string{
		`reqlock_lock_holders{mode="shared",route="GET /reports/{id}"} 0`,
		`reqlock_lock_holders{mode="limited",route="POST /exports"} 0`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("after the handlers: no %s in:\n%s", want, text)
		}
	}
}

// exclusiveOnly is a real store seen through the plain stores.Store
// interface alone: a store without shared locks (a store of your own).
type exclusiveOnly struct{ stores.Store }

// TestSharedTableStartUp: a table's shared or limited entry fails at
// start-up naming its file, line and route when the store lacks shared
// locks, and when its spec is invalid.
func TestSharedTableStartUp(t *testing.T) {
	_, err := middleware.NewRoutes(reqlock.MustNew(exclusiveOnly{memstore.New()}), mustEntries(t, `routes:
  GET /reports/:id: "@lock key=report:<id> mode=shared"
  POST /exports: "@lock key=tenant:<header:X-Tenant> limit=3"
`))
	for _, want := range []string{
		`reqlock/middleware: invalid configuration: routes.yaml:2: GET /reports/{id}: a shared lock: reqlock: invalid argument: ` +
			`shared and limited locks need a store that implements stores.SharedStore; middleware_test.exclusiveOnly does not`,
		`reqlock/middleware: invalid configuration: routes.yaml:3: POST /exports: a limited lock: reqlock: invalid argument: ` +
			`shared and limited locks need a store that implements stores.SharedStore; middleware_test.exclusiveOnly does not`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v\nwant it to say %s", err, want)
		}
	}
	_, err = middleware.LoadRoutes(reqlock.MustNew(memstore.New()), writeFile(t, "routes.yaml", `routes:
  GET /reports/:id: "@lock key=report:<id> key=x mode=shared"
  POST /exports: "@lock key=tenant:<header:X-Tenant> limit=3 mode=shared ttl=1s"
`))
	for _, want := range []string{
		`routes.yaml:2: GET /reports/:id: spec column 29: mode: a shared or limited lock takes one key; this spec has 2 key templates`,
		`routes.yaml:3: POST /exports: spec column 44: mode: a limit is a mode of its own`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v\nwant it to say %s", err, want)
		}
	}
}

// mustEntries parses a YAML route table named routes.yaml.
func mustEntries(t *testing.T, table string) []routetable.Entry {
	t.Helper()
	entries, err := routetable.Parse("routes.yaml", []byte(table))
	if err != nil {
		t.Fatal(err)
	}
	return entries
}

// writeFile writes a file named name in a new directory and returns its
// path.
func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSharedInsideExclusive: a route inside a locked group may take the
// group's key shared when the group holds it exclusively (a hold on the
// group's grant); a group holding it shared cannot take it exclusively
// inside: 500, never a wait for itself.
func TestSharedInsideExclusive(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	nested := func(outer, inner []middleware.Option) int {
		og := middleware.Must(middleware.New(locker, "item:<id>", append(outer, middleware.WithWait(time.Second))...))
		ig := middleware.Must(middleware.New(locker, "item:<id>", append(inner, middleware.WithWait(time.Second))...))
		mux := http.NewServeMux()
		mux.Handle("POST /items/{id}", og.Handler(ig.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/items/1", nil))
		return w.Code
	}
	if code := nested(nil, []middleware.Option{middleware.WithShared()}); code != http.StatusOK {
		t.Errorf("shared inside exclusive: %d, want 200", code)
	}
	start := time.Now()
	if code := nested([]middleware.Option{middleware.WithShared()}, nil); code != http.StatusInternalServerError {
		t.Errorf("exclusive inside shared: %d, want 500", code)
	}
	if d := time.Since(start); d >= time.Second {
		t.Errorf("exclusive inside shared took %v: it waited for itself", d)
	}
}
