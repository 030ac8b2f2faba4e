package echolock_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/echolock"
	"github.com/reqlock/reqlock/stores/memstore"
)

func TestFromSpec(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	e := echo.New()
	e.POST("/items/:id", func(c echo.Context) error {
		if _, ok := echolock.Lock(c); !ok {
			return c.NoContent(http.StatusInternalServerError)
		}
		return c.NoContent(http.StatusOK)
	}, echolock.Must(echolock.FromSpec(locker, "@lock key=item:<id> wait=none on-timeout=409")))
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/items/7", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("free key: %d", rec.Code)
	}
	held, err := locker.Obtain(context.Background(), "item:7", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	rec = httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/items/7", nil))
	if rec.Code != http.StatusConflict {
		t.Fatalf("held key: %d, want the spec's 409", rec.Code)
	}
	if _, err := echolock.FromSpec(locker, "@lock key=item:<id> wiat=1s"); err == nil {
		t.Fatal("a bad spec was accepted")
	}
}
