package ginlock_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/ginlock"
	"github.com/reqlock/reqlock/internal/adaptertest"
	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores/memstore"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.ReleaseMode)
	os.Exit(testredis.Main(m))
}

func serveGin(locker *reqlock.Locker, key string, opts []middleware.Option, h http.HandlerFunc) (http.Handler, error) {
	mw, err := ginlock.New(locker, key, opts...)
	if err != nil {
		return nil, err
	}
	r := gin.New()
	r.POST("/items/:id", mw, gin.WrapF(h))
	return r, nil
}

func serveGinSpec(locker *reqlock.Locker, spec string, h http.HandlerFunc) (http.Handler, error) {
	mw, err := ginlock.FromSpec(locker, spec)
	if err != nil {
		return nil, err
	}
	r := gin.New()
	r.POST("/items/:id", mw, gin.WrapF(h))
	return r, nil
}

// serveGinRoutes installs the table with ginlock.Install, registers routes
// after it, in their groups and each behind its Guard, and verifies the
// install.
func serveGinRoutes(rt *middleware.Routes, routes []adaptertest.Endpoint) (http.Handler, error) {
	r := gin.New()
	if err := ginlock.Install(r, rt); err != nil {
		return nil, err
	}
	registerGin(r, routes)
	if err := ginlock.Verify(r, rt); err != nil {
		return nil, err
	}
	return r, nil
}

// registerGin registers routes on r, in their groups and each behind its
// Guard.
func registerGin(r *gin.Engine, routes []adaptertest.Endpoint) {
	for _, route := range routes {
		var handlers []gin.HandlerFunc
		if route.Guard != nil {
			handlers = append(handlers, ginlock.Handler(route.Guard))
		}
		group := r.Group(route.Group)
		path := adaptertest.ColonPath(strings.TrimPrefix(route.Path, route.Group))
		group.Handle(route.Method, path, append(handlers, gin.WrapF(route.Handler))...)
	}
}

// installGinRoutes installs the table with ginlock.Install, before the
// routes or, late, after them, and never calls CheckRoutes.
func installGinRoutes(rt *middleware.Routes, routes []adaptertest.Endpoint, late bool) (http.Handler, error) {
	r := gin.New()
	if late {
		registerGin(r, routes)
	}
	if err := ginlock.Install(r, rt); err != nil {
		return nil, err
	}
	if !late {
		registerGin(r, routes)
	}
	return r, nil
}

func ginSkipper() middleware.Option {
	return ginlock.WithSkipper(func(c *gin.Context) bool { return c.GetHeader("X-Skip") != "" })
}

func ginResponder(status int, body string) middleware.Option {
	return ginlock.WithResponder(func(c *gin.Context, rej *middleware.Rejection) {
		c.String(status, "%s:%s", body, rej.Reason)
	})
}

// serveGinNested puts outer on a route group and inner on the route.
func serveGinNested(outer, inner *middleware.Guard, around func(*http.Request, func()), h http.HandlerFunc) http.Handler {
	r := gin.New()
	items := r.Group("/items", ginlock.Handler(outer))
	items.Use(func(c *gin.Context) { around(c.Request, c.Next) })
	items.POST("/:id", ginlock.Handler(inner), gin.WrapF(h))
	return r
}

func TestGinAdapter(t *testing.T) {
	adaptertest.Run(t, adaptertest.Adapter{
		Name:               "gin",
		Serve:              serveGin,
		ServeSpec:          serveGinSpec,
		ProblemContentType: "application/problem+json",
		ServeRoutes:        serveGinRoutes,
		InstallRoutes:      installGinRoutes,
		Skipper:            ginSkipper,
		Responder:          ginResponder,
		ServeNested:        serveGinNested,
	})
}

func TestLockAccessorAndContextValue(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	r := gin.New()
	// An earlier middleware stores the user the way gin apps do.
	r.Use(func(c *gin.Context) { c.Set("user", "u-7"); c.Next() })
	r.POST("/pay", ginlock.Must(ginlock.New(locker, "balance:<ctx:user>")), func(c *gin.Context) {
		lock, ok := ginlock.Lock(c)
		if !ok {
			c.Status(http.StatusInternalServerError)
			return
		}
		c.String(http.StatusOK, lock.Key())
	})
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/pay", nil))
	if rec.Code != http.StatusOK || rec.Body.String() != "balance:u%2D7" {
		t.Fatalf("got %d %q, want 200 balance:u%%2D7", rec.Code, rec.Body)
	}
}

func TestMustPanicsOnInvalidTemplate(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Must did not panic on an invalid template")
		}
	}()
	ginlock.Must(ginlock.New(reqlock.MustNew(memstore.New()), "sku:<id"))
}
