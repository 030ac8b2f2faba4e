package reqlockprom

import (
	"bytes"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/metrics"
)

// TestSameAsCore feeds the same events to a Metrics and to a Registry of
// the core package github.com/reqlock/reqlock/metrics, with the same
// options, and compares the text exposition promhttp serves for the one
// with what Registry.WriteTo writes for the other, byte for byte: the
// promise that dashboards and alerts work with either.
func TestSameAsCore(t *testing.T) {
	for _, c := range []struct {
		name string
		prom []Option
		core []metrics.Option
	}{
		{name: "defaults"},
		{
			// The buckets of the core package's TestExposition, whose
			// expected text this test thereby extends to the adapter.
			name: "small buckets",
			prom: []Option{WithBuckets([]float64{0.01, 0.1, 1}, []float64{0.1, 1})},
			core: []metrics.Option{metrics.WithBuckets([]float64{0.01, 0.1, 1}, []float64{0.1, 1})},
		},
		{
			name: "namespace, +Inf bucket, cap",
			prom: []Option{WithNamespace("orders"), WithBuckets([]float64{0.001, 1, math.Inf(1)}, []float64{2}), WithMaxRoutes(6)},
			core: []metrics.Option{metrics.WithNamespace("orders"), metrics.WithBuckets([]float64{0.001, 1, math.Inf(1)}, []float64{2}), metrics.WithMaxRoutes(6)},
		},
		{
			name: "no namespace, every route over the cap",
			prom: []Option{WithNamespace(""), WithMaxRoutes(0)},
			core: []metrics.Option{metrics.WithNamespace(""), metrics.WithMaxRoutes(0)},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			pm, cm := New(c.prom...), metrics.New(c.core...)
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(pm)
			sameText(t, "new", reg, cm)

			// An event a newer reqlock may add shows no outage family.
			for _, m := range []reqlock.OutageMetrics{pm, cm} {
				m.PendingRelease("later")
			}
			sameText(t, "unknown pending event", reg, cm)

			// The scenario of the core package's TestExposition first.
			for _, m := range []reqlock.Metrics{pm, cm} {
				scenario(m)
			}
			sameText(t, "scenario", reg, cm)

			for _, m := range []reqlock.Metrics{pm, cm} {
				moreEvents(m)
			}
			sameText(t, "more events", reg, cm)

			// Events after a scrape, and routes seen again.
			for _, m := range []reqlock.Metrics{pm, cm} {
				scenario(m)
				moreEvents(m)
			}
			sameText(t, "again", reg, cm)

			// The outage families, with the routes seen before and new ones.
			for _, m := range []reqlock.OutageMetrics{pm, cm} {
				outageEvents(m)
			}
			sameText(t, "outage", reg, cm)

			for _, m := range []reqlock.Metrics{pm, cm} {
				scenario(m)
				moreEvents(m)
				outageEvents(m.(reqlock.OutageMetrics))
				m.(reqlock.OutageMetrics).StoreDown()
			}
			sameText(t, "second outage, still down", reg, cm)

			for _, m := range []reqlock.ModeMetrics{pm, cm} {
				modeEvents(m)
			}
			sameText(t, "modes", reg, cm)
			for _, m := range []reqlock.ModeMetrics{pm, cm} {
				modeEvents(m)
				m.Holding("GET /reports/{id}", reqlock.HolderShared, -1)
			}
			sameText(t, "modes again", reg, cm)

			for _, m := range []reqlock.IdempotencyMetrics{pm, cm} {
				idempotencyEvents(m)
			}
			sameText(t, "idempotency", reg, cm)
		})
	}
}

// TestSameAsCoreIdempotencyFirst: idempotency events before any other show
// lock_idempotency_total alone, every event's series of a route at once,
// as the core package writes them.
func TestSameAsCoreIdempotencyFirst(t *testing.T) {
	pm, cm := New(), metrics.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(pm)
	for _, m := range []reqlock.IdempotencyMetrics{pm, cm} {
		idempotencyEvents(m)
	}
	sameText(t, "idempotency first", reg, cm)
	text := scrapeText(t, reg)
	for _, want := range []string{
		`reqlock_lock_idempotency_total{event="conflict",route="POST /orders"} 0` + "\n",
		`reqlock_lock_idempotency_total{event="recorded",route="POST /orders"} 1` + "\n",
		`reqlock_lock_idempotency_total{event="replayed",route="POST /orders"} 2` + "\n",
		`reqlock_lock_idempotency_total{event="mismatch",route="POST /pay"} 1` + "\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in:\n%s", want, text)
		}
	}
	if strings.Contains(text, "later") {
		t.Errorf("an event package reqlock does not define was counted:\n%s", text)
	}
}

