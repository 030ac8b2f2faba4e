package reqlockprom

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/metricdefs"
)

// metricNames are the names of the metrics with the default namespace.
var metricNames = []string{
	DefaultNamespace + "_" + metricdefs.NameSuccess,
	DefaultNamespace + "_" + metricdefs.NameFailure,
	DefaultNamespace + "_" + metricdefs.NameWait,
	DefaultNamespace + "_" + metricdefs.NameHold,
	DefaultNamespace + "_" + metricdefs.NameLost,
	DefaultNamespace + "_" + metricdefs.NameHandoffs,
}

// The whole text exposition is compared, byte for byte, with that of the
// core package's Registry, whose tests pin it, by TestSameAsCore.

// TestValues checks single values of the scenario with ToFloat64 and the
// histograms' sample counts and sums.
func TestValues(t *testing.T) {
	m := New()
	reg := registered(t, m)
	scenario(m)

	for _, c := range []struct {
		name string
		got  prometheus.Collector
		want float64
	}{
		{"success POST /x", m.success.WithLabelValues("POST /x"), 2},
		{"success GET /y", m.success.WithLabelValues("GET /y"), 0},
		{"timeout POST /x", m.failure.WithLabelValues("POST /x", "timeout"), 1},
		{"store_error POST /x", m.failure.WithLabelValues("POST /x", "store_error"), 1},
		{"bad_key POST /x", m.failure.WithLabelValues("POST /x", "bad_key"), 0},
		{"canceled GET /y", m.failure.WithLabelValues("GET /y", "canceled"), 1},
		{"invalid GET /y", m.failure.WithLabelValues("GET /y", "invalid"), 1},
		{"invalid POST /x", m.failure.WithLabelValues("POST /x", "invalid"), 0},
		{"lock_lost POST /x", m.failure.WithLabelValues("POST /x", "lock_lost"), 1},
		{"lock_lost GET /y", m.failure.WithLabelValues("GET /y", "lock_lost"), 0},
		{"lost POST /x", m.lost.WithLabelValues("POST /x"), 1},
		{"handoffs POST /x", m.handoffs.WithLabelValues("POST /x"), 2},
	} {
		if got := testutil.ToFloat64(c.got); got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}

	for _, c := range []struct {
		name   string
		labels map[string]string
		count  uint64
		sum    float64
	}{
		{"reqlock_lock_wait_seconds", map[string]string{"route": "POST /x", "result": "acquired"}, 2, 0.0703125},
		{"reqlock_lock_wait_seconds", map[string]string{"route": "POST /x", "result": "timeout"}, 1, 0.5},
		{"reqlock_lock_wait_seconds", map[string]string{"route": "POST /x", "result": "store_error"}, 1, 2},
		{"reqlock_lock_wait_seconds", map[string]string{"route": "GET /y", "result": "canceled"}, 1, 0.25},
		{"reqlock_lock_wait_seconds", map[string]string{"route": "GET /y", "result": "invalid"}, 1, 0},
		{"reqlock_lock_wait_seconds", map[string]string{"route": "POST /x", "result": "lock_lost"}, 1, 0.0078125},
		{"reqlock_lock_hold_seconds", map[string]string{"route": "POST /x"}, 2, 0.3125},
	} {
		count, sum, ok := histogram(t, reg, c.name, c.labels)
		if !ok || count != c.count || sum != c.sum {
			t.Errorf("%s%v: count %d sum %v (present %v), want count %d sum %v",
				c.name, c.labels, count, sum, ok, c.count, c.sum)
		}
	}

	// Histograms appear with their first observation only.
	for _, c := range []struct {
		name   string
		labels map[string]string
	}{
		{"reqlock_lock_wait_seconds", map[string]string{"route": "GET /y", "result": "acquired"}},
		{"reqlock_lock_wait_seconds", map[string]string{"route": "POST /x", "result": "bad_key"}},
		{"reqlock_lock_hold_seconds", map[string]string{"route": "GET /y"}},
	} {
		if _, _, ok := histogram(t, reg, c.name, c.labels); ok {
			t.Errorf("%s%v exists before its first observation", c.name, c.labels)
		}
	}
}

