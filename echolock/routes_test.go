package echolock_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/echolock"
	"github.com/reqlock/reqlock/internal/adaptertest"
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

// A table names echo's anonymous wildcard nowhere: the check says so at
// start-up rather than leave the route unlocked.
func TestRoutesAnonymousWildcardFailsCheck(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	rt := adaptertest.Table(t, locker, "GET /files/{path...}", "key=file:<path>")
	e := echo.New()
	e.Use(echolock.Routes(rt))
	e.GET("/files/*", lockKeys)
	err := echolock.CheckRoutes(rt, e.Routes())
	if !errors.Is(err, middleware.ErrInvalidConfig) || !strings.Contains(err.Error(), "code:1") {
		t.Fatalf("CheckRoutes = %v, want ErrInvalidConfig naming code:1", err)
	}
}

// echo applies e.Use middleware at request time, after routing: Install
// locks the routes registered before it as well as those after it.
func TestInstallLocksRoutesBeforeAndAfterIt(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	rt := adaptertest.Table(t, locker,
		"POST /items/{id}", "key=item:<id>",
		"POST /v1/carts/{id}", "key=cart:<id>")
	e := echo.New()
	e.POST("/items/:id", lockKeys)
	e.GET("/items/:id", lockKeys)
	if err := echolock.Install(e, rt); err != nil {
		t.Fatalf("Install on an echo with routes: %v", err)
	}
	e.Group("/v1").POST("/carts/:id", lockKeys)
	if err := echolock.CheckRoutes(rt, e.Routes()); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ method, path, want string }{
		{http.MethodPost, "/items/1", "item:1"},
		{http.MethodPost, "/v1/carts/2", "cart:2"},
		{http.MethodGet, "/items/1", "unlocked"},
	} {
		if rec := adaptertest.Do(e, tc.method, tc.path); rec.Code != http.StatusOK || rec.Body.String() != tc.want {
			t.Errorf("%s %s: got %d %q, want 200 %q", tc.method, tc.path, rec.Code, rec.Body, tc.want)
		}
	}
}

func TestInstallRefusesNil(t *testing.T) {
	rt := adaptertest.Table(t, reqlock.MustNew(memstore.New()), "POST /items/{id}", "key=item:<id>")
	if err := echolock.Install(nil, rt); !errors.Is(err, middleware.ErrInvalidConfig) {
		t.Errorf("Install(nil, rt): got %v, want ErrInvalidConfig", err)
	}
	e := echo.New()
	if err := echolock.Install(e, nil); !errors.Is(err, middleware.ErrInvalidConfig) {
		t.Errorf("Install(e, nil): got %v, want ErrInvalidConfig", err)
	}
	e.POST("/items/:id", lockKeys)
	if rec := adaptertest.Do(e, http.MethodPost, "/items/1"); rec.Code != http.StatusOK || rec.Body.String() != "unlocked" {
		t.Fatalf("after a refused Install: got %d %q, want 200 unlocked", rec.Code, rec.Body)
	}
	if err := echolock.CheckRoutes(nil, e.Routes()); !errors.Is(err, middleware.ErrInvalidConfig) {
		t.Errorf("CheckRoutes(nil, routes): got %v, want ErrInvalidConfig", err)
	}
}

// Routes in e.Pre runs before routing, when c.Path() is empty, so it locks
// nothing: the documented reason it belongs in e.Use. (Should this start
// locking, the docs of Routes need revisiting.)
func TestRoutesInPreLocksNothing(t *testing.T) {
	rt := adaptertest.Table(t, reqlock.MustNew(memstore.New()), "POST /items/{id}", "key=item:<id>")
	e := echo.New()
	e.Pre(echolock.Routes(rt))
	e.POST("/items/:id", lockKeys)
	if err := echolock.CheckRoutes(rt, e.Routes()); err != nil {
		t.Fatalf("CheckRoutes: %v", err)
	}
	if rec := adaptertest.Do(e, http.MethodPost, "/items/1"); rec.Code != http.StatusOK || rec.Body.String() != "unlocked" {
		t.Fatalf("Routes in e.Pre: got %d %q, want the route unlocked", rec.Code, rec.Body)
	}
}
