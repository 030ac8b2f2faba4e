package middleware_test

import (
	"errors"
	"testing"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores/memstore"
)

// TestMust: Must hands back what the constructor built, and panics with its
// error.
func TestMust(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	g := middleware.Must(middleware.New(locker, "item:<id>"))
	if g == nil || g.Config().Key != "item:<id>" {
		t.Fatalf("Must returned %v", g)
	}
	defer func() {
		err, _ := recover().(error)
		if !errors.Is(err, middleware.ErrInvalidConfig) || !errors.Is(err, keyfunc.ErrSyntax) {
			t.Fatalf("Must panicked with %v, want the constructor's error", err)
		}
	}()
	middleware.Must(middleware.New(locker, "item:<id"))
	t.Fatal("Must did not panic on an invalid template")
}