// TestNoRoutesUntilSeen: a new Metrics exports no series at all, and a
// route's series appear with its first event, whatever the event.
func TestNoRoutesUntilSeen(t *testing.T) {
	m := New()
	if n := testutil.CollectAndCount(m); n != 0 {
		t.Fatalf("new Metrics: %d series, want 0", n)
	}
	m.Lost("DELETE /z")
	for name, want := range map[string]int{
		"reqlock_lock_success_total":  1,
		"reqlock_lock_failure_total":  6, // one per reason
		"reqlock_lock_lost_total":     1,
		"reqlock_lock_handoffs_total": 1,
		"reqlock_lock_wait_seconds":   0,
		"reqlock_lock_hold_seconds":   0,
	} {
		if n := testutil.CollectAndCount(m, name); n != want {
			t.Errorf("%s: %d series, want %d", name, n, want)
		}
	}
	if got := testutil.ToFloat64(m.lost.WithLabelValues("DELETE /z")); got != 1 {
		t.Errorf("lost = %v, want 1", got)
	}
}

func TestMaxRoutes(t *testing.T) {
	m := New(WithMaxRoutes(2))
	reg := registered(t, m)
	for _, route := range []string{"GET /a", "GET /b", "GET /c", "GET /d", "GET /a", "GET /c"} {
		m.Obtained(route, reqlock.OutcomeAcquired, time.Millisecond)
		m.Obtained(route, reqlock.OutcomeTimeout, time.Millisecond)
		m.Held(route, time.Millisecond)
		m.Lost(route)
		m.HandedOff(route)
	}
	for _, name := range metricNames {
		got := labelValues(t, reg, name, "route")
		want := map[string]bool{"GET /a": true, "GET /b": true, OverflowRoute: true}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: routes %v, want %v", name, got, want)
		}
	}
	for route, want := range map[string]float64{"GET /a": 2, "GET /b": 1, OverflowRoute: 3} {
		labels := map[string]string{"route": route}
		if got, _ := counter(t, reg, "reqlock_lock_success_total", labels); got != want {
			t.Errorf("success{route=%q} = %v, want %v", route, got, want)
		}
		if got, _ := counter(t, reg, "reqlock_lock_failure_total",
			map[string]string{"route": route, "reason": "timeout"}); got != want {
			t.Errorf("failure{route=%q,reason=timeout} = %v, want %v", route, got, want)
		}
		for _, name := range []string{"reqlock_lock_lost_total", "reqlock_lock_handoffs_total"} {
			if got, _ := counter(t, reg, name, labels); got != want {
				t.Errorf("%s{route=%q} = %v, want %v", name, route, got, want)
			}
		}
		if count, _, _ := histogram(t, reg, "reqlock_lock_hold_seconds", labels); count != uint64(want) {
			t.Errorf("hold{route=%q} count %d, want %v", route, count, want)
		}
		if count, _, _ := histogram(t, reg, "reqlock_lock_wait_seconds",
			map[string]string{"route": route, "result": "acquired"}); count != uint64(want) {
			t.Errorf("wait{route=%q,result=acquired} count %d, want %v", route, count, want)
		}
	}
}

func TestMaxRoutesZero(t *testing.T) {
	m := New(WithMaxRoutes(0))
	reg := registered(t, m)
	m.Obtained("GET /a", reqlock.OutcomeAcquired, 0)
	m.Obtained("GET /b", reqlock.OutcomeAcquired, 0)
	got := labelValues(t, reg, "reqlock_lock_success_total", "route")
	if len(got) != 1 || !got[OverflowRoute] {
		t.Fatalf("routes %v, want only %q", got, OverflowRoute)
	}
	if v, _ := counter(t, reg, "reqlock_lock_success_total", map[string]string{"route": OverflowRoute}); v != 2 {
		t.Fatalf("success{route=other} = %v, want 2", v)
	}
}

