package metrics

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/metricdefs"
)

// Durations whose seconds are exact in binary, so that sums compare exactly.
const (
	d7ms  = 7812500 * time.Nanosecond // 2^-7 s
	d62ms = 62500 * time.Microsecond  // 2^-4 s
	d250  = 250 * time.Millisecond
	d500  = 500 * time.Millisecond
	d2s   = 2 * time.Second
)

var metricNames = []string{
	"reqlock_lock_failure_total",
	"reqlock_lock_handoffs_total",
	"reqlock_lock_hold_seconds",
	"reqlock_lock_lost_total",
	"reqlock_lock_success_total",
	"reqlock_lock_wait_seconds",
}

// scenario reports a small, fixed set of events, the same as the test of
// the Prometheus adapter.
func scenario(m reqlock.Metrics) {
	const x, y = "POST /x", "GET /y"
	m.Obtained(x, reqlock.OutcomeAcquired, d7ms)
	m.Obtained(x, reqlock.OutcomeAcquired, d62ms)
	m.Obtained(x, reqlock.OutcomeTimeout, d500)
	m.Obtained(x, reqlock.OutcomeStoreError, d2s)
	m.Held(x, d62ms)
	m.Held(x, d250)
	m.Lost(x)
	m.HandedOff(x)
	m.HandedOff(x)
	m.Obtained(x, reqlock.OutcomeLost, d7ms)
	m.Obtained(y, reqlock.OutcomeCanceled, d250)
	m.Obtained(y, reqlock.OutcomeInvalid, 0)
}

