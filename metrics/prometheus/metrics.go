package reqlockprom

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/metrics"
)

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

	routes  *metrics.Routes[route]
	reasons metrics.Reasons // of the results beyond metrics.KnownResults
}

// route caches the children of one route label, so that reporting an event
// is a map load and an atomic add.
type route struct {
	name     string
	success  prometheus.Counter
	failure  [metrics.NumKnownResults]prometheus.Counter // by metrics.ResultIndex; [0] is nil
	lost     prometheus.Counter
	handoffs prometheus.Counter
	wait     [metrics.NumKnownResults]atomic.Pointer[observer] // by metrics.ResultIndex; set on first use
	hold     atomic.Pointer[observer]                          // set on first use
	other    metrics.OtherResults[otherResult]                 // results beyond metrics.KnownResults
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
	const route, reason, result = metrics.LabelRoute, metrics.LabelReason, metrics.LabelResult
	m := &Metrics{
		success:  counter(metrics.NameSuccess, metrics.HelpSuccess, route),
		failure:  counter(metrics.NameFailure, metrics.HelpFailure, route, reason),
		wait:     histogram(metrics.NameWait, metrics.HelpWait, c.waitBuckets, route, result),
		hold:     histogram(metrics.NameHold, metrics.HelpHold, c.holdBuckets, route),
		lost:     counter(metrics.NameLost, metrics.HelpLost, route),
		handoffs: counter(metrics.NameHandoffs, metrics.HelpHandoffs, route),
	}
	m.routes = metrics.NewRoutes(c.maxRoutes, m.newRoute)
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
	r := m.routes.Get(label)
	i := metrics.ResultIndex(result)
	if i < 0 {
		// A result package reqlock did not define when this package was
		// written: a failure under its own reason, for the first
		// metrics.MaxOtherResults such results, or under reason "other".
		o := r.other.Get(result, &m.reasons, func(reason string) *otherResult {
			return &otherResult{
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
		o = &observer{m.wait.WithLabelValues(r.name, string(result))}
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
	}
	for i, result := range metrics.KnownResults() {
		if i > 0 {
			r.failure[i] = m.failure.WithLabelValues(name, string(result))
		}
	}
	return r
}
