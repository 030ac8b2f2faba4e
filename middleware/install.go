package middleware

import (
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/reqlock/reqlock/keyfunc"
)

// Answerer answers the rejections of an installed table's requests: a
// route's Guard, or, for the requests of a broken install, the table's
// Routes. Adapters answer with Respond, and an adapter that has a native
// way to answer (echo's *echo.HTTPError) uses it when HasResponder is
// false.
type Answerer interface {
	HasResponder() bool
	Respond(w http.ResponseWriter, req keyfunc.Request, rej *Rejection) error
}

var (
	_ Answerer = (*Guard)(nil)
	_ Answerer = (*Routes)(nil)
)

// Installation is one install of a route table in a router whose routes
// may be registered after it (gin, echo): the adapter's table middleware
// runs each request through Serve, and it sees to it that a wrong install
// never lets a listed route run unlocked. Build it with Routes.Install, once
// per install.
//
// At its first request it checks the table against the routes the router
// serves, with the check given to Install; an adapter that finds its
// middleware cannot see the routes it should lock calls Fail. Either way
// the install is then broken: the problem is logged once, at error level,
// on the table's logger, and every request through the install is answered
// 500 (reason internal), never run.
//
// An Installation is safe for concurrent use.
type Installation struct {
	rt    *Routes
	by    string // the install, such as "ginlock.Install", for messages
	check func(req keyfunc.Request) error

	checked sync.Once
	broken  atomic.Pointer[Rejection] // set once, by the first Fail
}

// Install returns an Installation of rt; by names the install in messages,
// such as "echolock.Routes". check reports whether rt matches the routes of
// the router that serves req (the adapter's start-up check, such as
// echolock.CheckRoutes with e's routes, or ginlock.Verify); the Installation calls it
// once, at its first request, when every route is registered.
func (rt *Routes) Install(by string, check func(req keyfunc.Request) error) *Installation {
	return &Installation{rt: rt, by: by, check: check}
}

// Serve runs one request through the installed table: the table middleware
// of every adapter that installs a table. method and path are the request's
// method and its route's path template as the router gives them ({id} or
// :id); req is the adapter's view of the request.
//
// Its first call checks the table (see Install). A request through a broken
// install goes to reject with the table's Routes, which answers it, and
// never to next. A request to a route without an entry goes to next as it
// is, unlocked. A request to a route with an entry is served by the entry's
// Guard (see Guard.Serve), whose rejections go to reject with the Guard.
// Serve returns what next or reject returns.
func (in *Installation) Serve(req keyfunc.Request, method, path string,
	next func(*http.Request) error, reject func(Answerer, *Rejection) error) error {
	in.checked.Do(func() {
		if err := in.check(req); err != nil {
			in.Fail(fmt.Errorf("the route table does not match the router's routes: %w", err))
		}
	})
	if rej := in.broken.Load(); rej != nil {
		return reject(in.rt, rej)
	}
	g := in.rt.Guard(method, path)
	if g == nil {
		return next(req.HTTPRequest())
	}
	return g.Serve(req, next, func(rej *Rejection) error { return reject(g, rej) })
}

// ServeResponse is Serve for an adapter that lets the Guards see the
// response (see Guard.ServeResponse): every adapter of this module calls
// it, so that routes with idempotency record and replay responses. w is
// the adapter's response writer; next gets a non-nil *Recording on a
// request whose response is recorded.
func (in *Installation) ServeResponse(w http.ResponseWriter, req keyfunc.Request, method, path string,
	next func(r *http.Request, rec *Recording) error, reject func(Answerer, *Rejection) error) error {
	in.checked.Do(func() {
		if err := in.check(req); err != nil {
			in.Fail(fmt.Errorf("the route table does not match the router's routes: %w", err))
		}
	})
	if rej := in.broken.Load(); rej != nil {
		return reject(in.rt, rej)
	}
	g := in.rt.Guard(method, path)
	if g == nil {
		return next(req.HTTPRequest(), nil)
	}
	return g.ServeResponse(w, req, next, func(rej *Rejection) error { return reject(g, rej) })
}

// Fail breaks the install with err, which says what is wrong: the first
// failure is logged, and from now on Serve answers every request with the
// returned Rejection (500).
func (in *Installation) Fail(err error) *Rejection {
	rej := &Rejection{
		Status: http.StatusInternalServerError,
		Reason: ReasonInternal,
		Detail: "the server's lock configuration is broken",
		Err:    fmt.Errorf("%w: %s: %w", ErrInvalidConfig, in.by, err),
	}
	if !in.broken.CompareAndSwap(nil, rej) {
		return in.broken.Load()
	}
	in.rt.logger.Error("reqlock: the route table's install is broken; answering 500 to every request it sees until it is fixed",
		slog.String("install", in.by), slog.Any("error", err))
	return rej
}