// scenarioText is the exposition of scenario with the buckets of
// TestExposition, byte for byte what the Prometheus adapter serves through
// promhttp for the same events (its TestSameAsCore checks that).
const scenarioText = `# HELP reqlock_lock_failure_total Lock attempts (calls of Obtain or ObtainAll) that did not acquire the lock, by route and reason: timeout (the key stayed held until the wait or the caller's deadline ran out, or a try-once attempt found it held), store_error (the store failed, or did not answer before the wait ended with no sign that the key was held), bad_key (no key could be derived from the request), canceled (the caller cancelled while waiting), invalid (invalid arguments or configuration, such as keys the store cannot lock together), lock_lost (the request's own lock on a key it asked for again was lost).
# TYPE reqlock_lock_failure_total counter
reqlock_lock_failure_total{reason="bad_key",route="GET /y"} 0
reqlock_lock_failure_total{reason="bad_key",route="POST /x"} 0
reqlock_lock_failure_total{reason="canceled",route="GET /y"} 1
reqlock_lock_failure_total{reason="canceled",route="POST /x"} 0
reqlock_lock_failure_total{reason="invalid",route="GET /y"} 1
reqlock_lock_failure_total{reason="invalid",route="POST /x"} 0
reqlock_lock_failure_total{reason="lock_lost",route="GET /y"} 0
reqlock_lock_failure_total{reason="lock_lost",route="POST /x"} 1
reqlock_lock_failure_total{reason="store_error",route="GET /y"} 0
reqlock_lock_failure_total{reason="store_error",route="POST /x"} 1
reqlock_lock_failure_total{reason="timeout",route="GET /y"} 0
reqlock_lock_failure_total{reason="timeout",route="POST /x"} 1
# HELP reqlock_lock_handoffs_total Held grants passed to a waiter of the same process without a store round trip, by route.
# TYPE reqlock_lock_handoffs_total counter
reqlock_lock_handoffs_total{route="GET /y"} 0
reqlock_lock_handoffs_total{route="POST /x"} 2
# HELP reqlock_lock_hold_seconds Seconds a lock was held, from acquiring it until its holder let go of it (a release in the store, or a handoff to a waiter of the same process), by route.
# TYPE reqlock_lock_hold_seconds histogram
reqlock_lock_hold_seconds_bucket{route="POST /x",le="0.1"} 1
reqlock_lock_hold_seconds_bucket{route="POST /x",le="1"} 2
reqlock_lock_hold_seconds_bucket{route="POST /x",le="+Inf"} 2
reqlock_lock_hold_seconds_sum{route="POST /x"} 0.3125
reqlock_lock_hold_seconds_count{route="POST /x"} 2
# HELP reqlock_lock_lost_total Locks found lost while they were held (their validity ran out without a renewal, or a renewal found them gone), by route.
# TYPE reqlock_lock_lost_total counter
reqlock_lock_lost_total{route="GET /y"} 0
reqlock_lock_lost_total{route="POST /x"} 1
# HELP reqlock_lock_success_total Lock attempts (calls of Obtain or ObtainAll, reentrant ones included) that acquired the lock, by route.
# TYPE reqlock_lock_success_total counter
reqlock_lock_success_total{route="GET /y"} 0
reqlock_lock_success_total{route="POST /x"} 2
# HELP reqlock_lock_wait_seconds Seconds a lock attempt took, from the call until it returned, by route and result (acquired, or the reason of lock_failure_total).
# TYPE reqlock_lock_wait_seconds histogram
reqlock_lock_wait_seconds_bucket{result="acquired",route="POST /x",le="0.01"} 1
reqlock_lock_wait_seconds_bucket{result="acquired",route="POST /x",le="0.1"} 2
reqlock_lock_wait_seconds_bucket{result="acquired",route="POST /x",le="1"} 2
reqlock_lock_wait_seconds_bucket{result="acquired",route="POST /x",le="+Inf"} 2
reqlock_lock_wait_seconds_sum{result="acquired",route="POST /x"} 0.0703125
reqlock_lock_wait_seconds_count{result="acquired",route="POST /x"} 2
reqlock_lock_wait_seconds_bucket{result="canceled",route="GET /y",le="0.01"} 0
reqlock_lock_wait_seconds_bucket{result="canceled",route="GET /y",le="0.1"} 0
reqlock_lock_wait_seconds_bucket{result="canceled",route="GET /y",le="1"} 1
reqlock_lock_wait_seconds_bucket{result="canceled",route="GET /y",le="+Inf"} 1
reqlock_lock_wait_seconds_sum{result="canceled",route="GET /y"} 0.25
reqlock_lock_wait_seconds_count{result="canceled",route="GET /y"} 1
reqlock_lock_wait_seconds_bucket{result="invalid",route="GET /y",le="0.01"} 1
reqlock_lock_wait_seconds_bucket{result="invalid",route="GET /y",le="0.1"} 1
reqlock_lock_wait_seconds_bucket{result="invalid",route="GET /y",le="1"} 1
reqlock_lock_wait_seconds_bucket{result="invalid",route="GET /y",le="+Inf"} 1
reqlock_lock_wait_seconds_sum{result="invalid",route="GET /y"} 0
reqlock_lock_wait_seconds_count{result="invalid",route="GET /y"} 1
reqlock_lock_wait_seconds_bucket{result="lock_lost",route="POST /x",le="0.01"} 1
reqlock_lock_wait_seconds_bucket{result="lock_lost",route="POST /x",le="0.1"} 1
reqlock_lock_wait_seconds_bucket{result="lock_lost",route="POST /x",le="1"} 1
reqlock_lock_wait_seconds_bucket{result="lock_lost",route="POST /x",le="+Inf"} 1
reqlock_lock_wait_seconds_sum{result="lock_lost",route="POST /x"} 0.0078125
reqlock_lock_wait_seconds_count{result="lock_lost",route="POST /x"} 1
reqlock_lock_wait_seconds_bucket{result="store_error",route="POST /x",le="0.01"} 0
reqlock_lock_wait_seconds_bucket{result="store_error",route="POST /x",le="0.1"} 0
reqlock_lock_wait_seconds_bucket{result="store_error",route="POST /x",le="1"} 0
reqlock_lock_wait_seconds_bucket{result="store_error",route="POST /x",le="+Inf"} 1
reqlock_lock_wait_seconds_sum{result="store_error",route="POST /x"} 2
reqlock_lock_wait_seconds_count{result="store_error",route="POST /x"} 1
reqlock_lock_wait_seconds_bucket{result="timeout",route="POST /x",le="0.01"} 0
reqlock_lock_wait_seconds_bucket{result="timeout",route="POST /x",le="0.1"} 0
reqlock_lock_wait_seconds_bucket{result="timeout",route="POST /x",le="1"} 1
reqlock_lock_wait_seconds_bucket{result="timeout",route="POST /x",le="+Inf"} 1
reqlock_lock_wait_seconds_sum{result="timeout",route="POST /x"} 0.5
reqlock_lock_wait_seconds_count{result="timeout",route="POST /x"} 1
`

// TestExposition compares the whole exposition of the scenario.
func TestExposition(t *testing.T) {
	m := New(WithBuckets([]float64{0.01, 0.1, 1}, []float64{0.1, 1}))
	scenario(m)
	got, _ := scrape(t, m)
	if got != scenarioText {
		t.Fatalf("exposition:\n%s\nwant:\n%s", got, scenarioText)
	}
	// A second scrape, with no event between, is the same.
	if again, _ := scrape(t, m); again != got {
		t.Fatalf("second scrape differs:\n%s", again)
	}
}

