package middleware_test

import (
	"io"
	"net/http"
	"os"
	"testing"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/adaptertest"
	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/middleware"
)

func TestMain(m *testing.M) { os.Exit(testredis.Main(m)) }

func serveNetHTTP(locker *reqlock.Locker, key string, opts []middleware.Option, h http.HandlerFunc) (http.Handler, error) {
	guard, err := middleware.New(locker, key, opts...)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(adaptertest.Route, guard.Handler(h))
	return mux, nil
}

// serveNetHTTPRoutes registers routes on a ServeMux, each behind its
// Guard, and wraps the mux once with rt.Handler.
func serveNetHTTPRoutes(rt *middleware.Routes, routes []adaptertest.Endpoint) (http.Handler, error) {
	mux := http.NewServeMux()
	for _, r := range routes {
		var h http.Handler = r.Handler
		if r.Guard != nil {
			h = r.Guard.Handler(h)
		}
		mux.Handle(r.Method+" "+r.Path, h)
	}
	return rt.Handler(mux)
}

// installNetHTTPRoutes is serveNetHTTPRoutes: net/http's table wraps the
// whole mux, after the routes are registered, and checks them always.
func installNetHTTPRoutes(rt *middleware.Routes, routes []adaptertest.Endpoint, late bool) (http.Handler, error) {
	return serveNetHTTPRoutes(rt, routes)
}

// netHTTPSkipper and netHTTPResponder are the native options of net/http:
// middleware's own.
func netHTTPSkipper() middleware.Option {
	return middleware.WithSkipper(func(r *http.Request) bool { return r.Header.Get("X-Skip") != "" })
}

func netHTTPResponder(status int, body string) middleware.Option {
	return middleware.WithResponder(func(w http.ResponseWriter, r *http.Request, rej *middleware.Rejection) {
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body+":"+string(rej.Reason))
	})
}

// serveNetHTTPNested wraps the route twice: outer, then inner.
func serveNetHTTPNested(outer, inner *middleware.Guard, around func(*http.Request, func()), h http.HandlerFunc) http.Handler {
	route := inner.Handler(h)
	mux := http.NewServeMux()
	mux.Handle(adaptertest.Route, outer.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		around(r, func() { route.ServeHTTP(w, r) })
	})))
	return mux
}

func TestNetHTTPAdapter(t *testing.T) {
	adaptertest.Run(t, adaptertest.Adapter{
		Name:               "net/http",
		Serve:              serveNetHTTP,
		ProblemContentType: "application/problem+json",
		ServeRoutes:        serveNetHTTPRoutes,
		InstallRoutes:      installNetHTTPRoutes,
		Skipper:            netHTTPSkipper,
		Responder:          netHTTPResponder,
		ServeNested:        serveNetHTTPNested,
	})
}
