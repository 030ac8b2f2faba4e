package middleware

import (
	"net/http"

	"github.com/reqlock/reqlock/keyfunc"
)

// Handler returns next behind the route's lock: the net/http adapter.
// Path placeholders read r.PathValue (Go 1.22 ServeMux patterns, and
// routers that set path values), ctx placeholders read
// r.Context().Value(keyfunc.ContextKey(name)).
//
// The handler runs only while the lock is held; reqlock.FromContext on its
// request context returns the lock. The lock is released when the handler
// returns, also when it panics (the panic then continues) and when the
// request was cancelled.
func (g *Guard) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = g.ServeResponse(w, keyfunc.HTTPRequest(r), func(r *http.Request, rec *Recording) error {
			if rec != nil {
				next.ServeHTTP(rec.Writer(w), r)
				return nil
			}
			next.ServeHTTP(w, r)
			return nil
		}, func(rej *Rejection) error {
			_ = g.Respond(w, keyfunc.HTTPRequest(r), rej)
			return nil
		})
	})
}

// HandlerFunc is Handler for a handler function.
func (g *Guard) HandlerFunc(next http.HandlerFunc) http.Handler { return g.Handler(next) }

// Middleware returns Handler as a func(http.Handler) http.Handler, the shape
// routers such as chi take in Use and With.
func (g *Guard) Middleware() func(http.Handler) http.Handler { return g.Handler }