// TestDefaultBuckets checks the le values of the default buckets, those of
// the adapter, and where observations fall: a bucket counts the values
// up to its bound, included.
func TestDefaultBuckets(t *testing.T) {
	m := New()
	m.Obtained("GET /a", reqlock.OutcomeAcquired, 500*time.Microsecond) // on the bound 0.0005
	m.Obtained("GET /a", reqlock.OutcomeAcquired, 500*time.Microsecond+1)
	m.Obtained("GET /a", reqlock.OutcomeAcquired, time.Minute) // beyond 10 s
	m.Held("GET /a", time.Minute)                              // on the bound 60
	m.Held("GET /a", time.Hour)
	_, fams := scrape(t, m)

	for _, c := range []struct {
		name string
		les  []string
		want []float64 // cumulative counts, +Inf included
	}{
		{"reqlock_lock_wait_seconds",
			[]string{"0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"},
			[]float64{1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3}},
		{"reqlock_lock_hold_seconds",
			[]string{"0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60", "+Inf"},
			[]float64{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2}},
	} {
		if got := labelValues(fams, c.name, "le"); !sameSet(got, c.les) {
			t.Errorf("%s: le %v, want %v", c.name, got, c.les)
		}
		var les []string
		var counts []float64
		for _, f := range fams {
			for _, s := range f.samples {
				if s.name == c.name+"_bucket" {
					les = append(les, s.labels["le"])
					counts = append(counts, s.value)
				}
			}
		}
		if !slices.Equal(les, c.les) || !slices.Equal(counts, c.want) {
			t.Errorf("%s: buckets %v %v, want %v %v", c.name, les, counts, c.les, c.want)
		}
	}
	if !slices.Equal(DefaultWaitBuckets(), []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}) ||
		!slices.Equal(DefaultHoldBuckets(), []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}) {
		t.Error("default buckets differ from the adapter's")
	}
}

