package ginlock

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/routetable"
	"github.com/reqlock/reqlock/stores/memstore"
)

// unguardedRoutes reads gin's unexported route trees: the walk must find
// exactly the routes Engine.Routes lists, each with its chain, and say
// errLayout when it does not, so that a gin release that moves the trees
// makes Verify fail rather than pass a table it cannot check.
func TestUnguardedRoutesReadsTheTrees(t *testing.T) {
	r := gin.New()
	early := r.Group("/early")
	r.Use(tableHandler(nil))
	ok := func(*gin.Context) {}
	r.POST("/a/:id", ok)
	r.Group("/g").GET("/b/*path", ok)
	early.PUT("/c", ok)

	got, err := unguardedRoutes(r, r.Routes())
	if err != nil {
		t.Fatalf("unguardedRoutes: %v", err)
	}
	if len(got) != 1 || got[0].Method != http.MethodPut || got[0].Path != "/early/c" {
		t.Fatalf("unguardedRoutes = %v, want only PUT /early/c", got)
	}
	if _, err := unguardedRoutes(r, append(r.Routes(), gin.RouteInfo{})); !errors.Is(err, errLayout) {
		t.Fatalf("a walk that misses a listed route: err = %v, want errLayout", err)
	}
}

// A layout of gin's trees that ginlock cannot read fails Verify at
// start-up, but not every request of an install that never called it:
// the first request then checks the table's entries only.
func TestUnreadableLayoutFailsVerifyOnly(t *testing.T) {
	saved := readChains
	t.Cleanup(func() { readChains = saved })
	readChains = func(*gin.Engine, gin.RoutesInfo) ([]middleware.RouteID, error) {
		return nil, fmt.Errorf("%w: a layout from another gin release", errLayout)
	}
	e, err := routetable.ParseEntry("POST /a/:id", "key=a:<id>", "code:1")
	if err != nil {
		t.Fatal(err)
	}
	rt, err := middleware.NewRoutes(reqlock.MustNew(memstore.New()), []routetable.Entry{e})
	if err != nil {
		t.Fatal(err)
	}
	r := gin.New()
	r.POST("/a/:id", func(*gin.Context) {})
	if err := Verify(r, rt); !errors.Is(err, errLayout) || !errors.Is(err, middleware.ErrInvalidConfig) {
		t.Fatalf("Verify with an unreadable layout: %v, want errLayout and ErrInvalidConfig", err)
	}
	if err := verify(r, rt, false); err != nil {
		t.Fatalf("the first request's check with an unreadable layout: %v, want nil (entries all match)", err)
	}
}
