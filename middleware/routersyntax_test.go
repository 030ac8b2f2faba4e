package middleware_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/routetable"
	"github.com/reqlock/reqlock/stores/memstore"
)

// wantRouterSyntaxError checks that err is the start-up error of a key
// template in router syntax: it wraps ErrInvalidConfig and keyfunc.ErrSyntax
// and shows the reqlock spelling of the parameter.
func wantRouterSyntaxError(t *testing.T, what string, err error, syntax, spelling string) {
	t.Helper()
	if !errors.Is(err, middleware.ErrInvalidConfig) || !errors.Is(err, keyfunc.ErrSyntax) {
		t.Fatalf("%s: err = %v, want ErrInvalidConfig and keyfunc.ErrSyntax", what, err)
	}
	for _, part := range []string{"router syntax " + syntax, "write " + spelling + " for a path parameter"} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("%s: error %q lacks %q", what, err, part)
		}
	}
}

// TestRouterSyntaxInCode: New, NewWithConfig (Key and Keys) and MustNew-style
// callers fail at start-up on {id} or :id.
func TestRouterSyntaxInCode(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	for _, tc := range []struct{ key, syntax string }{
		{"acct:{id}", "{id}"},
		{"acct::id", ":id"},
		{"acct/:id", ":id"},
	} {
		g, err := middleware.New(locker, tc.key)
		if g != nil {
			t.Errorf("New(%q) returned a Guard", tc.key)
		}
		wantRouterSyntaxError(t, "New("+tc.key+")", err, tc.syntax, "<id>")
		_, err = middleware.NewWithConfig(locker, middleware.Config{Key: "sku:<sku>", Keys: []string{tc.key}})
		wantRouterSyntaxError(t, "NewWithConfig(Keys: "+tc.key+")", err, tc.syntax, "<id>")
	}
}

// TestRouterSyntaxInSpec: a spec's key in router syntax fails ParseSpec and
// NewFromSpec, quoted or not, and the error keeps the spec column.
func TestRouterSyntaxInSpec(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	for _, tc := range []struct{ spec, syntax string }{
		{"@lock key=acct:{id} wait=1s", "{id}"},
		{`@lock key="acct::id"`, ":id"},
		{"@lock key=sku:<sku> key=:id", ":id"},
	} {
		_, err := middleware.ParseSpec(tc.spec)
		wantRouterSyntaxError(t, "ParseSpec("+tc.spec+")", err, tc.syntax, "<id>")
		if !strings.Contains(err.Error(), "spec column ") {
			t.Errorf("ParseSpec(%s): error %q has no column", tc.spec, err)
		}
		_, err = middleware.NewFromSpec(locker, tc.spec)
		wantRouterSyntaxError(t, "NewFromSpec("+tc.spec+")", err, tc.syntax, "<id>")
	}
}

// TestRouterSyntaxInTable: a YAML or JSON route table with a key in router
// syntax fails LoadRoutes, with the entry's line, and so does
// NewRoutesWithConfig given such a route built in code.
func TestRouterSyntaxInTable(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, data, where, syntax string }{
		{"routes.yaml", "routes:\n  GET /a: key=a\n  POST /acct/{id}: key=acct:{id}\n", "routes.yaml:3", "{id}"},
		{"routes.yml", "routes:\n  POST /acct/:id: '@lock key=acct::id'\n", "routes.yml:2", ":id"},
		{"routes.json", "{\"routes\": {\n\"POST /acct/{id}\": \"key=acct:{id}\"}}", "routes.json:2", "{id}"},
	} {
		path := filepath.Join(dir, tc.name)
		if err := os.WriteFile(path, []byte(tc.data), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := middleware.LoadRoutes(reqlock.MustNew(memstore.New()), path)
		wantRouterSyntaxError(t, "LoadRoutes "+tc.name, err, tc.syntax, "<id>")
		if !strings.Contains(err.Error(), tc.where) {
			t.Errorf("%s: error %q does not name %s", tc.name, err, tc.where)
		}
	}
	_, err := middleware.NewRoutesWithConfig(reqlock.MustNew(memstore.New()), []middleware.Route{
		{Method: "POST", Path: "/acct/{id}", Config: middleware.Config{Key: "acct:{id}"}},
	})
	wantRouterSyntaxError(t, "NewRoutesWithConfig", err, "{id}", "<id>")
}

// TestEscapedTemplateLocksItsKey: escaped braces and colons reach the lock
// key as the bytes they escape, in code, in specs (quoted or not) and in
// tables, while a constant word after a colon needs no escape.
func TestEscapedTemplateLocksItsKey(t *testing.T) {
	yaml := "routes:\n" +
		"  POST /a/{id}: key=\\{acct}:<id> wait=none\n" +
		"  POST /b/{id}: '@lock key=acct:\\:id:<id> wait=none'\n" +
		"  POST /c/{id}: key=tenant:acme:<id> wait=none\n"
	entries, err := routetable.Parse("routes.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	locker := reqlock.MustNew(memstore.New())
	rt, err := middleware.NewRoutes(locker, entries)
	if err != nil {
		t.Fatal(err)
	}
	fromCode, err := middleware.New(locker, `\{acct}:<id>`, middleware.WithWait(middleware.NoWait))
	if err != nil {
		t.Fatal(err)
	}
	quoted, err := middleware.NewFromSpec(locker, `@lock key="acct:\\:id:<id>" wait=none`)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		guard *middleware.Guard
		path  string
		key   string
	}{
		{"table {acct}", rt.Guard("POST", "/a/{id}"), "/a/7", "{acct}:7"},
		{"table acct::id", rt.Guard("POST", "/b/{id}"), "/b/7", "acct::id:7"},
		{"table tenant:acme", rt.Guard("POST", "/c/{id}"), "/c/7", "tenant:acme:7"},
		{"code {acct}", fromCode, "/a/7", "{acct}:7"},
		{"quoted spec acct::id", quoted, "/b/7", "acct::id:7"},
	} {
		if tc.guard == nil {
			t.Fatalf("%s: no guard", tc.name)
		}
		held, err := locker.Obtain(context.Background(), tc.key, time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.Handle("POST "+strings.TrimSuffix(tc.path, "7")+"{id}", tc.guard.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, tc.path, nil))
		held.Release(context.Background())
		if rec.Code == http.StatusOK {
			t.Errorf("%s: request ran while %q was held, want it locked on that key", tc.name, tc.key)
		}
		rec = httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, tc.path, nil))
		if rec.Code != http.StatusOK {
			t.Errorf("%s: %d after release, want 200", tc.name, rec.Code)
		}
	}
}