func sameSet(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

// TestCumulativeBuckets: every observation counts in its bucket and all
// above it, and sums are in seconds.
func TestCumulativeBuckets(t *testing.T) {
	m := New(WithBuckets([]float64{0.25, 0.5, 1, 2}, nil))
	var sum float64 // in the order of the observations, as the histogram adds
	for _, d := range []time.Duration{0, d250, d250 + 1, d500, d500, time.Second, 3 * time.Second, -time.Second} {
		m.Obtained("GET /a", reqlock.OutcomeTimeout, d)
		sum += max(d, 0).Seconds()
	}
	_, fams := scrape(t, m)
	want := map[string]float64{"0.25": 3, "0.5": 6, "1": 7, "2": 7, "+Inf": 8} // -1 s counts as 0
	for le, w := range want {
		if v, ok := value(fams, "reqlock_lock_wait_seconds_bucket", "result", "timeout", "route", "GET /a", "le", le); !ok || v != w {
			t.Errorf("bucket le=%s: %v (present %v), want %v", le, v, ok, w)
		}
	}
	if v, _ := value(fams, "reqlock_lock_wait_seconds_sum", "result", "timeout", "route", "GET /a"); v != sum {
		t.Errorf("sum %v, want %v", v, sum)
	}
	if v, _ := value(fams, "reqlock_lock_wait_seconds_count", "result", "timeout", "route", "GET /a"); v != 8 {
		t.Errorf("count %v, want 8", v)
	}
}

// TestNoRoutesUntilSeen: a new Registry writes nothing at all, and a
// route's counters appear with its first event, whatever the event; its
// histograms with their first observation.
func TestNoRoutesUntilSeen(t *testing.T) {
	m := New()
	if text, _ := scrape(t, m); text != "" {
		t.Fatalf("new Registry wrote %q, want nothing", text)
	}
	m.Lost("DELETE /z")
	text, fams := scrape(t, m)
	for name, want := range map[string]int{
		"reqlock_lock_success_total":  1,
		"reqlock_lock_failure_total":  6, // one per reason
		"reqlock_lock_lost_total":     1,
		"reqlock_lock_handoffs_total": 1,
		"reqlock_lock_wait_seconds":   0,
		"reqlock_lock_hold_seconds":   0,
	} {
		if n := countSeries(fams, name); n != want {
			t.Errorf("%s: %d series, want %d", name, n, want)
		}
	}
	if strings.Contains(text, "_seconds") {
		t.Errorf("histogram families without observations are written:\n%s", text)
	}
	if got := labelValues(fams, "reqlock_lock_failure_total", "reason"); !slices.Equal(got, []string{"bad_key", "canceled", "invalid", "lock_lost", "store_error", "timeout"}) {
		t.Errorf("reasons %v", got)
	}
	if v, _ := value(fams, "reqlock_lock_lost_total", "route", "DELETE /z"); v != 1 {
		t.Errorf("lost = %v, want 1", v)
	}

	m.Obtained("DELETE /z", reqlock.OutcomeBadKey, 0)
	_, fams = scrape(t, m)
	if n := countSeries(fams, "reqlock_lock_wait_seconds"); n != 1 {
		t.Errorf("after one attempt: %d wait series, want 1", n)
	}
	if v, _ := value(fams, "reqlock_lock_wait_seconds_bucket", "result", "bad_key", "route", "DELETE /z", "le", "0.0005"); v != 1 {
		t.Errorf("a zero wait is not in the first bucket: %v", v)
	}
}

// TestEscaping: route label values are escaped as the format requires,
// and read back unchanged.
func TestEscaping(t *testing.T) {
	m := New()
	routes := []string{`POST /a"b`, `GET /c\d`, "GET /e\nf", `\"` + "\n", "GET /ünï", "GET /{id},x=y}"}
	for _, r := range routes {
		m.Obtained(r, reqlock.OutcomeAcquired, time.Millisecond)
		m.Held(r, time.Millisecond)
	}
	text, fams := scrape(t, m)
	for _, line := range []string{
		`reqlock_lock_success_total{route="POST /a\"b"} 1`,
		`reqlock_lock_success_total{route="GET /c\\d"} 1`,
		`reqlock_lock_success_total{route="GET /e\nf"} 1`,
		`reqlock_lock_success_total{route="\\\"\n"} 1`,
		`reqlock_lock_hold_seconds_count{route="GET /ünï"} 1`,
		`reqlock_lock_wait_seconds_bucket{result="acquired",route="GET /{id},x=y}",le="+Inf"} 1`,
	} {
		if !strings.Contains(text, line+"\n") {
			t.Errorf("no line %s", line)
		}
	}
	for _, name := range metricNames {
		if got := labelValues(fams, name, "route"); !sameSet(got, routes) {
			t.Errorf("%s: routes %q, want %q", name, got, routes)
		}
	}
	if got := string(appendEscaped(nil, "a\\b\"c\nd", false)); got != `a\\b"c\nd` {
		t.Errorf("HELP escaping: %s", got)
	}
}

// TestRouteNames: an empty label is "unlabeled", an invalid UTF-8 one is
// made valid; labels with the same value share their series.
func TestRouteNames(t *testing.T) {
	m := New()
	m.Obtained("", reqlock.OutcomeAcquired, 0)
	m.Obtained(reqlock.UnlabeledRoute, reqlock.OutcomeAcquired, 0)
	m.Obtained("GET /\xff", reqlock.OutcomeAcquired, 0)
	m.Obtained("GET /\xfe", reqlock.OutcomeAcquired, 0)
	_, fams := scrape(t, m)
	if got := labelValues(fams, "reqlock_lock_success_total", "route"); !slices.Equal(got, []string{"GET /\uFFFD", "unlabeled"}) {
		t.Fatalf("routes %q", got)
	}
	for _, route := range []string{"GET /\uFFFD", "unlabeled"} {
		if v, _ := value(fams, "reqlock_lock_success_total", "route", route); v != 2 {
			t.Errorf("success{route=%q} = %v, want 2", route, v)
		}
	}
}

func TestMaxRoutes(t *testing.T) {
	m := New(WithMaxRoutes(2))
	for _, route := range []string{"GET /a", "GET /b", "GET /c", "GET /d", "GET /a", "GET /c"} {
		m.Obtained(route, reqlock.OutcomeAcquired, time.Millisecond)
		m.Obtained(route, reqlock.OutcomeTimeout, time.Millisecond)
		m.Held(route, time.Millisecond)
		m.Lost(route)
		m.HandedOff(route)
	}
	_, fams := scrape(t, m)
	for _, name := range metricNames {
		if got, want := labelValues(fams, name, "route"), []string{"GET /a", "GET /b", OverflowRoute}; !slices.Equal(got, want) {
			t.Errorf("%s: routes %v, want %v", name, got, want)
		}
	}
	for route, want := range map[string]float64{"GET /a": 2, "GET /b": 1, OverflowRoute: 3} {
		for _, c := range []struct {
			name   string
			labels []string
		}{
			{"reqlock_lock_success_total", []string{"route", route}},
			{"reqlock_lock_failure_total", []string{"reason", "timeout", "route", route}},
			{"reqlock_lock_lost_total", []string{"route", route}},
			{"reqlock_lock_handoffs_total", []string{"route", route}},
			{"reqlock_lock_hold_seconds_count", []string{"route", route}},
			{"reqlock_lock_wait_seconds_count", []string{"result", "acquired", "route", route}},
			{"reqlock_lock_wait_seconds_count", []string{"result", "timeout", "route", route}},
		} {
			if v, ok := value(fams, c.name, c.labels...); !ok || v != want {
				t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, v, ok, want)
			}
		}
	}
}

