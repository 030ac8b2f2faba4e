package middleware_test

import (
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

func TestNetHTTPAdapter(t *testing.T) {
	adaptertest.Run(t, adaptertest.Adapter{
		Name:               "net/http",
		Serve:              serveNetHTTP,
		ProblemContentType: "application/problem+json",
	})
}
