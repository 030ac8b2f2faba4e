package adaptertest

import (
	"fmt"
	"maps"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores/memstore"
)

// recordingMetrics is a reqlock.Metrics that counts every event by label.
type recordingMetrics struct {
	mu        sync.Mutex
	obtained  map[string]map[reqlock.Outcome]int
	held      map[string]int
	lost      map[string]int
	handedOff map[string]int
	idem      map[string]map[reqlock.IdempotencyEvent]int
}

func newRecordingMetrics() *recordingMetrics {
	return &recordingMetrics{
		obtained:  map[string]map[reqlock.Outcome]int{},
		held:      map[string]int{},
		lost:      map[string]int{},
		handedOff: map[string]int{},
		idem:      map[string]map[reqlock.IdempotencyEvent]int{},
	}
}

// Idempotency implements reqlock.IdempotencyMetrics.
func (m *recordingMetrics) Idempotency(label string, event reqlock.IdempotencyEvent) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.idem[label] == nil {
		m.idem[label] = map[reqlock.IdempotencyEvent]int{}
	}
	m.idem[label][event]++
}

// idemString renders the idempotency events: "label: event=n ...", labels
// and events sorted, one label a line.
func (m *recordingMetrics) idemString() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var lines []string
	for label, events := range m.idem {
		var parts []string
		for e, n := range events {
			parts = append(parts, fmt.Sprintf("%s=%d", e, n))
		}
		sort.Strings(parts)
		lines = append(lines, label+": "+strings.Join(parts, " "))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func (m *recordingMetrics) Obtained(label string, result reqlock.Outcome, wait time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.obtained[label] == nil {
		m.obtained[label] = map[reqlock.Outcome]int{}
	}
	m.obtained[label][result]++
}

func (m *recordingMetrics) Held(label string, held time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.held[label]++
}

func (m *recordingMetrics) Lost(label string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lost[label]++
}

func (m *recordingMetrics) HandedOff(label string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.handedOff[label]++
}

// obtainedString renders the Obtained counts, sorted: "label: result=n ...; ...".
func (m *recordingMetrics) obtainedString() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return renderObtained(m.obtained)
}

func renderObtained(o map[string]map[reqlock.Outcome]int) string {
	var parts []string
	for label, results := range o {
		var rs []string
		for r, n := range results {
			rs = append(rs, fmt.Sprintf("%s=%d", r, n))
		}
		sort.Strings(rs)
		parts = append(parts, label+": "+strings.Join(rs, " "))
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

func (m *recordingMetrics) heldCounts() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.held)
}

// labels returns every label any event carried.
func (m *recordingMetrics) labels() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	set := map[string]bool{}
	for _, mp := range []map[string]int{m.held, m.lost, m.handedOff} {
		for l := range mp {
			set[l] = true
		}
	}
	for l := range m.obtained {
		set[l] = true
	}
	out := make([]string, 0, len(set))
	for l := range set {
		out = append(out, l)
	}
	sort.Strings(out)
	return out
}

// expectMetrics compares the recorded events with want and held, and fails
// when a label is a raw key.
func expectMetrics(t *testing.T, m *recordingMetrics, want map[string]map[reqlock.Outcome]int, held map[string]int, rawKeys ...string) {
	t.Helper()
	if got, w := m.obtainedString(), renderObtained(want); got != w {
		t.Errorf("Obtained events:\n got %s\nwant %s", got, w)
	}
	if got := m.heldCounts(); !maps.Equal(got, held) {
		t.Errorf("Held events = %v, want %v", got, held)
	}
	for _, l := range m.labels() {
		for _, k := range rawKeys {
			if strings.Contains(l, k) {
				t.Errorf("label %q carries the raw key %q", l, k)
			}
		}
	}
}

// metricsLockers returns a Locker that reports to m and another on the same
// store that reports nowhere, to hold keys without events.
func metricsLockers(m *recordingMetrics) (locker, quiet *reqlock.Locker) {
	store := memstore.New()
	return reqlock.MustNew(store, reqlock.WithMetrics(m)), reqlock.MustNew(store)
}