// idempotencyEvents reports reqlock.IdempotencyMetrics events of two
// routes, and one event package reqlock does not define.
func idempotencyEvents(m reqlock.IdempotencyMetrics) {
	m.Idempotency("POST /orders", reqlock.IdempotencyRecorded)
	m.Idempotency("POST /orders", reqlock.IdempotencyReplayed)
	m.Idempotency("POST /orders", reqlock.IdempotencyReplayed)
	m.Idempotency("POST /pay", reqlock.IdempotencyMismatch)
	m.Idempotency("POST /pay", "later")
}

// TestSameAsCoreModesFirst: mode events before any other show the mode
// families alone, with their routes, as the core package writes them.
func TestSameAsCoreModesFirst(t *testing.T) {
	pm, cm := New(), metrics.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(pm)
	for _, m := range []reqlock.ModeMetrics{pm, cm} {
		modeEvents(m)
	}
	sameText(t, "modes first", reg, cm)
	text := scrapeText(t, reg)
	for _, want := range []string{
		`reqlock_lock_holders{mode="shared",route="GET /reports/{id}"} 2` + "\n",
		`reqlock_lock_holders{mode="limited",route="POST /exports"} 1` + "\n",
		`reqlock_lock_limit_reached_total{route="POST /exports"} 3` + "\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in:\n%s", want, text)
		}
	}
	if strings.Contains(text, `reqlock_lock_limit_reached_total{route="GET /reports/{id}"}`) {
		t.Errorf("a route without a limit has lock_limit_reached_total:\n%s", text)
	}
}

// modeEvents reports every reqlock.ModeMetrics event: holders of each mode
// coming and going, one mode package reqlock does not define, over-limit
// answers of a known and an overflowing route.
func modeEvents(m reqlock.ModeMetrics) {
	for range 3 {
		m.Holding("GET /reports/{id}", reqlock.HolderShared, 1)
	}
	m.Holding("GET /reports/{id}", reqlock.HolderShared, -1)
	m.Holding("POST /reports/{id}/rebuild", reqlock.HolderExclusive, 1)
	m.Holding("POST /reports/{id}/rebuild", reqlock.HolderExclusive, -1)
	m.Holding("POST /exports", reqlock.HolderLimited, 1)
	m.Holding(`POST /a"b`, "later", 1)
	for range 3 {
		m.LimitReached("POST /exports")
	}
	m.LimitReached(OverflowRoute)
}

// TestSameAsCoreOutageFirst: outage events before any route's event show
// the families without routes, then lock_store_down_rejected_total with
// the first rejected route, as the core package writes them.
func TestSameAsCoreOutageFirst(t *testing.T) {
	pm, cm := New(), metrics.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(pm)
	for _, m := range []reqlock.OutageMetrics{pm, cm} {
		m.StoreDown()
	}
	sameText(t, "store down", reg, cm)
	if !strings.Contains(scrapeText(t, reg), "reqlock_lock_store_down 1\n") {
		t.Fatalf("no reqlock_lock_store_down 1 after StoreDown:\n%s", scrapeText(t, reg))
	}
	for _, m := range []reqlock.OutageMetrics{pm, cm} {
		m.RejectedStoreDown("POST /a")
		m.StoreBack(-time.Second, 1) // a clock step adds nothing
	}
	sameText(t, "rejected, back", reg, cm)
}

// outageEvents reports every reqlock.OutageMetrics event: an outage whose
// length is not exact in binary, rejections of known, new, escaped and
// overflowing routes, every pending-release event and one package reqlock
// does not define.
func outageEvents(m reqlock.OutageMetrics) {
	m.StoreDown()
	for i, route := range []string{"POST /x", "GET /new-outage", `POST /a"b`, "GET /\xff", OverflowRoute, ""} {
		for range i + 1 {
			m.RejectedStoreDown(route)
		}
	}
	for i, e := range []reqlock.PendingEvent{
		reqlock.PendingQueued, reqlock.PendingReleased, reqlock.PendingNotHeld,
		reqlock.PendingExpired, reqlock.PendingDropped, reqlock.PendingUnreleased, "later",
	} {
		for range 2*i + 1 {
			m.PendingRelease(e)
		}
	}
	m.StoreBack(1234567891*time.Nanosecond, 21)
	m.StoreDown()
	m.StoreBack(100*time.Millisecond+1, 0) // sums to a float whose text the two must agree on
}

