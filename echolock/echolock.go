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
// Install, or e.Use(Routes(rt)); installed with e.Pre, or with an entry that
// matches no route, it answers 500 rather than let a route run unlocked
// (see Routes).
//
// WithSkipper and WithResponder give a route or a table echo-shaped
// skippers and responders.
package echolock

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"sync/atomic"

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
// middleware.ErrInvalidConfig, installing nothing, when e or rt is nil. The
// table is checked against e's routes at the first request (see Routes);
// call CheckRoutes once the routes are registered to fail at start-up
// instead:
//
//	rt, err := middleware.LoadRoutes(locker, "routes.yaml")
//	if err := echolock.Install(e, rt); err != nil { ... }
//	e.POST("/skus/:id/deduct", deduct)
//	if err := echolock.CheckRoutes(rt, e.Routes()); err != nil { ... }
func Install(e *echo.Echo, rt *middleware.Routes) error {
	if e == nil || rt == nil {
		return fmt.Errorf("%w: echolock.Install: the echo instance or the route table is nil", middleware.ErrInvalidConfig)
	}
	e.Use(tableMiddleware(rt, "echolock.Install"))
	return nil
}

// Routes returns echo middleware that locks each request by its route's
// entry in rt, found by c.Path(); routes without one pass through. Install
// it once in one echo instance with e.Use (or Install), before or after
// registering the routes.
//
// A wrong table or install never lets a listed route run unlocked: at the
// first request the table is checked against the echo instance's routes,
// and a request to a route that arrives before routing (the middleware
// installed with e.Pre, where c.Path() is still empty) is caught; either
// breaks the install, which logs the problem once and answers every
// request 500 from then on. Call CheckRoutes once the routes are registered
// to fail at start-up instead:
//
//	rt, err := middleware.LoadRoutes(locker, "routes.yaml")
//	e.Use(echolock.Routes(rt))
//	e.POST("/skus/:id/deduct", deduct)
//	if err := echolock.CheckRoutes(rt, e.Routes()); err != nil { ... }
func Routes(rt *middleware.Routes) echo.MiddlewareFunc {
	return tableMiddleware(rt, "echolock.Routes")
}

// tableMiddleware installs rt; by names the install in messages.
func tableMiddleware(rt *middleware.Routes, by string) echo.MiddlewareFunc {
	// The middleware learns its echo instance from its requests.
	in := rt.Install(by, func(req keyfunc.Request) error {
		return CheckRoutes(rt, allRoutes(req.(request).c.Echo()))
	})
	// afterRouting is set by the first request with a route path, which
	// a table in e.Pre never sees: from then on a request without one is
	// a request to no route, and is not routed a second time to tell.
	var afterRouting atomic.Bool
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			path := c.Path()
			if path != "" && !afterRouting.Load() {
				afterRouting.Store(true)
			}
			return in.ServeResponse(c.Response(), request{c}, c.Request().Method, path, func(r *http.Request, rec *middleware.Recording) error {
				// A request without a route path has no entry. If it
				// matches a route all the same, routing has not happened
				// yet: the table is in e.Pre, and would lock nothing.
				if path == "" && !afterRouting.Load() && routed(c) {
					return reject(rt, c, in.Fail(errors.New("a request to a route reached the table's middleware before routing, "+
						"with no route path: it is installed with e.Pre; install it with e.Use or echolock.Install")))
				}
				c.SetRequest(r)
				err := run(c, next, rec)
				if path == "" && c.Path() != "" {
					// Routed after the table ran: it is in e.Pre, ahead of
					// a middleware that rewrote the path (Rewrite,
					// RemoveTrailingSlash), which the probe above could
					// not foresee. This request ran unlocked; every later
					// one is refused.
					in.Fail(errors.New("a request was routed to " + c.Path() + " after the table's middleware ran: " +
						"it is installed with e.Pre; install it with e.Use or echolock.Install"))
				}
				return err
			}, func(a middleware.Answerer, rej *middleware.Rejection) error {
				return reject(a, c, rej)
			})
		}
	}
}