// TestMaxRoutesOtherRoute: a route actually named "other" shares the
// overflow's series, as in the adapter.
func TestMaxRoutesOtherRoute(t *testing.T) {
	m := New(WithMaxRoutes(1))
	m.Lost(OverflowRoute)
	m.Lost("GET /beyond")
	_, fams := scrape(t, m)
	if got := labelValues(fams, "reqlock_lock_lost_total", "route"); !slices.Equal(got, []string{OverflowRoute}) {
		t.Fatalf("routes %v", got)
	}
	if v, _ := value(fams, "reqlock_lock_lost_total", "route", OverflowRoute); v != 2 {
		t.Fatalf("lost{route=other} = %v, want 2", v)
	}
}

func TestMaxRoutesZero(t *testing.T) {
	m := New(WithMaxRoutes(0))
	m.Obtained("GET /a", reqlock.OutcomeAcquired, 0)
	m.Obtained("GET /b", reqlock.OutcomeAcquired, 0)
	_, fams := scrape(t, m)
	if got := labelValues(fams, "reqlock_lock_success_total", "route"); !slices.Equal(got, []string{OverflowRoute}) {
		t.Fatalf("routes %v, want only %q", got, OverflowRoute)
	}
	if v, _ := value(fams, "reqlock_lock_success_total", "route", OverflowRoute); v != 2 {
		t.Fatalf("success{route=other} = %v, want 2", v)
	}
}

// TestMaxRoutesConcurrent: many goroutines seeing new routes at once never
// exceed the cap, and no event is lost.
func TestMaxRoutesConcurrent(t *testing.T) {
	const maxRoutes, goroutines, routesEach = 10, 32, 20
	m := New(WithMaxRoutes(maxRoutes))
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range routesEach {
				m.Obtained(fmt.Sprintf("GET /%d", (g*routesEach+i)%50), reqlock.OutcomeAcquired, 0)
			}
		})
	}
	wg.Wait()
	_, fams := scrape(t, m)
	routes := labelValues(fams, "reqlock_lock_success_total", "route")
	if len(routes) != maxRoutes+1 || !slices.Contains(routes, OverflowRoute) {
		t.Fatalf("%d routes %v, want %d and %q", len(routes), routes, maxRoutes, OverflowRoute)
	}
	var total float64
	for _, route := range routes {
		v, _ := value(fams, "reqlock_lock_success_total", "route", route)
		total += v
	}
	if total != goroutines*routesEach {
		t.Fatalf("success total %v, want %d", total, goroutines*routesEach)
	}
}

// TestConcurrent reports events from many goroutines while others scrape;
// every scrape is well-formed with consistent histograms, counters never
// go down, and the totals at the end are exact.
func TestConcurrent(t *testing.T) {
	const (
		goroutines = 16
		rounds     = 2000
		wait       = 1953125 * time.Nanosecond // 2^-9 s: sums stay exact
		hold       = 2 * wait
	)
	routes := []string{"POST /a", "POST /b", "GET /c"}
	m := New()
	stop := make(chan struct{})
	var scrapers sync.WaitGroup
	for range 2 {
		scrapers.Go(func() {
			prev := make(map[string]float64)
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, fams := scrape(t, m)
				for _, f := range fams {
					for _, s := range f.samples {
						key := s.name + fmt.Sprint(s.labels)
						if s.value < prev[key] {
							t.Errorf("%s went down from %v", s.line, prev[key])
						}
						prev[key] = s.value
					}
				}
			}
		})
	}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range rounds {
				route := routes[(g+i)%len(routes)]
				m.Obtained(route, reqlock.OutcomeAcquired, wait)
				m.Obtained(route, reqlock.OutcomeTimeout, wait)
				m.Held(route, hold)
				m.HandedOff(route)
				if i%4 == 0 {
					m.Lost(route)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	scrapers.Wait()

	_, fams := scrape(t, m)
	// Count what each route was given, as the goroutines did.
	given, lost := make(map[string]float64), make(map[string]float64)
	for g := range goroutines {
		for i := range rounds {
			given[routes[(g+i)%len(routes)]]++
			if i%4 == 0 {
				lost[routes[(g+i)%len(routes)]]++
			}
		}
	}
	for _, route := range routes {
		perRoute := given[route]
		for _, c := range []struct {
			name   string
			labels []string
			want   float64
		}{
			{"reqlock_lock_success_total", []string{"route", route}, perRoute},
			{"reqlock_lock_failure_total", []string{"reason", "timeout", "route", route}, perRoute},
			{"reqlock_lock_failure_total", []string{"reason", "store_error", "route", route}, 0},
			{"reqlock_lock_handoffs_total", []string{"route", route}, perRoute},
			{"reqlock_lock_lost_total", []string{"route", route}, lost[route]},
			{"reqlock_lock_wait_seconds_count", []string{"result", "acquired", "route", route}, perRoute},
			{"reqlock_lock_wait_seconds_sum", []string{"result", "acquired", "route", route}, perRoute * wait.Seconds()},
			{"reqlock_lock_wait_seconds_bucket", []string{"result", "timeout", "route", route, "le", "0.0025"}, perRoute},
			{"reqlock_lock_wait_seconds_bucket", []string{"result", "timeout", "route", route, "le", "0.001"}, 0},
			{"reqlock_lock_hold_seconds_count", []string{"route", route}, perRoute},
			{"reqlock_lock_hold_seconds_sum", []string{"route", route}, perRoute * hold.Seconds()},
			{"reqlock_lock_hold_seconds_bucket", []string{"route", route, "le", "0.005"}, perRoute},
			{"reqlock_lock_hold_seconds_bucket", []string{"route", route, "le", "0.0025"}, 0},
		} {
			if v, ok := value(fams, c.name, c.labels...); !ok || v != c.want {
				t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, v, ok, c.want)
			}
		}
	}
}

