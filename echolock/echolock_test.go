package echolock_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/echolock"
	"github.com/reqlock/reqlock/internal/adaptertest"
	"github.com/reqlock/reqlock/internal/testredis"
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

func TestEchoAdapter(t *testing.T) {
	adaptertest.Run(t, adaptertest.Adapter{
		Name:  "echo",
		Serve: serveEcho,
		// echo's error handler renders the *echo.HTTPError the adapter returns.
		ProblemContentType: "application/json",
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
	e.HTTPErrorHandler = func(err error, c echo.Context) {
		seen, _ = err.(*echo.HTTPError)
		e.DefaultHTTPErrorHandler(err, c)
	}
	e.POST("/skus/:id", func(c echo.Context) error { return nil }, mw)
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/skus/1", nil))
	if seen == nil || seen.Code != http.StatusLocked || seen.Internal == nil {
		t.Fatalf("error handler saw %#v, want *echo.HTTPError 423 with the cause in Internal", seen)
	}
	if rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("Retry-After = %q", rec.Header().Get("Retry-After"))
	}
}