func (s *suite) testMetricsRoutes(t *testing.T) {
	m := newRecordingMetrics()
	locker, quiet := metricsLockers(m)
	rt := Table(t, locker,
		"POST /items/:id", "key=item:<id> wait=none",
		"POST /carts/{id}", "key=sku:<json:items[*].sku> wait=none",
		"PUT /items/{id}", "key=item:<id> wait=none name=put-item")
	report := reportLock(quiet)
	srv := s.serveRoutes(t, rt,
		Endpoint{Method: http.MethodPost, Path: "/items/{id}", Handler: report},
		Endpoint{Method: http.MethodPost, Path: "/carts/{id}", Handler: report},
		Endpoint{Method: http.MethodPut, Path: "/items/{id}", Handler: report},
		Endpoint{Method: http.MethodGet, Path: "/items/{id}", Handler: report}, // not listed: no events
	)
	expectBody(t, srv, post("/items/1", ""), "item:1")
	expectBody(t, srv, post("/carts/1", cart("a", "b")), "sku:a sku:b")
	s.expectRejection(t, do(srv, post("/carts/1", `{}`)), http.StatusBadRequest, middleware.ReasonBadKey, false)
	expectBody(t, srv, request(http.MethodGet, "/items/1", ""), unlocked)
	release := hold(t, quiet, "item:1")
	s.expectRejection(t, do(srv, post("/items/1", "")), http.StatusLocked, middleware.ReasonTimeout, true)
	s.expectRejection(t, do(srv, request(http.MethodPut, "/items/1", "")), http.StatusLocked, middleware.ReasonTimeout, true)
	release()
	expectBody(t, srv, request(http.MethodPut, "/items/1", ""), "item:1")

	expectMetrics(t, m, map[string]map[reqlock.Outcome]int{
		"POST /items/{id}": {reqlock.OutcomeAcquired: 1, reqlock.OutcomeTimeout: 1},
		"POST /carts/{id}": {reqlock.OutcomeAcquired: 1, reqlock.OutcomeBadKey: 1},
		"put-item":         {reqlock.OutcomeAcquired: 1, reqlock.OutcomeTimeout: 1},
	}, map[string]int{"POST /items/{id}": 1, "POST /carts/{id}": 1, "put-item": 1},
		"item:1", "sku:a", "sku:b")
}

func (s *suite) testMetricsGuards(t *testing.T) {
	m := newRecordingMetrics()
	locker, quiet := metricsLockers(m)
	report := reportLock(quiet)
	plain := s.serve(t, locker, "item:<id>", report, middleware.WithWait(0))
	named := s.serve(t, locker, "item:<id>", report, middleware.WithWait(0), middleware.WithName("deduct"))
	multi := s.serve(t, locker, "a:<id>", report, middleware.WithKeys("b:<json:x>"))

	expectBody(t, plain, post("/items/1", ""), "item:1")
	expectBody(t, named, post("/items/1", ""), "item:1")
	expectBody(t, multi, post("/items/1", `{"x":"q"}`), "a:1 b:q")
	s.expectRejection(t, do(multi, post("/items/1", `{"y":"q"}`)), http.StatusBadRequest, middleware.ReasonBadKey, false)
	release := hold(t, quiet, "item:1")
	s.expectRejection(t, do(plain, post("/items/1", "")), http.StatusLocked, middleware.ReasonTimeout, true)
	s.expectRejection(t, do(named, post("/items/1", "")), http.StatusLocked, middleware.ReasonTimeout, true)
	release()

	expectMetrics(t, m, map[string]map[reqlock.Outcome]int{
		"item:<id>":         {reqlock.OutcomeAcquired: 1, reqlock.OutcomeTimeout: 1},
		"deduct":            {reqlock.OutcomeAcquired: 1, reqlock.OutcomeTimeout: 1},
		"a:<id> b:<json:x>": {reqlock.OutcomeAcquired: 1, reqlock.OutcomeBadKey: 1},
	}, map[string]int{"item:<id>": 1, "deduct": 1, "a:<id> b:<json:x>": 1},
		"item:1", "a:1", "b:q")
}
