package echolock_test

import (
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

// TestIdempotencyEchoError: a handler that returns an error is recorded as
// echo's error handler rendered it (the middleware renders it before the
// record is taken), and replayed with the same bytes.
func TestIdempotencyEchoError(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	runs := 0
	e := echo.New()
	e.POST("/items/:id", func(c echo.Context) error {
		runs++
		return echo.NewHTTPError(http.StatusNotFound, "no item "+echolock.Param(c, "id"))
	}, echolock.Must(echolock.FromSpec(locker, "@lock key=item:<id> idempotency=required")))
	var first string
	for i := range 3 {
		req := httptest.NewRequest(http.MethodPost, "/items/7", strings.NewReader("b"))
		req.Header.Set("Idempotency-Key", "k")
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		got := rec.Result().Status[:3] + " " + rec.Header().Get("Content-Type") + " " + rec.Body.String()
		if !strings.HasPrefix(got, "404 application/json") || !strings.Contains(got, "no item 7") {
			t.Fatalf("#%d: %q", i, got)
		}
		if replayed := rec.Header().Get(middleware.ReplayedHeader) == "true"; replayed != (i > 0) {
			t.Fatalf("#%d: replayed=%v", i, replayed)
		}
		if i == 0 {
			first = got
		} else if got != first {
			t.Fatalf("replay %q differs from the first answer %q", got, first)
		}
	}
	if runs != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs)
	}
}
