package echolock_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/echolock"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores/memstore"
)

// lockKeys answers the keys of the request's lock, or "unlocked".
func lockKeys(c echo.Context) error {
	lock, ok := echolock.Lock(c)
	if !ok {
		return c.String(http.StatusOK, "unlocked")
	}
	return c.String(http.StatusOK, strings.Join(lock.Keys(), " "))
}

func serve(h http.Handler, method, path string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec
}

func routes(t *testing.T, locker *reqlock.Locker, route, spec string) *middleware.Routes {
	t.Helper()
	rs, err := middleware.ParseRoute(route, spec, "code:1")
	if err != nil {
		t.Fatal(err)
	}
	rt, err := middleware.NewRoutes(locker, []middleware.RouteSpec{rs})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// echo names every wildcard "*", also one registered as *path: <path>
// reads it, unescaped like the other parameters.
func TestNamedWildcardReadsTheRestOfThePath(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	rt := routes(t, locker, "GET /files/{path...}", "key=file:<path> wait=none")
	e := echo.New()
	e.Use(echolock.Routes(rt))
	// The route guard locks the same key again: reentrant only when both
	// derive the same key.
	e.GET("/files/*path", lockKeys, echolock.Must(echolock.New(locker, "file:<path>", middleware.WithWait(0))))
	if err := echolock.CheckRoutes(rt, e.Routes()); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"/files/a":       "file:a",
		"/files/a/b":     "file:a%2Fb",
		"/files/a%2Fb/c": "file:a%2Fb%2Fc",
		"/files/dir/":    "file:dir%2F",
	} {
		if rec := serve(e, http.MethodGet, path); rec.Code != http.StatusOK || rec.Body.String() != want {
			t.Errorf("GET %s: got %d %q, want 200 %q", path, rec.Code, rec.Body, want)
		}
	}
}

// A table names echo's anonymous wildcard nowhere: the check says so at
// start-up rather than leave the route unlocked.
func TestRoutesAnonymousWildcardFailsCheck(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	rt := routes(t, locker, "GET /files/{path...}", "key=file:<path>")
	e := echo.New()
	e.Use(echolock.Routes(rt))
	e.GET("/files/*", lockKeys)
	err := echolock.CheckRoutes(rt, e.Routes())
	if !errors.Is(err, middleware.ErrInvalidConfig) || !strings.Contains(err.Error(), "code:1") {
		t.Fatalf("CheckRoutes = %v, want ErrInvalidConfig naming code:1", err)
	}
}

// Routes matches c.Path, which includes the group's prefix.
func TestRoutesOnGroup(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	rt := routes(t, locker, "POST /v1/items/{id}", "key=item:<id>")
	e := echo.New()
	e.Use(echolock.Routes(rt))
	v1 := e.Group("/v1")
	v1.POST("/items/:id", lockKeys)
	v1.GET("/items/:id", lockKeys)
	if err := echolock.CheckRoutes(rt, e.Routes()); err != nil {
		t.Fatal(err)
	}
	if rec := serve(e, http.MethodPost, "/v1/items/3"); rec.Body.String() != "item:3" {
		t.Fatalf("POST: got %d %q, want item:3", rec.Code, rec.Body)
	}
	if rec := serve(e, http.MethodGet, "/v1/items/3"); rec.Body.String() != "unlocked" {
		t.Fatalf("GET: got %d %q, want unlocked", rec.Code, rec.Body)
	}
	rt = routes(t, locker, "POST /items/:id", "key=item:<id>")
	err := echolock.CheckRoutes(rt, e.Routes())
	if !errors.Is(err, middleware.ErrInvalidConfig) || !strings.Contains(err.Error(), "code:1") {
		t.Fatalf("CheckRoutes = %v, want ErrInvalidConfig naming code:1", err)
	}
}
