package middleware

import (
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
)

// RouteLister lists the routes a router serves, for an Installation's
// check. ginlock and echolock implement it over gin's engine.Routes() and
// echo's e.Routes().
type RouteLister interface {
	RegisteredRoutes() []RouteID
}

// Installation is one install of a route table in a router whose routes
// may be registered after it (gin, echo): the adapter's table middleware
// finds each request's Guard through it, and it sees to it that a wrong
// install never lets a listed route run unlocked. Build it with
// Routes.Install, once per install.
//
// At its first request it checks the table against the routes the router
// serves (Routes.Check); an adapter that finds its middleware cannot see
// the routes it should lock calls Fail. Either way the install is then
// broken: the problem is logged once, at error level, on the table's
// logger, and every request through the install is answered 500 (reason
// internal), never run.
//
// An Installation is safe for concurrent use.
type Installation struct {
	rt *Routes
	by string // the install, such as "ginlock.Install", for messages

	checked sync.Once
	broken  atomic.Pointer[Rejection] // set once, by the first Fail
}

// Install returns an Installation of rt; by names the install in messages,
// such as "echolock.Routes".
func (rt *Routes) Install(by string) *Installation {
	return &Installation{rt: rt, by: by}
}

// Routes returns the installed table.
func (in *Installation) Routes() *Routes { return in.rt }

// Guard returns the Guard of the request's route, by method and path
// template as the router gives them ({id} or :id), or nil for a route
// without an entry. Its first call checks the table against routes' list;
// when the install is broken, it returns the Rejection to answer instead
// (with Routes.Respond), and no Guard.
func (in *Installation) Guard(method, path string, routes RouteLister) (*Guard, *Rejection) {
	in.checked.Do(func() {
		if err := in.rt.Check(routes.RegisteredRoutes()); err != nil {
			in.Fail(fmt.Errorf("the route table does not match the router's routes: %w", err))
		}
	})
	if rej := in.broken.Load(); rej != nil {
		return nil, rej
	}
	return in.rt.Guard(method, path), nil
}

// Fail breaks the install with err, which says what is wrong: the first
// failure is logged, and from now on Guard answers every request with the
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