// scrapeText returns the text exposition promhttp serves for g.
func scrapeText(t *testing.T, g prometheus.Gatherer) string {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(g, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Body.String()
}

// Durations whose seconds are exact in binary, so that sums compare exactly.
const (
	d7ms  = 7812500 * time.Nanosecond // 2^-7 s
	d62ms = 62500 * time.Microsecond  // 2^-4 s
	d250  = 250 * time.Millisecond
	d500  = 500 * time.Millisecond
	d2s   = 2 * time.Second
)

// scenario reports a small, fixed set of events: those of the core
// package's TestExposition.
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

// moreEvents reports every kind of event on routes that need escaping, an
// empty and an invalid UTF-8 route label, a route named as the overflow
// route, outcomes package reqlock does not define (more of them than get a
// reason of their own), negative durations and values on bucket bounds.
func moreEvents(m reqlock.Metrics) {
	routes := []string{
		`POST /a"b`, `GET /c\d`, "GET /e\nf", `\"` + "\n", "GET /ünï", "GET /{id},x=y}",
		"", reqlock.UnlabeledRoute, "GET /\xff", "GET /\xfe", OverflowRoute, "DELETE /skus/{id}",
	}
	outcomes := []reqlock.Outcome{
		reqlock.OutcomeAcquired, reqlock.OutcomeTimeout, reqlock.OutcomeStoreError,
		reqlock.OutcomeBadKey, reqlock.OutcomeCanceled, reqlock.OutcomeInvalid, reqlock.OutcomeLost,
	}
	waits := []time.Duration{
		0, -time.Second, 500 * time.Microsecond, time.Millisecond, 3 * time.Millisecond,
		123456789 * time.Nanosecond, time.Second, 10 * time.Second, time.Minute,
	}
	for i, route := range routes {
		for j, outcome := range outcomes {
			if (i+j)%4 != 3 { // not every route sees every outcome
				m.Obtained(route, outcome, waits[(i+j)%len(waits)])
			}
		}
		for k := range i % 3 {
			m.Held(route, waits[(i+k)%len(waits)])
		}
		for range i % 2 {
			m.Lost(route)
		}
		for range i % 4 {
			m.HandedOff(route)
		}
	}
	m.Held("POST /long", 1_000_000*time.Second) // a sum written 1e+06
	m.Obtained("POST /long", reqlock.OutcomeTimeout, 1_234_567*time.Second)
	m.Held("POST /long", time.Hour)

	// Outcomes a newer reqlock may add: the first 8 distinct valid ones get
	// their own reason, the others (and an empty or invalid one) "other".
	m.Obtained("GET /new", "quorum", 2*time.Second)
	m.Obtained("GET /new", "quorum", time.Millisecond)
	m.Obtained("GET /new", "", 0)
	m.Obtained("GET /new", "bad\xff", 0)
	for i := range 12 {
		m.Obtained(routes[i%len(routes)], reqlock.Outcome(fmt.Sprintf("new%d", i)), time.Duration(i)*time.Millisecond)
	}
}

// sameText fails unless the exposition promhttp serves for reg is that of
// reg written by core, byte for byte.
func sameText(t *testing.T, when string, reg prometheus.Gatherer, core *metrics.Registry) {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("%s: promhttp status %d: %s", when, rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, metrics.ContentType) {
		t.Errorf("%s: promhttp Content-Type %q, want the core's %q", when, ct, metrics.ContentType)
	}
	var want bytes.Buffer
	if _, err := core.WriteTo(&want); err != nil {
		t.Fatal(err)
	}
	got := rec.Body.String()
	if got == want.String() {
		return
	}
	gl, wl := strings.Split(got, "\n"), strings.Split(want.String(), "\n")
	for i := range max(len(gl), len(wl)) {
		var g, w string
		if i < len(gl) {
			g = gl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if g != w {
			t.Fatalf("%s: the expositions differ first at line %d:\nadapter: %q\ncore:    %q\nadapter's whole text:\n%s", when, i+1, g, w, got)
		}
	}
}
