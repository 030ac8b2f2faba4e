package ginlock_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/ginlock"
	"github.com/reqlock/reqlock/stores/memstore"
)

func TestFromSpec(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	r := gin.New()
	r.POST("/items/:id", ginlock.Must(ginlock.FromSpec(locker, "@lock key=item:<id> wait=none on-timeout=409")),
		func(c *gin.Context) {
			if _, ok := ginlock.Lock(c); !ok {
				c.Status(http.StatusInternalServerError)
			}
		})
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/items/7", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("free key: %d", rec.Code)
	}
	held, err := locker.Obtain(context.Background(), "item:7", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	rec = httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/items/7", nil))
	if rec.Code != http.StatusConflict {
		t.Fatalf("held key: %d, want the spec's 409", rec.Code)
	}
	if _, err := ginlock.FromSpec(locker, "@lock key=item:<id> wiat=1s"); err == nil {
		t.Fatal("a bad spec was accepted")
	}
}
