package ginlock_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/ginlock"
	"github.com/reqlock/reqlock/internal/adaptertest"
	"github.com/reqlock/reqlock/stores/memstore"
)

// useGinContext is a handler that uses its *gin.Context as the request's
// context: FromContext(c) finds the route's lock, and Obtain(c) on the same
// key, allowed to wait 1s, re-enters it (a wait for itself would end in an
// error) with the same fence. It answers the key.
func useGinContext(locker *reqlock.Locker) gin.HandlerFunc {
	return func(c *gin.Context) {
		lock, ok := reqlock.FromContext(c)
		if !ok {
			c.String(http.StatusInternalServerError, "FromContext(c) found no lock")
			return
		}
		inner, err := locker.Obtain(c, lock.Key(), time.Second, time.Second)
		if err != nil {
			c.String(http.StatusInternalServerError, "Obtain(c) on the route's key: %v", err)
			return
		}
		defer func() { _ = inner.Release(c) }()
		if inner.Fence() != lock.Fence() {
			c.String(http.StatusInternalServerError, "Obtain(c) fence %d, the route's %d", inner.Fence(), lock.Fence())
			return
		}
		c.String(http.StatusOK, lock.Key())
	}
}

// TestGinContextCarriesTheLock: a handler may pass its *gin.Context where a
// context.Context goes, on a route guard and on a table route, without the
// engine's ContextWithFallback (issue 10 item 3).
func TestGinContextCarriesTheLock(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())

	guarded := gin.New()
	guarded.POST("/items/:id", ginlock.Must(ginlock.New(locker, "item:<id>")), useGinContext(locker))

	table := gin.New()
	rt := adaptertest.Table(t, locker, "POST /items/{id}", "key=item:<id>")
	if err := ginlock.Install(table, rt); err != nil {
		t.Fatal(err)
	}
	table.POST("/items/:id", useGinContext(locker))

	for name, r := range map[string]*gin.Engine{"route guard": guarded, "table": table} {
		rec := adaptertest.Do(r, http.MethodPost, "/items/5")
		if rec.Code != http.StatusOK || rec.Body.String() != "item:5" {
			t.Fatalf("%s: got %d %q", name, rec.Code, rec.Body)
		}
		lock, err := locker.Obtain(context.Background(), "item:5", time.Second, 0)
		if err != nil {
			t.Fatalf("%s: item:5 not released after the request: %v", name, err)
		}
		_ = lock.Release(context.Background())
	}
}

// TestGinContextNestedGuards: between a group's guard and a route's, c
// stands for the group's lock again once the route's handlers are done.
func TestGinContextNestedGuards(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	r := gin.New()
	var after string
	g := r.Group("/items",
		ginlock.Must(ginlock.New(locker, "group:<id>")),
		func(c *gin.Context) {
			c.Next()
			lock, ok := reqlock.FromContext(c)
			after = fmt.Sprint(ok)
			if ok {
				after = lock.Key()
			}
		})
	g.POST("/:id", ginlock.Must(ginlock.New(locker, "item:<id>")), useGinContext(locker))
	rec := adaptertest.Do(r, http.MethodPost, "/items/3")
	if rec.Code != http.StatusOK || rec.Body.String() != "item:3" {
		t.Fatalf("got %d %q, want the route's lock item:3", rec.Code, rec.Body)
	}
	if after != "group:3" {
		t.Fatalf("after the route's handlers, FromContext(c) = %s, want the group's lock group:3", after)
	}
}