// TestUnknownOutcome: an outcome that package reqlock may add later is a
// failure under its own reason, up to metricdefs.MaxOtherOutcomes of them,
// as in the adapter.
func TestUnknownOutcome(t *testing.T) {
	m := New()
	m.Obtained("GET /a", "quorum", time.Second)
	m.Obtained("GET /a", "quorum", time.Second)
	for i := range metricdefs.MaxOtherOutcomes + 3 {
		m.Obtained("GET /b", reqlock.Outcome(fmt.Sprintf("new%d", i)), 0)
	}
	m.Obtained("GET /b", "", 0)
	_, fams := scrape(t, m)
	if v, _ := value(fams, "reqlock_lock_failure_total", "reason", "quorum", "route", "GET /a"); v != 2 {
		t.Errorf("failure{reason=quorum} = %v, want 2", v)
	}
	if v, _ := value(fams, "reqlock_lock_wait_seconds_sum", "result", "quorum", "route", "GET /a"); v != 2 {
		t.Errorf("wait{result=quorum} sum = %v, want 2", v)
	}
	if v, _ := value(fams, "reqlock_lock_success_total", "route", "GET /a"); v != 0 {
		t.Errorf("success = %v, want 0", v)
	}
	// quorum took one of the slots: new0..new6 get theirs, the rest and
	// the empty outcome share "other".
	reasons := labelValues(fams, "reqlock_lock_failure_total", "reason")
	if len(reasons) != 6+metricdefs.MaxOtherOutcomes+1 || !slices.Contains(reasons, "other") ||
		slices.Contains(reasons, fmt.Sprintf("new%d", metricdefs.MaxOtherOutcomes-1)) {
		t.Errorf("reasons %v: want the 6 known, %d others and \"other\"", reasons, metricdefs.MaxOtherOutcomes)
	}
	if v, _ := value(fams, "reqlock_lock_failure_total", "reason", "other", "route", "GET /b"); v != 5 {
		t.Errorf("failure{route=GET /b,reason=other} = %v, want 5", v)
	}
	if v, _ := value(fams, "reqlock_lock_wait_seconds_count", "result", "other", "route", "GET /b"); v != 5 {
		t.Errorf("wait{route=GET /b,result=other} count = %v, want 5", v)
	}
}

func TestNegativeDuration(t *testing.T) {
	m := New()
	m.Held("GET /a", -time.Second)
	_, fams := scrape(t, m)
	if c, _ := value(fams, "reqlock_lock_hold_seconds_count", "route", "GET /a"); c != 1 {
		t.Errorf("count %v, want 1", c)
	}
	if s, ok := value(fams, "reqlock_lock_hold_seconds_sum", "route", "GET /a"); !ok || s != 0 {
		t.Errorf("sum %v (present %v), want 0", s, ok)
	}
}

