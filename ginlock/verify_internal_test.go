package ginlock

import (
	"errors"
	"net/http"
	"testing"

	"github.com/gin-gonic/gin"
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
