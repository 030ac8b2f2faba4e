// Package ginlock puts reqlock's per-request lock on gin routes.
//
//	locker := reqlock.MustNew(memstore.New())
//	r.POST("/skus/:id/deduct", ginlock.Must(ginlock.New(locker, "sku:<id>")), deduct)
//
// Path placeholders read c.Param (a catch-all *path without its leading
// slash, as net/http's {path...}); ctx placeholders read c.Get, then the
// request context. The handler finds its lock with Lock(c). The request flow,
// responses and configuration are those of package middleware.
//
// gin's c is a context.Context, and a locked handler may use it as the
// request's context: reqlock.FromContext(c) finds the route's lock, and
// locker.Obtain(c, key, ...) on a key the route holds re-enters the lock at
// once, with its fence, instead of waiting for itself; both also without
// the engine's ContextWithFallback.
//
// A whole route table (middleware.Routes) goes in front of every route with
// Install, called before any route is registered and any group is created,
// and Verify, called after the last route: see Install for why the order
// matters on gin, and how a wrong table or order is caught.
//
// WithSkipper and WithResponder give a route or a table gin-shaped skippers
// and responders.
package ginlock

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/ctxkeys"
	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/middleware"
)

// New returns gin middleware that locks each request on the key template
// key. Errors wrap middleware.ErrInvalidConfig and name the problem.
func New(locker *reqlock.Locker, key string, opts ...middleware.Option) (gin.HandlerFunc, error) {
	g, err := middleware.New(locker, key, opts...)
	if err != nil {
		return nil, err
	}
	return Handler(g), nil
}

// NewWithConfig is New with a whole middleware.Config.
func NewWithConfig(locker *reqlock.Locker, cfg middleware.Config) (gin.HandlerFunc, error) {
	g, err := middleware.NewWithConfig(locker, cfg)
	if err != nil {
		return nil, err
	}
	return Handler(g), nil
}

// FromSpec returns gin middleware configured by a one-line lock spec (see
// middleware.ParseSpec), the in-code form of a lock annotation:
//
//	r.POST("/skus/:id/deduct", ginlock.Must(ginlock.FromSpec(locker, "@lock key=sku:<id> wait=2s")), deduct)
func FromSpec(locker *reqlock.Locker, spec string) (gin.HandlerFunc, error) {
	g, err := middleware.NewFromSpec(locker, spec)
	if err != nil {
		return nil, err
	}
	return Handler(g), nil
}

// Must panics when err is not nil; wrap New at start-up with it.
func Must(h gin.HandlerFunc, err error) gin.HandlerFunc {
	if err != nil {
		panic(err)
	}
	return h
}

// Handler adapts a Guard to gin. A rejected request is answered by the
// guard's Responder and aborted; otherwise the rest of the chain runs while
// the lock is held, and the lock is released when it returns or panics.
func Handler(g *middleware.Guard) gin.HandlerFunc {
	return func(c *gin.Context) {
		ran := false
		_ = g.ServeResponse(c.Writer, request{c}, func(r *http.Request, rec *middleware.Recording) error {
			ran = true
			return next(c, r, rec)
		}, func(rej *middleware.Rejection) error { return reject(c, g, rej) })
		if !ran {
			c.Abort() // rejected, or answered with a replay
		}
	}
}

// Install puts the route table rt in front of every route of r, and is the
// one way to install a table on gin. gin copies the engine's middleware into
// a route when the route is registered, and into a group when the group is
// created, so a route registered, or a group created, before the table's
// middleware would never run it: its entry would silently lock nothing.
// Install therefore refuses, with an error wrapping
// middleware.ErrInvalidConfig that names a route, when r has routes already,
// installing nothing; it refuses a nil r or rt too. Call it before
// registering routes and before creating groups: a group created before
// Install, even one without routes yet, is out of its sight (gin lists no
// groups), and only Verify finds its routes.
//
// Call Verify once the routes are registered, before serving, to fail at
// start-up on an entry that matches no route r serves (a typo) or whose
// route does not run the table (a group created too early):
//
//	rt, err := middleware.LoadRoutes(locker, "routes.yaml")
//	if err := ginlock.Install(r, rt); err != nil { ... }
//	r.POST("/skus/:id/deduct", deduct)
//	if err := ginlock.Verify(r, rt); err != nil { ... }
//
// Without it, the install runs Verify at its first request, and a problem
// breaks the install, which logs it once and answers 500 to every request
// it sees; a route that does not run the table is not among those, and
// runs unlocked until the service is fixed.
//
// Each request is locked by its route's entry, found by c.FullPath(); routes
// without one pass through.
func Install(r *gin.Engine, rt *middleware.Routes) error {
	if r == nil || rt == nil {
		return fmt.Errorf("%w: ginlock.Install: the engine or the route table is nil", middleware.ErrInvalidConfig)
	}
	if routes := r.Routes(); len(routes) > 0 {
		return fmt.Errorf("%w: ginlock.Install: the engine has %d routes already, such as %s %s, and gin "+
			"gives a route only the middleware installed before it is registered, so they would run unlocked; "+
			"install the route table before registering routes and creating groups",
			middleware.ErrInvalidConfig, len(routes), routes[0].Method, routes[0].Path)
	}
	r.Use(tableHandler(rt.Install("ginlock.Install", func(keyfunc.Request) error { return verify(r, rt, false) })))
	return nil
}

// tableHandler is the table middleware of an install; Verify finds it in a
// route's handler chain by its code, which is one function only while
// tableHandler is not inlined (each inlined copy gets its own literal).
//
//go:noinline
func tableHandler(in *middleware.Installation) gin.HandlerFunc {
	return func(c *gin.Context) {
		ran := false
		_ = in.ServeResponse(c.Writer, request{c}, c.Request.Method, c.FullPath(),
			func(r *http.Request, rec *middleware.Recording) error {
				ran = true
				return next(c, r, rec)
			},
			func(a middleware.Answerer, rej *middleware.Rejection) error { return reject(c, a, rej) })
		if !ran {
			c.Abort() // rejected, or answered with a replay
		}
	}
}

