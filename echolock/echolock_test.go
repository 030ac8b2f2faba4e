package echolock_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/echolock"
	"github.com/reqlock/reqlock/internal/adaptertest"
	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores/memstore"
)

func TestMain(m *testing.M) { os.Exit(testredis.Main(m)) }

func serveEcho(locker *reqlock.Locker, key string, opts []middleware.Option, h http.HandlerFunc) (http.Handler, error) {
	mw, err := echolock.New(locker, key, opts...)
	if err != nil {
		return nil, err
	}
	e := echo.New()
	e.POST("/items/:id", echo.WrapHandler(h), mw)
	return e, nil
}

func serveEchoSpec(locker *reqlock.Locker, spec string, h http.HandlerFunc) (http.Handler, error) {
	mw, err := echolock.FromSpec(locker, spec)
	if err != nil {
		return nil, err
	}
	e := echo.New()
	e.POST("/items/:id", echo.WrapHandler(h), mw)
	return e, nil
}

// serveEchoRoutes installs the table with echolock.Install, registers
// routes, in their groups and each behind its Guard, and checks the table
// against the router.
func serveEchoRoutes(rt *middleware.Routes, routes []adaptertest.Endpoint) (http.Handler, error) {
	e := echo.New()
	if err := echolock.Install(e, rt); err != nil {
		return nil, err
	}
	registerEcho(e, routes)
	if err := echolock.CheckRoutes(rt, e.Routes()); err != nil {
		return nil, err
	}
	return e, nil
}

// registerEcho registers routes on e, in their groups and each behind its
// Guard.
func registerEcho(e *echo.Echo, routes []adaptertest.Endpoint) {
	for _, route := range routes {
		var mws []echo.MiddlewareFunc
		if route.Guard != nil {
			mws = append(mws, echolock.Middleware(route.Guard))
		}
		path := adaptertest.ColonPath(strings.TrimPrefix(route.Path, route.Group))
		e.Group(route.Group).Add(route.Method, path, echo.WrapHandler(route.Handler), mws...)
	}
}

// installEchoRoutes installs the table with echolock.Install, before the
// routes or, late, after them, and never calls CheckRoutes.
func installEchoRoutes(rt *middleware.Routes, routes []adaptertest.Endpoint, late bool) (http.Handler, error) {
	e := echo.New()
	if late {
		registerEcho(e, routes)
	}
	if err := echolock.Install(e, rt); err != nil {
		return nil, err
	}
	if !late {
		registerEcho(e, routes)
	}
	return e, nil
}

func echoSkipper() middleware.Option {
	return echolock.WithSkipper(func(c echo.Context) bool { return c.Request().Header.Get("X-Skip") != "" })
}

func echoResponder(status int, body string) middleware.Option {
	return echolock.WithResponder(func(c echo.Context, rej *middleware.Rejection) error {
		return c.String(status, body+":"+string(rej.Reason))
	})
}

// serveEchoNested puts outer on a group and inner on the route.
func serveEchoNested(outer, inner *middleware.Guard, around func(*http.Request, func()), h http.HandlerFunc) http.Handler {
	e := echo.New()
	items := e.Group("/items", echolock.Middleware(outer), func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			var err error
			around(c.Request(), func() { err = next(c) })
			return err
		}
	})
	items.POST("/:id", echo.WrapHandler(h), echolock.Middleware(inner))
	return e
}

func TestEchoAdapter(t *testing.T) {
	adaptertest.Run(t, adaptertest.Adapter{
		Name:      "echo",
		Serve:     serveEcho,
		ServeSpec: serveEchoSpec,
		// With echo's default error handler a rejection reads as on every
		// adapter (issue 10 item 4; it was application/json).
		ProblemContentType: "application/problem+json",
		ServeRoutes:        serveEchoRoutes,
		InstallRoutes:      installEchoRoutes,
		Skipper:            echoSkipper,
		Responder:          echoResponder,
		ServeNested:        serveEchoNested,
	})
}

func TestLockAccessorAndContextValue(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	e := echo.New()
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error { c.Set("user", "u-7"); return next(c) }
	})
	e.POST("/pay", func(c echo.Context) error {
		lock, ok := echolock.Lock(c)
		if !ok {
			return c.NoContent(http.StatusInternalServerError)
		}
		return c.String(http.StatusOK, lock.Key())
	}, echolock.Must(echolock.New(locker, "balance:<ctx:user>")))
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/pay", nil))
	if rec.Code != http.StatusOK || rec.Body.String() != "balance:u%2D7" {
		t.Fatalf("got %d %q, want 200 balance:u%%2D7", rec.Code, rec.Body)
	}
}

// An app with its own error handler gets the rejection as an uncommitted
// *echo.HTTPError, the problem details in Message and the cause in
// Internal, and renders it as it likes; only Retry-After is set.
func TestRejectionIsAnHTTPError(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	held, err := locker.Obtain(t.Context(), "sku:1", 0x7fffffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(t.Context())
	mw := echolock.Must(echolock.New(locker, "sku:<id>", middleware.WithWait(0)))
	e := echo.New()
	var seen *echo.HTTPError
	var committed bool
	e.HTTPErrorHandler = func(err error, c echo.Context) {
		seen, _ = err.(*echo.HTTPError)
		committed = c.Response().Committed
		_ = c.String(http.StatusTeapot, "custom")
	}
	e.POST("/skus/:id", func(c echo.Context) error { return nil }, mw)
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/skus/1", nil))
	if seen == nil || seen.Code != http.StatusLocked || !errors.Is(seen.Internal, reqlock.ErrHeld) || committed {
		t.Fatalf("error handler saw %#v (committed %v), want an uncommitted *echo.HTTPError 423 with the cause in Internal", seen, committed)
	}
	if p, ok := seen.Message.(middleware.Problem); !ok || p.Status != http.StatusLocked || p.Reason != middleware.ReasonTimeout {
		t.Fatalf("Message = %#v, want the problem details", seen.Message)
	}
	if rec.Code != http.StatusTeapot || rec.Body.String() != "custom" || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/plain") {
		t.Fatalf("the app's handler did not render the answer: %d %v %q", rec.Code, rec.Header(), rec.Body)
	}
	if rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("Retry-After = %q", rec.Header().Get("Retry-After"))
	}
}

// Param gives a handler the path value its lock's key was rendered from:
// "a/b" for /accounts/a%2Fb, where echo's c.Param keeps the escape, so the
// handler works on the account the lock covers.
func TestParamIsTheLockedValue(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	e := echo.New()
	var param, echoParam string
	var locked bool
	e.POST("/accounts/:id/withdraw", func(c echo.Context) error {
		param, echoParam = echolock.Param(c, "id"), c.Param("id")
		lock, ok := echolock.Lock(c)
		key, err := keyfunc.MustParse("acct:<id>").Render(param)
		if ok && err == nil {
			_, locked = lock.FenceOf(key)
		}
		return c.NoContent(http.StatusNoContent)
	}, echolock.Must(echolock.New(locker, "acct:<id>")))
	for _, tc := range []struct{ path, want string }{
		{"/accounts/a%2Fb/withdraw", "a/b"},
		{"/accounts/plain/withdraw", "plain"},
	} {
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, tc.path, nil))
		if rec.Code != http.StatusNoContent {
			t.Fatalf("%s: status %d: %s", tc.path, rec.Code, rec.Body)
		}
		if param != tc.want {
			t.Fatalf("%s: Param = %q (echo's c.Param %q), want %q", tc.path, param, echoParam, tc.want)
		}
		if !locked {
			t.Fatalf("%s: the lock holds no key rendered from %q", tc.path, param)
		}
	}
}