// TestMaxRoutesConcurrent: many goroutines seeing new routes at once never
// exceed the cap, and no event is lost.
func TestMaxRoutesConcurrent(t *testing.T) {
	const maxRoutes, goroutines, routesEach = 10, 32, 20
	m := New(WithMaxRoutes(maxRoutes))
	reg := registered(t, m)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range routesEach {
				m.Obtained(fmt.Sprintf("GET /%d", (g*routesEach+i)%50), reqlock.OutcomeAcquired, 0)
			}
		})
	}
	wg.Wait()
	routes := labelValues(t, reg, "reqlock_lock_success_total", "route")
	if len(routes) != maxRoutes+1 || !routes[OverflowRoute] {
		t.Fatalf("%d routes %v, want %d and %q", len(routes), routes, maxRoutes, OverflowRoute)
	}
	var total float64
	for _, s := range series(t, reg, "reqlock_lock_success_total", nil) {
		total += s.GetCounter().GetValue()
	}
	if total != goroutines*routesEach {
		t.Fatalf("success total %v, want %d", total, goroutines*routesEach)
	}
}

func TestRouteNames(t *testing.T) {
	m := New()
	reg := registered(t, m)
	m.Obtained("", reqlock.OutcomeAcquired, 0)
	m.Obtained("GET /\xff", reqlock.OutcomeAcquired, 0)
	got := labelValues(t, reg, "reqlock_lock_success_total", "route")
	want := map[string]bool{reqlock.UnlabeledRoute: true, "GET /\uFFFD": true}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("routes %v, want %v", got, want)
	}
}

// TestUnknownOutcome: an outcome that package reqlock may add later is a
// failure under its own reason, up to metricdefs.MaxOtherOutcomes of them.
func TestUnknownOutcome(t *testing.T) {
	m := New()
	reg := registered(t, m)
	m.Obtained("GET /a", "quorum", time.Second)
	m.Obtained("GET /a", "quorum", time.Second)
	for i := range metricdefs.MaxOtherOutcomes + 3 {
		m.Obtained("GET /b", reqlock.Outcome(fmt.Sprintf("new%d", i)), 0)
	}
	if v, _ := counter(t, reg, "reqlock_lock_failure_total", map[string]string{"route": "GET /a", "reason": "quorum"}); v != 2 {
		t.Errorf("failure{reason=quorum} = %v, want 2", v)
	}
	if count, sum, _ := histogram(t, reg, "reqlock_lock_wait_seconds",
		map[string]string{"route": "GET /a", "result": "quorum"}); count != 2 || sum != 2 {
		t.Errorf("wait{result=quorum}: count %d sum %v, want 2 and 2", count, sum)
	}
	if v, _ := counter(t, reg, "reqlock_lock_success_total", map[string]string{"route": "GET /a"}); v != 0 {
		t.Errorf("success = %v, want 0", v)
	}
	// quorum took one of the slots: new0..new6 get theirs, the rest share "other".
	reasons := labelValues(t, reg, "reqlock_lock_failure_total", "reason")
	if len(reasons) != 6+metricdefs.MaxOtherOutcomes+1 || !reasons["other"] || reasons[fmt.Sprintf("new%d", metricdefs.MaxOtherOutcomes-1)] {
		t.Errorf("reasons %v: want the 6 known, %d others and \"other\"", reasons, metricdefs.MaxOtherOutcomes)
	}
	if v, _ := counter(t, reg, "reqlock_lock_failure_total", map[string]string{"route": "GET /b", "reason": "other"}); v != 4 {
		t.Errorf("failure{route=GET /b,reason=other} = %v, want 4", v)
	}
}

func TestNegativeDuration(t *testing.T) {
	m := New()
	reg := registered(t, m)
	m.Held("GET /a", -time.Second)
	if count, sum, _ := histogram(t, reg, "reqlock_lock_hold_seconds", nil); count != 1 || sum != 0 {
		t.Fatalf("hold: count %d sum %v, want 1 and 0", count, sum)
	}
}