// TestFloats: values are formatted as the Prometheus client library
// formats them.
func TestFloats(t *testing.T) {
	for f, want := range map[float64]string{
		0: "0", math.Copysign(0, -1): "0", 1: "1", -1: "-1", 2: "2", 0.5: "0.5",
		0.0005: "0.0005", 0.00001: "1e-05", 0.30000000000000004: "0.30000000000000004",
		123456: "123456", 1e6: "1e+06", 1234567: "1.234567e+06", 1 << 53: "9.007199254740992e+15",
		math.Inf(1): "+Inf", math.Inf(-1): "-Inf",
	} {
		if got := string(appendFloat(nil, f)); got != want {
			t.Errorf("appendFloat(%v) = %s, want %s", f, got, want)
		}
	}
	if got := string(appendFloat(nil, math.NaN())); got != "NaN" {
		t.Errorf("appendFloat(NaN) = %s", got)
	}

	// A counter of a million is written 1e+06, as by the client library.
	m := New()
	for range 1_000_000 {
		m.HandedOff("GET /a")
	}
	if text, _ := scrape(t, m); !strings.Contains(text, "\nreqlock_lock_handoffs_total{route=\"GET /a\"} 1e+06\n") {
		t.Errorf("a million handoffs:\n%s", text)
	}
}

func TestOptions(t *testing.T) {
	m := New(WithNamespace("orders"))
	m.Obtained("GET /a", reqlock.OutcomeAcquired, 0)
	_, fams := scrape(t, m)
	if v, ok := value(fams, "orders_lock_success_total", "route", "GET /a"); !ok || v != 1 {
		t.Fatalf("orders_lock_success_total = %v (present %v), want 1", v, ok)
	}

	m = New(WithNamespace(""))
	m.Obtained("GET /a", reqlock.OutcomeAcquired, 0)
	_, fams = scrape(t, m)
	var names []string
	for _, f := range fams {
		names = append(names, f.name)
	}
	want := []string{"lock_failure_total", "lock_handoffs_total", "lock_lost_total", "lock_success_total", "lock_wait_seconds"}
	if !slices.Equal(names, want) {
		t.Fatalf("empty namespace: families %v, want %v", names, want)
	}

	// Buckets given as +Inf at the end, and one option of two kept.
	m = New(WithBuckets([]float64{1, math.Inf(1)}, nil), WithBuckets(nil, []float64{2}))
	m.Obtained("GET /a", reqlock.OutcomeAcquired, 0)
	m.Held("GET /a", 0)
	_, fams = scrape(t, m)
	if got := labelValues(fams, "reqlock_lock_wait_seconds", "le"); !slices.Equal(got, []string{"+Inf", "1"}) {
		t.Errorf("wait le %v", got)
	}
	if got := labelValues(fams, "reqlock_lock_hold_seconds", "le"); !slices.Equal(got, []string{"+Inf", "2"}) {
		t.Errorf("hold le %v", got)
	}

	// WithBuckets copies its slices.
	b := []float64{1, 2}
	m = New(WithBuckets(b, b))
	b[0] = 5
	m.Held("GET /a", 0)
	if _, fams = scrape(t, m); !slices.Equal(labelValues(fams, "reqlock_lock_hold_seconds", "le"), []string{"+Inf", "1", "2"}) {
		t.Errorf("buckets not copied")
	}
}

func TestInvalidOptions(t *testing.T) {
	for name, opt := range map[string]Option{
		"negative max routes":  WithMaxRoutes(-1),
		"decreasing buckets":   WithBuckets([]float64{1, 0.5}, nil),
		"decreasing hold buck": WithBuckets(nil, []float64{2, 1}),
		"equal buckets":        WithBuckets([]float64{1, 1}, nil),
		"NaN bucket":           WithBuckets([]float64{math.NaN()}, nil),
		"namespace with -":     WithNamespace("my-app"),
		"namespace digit":      WithNamespace("1app"),
		"namespace space":      WithNamespace("a b"),
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("New did not panic")
				}
			}()
			New(opt)
		})
	}
	for _, ns := range []string{"a", "_a1", "a:b", "A_B"} {
		New(WithNamespace(ns))
	}
}

// TestFamilies: the families are in the order of their names, the order
// of the exposition, and counters are the families named _total.
func TestFamilies(t *testing.T) {
	names := []string{metricdefs.NameFailure, metricdefs.NameHandoffs, metricdefs.NameHold, metricdefs.NameLost, metricdefs.NameSuccess, metricdefs.NameWait}
	if !slices.IsSorted(names) {
		t.Errorf("the families are not in the order of their names: %q", names)
	}
	for f, d := range families {
		if d.name != names[f] || d.help == "" || strings.HasSuffix(d.name, "_total") != (d.typ == "counter") {
			t.Errorf("family %d: %+v", f, d)
		}
	}
}

