package middleware_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores/memstore"
)

// TestGuardSkipDecidesAsServe: Skip, for a custom adapter that works with
// an *http.Request, asks both skippers as Serve does; it ignored the
// RequestSkipper, and so locked requests that Serve lets through.
func TestGuardSkipDecidesAsServe(t *testing.T) {
	g, err := middleware.New(reqlock.MustNew(memstore.New()), "item:<id>",
		middleware.WithSkipper(func(r *http.Request) bool { return r.Header.Get("X-Skip") != "" }),
		middleware.WithRequestSkipper(func(req keyfunc.Request) bool { return req.HTTPRequest().Header.Get("X-Skip-Request") != "" }))
	if err != nil {
		t.Fatal(err)
	}
	for header, want := range map[string]bool{"X-Skip": true, "X-Skip-Request": true, "X-Other": false} {
		r := httptest.NewRequest(http.MethodPost, "/items/1", nil)
		r.Header.Set(header, "1")
		if got := g.Skip(r); got != want {
			t.Errorf("%s: Skip = %v, want %v", header, got, want)
		}
		if got := g.SkipRequest(keyfunc.HTTPRequest(r)); got != want {
			t.Errorf("%s: SkipRequest = %v, want %v", header, got, want)
		}
		served := false
		_ = g.Serve(keyfunc.HTTPRequest(r), func(r *http.Request) error {
			_, locked := reqlock.FromContext(r.Context())
			served = !locked
			return nil
		}, func(*middleware.Rejection) error { return nil })
		if served != want {
			t.Errorf("%s: Serve ran the request unlocked: %v, want %v", header, served, want)
		}
	}
}