// routed reports whether the request of c, whose route path is empty,
// matches a route of its echo instance: an empty path then means routing
// has not happened yet. (After routing, a request to no route has an empty
// path too.) It routes the request a second time, at the cost of a context.
func routed(c echo.Context) bool {
	e, r := c.Echo(), c.Request()
	if e == nil {
		return false
	}
	router := e.Router()
	if hr, ok := e.Routers()[r.Host]; ok {
		router = hr
	}
	probe := e.NewContext(r, nil)
	router.Find(r.Method, echo.GetPath(r), probe)
	return probe.Path() != ""
}

// allRoutes lists the routes of e, of every host.
func allRoutes(e *echo.Echo) []*echo.Route {
	if e == nil {
		return nil
	}
	routes := e.Routes()
	for _, r := range e.Routers() {
		routes = append(routes, r.Routes()...)
	}
	return routes
}

// CheckRoutes reports every entry of rt that matches none of routes
// (e.Routes()), naming the entry's source, joined with the problems a
// middleware.LoadRoutesDeferred table kept; see middleware.CheckRoutes.
// Call it once the routes are registered, to fail at start-up rather than
// at the first request.
func CheckRoutes(rt *middleware.Routes, routes []*echo.Route) error {
	return middleware.CheckRoutes(rt, routes, func(r *echo.Route) (string, string) { return r.Method, r.Path })
}

// WithSkipper is middleware.WithSkipper in echo's shape (echo middleware's
// Skipper): a request for which skip returns true goes through unlocked.
// Give it to New or to a route table (middleware.NewRoutes, LoadRoutes). On
// another adapter it skips nothing.
func WithSkipper(skip func(c echo.Context) bool) middleware.Option {
	return middleware.WithRequestSkipper(func(req keyfunc.Request) bool {
		r, ok := req.(request)
		return ok && skip(r.c)
	})
}

// WithResponder is middleware.WithResponder in echo's shape: respond answers
// each rejection with c, or returns an error, which goes to echo's error
// handler as the middleware's. Give it to New or to a route table. On
// another adapter the answer is middleware.WriteProblem.
func WithResponder(respond func(c echo.Context, rej *middleware.Rejection) error) middleware.Option {
	return middleware.WithRequestResponder(func(w http.ResponseWriter, req keyfunc.Request, rej *middleware.Rejection) error {
		if r, ok := req.(request); ok {
			return respond(r.c, rej)
		}
		middleware.WriteProblem(w, req.HTTPRequest(), rej)
		return nil
	})
}

func serve(g *middleware.Guard, c echo.Context, next echo.HandlerFunc) error {
	return g.ServeResponse(c.Response(), request{c}, func(r *http.Request, rec *middleware.Recording) error {
		c.SetRequest(r)
		return run(c, next, rec)
	}, func(rej *middleware.Rejection) error {
		return reject(g, c, rej)
	})
}

// run runs next, its writes going through rec when the response is recorded
// (a route with idempotency): then an error it returns is rendered by echo's
// error handler at once, as echo's own body-dumping middleware does, so that
// the response is complete when the Recording takes it.
func run(c echo.Context, next echo.HandlerFunc, rec *middleware.Recording) error {
	if rec == nil {
		return next(c)
	}
	resp := c.Response()
	orig := resp.Writer
	resp.Writer = rec.Writer(orig)
	defer func() { resp.Writer = orig }()
	if err := next(c); err != nil {
		c.Error(err)
	}
	return nil
}

// Param returns the path parameter name of c's request as the lock's key
// reads it: unescaped, as net/http and gin give it. echo's own c.Param
// keeps the escapes of a path like "/accounts/a%2Fb", so a handler that
// reads it locks "a/b" and works on "a%2Fb"; use Param for the value the
// lock covers. A wildcard "*path" is named "path" or "*".
func Param(c echo.Context, name string) string {
	return request{c}.PathValue(name)
}

// Lock returns the lock the middleware holds for c's request.
func Lock(c echo.Context) (*reqlock.Lock, bool) {
	return reqlock.FromContext(c.Request().Context())
}

// reject answers rej with a when it has a responder of its own, else
// returns it as an *echo.HTTPError (see the package doc).
func reject(a middleware.Answerer, c echo.Context, rej *middleware.Rejection) error {
	if a.HasResponder() {
		return a.Respond(c.Response(), request{c}, rej)
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