func TestOptions(t *testing.T) {
	m := New(WithNamespace("orders"), WithConstLabels(prometheus.Labels{"locker": "sku"}))
	reg := registered(t, m)
	m.Obtained("GET /a", reqlock.OutcomeAcquired, 0)
	if v, ok := counter(t, reg, "orders_lock_success_total", map[string]string{"route": "GET /a", "locker": "sku"}); !ok || v != 1 {
		t.Fatalf("orders_lock_success_total{locker=sku} = %v (present %v), want 1", v, ok)
	}

	m = New(WithNamespace(""))
	m.Obtained("GET /a", reqlock.OutcomeAcquired, 0)
	if n := testutil.CollectAndCount(m, "lock_success_total"); n != 1 {
		t.Fatalf("empty namespace: %d series of lock_success_total, want 1", n)
	}

	// Two Metrics told apart by a const label share a registry.
	reg = prometheus.NewPedanticRegistry()
	reg.MustRegister(New(WithConstLabels(prometheus.Labels{"locker": "a"})))
	reg.MustRegister(New(WithConstLabels(prometheus.Labels{"locker": "b"})))
}

func TestInvalidOptions(t *testing.T) {
	for name, opt := range map[string]Option{
		"negative max routes":  WithMaxRoutes(-1),
		"const label route":    WithConstLabels(prometheus.Labels{"route": "x"}),
		"const label reason":   WithConstLabels(prometheus.Labels{"reason": "x"}),
		"decreasing buckets":   WithBuckets([]float64{1, 0.5}, nil),
		"decreasing hold buck": WithBuckets(nil, []float64{2, 1}),
		"equal buckets":        WithBuckets([]float64{1, 1}, nil),
		"NaN bucket":           WithBuckets([]float64{math.NaN()}, nil),
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
}

func TestRegistry(t *testing.T) {
	m := New()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(m); err != nil {
		t.Fatalf("Register: %v", err)
	}
	var already prometheus.AlreadyRegisteredError
	if err := reg.Register(m); err == nil {
		t.Fatal("second Register succeeded")
	} else if !asAlreadyRegistered(err, &already) {
		t.Fatalf("second Register: %v, want AlreadyRegisteredError", err)
	}
	// A second Metrics with the same names and no distinguishing label
	// collides with the first.
	if err := reg.Register(New()); err == nil {
		t.Fatal("registering a second, identical Metrics succeeded")
	}

	scenario(m)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatalf("GatherAndLint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	text := string(body)
	for _, name := range metricNames {
		for _, line := range []string{"# TYPE " + name + " ", "\n" + name} {
			if !strings.Contains(text, line) {
				t.Errorf("promhttp output lacks %q", line)
			}
		}
	}
	for _, line := range []string{
		`reqlock_lock_success_total{route="POST /x"} 2`,
		`reqlock_lock_failure_total{reason="timeout",route="POST /x"} 1`,
		`reqlock_lock_hold_seconds_count{route="POST /x"} 2`,
	} {
		if !strings.Contains(text, line) {
			t.Errorf("promhttp output lacks %q", line)
		}
	}
	if t.Failed() {
		t.Logf("promhttp output:\n%s", text)
	}
}

func asAlreadyRegistered(err error, target *prometheus.AlreadyRegisteredError) bool {
	a, ok := err.(prometheus.AlreadyRegisteredError)
	if ok {
		*target = a
	}
	return ok
}

// TestNoAllocation: events of a route already seen, of routes beyond the
// cap, of an unknown outcome already seen, and the outage events do not
// allocate.
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
			m.StoreDown()
			m.RejectedStoreDown(route)
			m.StoreBack(time.Second, 1)
			m.PendingRelease(reqlock.PendingQueued)
		}
	}
	for _, route := range []string{"POST /seen", "POST /beyond-the-cap"} {
		f := events(route)
		f() // first sight
		if n := testing.AllocsPerRun(1000, f); n != 0 {
			t.Errorf("%s: %v allocations per run of 10 events, want 0", route, n)
		}
	}
}
