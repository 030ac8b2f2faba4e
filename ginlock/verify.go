package ginlock

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/gin-gonic/gin"

	"github.com/reqlock/reqlock/middleware"
)

// Verify checks, once every route of r is registered and before r serves,
// that the route table rt installed on r (Install) locks what it lists: it
// reports CheckRoutes's problems (an entry matching no route) and every
// route with an entry whose handler chain lacks the table, such as a route
// of a group created before Install (gin copies the engine's middleware
// into a group when the group is created), joined, each naming the entry's
// source and wrapping middleware.ErrInvalidConfig. Routes without an entry
// are not checked.
//
// gin lists only a route's last handler, so Verify reads the chains from
// the engine's route trees, which gin does not export; should a gin release
// change their layout, Verify returns an error saying so rather than pass
// a table it cannot check. Install runs the same check at the first request,
// where an unreadable layout skips the chain check instead.
func Verify(r *gin.Engine, rt *middleware.Routes) error {
	return verify(r, rt, true)
}

// verify is Verify. With strict false, as at Install's first request, a
// layout of gin's trees it cannot read skips the chain check (CheckRoutes's
// problems are still reported), so that a gin release that moves its trees
// does not turn every request of a service that never called Verify into a
// 500; Verify itself, at start-up, fails instead.
func verify(r *gin.Engine, rt *middleware.Routes, strict bool) error {
	if r == nil || rt == nil {
		return fmt.Errorf("%w: ginlock.Verify: the engine or the route table is nil", middleware.ErrInvalidConfig)
	}
	routes := r.Routes()
	err := CheckRoutes(rt, routes)
	unguarded, lerr := readChains(r, routes)
	if lerr != nil && !strict {
		return err
	}
	if lerr != nil {
		return errors.Join(err, fmt.Errorf("%w: ginlock.Verify cannot read the engine's handler chains, so it cannot "+
			"tell whether the table runs in front of each route: %w", middleware.ErrInvalidConfig, lerr))
	}
	return errors.Join(err, rt.CheckUnguarded(unguarded,
		"its handlers do not run the table installed by ginlock.Install (a group created before Install?); "+
			"create groups and register routes after Install"))
}

// tableCode identifies the table middleware of Install in a handler chain:
// the code of the function literal tableHandler returns, which is the same
// for every install.
var tableCode = reflect.ValueOf(tableHandler(nil)).Pointer()

// readChains is unguardedRoutes; tests replace it to stand in for a gin
// release whose trees it cannot read.
var readChains = unguardedRoutes

// errLayout says that gin's route trees are not laid out as ginlock reads
// them.
var errLayout = errors.New("gin's route trees are not laid out as this version of ginlock expects")

// unguardedRoutes returns the routes of r (whose list is routes) whose
// handler chain lacks the table middleware, read from gin's unexported
// route trees (Engine.trees: method, root; node: path, children,
// handlers), walked as Engine.Routes walks them. It fails with errLayout
// when the trees do not have that shape or do not list exactly routes.
func unguardedRoutes(r *gin.Engine, routes gin.RoutesInfo) ([]middleware.RouteID, error) {
	trees := reflect.ValueOf(r).Elem().FieldByName("trees")
	if trees.Kind() != reflect.Slice {
		return nil, fmt.Errorf("%w: no Engine.trees slice", errLayout)
	}
	var (
		unguarded []middleware.RouteID
		seen      int
		walk      func(method, path string, n reflect.Value) error
	)
	chainType := reflect.TypeFor[gin.HandlersChain]()
	walk = func(method, path string, n reflect.Value) error {
		if n.Kind() != reflect.Pointer || n.Type().Elem().Kind() != reflect.Struct {
			return fmt.Errorf("%w: a tree node is not a struct pointer", errLayout)
		}
		if n.IsNil() {
			return nil
		}
		n = n.Elem()
		p, handlers, children := n.FieldByName("path"), n.FieldByName("handlers"), n.FieldByName("children")
		if p.Kind() != reflect.String || !handlers.IsValid() || handlers.Type() != chainType || children.Kind() != reflect.Slice {
			return fmt.Errorf("%w: a tree node lacks path, handlers or children", errLayout)
		}
		path += p.String()
		if handlers.Len() > 0 {
			seen++
			guarded := false
			for i := range handlers.Len() {
				guarded = guarded || handlers.Index(i).Pointer() == tableCode
			}
			if !guarded {
				unguarded = append(unguarded, middleware.RouteID{Method: method, Path: path})
			}
		}
		for i := range children.Len() {
			if err := walk(method, path, children.Index(i)); err != nil {
				return err
			}
		}
		return nil
	}
	for i := range trees.Len() {
		t := trees.Index(i)
		if t.Kind() != reflect.Struct {
			return nil, fmt.Errorf("%w: a method tree is not a struct", errLayout)
		}
		method, root := t.FieldByName("method"), t.FieldByName("root")
		if method.Kind() != reflect.String {
			return nil, fmt.Errorf("%w: a method tree has no method", errLayout)
		}
		if err := walk(method.String(), "", root); err != nil {
			return nil, err
		}
	}
	if seen != len(routes) {
		return nil, fmt.Errorf("%w: the trees hold %d routes, Engine.Routes lists %d", errLayout, seen, len(routes))
	}
	return unguarded, nil
}