// CheckRoutes reports every entry of rt that matches none of routes
// (engine.Routes()), naming the entry's source, joined with the problems a
// middleware.LoadRoutesDeferred table kept; see middleware.CheckRoutes.
// It cannot tell whether the table runs in front of a route (gin lists only
// a route's last handler): Verify, which runs it too, can.
func CheckRoutes(rt *middleware.Routes, routes gin.RoutesInfo) error {
	return middleware.CheckRoutes(rt, routes, func(r gin.RouteInfo) (string, string) { return r.Method, r.Path })
}

// WithSkipper is middleware.WithSkipper in gin's shape: a request for which
// skip returns true goes through unlocked. Give it to New or to a route
// table (middleware.NewRoutes, LoadRoutes). On another adapter it skips
// nothing.
func WithSkipper(skip func(c *gin.Context) bool) middleware.Option {
	return middleware.WithRequestSkipper(func(req keyfunc.Request) bool {
		r, ok := req.(request)
		return ok && skip(r.c)
	})
}

// WithResponder is middleware.WithResponder in gin's shape: respond answers
// each rejection with c (the request is aborted after it). Give it to New or
// a route table. On another adapter the answer is middleware.WriteProblem.
func WithResponder(respond func(c *gin.Context, rej *middleware.Rejection)) middleware.Option {
	return middleware.WithRequestResponder(func(w http.ResponseWriter, req keyfunc.Request, rej *middleware.Rejection) error {
		if r, ok := req.(request); ok {
			respond(r.c, rej)
			return nil
		}
		middleware.WriteProblem(w, req.HTTPRequest(), rej)
		return nil
	})
}

// next runs the rest of c's chain with the request r a Guard hands on,
// its writes going through rec when the response is recorded (a route with
// idempotency). Callers wrap it in a function literal at the call: a
// returned closure would cost every locked request an allocation.
func next(c *gin.Context, r *http.Request, rec *middleware.Recording) error {
	if rec != nil {
		orig := c.Writer
		c.Writer = &recordedWriter{ResponseWriter: orig, rec: rec.Writer(orig)}
		defer func() { c.Writer = orig }()
	}
	if r == c.Request {
		c.Next() // skipped, unlisted, or a fail-open run: nothing to hand on
		return nil
	}
	// *gin.Context is a context.Context, but without the engine's
	// ContextWithFallback its Value reads only c.Keys for string keys:
	// put the request's context, which carries the lock, where the core
	// looks for it, so that reqlock.FromContext(c) and
	// locker.Obtain(c, ...) behave as with c.Request.Context().
	prev, had := c.Get(ctxkeys.RequestContext)
	c.Request = r
	c.Set(ctxkeys.RequestContext, r.Context())
	defer func() {
		// An outer guard's handlers see its own context again.
		if had {
			c.Set(ctxkeys.RequestContext, prev)
		} else {
			c.Delete(ctxkeys.RequestContext)
		}
	}()
	c.Next()
	return nil
}

// reject answers rej with a and aborts c's chain; an error of a's
// RequestResponder goes to c.Errors.
func reject(c *gin.Context, a middleware.Answerer, rej *middleware.Rejection) error {
	if err := a.Respond(c.Writer, request{c}, rej); err != nil {
		_ = c.Error(err)
	}
	c.Abort()
	return nil
}

// recordedWriter is gin's writer with the body, status, early header,
// flushes and hijack the handler does going through a middleware.Recording's writer (which
// passes them on to gin's), so that a hijacked connection is never
// recorded; the rest is gin's own, Status included, from which the
// Recording takes the status gin sends.
type recordedWriter struct {
	gin.ResponseWriter
	rec http.ResponseWriter
}

func (w *recordedWriter) WriteHeader(code int)              { w.rec.WriteHeader(code) }
func (w *recordedWriter) Write(b []byte) (int, error)       { return w.rec.Write(b) }
func (w *recordedWriter) WriteString(s string) (int, error) { return w.rec.Write([]byte(s)) }
func (w *recordedWriter) Unwrap() http.ResponseWriter       { return w.rec }
func (w *recordedWriter) Flush()                            { _ = http.NewResponseController(w.rec).Flush() }
func (w *recordedWriter) WriteHeaderNow()                   { w.rec.(interface{ WriteHeaderNow() }).WriteHeaderNow() }

func (w *recordedWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.rec).Hijack()
}

// Lock returns the lock the middleware holds for c's request.
func Lock(c *gin.Context) (*reqlock.Lock, bool) {
	return reqlock.FromContext(c.Request.Context())
}

// request is gin's view of keyfunc.Request.
type request struct{ c *gin.Context }

func (r request) HTTPRequest() *http.Request { return r.c.Request }

// PathValue returns the path parameter. A catch-all parameter (*path) is
// the rest of the path without the leading slash gin gives it, as net/http
// gives {path...} and echo gives *: one resource, one key on every router,
// and the same key as the JSON value "a/b" for the path /files/a/b.
func (r request) PathValue(name string) string {
	v := r.c.Param(name)
	if strings.HasSuffix(r.c.FullPath(), "/*"+name) {
		v = strings.TrimPrefix(v, "/")
	}
	return v
}

func (r request) ContextValue(name string) (any, bool) {
	if v, ok := r.c.Get(name); ok {
		return v, true
	}
	v := r.c.Request.Context().Value(keyfunc.ContextKey(name))
	return v, v != nil
}
