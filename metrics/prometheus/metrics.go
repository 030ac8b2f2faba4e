package reqlockprom

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/metricdefs"
)

// Metrics reports a reqlock.Locker's events to Prometheus. It implements
// reqlock.Metrics, reqlock.OutageMetrics, reqlock.ModeMetrics,
// reqlock.IdempotencyMetrics and prometheus.Collector; create
// it with New, register it with a prometheus.Registerer and pass it to
// reqlock.WithMetrics. It is safe for concurrent use.
type Metrics struct {
	success  *prometheus.CounterVec   // route
	failure  *prometheus.CounterVec   // route, reason
	wait     *prometheus.HistogramVec // route, result
	hold     *prometheus.HistogramVec // route
	lost     *prometheus.CounterVec   // route
	handoffs *prometheus.CounterVec   // route
	outage   *outage                  // the families of reqlock.OutageMetrics
	modes    *modes                   // the families of reqlock.ModeMetrics
	idem     *idempotency             // the family of reqlock.IdempotencyMetrics

	routes  *metricdefs.Routes[route]
	reasons metricdefs.Reasons // of the outcomes beyond metricdefs.KnownOutcomes
}

// route caches the children of one route label, so that reporting an event
// is a map load and an atomic add.
type route struct {
	name     string
	success  prometheus.Counter
	failure  [metricdefs.NumKnownOutcomes]prometheus.Counter // by metricdefs.OutcomeIndex; [0] is nil
	lost     prometheus.Counter
	handoffs prometheus.Counter
	wait     [metricdefs.NumKnownOutcomes]atomic.Pointer[observer] // by metricdefs.OutcomeIndex; set on first use
	hold     atomic.Pointer[observer]                              // set on first use
	other    metricdefs.OtherOutcomes[otherOutcome]                // outcomes beyond metricdefs.KnownOutcomes

	// downRejected counts lock_store_down_rejected_total; created with
	// the route, it is collected once an outage event came.
	downRejected prometheus.Counter

	modes routeModes                       // the route's series of reqlock.ModeMetrics
	idem  atomic.Pointer[routeIdempotency] // the route's series of reqlock.IdempotencyMetrics; set with its first event
}

type observer struct{ prometheus.Observer }

type otherOutcome struct {
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
	const route, reason, result = metricdefs.LabelRoute, metricdefs.LabelReason, metricdefs.LabelResult
	m := &Metrics{
		success:  counter(metricdefs.NameSuccess, metricdefs.HelpSuccess, route),
		failure:  counter(metricdefs.NameFailure, metricdefs.HelpFailure, route, reason),
		wait:     histogram(metricdefs.NameWait, metricdefs.HelpWait, c.waitBuckets, route, result),
		hold:     histogram(metricdefs.NameHold, metricdefs.HelpHold, c.holdBuckets, route),
		lost:     counter(metricdefs.NameLost, metricdefs.HelpLost, route),
		handoffs: counter(metricdefs.NameHandoffs, metricdefs.HelpHandoffs, route),
		outage:   newOutage(c),
		modes:    newModes(c),
		idem:     newIdempotency(c),
	}
	m.routes = metricdefs.NewRoutes(c.maxRoutes, m.newRoute)
	return m
}

func (m *Metrics) vecs() [6]prometheus.Collector {
	return [...]prometheus.Collector{m.success, m.failure, m.wait, m.hold, m.lost, m.handoffs}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.vecs() {
		c.Describe(ch)
	}
	for _, c := range m.outage.collectors() {
		c.Describe(ch)
	}
	for _, c := range m.modes.collectors() {
		c.Describe(ch)
	}
	m.idem.events.Describe(ch)
}

// Collect implements prometheus.Collector. The families of
// reqlock.OutageMetrics, reqlock.ModeMetrics and reqlock.IdempotencyMetrics
// are collected once the first of their events came.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.vecs() {
		c.Collect(ch)
	}
	if m.outage.Seen() {
		for _, c := range m.outage.collectors() {
			c.Collect(ch)
		}
	}
	if m.modes.seen.Load() {
		for _, c := range m.modes.collectors() {
			c.Collect(ch)
		}
	}
	if m.idem.seen.Load() {
		m.idem.events.Collect(ch)
	}
}

// Obtained implements reqlock.Metrics: it counts a success or a failure by
// reason and observes wait in lock_wait_seconds.
func (m *Metrics) Obtained(label string, outcome reqlock.Outcome, wait time.Duration) {
	r := m.routes.Get(label)
	i := metricdefs.OutcomeIndex(outcome)
	if i < 0 {
		// An outcome package reqlock did not define when this package was
		// written: a failure under its own reason, for the first
		// metricdefs.MaxOtherOutcomes such outcomes, or under reason "other".
		o := r.other.Get(outcome, &m.reasons, func(reason string) *otherOutcome {
			return &otherOutcome{
				failure: m.failure.WithLabelValues(r.name, reason),
				wait:    m.wait.WithLabelValues(r.name, reason),
			}
		})
		o.failure.Inc()
		o.wait.Observe(seconds(wait))
		return
	}
	if i == 0 {
		r.success.Inc()
	} else {
		r.failure[i].Inc()
	}
	o := r.wait[i].Load()
	if o == nil {
		o = &observer{m.wait.WithLabelValues(r.name, string(outcome))}
		r.wait[i].Store(o)
	}
	o.Observe(seconds(wait))
}

// Held implements reqlock.Metrics: it observes held in lock_hold_seconds.
func (m *Metrics) Held(label string, held time.Duration) {
	r := m.routes.Get(label)
	o := r.hold.Load()
	if o == nil {
		o = &observer{m.hold.WithLabelValues(r.name)}
		r.hold.Store(o)
	}
	o.Observe(seconds(held))
}

// Lost implements reqlock.Metrics: it counts lock_lost_total.
func (m *Metrics) Lost(label string) { m.routes.Get(label).lost.Inc() }

// HandedOff implements reqlock.Metrics: it counts lock_handoffs_total.
func (m *Metrics) HandedOff(label string) { m.routes.Get(label).handoffs.Inc() }

// seconds converts d for a histogram; a negative d (a clock step) counts as
// zero rather than lowering the sum.
func seconds(d time.Duration) float64 { return max(d, 0).Seconds() }

// newRoute creates the children of the route label value name: its
// counters, at zero for every reason, so that rate() and increase() see
// its first failure; its histograms are created by their first
// observation.
func (m *Metrics) newRoute(name string) *route {
	r := &route{
		name:     name,
		success:  m.success.WithLabelValues(name),
		lost:     m.lost.WithLabelValues(name),
		handoffs: m.handoffs.WithLabelValues(name),

		downRejected: m.outage.rejected.WithLabelValues(name),
	}
	for i, outcome := range metricdefs.KnownOutcomes() {
		if i > 0 {
			r.failure[i] = m.failure.WithLabelValues(name, string(outcome))
		}
	}
	return r
}
