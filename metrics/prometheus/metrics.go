package reqlockprom

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/reqlock/reqlock"
)

// Label names.
const (
	labelRoute  = "route"
	labelReason = "reason"
	labelResult = "result"
)

// knownResults are the results of package reqlock, in the order of the
// per-route arrays; index 0, acquired, is the only success.
var knownResults = [...]reqlock.Result{
	reqlock.ResultAcquired,
	reqlock.ResultTimeout,
	reqlock.ResultStoreError,
	reqlock.ResultBadKey,
	reqlock.ResultCanceled,
}

const numKnown = len(knownResults)

func resultIndex(r reqlock.Result) int {
	switch r {
	case reqlock.ResultAcquired:
		return 0
	case reqlock.ResultTimeout:
		return 1
	case reqlock.ResultStoreError:
		return 2
	case reqlock.ResultBadKey:
		return 3
	case reqlock.ResultCanceled:
		return 4
	}
	return -1
}

// maxOtherResults caps the distinct results, beyond knownResults, that get
// a reason of their own (results a newer reqlock may add); further ones are
// counted as reason "other".
const maxOtherResults = 8

// Metrics reports a reqlock.Locker's events to Prometheus. It implements
// reqlock.Metrics and prometheus.Collector; create it with New, register it
// with a prometheus.Registerer and pass it to reqlock.WithMetrics. It is
// safe for concurrent use.
type Metrics struct {
	success  *prometheus.CounterVec   // route
	failure  *prometheus.CounterVec   // route, reason
	wait     *prometheus.HistogramVec // route, result
	hold     *prometheus.HistogramVec // route
	lost     *prometheus.CounterVec   // route
	handoffs *prometheus.CounterVec   // route

	maxRoutes int64
	routes    sync.Map     // event label -> *route; at most maxRoutes entries
	nroutes   atomic.Int64 // entries of routes; written under mu
	other     atomic.Pointer[route]
	mu        sync.Mutex // serialises adding routes and other results

	otherResults map[reqlock.Result]string // guarded by mu: result -> its reason label
}

// route caches the children of one route label, so that reporting an event
// is a map load and an atomic add.
type route struct {
	name     string
	success  prometheus.Counter
	failure  [numKnown]prometheus.Counter // by resultIndex; [0] is nil
	lost     prometheus.Counter
	handoffs prometheus.Counter
	wait     [numKnown]atomic.Pointer[observer] // by resultIndex; set on first use
	hold     atomic.Pointer[observer]           // set on first use

	otherMu sync.Mutex
	other   map[reqlock.Result]*otherResult // results beyond knownResults
}

type observer struct{ prometheus.Observer }

type otherResult struct {
	failure prometheus.Counter
	wait    prometheus.Observer
}

var (
	_ reqlock.Metrics      = (*Metrics)(nil)
	_ prometheus.Collector = (*Metrics)(nil)
)

// New returns a Metrics; it panics when an option is invalid (negative
// WithMaxRoutes, buckets not increasing, a const label named route, reason
// or result). Register it before use: reg.MustRegister(m).
func New(opts ...Option) *Metrics {
	c := newConfig(opts)
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: c.namespace, Name: name, Help: help, ConstLabels: c.constLabels,
		}, labels)
	}
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: c.namespace, Name: name, Help: help, ConstLabels: c.constLabels, Buckets: buckets,
		}, labels)
	}
	return &Metrics{
		success: counter("lock_success_total",
			"Lock attempts (calls of Obtain or ObtainAll, reentrant ones included) that acquired the lock, by route.",
			labelRoute),
		failure: counter("lock_failure_total",
			"Lock attempts (calls of Obtain or ObtainAll) that did not acquire the lock, by route and reason: "+
				"timeout (the key stayed held until the wait or the caller's deadline ran out, or a try-once attempt found it held), "+
				"store_error (the store failed or did not answer in time), "+
				"bad_key (no valid key could be derived from the request, or invalid arguments), "+
				"canceled (the caller cancelled while waiting).",
			labelRoute, labelReason),
		wait: histogram("lock_wait_seconds",
			"Seconds a lock attempt took, from the call until it returned, by route and result "+
				"(acquired, or the reason of lock_failure_total).",
			c.waitBuckets, labelRoute, labelResult),
		hold: histogram("lock_hold_seconds",
			"Seconds a lock was held, from acquiring it to releasing it, by route.",
			c.holdBuckets, labelRoute),
		lost: counter("lock_lost_total",
			"Locks whose watchdog found them lost (expired or taken over) while they were held, by route.",
			labelRoute),
		handoffs: counter("lock_handoffs_total",
			"Held grants passed to a waiter of the same process without a store round trip, by route.",
			labelRoute),
		maxRoutes:    int64(c.maxRoutes),
		otherResults: make(map[reqlock.Result]string),
	}
}

