// Package echolock puts reqlock's per-request lock on echo v4 routes.
//
//	locker := reqlock.MustNew(memstore.New())
//	e.POST("/skus/:id/deduct", deduct, echolock.Must(echolock.New(locker, "sku:<id>")))
//
// Path placeholders read c.Param (on a route written /files/*path, <path>
// reads echo's "*"); ctx placeholders read c.Get, then the
// request context. The handler finds its lock with Lock(c), or
// reqlock.FromContext(c.Request().Context()): echo.Context is not a
// context.Context, so a handler passes c.Request().Context() to
// Locker.Obtain (which re-enters the route's lock on the same key).
//
// A rejection is returned as an *echo.HTTPError whose Message is the problem
// details (a middleware.Problem) and whose Internal is the cause. With echo's
// DefaultHTTPErrorHandler the adapter writes the answer itself, exactly as
// net/http and gin answer (application/problem+json, the same body bytes,
// X-Content-Type-Options: nosniff, Retry-After), and the default handler
// leaves the committed response alone. An app with its own HTTPErrorHandler
// gets the *echo.HTTPError uncommitted, with only Retry-After set, and
// renders it as it likes. A route with its own middleware.Responder writes the
// response itself instead.
//
// A whole route table (middleware.Routes) goes in front of every route with
// Install, or e.Use(Routes(rt)); never with e.Pre (see Routes).
package echolock

import (
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/middleware"
)

// New returns echo middleware that locks each request on the key template
// key. Errors wrap middleware.ErrInvalidConfig and name the problem.
func New(locker *reqlock.Locker, key string, opts ...middleware.Option) (echo.MiddlewareFunc, error) {
	g, err := middleware.New(locker, key, opts...)
	if err != nil {
		return nil, err
	}
	return Middleware(g), nil
}

// NewWithConfig is New with a whole middleware.Config.
func NewWithConfig(locker *reqlock.Locker, cfg middleware.Config) (echo.MiddlewareFunc, error) {
	g, err := middleware.NewWithConfig(locker, cfg)
	if err != nil {
		return nil, err
	}
	return Middleware(g), nil
}

// FromSpec returns echo middleware configured by a one-line lock spec (see
// middleware.ParseSpec), the in-code form of a lock annotation:
//
//	e.POST("/skus/:id/deduct", deduct, echolock.Must(echolock.FromSpec(locker, "@lock key=sku:<id> wait=2s")))
func FromSpec(locker *reqlock.Locker, spec string) (echo.MiddlewareFunc, error) {
	g, err := middleware.NewFromSpec(locker, spec)
	if err != nil {
		return nil, err
	}
	return Middleware(g), nil
}

// Must panics when err is not nil; wrap New at start-up with it.
func Must(m echo.MiddlewareFunc, err error) echo.MiddlewareFunc {
	if err != nil {
		panic(err)
	}
	return m
}

// Middleware adapts a Guard to echo. The next handler runs while the lock is
// held, and the lock is released when it returns or panics.
func Middleware(g *middleware.Guard) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error { return serve(g, c, next) }
	}
}

// Install puts the route table rt in front of every route of e: it is
// e.Use(Routes(rt)), with ginlock.Install's signature. echo applies e.Use
// middleware when a request arrives, after routing, so unlike on gin the
// order does not matter: routes registered before Install are locked as well
// as those registered after it. Install returns an error wrapping
// middleware.ErrInvalidConfig, installing nothing, when e or rt is nil. Call
// CheckRoutes once the routes are registered:
//
//	rt, err := middleware.LoadRoutes(locker, "routes.yaml")
//	if err := echolock.Install(e, rt); err != nil { ... }
//	e.POST("/skus/:id/deduct", deduct)
//	if err := echolock.CheckRoutes(rt, e.Routes()); err != nil { ... }
func Install(e *echo.Echo, rt *middleware.Routes) error {
	if e == nil || rt == nil {
		return fmt.Errorf("%w: echolock.Install: the echo instance or the route table is nil", middleware.ErrInvalidConfig)
	}
	e.Use(Routes(rt))
	return nil
}

