package metricdefs

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/reqlock/reqlock"
)

func TestRouteName(t *testing.T) {
	for label, want := range map[string]string{
		"":                     reqlock.UnlabeledRoute,
		reqlock.UnlabeledRoute: reqlock.UnlabeledRoute,
		"POST /skus/{id}":      "POST /skus/{id}",
		"GET /\xff\xfe":        "GET /\uFFFD",
		"a\xffb\xfec":          "a\uFFFDb\uFFFDc",
		"GET /ünï\n\"":         "GET /ünï\n\"",
	} {
		if got := RouteName(label); got != want {
			t.Errorf("RouteName(%q) = %q, want %q", label, got, want)
		}
	}
}

type testRoute struct{ name string }

func TestRoutes(t *testing.T) {
	var created []string
	rs := NewRoutes(3, func(name string) *testRoute {
		created = append(created, name)
		return &testRoute{name}
	})
	a := rs.Get("GET /a")
	if rs.Get("GET /a") != a || a.name != "GET /a" {
		t.Fatalf("GET /a: %v, then %v", a, rs.Get("GET /a"))
	}
	// "" and "unlabeled" are two labels of one route.
	if u := rs.Get(""); rs.Get(reqlock.UnlabeledRoute) != u || u.name != reqlock.UnlabeledRoute {
		t.Fatalf("unlabeled: %v and %v", u, rs.Get(reqlock.UnlabeledRoute))
	}
	// The cap of 3 labels is reached: further labels go to the overflow.
	over := rs.Get("GET /b")
	if over.name != OverflowRoute || rs.Get("GET /c") != over || rs.Get(OverflowRoute) != over {
		t.Fatalf("beyond the cap: %v, %v", over, rs.Get("GET /c"))
	}
	if rs.Get("GET /a") != a {
		t.Fatal("a route seen before the cap lost its series")
	}
	if !slices.Equal(created, []string{"GET /a", reqlock.UnlabeledRoute, OverflowRoute}) {
		t.Errorf("created %q", created)
	}
	var names []string
	for _, r := range rs.All() {
		names = append(names, r.name)
	}
	if !slices.Equal(names, created) {
		t.Errorf("All: %q, want %q", names, created)
	}

	// A label named as the overflow route, seen before the cap, shares
	// its series with the overflow.
	rs = NewRoutes(1, func(name string) *testRoute { return &testRoute{name} })
	if other := rs.Get(OverflowRoute); rs.Get("GET /beyond") != other {
		t.Error("the overflow does not share the series of a route named other")
	}

	defer func() {
		if recover() == nil {
			t.Error("NewRoutes(-1) did not panic")
		}
	}()
	NewRoutes(-1, func(name string) *testRoute { return nil })
}

// TestRoutesConcurrent: goroutines seeing the same new labels at once get
// the same series, created once each, and never more than the cap.
func TestRoutesConcurrent(t *testing.T) {
	var mu sync.Mutex
	counts := make(map[string]int)
	rs := NewRoutes(10, func(name string) *testRoute {
		mu.Lock()
		counts[name]++
		mu.Unlock()
		return &testRoute{name}
	})
	var wg sync.WaitGroup
	got := make([][]*testRoute, 16)
	for g := range got {
		wg.Go(func() {
			for i := range 40 {
				got[g] = append(got[g], rs.Get(fmt.Sprintf("GET /%d", i%20)))
			}
		})
	}
	wg.Wait()
	for g := range got {
		for i, r := range got[g] {
			// A label may be seen as overflow by one goroutine while another
			// creates its series, the last below the cap; otherwise every
			// goroutine gets the same series, and it is the label's own.
			if r != got[0][i] && r.name != OverflowRoute && got[0][i].name != OverflowRoute {
				t.Fatalf("goroutines %d and 0 got different series for label %d", g, i)
			}
			if label := fmt.Sprintf("GET /%d", i%20); r.name != RouteName(label) && r.name != OverflowRoute {
				t.Fatalf("goroutine %d got the series of %q for label %q", g, r.name, label)
			}
		}
	}
	if len(counts) != 11 || counts[OverflowRoute] != 1 {
		t.Fatalf("created %v, want 10 routes and the overflow", counts)
	}
	for name, n := range counts {
		if n != 1 {
			t.Errorf("%s created %d times", name, n)
		}
	}
}