// TestServeHTTP: the handler serves the exposition with its content type.
func TestServeHTTP(t *testing.T) {
	m := New(WithBuckets([]float64{0.01, 0.1, 1}, []float64{0.1, 1}))
	scenario(m)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Errorf("status %d", resp.StatusCode)
	}
	if ContentType != "text/plain; version=0.0.4; charset=utf-8" {
		t.Errorf("ContentType %q", ContentType)
	}
	if ct := resp.Header.Get("Content-Type"); ct != ContentType {
		t.Errorf("Content-Type %q", ct)
	}
	if cl := resp.Header.Get("Content-Length"); cl != strconv.Itoa(len(scenarioText)) {
		t.Errorf("Content-Length %s, want %d", cl, len(scenarioText))
	}
	if string(body) != scenarioText {
		t.Errorf("body:\n%s", body)
	}

	resp, err = http.Head(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != ContentType {
		t.Errorf("HEAD: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}

type failingWriter struct{ n int }

func (w *failingWriter) Write(p []byte) (int, error) {
	return min(len(p), w.n), errors.New("disk full")
}

func TestWriteToError(t *testing.T) {
	m := New()
	m.Lost("GET /a")
	n, err := m.WriteTo(&failingWriter{n: 10})
	if err == nil || n != 10 {
		t.Fatalf("WriteTo = %d, %v; want 10 and the writer's error", n, err)
	}
}

// TestNoAllocation: events of a route already seen, of routes beyond the
// cap, and of an unknown outcome already seen do not allocate.
func TestNoAllocation(t *testing.T) {
	m := New(WithMaxRoutes(1))
	events := func(route string) func() {
		return func() {
			m.Obtained(route, reqlock.OutcomeAcquired, time.Millisecond)
			m.Obtained(route, reqlock.OutcomeTimeout, time.Millisecond)
			m.Obtained(route, "quorum", time.Millisecond)
			m.Held(route, time.Millisecond)
			m.Lost(route)
			m.HandedOff(route)
		}
	}
	for _, route := range []string{"POST /seen", "POST /beyond-the-cap"} {
		f := events(route)
		f() // first sight
		if n := testing.AllocsPerRun(1000, f); n != 0 {
			t.Errorf("%s: %v allocations per run of 6 events, want 0", route, n)
		}
	}
	// Nor do they after a scrape flipped the histograms' counts.
	scrape(t, m)
	if n := testing.AllocsPerRun(1000, events("POST /seen")); n != 0 {
		t.Errorf("after a scrape: %v allocations per run, want 0", n)
	}
}

func BenchmarkObtained(b *testing.B) {
	m := New()
	m.Obtained("POST /x", reqlock.OutcomeAcquired, time.Millisecond)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Obtained("POST /x", reqlock.OutcomeAcquired, time.Millisecond)
		}
	})
}

func BenchmarkWriteTo(b *testing.B) {
	m := New()
	for i := range 100 {
		route := fmt.Sprintf("POST /r%d", i)
		for _, o := range metricdefs.KnownOutcomes() {
			m.Obtained(route, o, time.Millisecond)
		}
		m.Held(route, time.Millisecond)
	}
	b.ReportAllocs()
	for b.Loop() {
		m.WriteTo(io.Discard)
	}
}

// TestOutageFamilies: the store's outages and the pending releases appear
// with their first event, in the order of the names, and count.
func TestOutageFamilies(t *testing.T) {
	if !outageNamesSorted() {
		t.Fatal("the outage families are not in the order of their names")
	}
	m := New()
	scenario(m)
	if text, _ := scrape(t, m); strings.Contains(text, metricdefs.NameStoreDown) {
		t.Fatalf("outage families before any outage event:\n%s", text)
	}
	var om reqlock.OutageMetrics = m
	om.StoreDown()
	om.RejectedStoreDown("POST /a")
	om.RejectedStoreDown("POST /a")
	om.PendingRelease(reqlock.PendingQueued)
	_, fams := scrape(t, m)
	ns := DefaultNamespace + "_"
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{metricdefs.NameStoreDown, nil, 1},
		{metricdefs.NameStoreOutages, nil, 1},
		{metricdefs.NameStoreRejected, []string{"route", "POST /a"}, 2},
		{metricdefs.NamePendingReleases, []string{"event", "queued"}, 1},
		{metricdefs.NamePendingReleases, []string{"event", "released"}, 0},
	} {
		if got, ok := value(fams, ns+c.name, c.labels...); !ok || got != c.want {
			t.Errorf("%s%v = %v (found %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	om.StoreBack(1500*time.Millisecond, 2)
	om.PendingRelease(reqlock.PendingReleased)
	_, fams = scrape(t, m)
	if got, _ := value(fams, ns+metricdefs.NameStoreDown); got != 0 {
		t.Errorf("store down %v after StoreBack", got)
	}
	if got, _ := value(fams, ns+metricdefs.NameStoreDownFor); got != 1.5 {
		t.Errorf("down seconds %v, want 1.5", got)
	}
	if got, _ := value(fams, ns+metricdefs.NamePendingReleases, "event", "released"); got != 1 {
		t.Errorf("released %v, want 1", got)
	}
}