func (m *Metrics) vecs() [6]prometheus.Collector {
	return [...]prometheus.Collector{m.success, m.failure, m.wait, m.hold, m.lost, m.handoffs}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.vecs() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.vecs() {
		c.Collect(ch)
	}
}

// Obtained implements reqlock.Metrics: it counts a success or a failure by
// reason and observes wait in lock_wait_seconds.
func (m *Metrics) Obtained(label string, result reqlock.Result, wait time.Duration) {
	r := m.route(label)
	i := resultIndex(result)
	if i < 0 {
		m.obtainedOther(r, result, seconds(wait))
		return
	}
	if i == 0 {
		r.success.Inc()
	} else {
		r.failure[i].Inc()
	}
	o := r.wait[i].Load()
	if o == nil {
		o = &observer{m.wait.WithLabelValues(r.name, string(result))}
		r.wait[i].Store(o)
	}
	o.Observe(seconds(wait))
}

// Held implements reqlock.Metrics: it observes held in lock_hold_seconds.
func (m *Metrics) Held(label string, held time.Duration) {
	r := m.route(label)
	o := r.hold.Load()
	if o == nil {
		o = &observer{m.hold.WithLabelValues(r.name)}
		r.hold.Store(o)
	}
	o.Observe(seconds(held))
}

// Lost implements reqlock.Metrics: it counts lock_lost_total.
func (m *Metrics) Lost(label string) { m.route(label).lost.Inc() }

// HandedOff implements reqlock.Metrics: it counts lock_handoffs_total.
func (m *Metrics) HandedOff(label string) { m.route(label).handoffs.Inc() }

// seconds converts d for a histogram; a negative d (a clock step) counts as
// zero rather than lowering the sum.
func seconds(d time.Duration) float64 { return max(d, 0).Seconds() }

// route returns the cached children of label, adding them on first sight,
// or those of OverflowRoute once the cap is reached.
func (m *Metrics) route(label string) *route {
	if r, ok := m.routes.Load(label); ok {
		return r.(*route)
	}
	return m.addRoute(label)
}

func (m *Metrics) addRoute(label string) *route {
	if m.nroutes.Load() >= m.maxRoutes {
		if r := m.other.Load(); r != nil {
			return r
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.routes.Load(label); ok {
		return r.(*route)
	}
	if m.nroutes.Load() >= m.maxRoutes {
		r := m.other.Load()
		if r == nil {
			r = m.newRoute(OverflowRoute)
			m.other.Store(r)
		}
		return r
	}
	r := m.newRoute(routeName(label))
	m.routes.Store(label, r)
	m.nroutes.Add(1)
	return r
}

// routeName is the label value of an event label: Prometheus label values
// must be valid UTF-8, and an empty label is reqlock.UnlabeledRoute.
func routeName(label string) string {
	if label == "" {
		return reqlock.UnlabeledRoute
	}
	if !utf8.ValidString(label) {
		return strings.ToValidUTF8(label, "\uFFFD")
	}
	return label
}

// newRoute creates the route's counters, at zero for every reason, so that
// rate() and increase() see its first failure; its histograms are created
// by their first observation.
func (m *Metrics) newRoute(name string) *route {
	r := &route{
		name:     name,
		success:  m.success.WithLabelValues(name),
		lost:     m.lost.WithLabelValues(name),
		handoffs: m.handoffs.WithLabelValues(name),
	}
	for i := 1; i < numKnown; i++ {
		r.failure[i] = m.failure.WithLabelValues(name, string(knownResults[i]))
	}
	return r
}

// obtainedOther counts a result that package reqlock did not define when
// this package was written: a failure under its own reason, for the first
// maxOtherResults such results, or under reason "other".
func (m *Metrics) obtainedOther(r *route, result reqlock.Result, secs float64) {
	r.otherMu.Lock()
	o := r.other[result]
	if o == nil {
		reason := m.otherReason(result)
		o = &otherResult{
			failure: m.failure.WithLabelValues(r.name, reason),
			wait:    m.wait.WithLabelValues(r.name, reason),
		}
		if r.other == nil {
			r.other = make(map[reqlock.Result]*otherResult)
		}
		if len(r.other) < maxOtherResults+1 {
			r.other[result] = o
		}
	}
	r.otherMu.Unlock()
	o.failure.Inc()
	o.wait.Observe(secs)
}

func (m *Metrics) otherReason(result reqlock.Result) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if reason, ok := m.otherResults[result]; ok {
		return reason
	}
	if result == "" || !utf8.ValidString(string(result)) || len(m.otherResults) >= maxOtherResults {
		return "other"
	}
	m.otherResults[result] = string(result)
	return string(result)
}
