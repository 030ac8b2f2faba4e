package metrics

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/reqlock/reqlock"
)

// The exported names, texts and helpers are what the Prometheus adapter
// builds on; these tests pin them.

func TestKnownResults(t *testing.T) {
	known := KnownResults()
	if known[0] != reqlock.ResultAcquired {
		t.Errorf("KnownResults()[0] = %q, want acquired", known[0])
	}
	for i, r := range known {
		if got := ResultIndex(r); got != i {
			t.Errorf("ResultIndex(%q) = %d, want %d", r, got, i)
		}
	}
	want := []reqlock.Result{reqlock.ResultAcquired, reqlock.ResultTimeout, reqlock.ResultStoreError, reqlock.ResultBadKey, reqlock.ResultCanceled}
	if !slices.Equal(known[:], want) {
		t.Errorf("KnownResults() = %q, want %q", known, want)
	}
	for _, r := range []reqlock.Result{"", "quorum", "Acquired", OtherReason} {
		if got := ResultIndex(r); got != -1 {
			t.Errorf("ResultIndex(%q) = %d, want -1", r, got)
		}
	}
}

func TestReasons(t *testing.T) {
	var rs Reasons // the zero value is ready
	for _, r := range KnownResults() {
		if got := rs.Reason(r); got != string(r) {
			t.Errorf("Reason(%q) = %q", r, got)
		}
	}
	for _, r := range []reqlock.Result{"", "bad\xff"} {
		if got := rs.Reason(r); got != OtherReason {
			t.Errorf("Reason(%q) = %q, want %q", r, got, OtherReason)
		}
	}
	for i := range MaxOtherResults + 2 {
		r := reqlock.Result(fmt.Sprintf("new%d", i))
		want := string(r)
		if i >= MaxOtherResults {
			want = OtherReason
		}
		for range 2 { // the same reason the second time
			if got := rs.Reason(r); got != want {
				t.Errorf("Reason(%q) = %q, want %q", r, got, want)
			}
		}
	}
	// Known results take none of the slots, and keep their reason.
	if got := rs.Reason(reqlock.ResultTimeout); got != "timeout" {
		t.Errorf("Reason(timeout) after the cap = %q", got)
	}
}

func TestOtherResults(t *testing.T) {
	var rs Reasons
	var o OtherResults[int]
	var created []string
	newSeries := func(reason string) *int {
		created = append(created, reason)
		return new(int)
	}
	quorum := o.Get("quorum", &rs, newSeries)
	if o.Get("quorum", &rs, newSeries) != quorum {
		t.Error("a second Get of a result gives other series")
	}
	empty := o.Get("", &rs, newSeries)
	if o.Get("bad\xff", &rs, newSeries) != empty {
		t.Error("results of the reason other do not share their series")
	}
	if !slices.Equal(created, []string{"quorum", OtherReason}) {
		t.Errorf("created %q", created)
	}
	got := make(map[string]*int)
	o.Each(func(reason string, s *int) { got[reason] = s })
	if len(got) != 2 || got["quorum"] != quorum || got[OtherReason] != empty {
		t.Errorf("Each: %v", got)
	}
}

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

func TestCheckBuckets(t *testing.T) {
	for _, b := range [][]float64{nil, {}, {1}, {-1, 0, 1e-9, 1}, {1, math.Inf(1)}, DefaultWaitBuckets(), DefaultHoldBuckets()} {
		if err := CheckBuckets(b); err != nil {
			t.Errorf("CheckBuckets(%v): %v", b, err)
		}
	}
	for _, b := range [][]float64{{1, 1}, {2, 1}, {math.NaN()}, {1, math.NaN()}, {math.Inf(1), math.Inf(1)}} {
		if err := CheckBuckets(b); err == nil || !strings.Contains(err.Error(), "increase strictly") {
			t.Errorf("CheckBuckets(%v): %v, want an error", b, err)
		}
	}
}

func TestFamilies(t *testing.T) {
	names := []string{NameFailure, NameHandoffs, NameHold, NameLost, NameSuccess, NameWait}
	if !slices.IsSorted(names) {
		t.Errorf("the families are not in the order of their names: %q", names)
	}
	for f, d := range families {
		if d.name != names[f] || d.help == "" || strings.HasSuffix(d.name, "_total") != (d.typ == "counter") {
			t.Errorf("family %d: %+v", f, d)
		}
	}
}