// Routes returns echo middleware that locks each request by its route's
// entry in rt, found by c.Path(); routes without one pass through. Install
// it once with e.Use (or Install), before or after registering the routes,
// and call CheckRoutes once they are registered:
//
//	rt, err := middleware.LoadRoutes(locker, "routes.yaml")
//	e.Use(echolock.Routes(rt))
//	e.POST("/skus/:id/deduct", deduct)
//	if err := echolock.CheckRoutes(rt, e.Routes()); err != nil { ... }
//
// Never install it with e.Pre: Pre middleware runs before routing, when
// c.Path() is still empty, so every route would run unlocked, and
// CheckRoutes would not notice.
func Routes(rt *middleware.Routes) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			g := rt.Guard(c.Request().Method, c.Path())
			if g == nil {
				return next(c)
			}
			return serve(g, c, next)
		}
	}
}

// CheckRoutes reports every entry of rt that matches none of routes
// (e.Routes()), naming the entry's source; see middleware.CheckRoutes. It
// cannot tell how Routes was installed (see Routes on e.Pre).
func CheckRoutes(rt *middleware.Routes, routes []*echo.Route) error {
	return middleware.CheckRoutes(rt, routes, func(r *echo.Route) (string, string) { return r.Method, r.Path })
}

func serve(g *middleware.Guard, c echo.Context, next echo.HandlerFunc) error {
	return g.Serve(request{c}, func(r *http.Request) error {
		c.SetRequest(r)
		return next(c)
	}, func(rej *middleware.Rejection) error {
		return reject(g, c, rej)
	})
}

// Lock returns the lock the middleware holds for c's request.
func Lock(c echo.Context) (*reqlock.Lock, bool) {
	return reqlock.FromContext(c.Request().Context())
}

func reject(g *middleware.Guard, c echo.Context, rej *middleware.Rejection) error {
	if g.HasResponder() {
		g.Reject(c.Response(), c.Request(), rej)
		return nil
	}
	he := &echo.HTTPError{Code: rej.Status, Message: rej.Problem(), Internal: rej.Err}
	if usesDefaultErrorHandler(c.Echo()) {
		// echo's default handler would render he with c.JSON: as
		// application/json, with "<" escaped, without nosniff. Write the
		// problem as every adapter does; the default handler leaves a
		// committed response alone, and the middleware before this one
		// still sees the error.
		middleware.WriteProblem(c.Response(), c.Request(), rej)
		return he
	}
	if v := rej.RetryAfterHeader(); v != "" {
		c.Response().Header().Set("Retry-After", v)
	}
	return he
}

// usesDefaultErrorHandler reports whether e renders errors with echo's
// DefaultHTTPErrorHandler: its HTTPErrorHandler is that method itself (as
// echo.New sets it), not a function of the app's, even one that calls it.
func usesDefaultErrorHandler(e *echo.Echo) bool {
	if e == nil || e.HTTPErrorHandler == nil {
		return false
	}
	// Every method value of DefaultHTTPErrorHandler shares one code pointer.
	return reflect.ValueOf(e.HTTPErrorHandler).Pointer() == reflect.ValueOf(e.DefaultHTTPErrorHandler).Pointer()
}

// request is echo's view of keyfunc.Request.
type request struct{ c echo.Context }

func (r request) HTTPRequest() *http.Request { return r.c.Request() }

// PathValue returns the path parameter unescaped, as net/http and gin give
// it: echo routes on the escaped path when the URL has one, so that
// "/skus/a%3Ab" and a JSON body's "a:b" lock the same key.
//
// echo names a wildcard "*" even when the route writes it *path, so <path>
// on such a route reads "*".
func (r request) PathValue(name string) string {
	v := r.c.Param(name)
	if v == "" && strings.HasSuffix(r.c.Path(), "/*"+name) {
		v = r.c.Param("*")
	}
	if r.c.Request().URL.RawPath != "" {
		if u, err := url.PathUnescape(v); err == nil {
			return u
		}
	}
	return v
}

func (r request) ContextValue(name string) (any, bool) {
	if v := r.c.Get(name); v != nil {
		return v, true
	}
	v := r.c.Request().Context().Value(keyfunc.ContextKey(name))
	return v, v != nil
}
