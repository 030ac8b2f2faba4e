package metricdefs

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/reqlock/reqlock"
)

// RouteName returns the route label value of an event label: the label
// itself, made valid UTF-8 (label values must be) by replacing each
// invalid byte sequence with U+FFFD, or reqlock.UnlabeledRoute for an
// empty label.
func RouteName(label string) string {
	if label == "" {
		return reqlock.UnlabeledRoute
	}
	if !utf8.ValidString(label) {
		return strings.ToValidUTF8(label, "\uFFFD")
	}
	return label
}

// Routes maps the labels of events to the series R of their routes, for an
// implementation of reqlock.Metrics, so that both implementations name and
// cap routes alike. Create it with NewRoutes; it is safe for concurrent
// use.
//
// The route label value of an event label is its RouteName; event labels
// of the same RouteName share their series. Routes counts the distinct
// event labels: once it holds as many as its cap, the events of any
// further label get the series of OverflowRoute (those of a label actually
// named "other", if any).
type Routes[R any] struct {
	max      int64
	newRoute func(name string) *R

	byLabel  sync.Map     // event label -> *R; at most max entries
	nlabels  atomic.Int64 // entries of byLabel; written under mu
	overflow atomic.Pointer[R]

	mu     sync.Mutex    // serialises adding routes
	byName map[string]*R // guarded by mu: route label value -> its series
	list   []*R          // guarded by mu: the values of byName, in order of creation
}

// NewRoutes returns an empty Routes that holds at most maxRoutes distinct
// event labels (the cap of the option WithMaxRoutes) and creates the series
// of a route label value with newRoute, which is called with a lock of
// Routes held. It panics when maxRoutes is negative.
func NewRoutes[R any](maxRoutes int, newRoute func(name string) *R) *Routes[R] {
	if maxRoutes < 0 {
		panic(fmt.Sprintf("metricdefs: NewRoutes(%d): the cap must not be negative", maxRoutes))
	}
	return &Routes[R]{max: int64(maxRoutes), newRoute: newRoute, byName: make(map[string]*R)}
}

// Get returns the series of the route of an event's label, creating them
// on the label's first sight. For a label already seen, or once the cap is
// reached, it takes a map load (and an atomic load) and does not allocate.
func (rs *Routes[R]) Get(label string) *R {
	if r, ok := rs.byLabel.Load(label); ok {
		return r.(*R)
	}
	return rs.add(label)
}

func (rs *Routes[R]) add(label string) *R {
	if rs.nlabels.Load() >= rs.max {
		if r := rs.overflow.Load(); r != nil {
			return r
		}
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if r, ok := rs.byLabel.Load(label); ok {
		return r.(*R)
	}
	if rs.nlabels.Load() >= rs.max {
		r := rs.overflow.Load()
		if r == nil {
			r = rs.series(OverflowRoute)
			rs.overflow.Store(r)
		}
		return r
	}
	r := rs.series(RouteName(label))
	rs.byLabel.Store(label, r)
	rs.nlabels.Add(1)
	return r
}

// series returns the series of the route label value name, creating them;
// rs.mu is held.
func (rs *Routes[R]) series(name string) *R {
	if r := rs.byName[name]; r != nil {
		return r
	}
	r := rs.newRoute(name)
	rs.byName[name] = r
	rs.list = append(rs.list, r)
	return r
}

// All returns the series of every route created so far, in the order of
// their creation.
func (rs *Routes[R]) All() []*R {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return slices.Clone(rs.list)
}
