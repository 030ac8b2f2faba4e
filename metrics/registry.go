package metrics

import (
	"sync/atomic"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/metricdefs"
)

// Registry holds a reqlock.Locker's metrics in process and serves them in
// the Prometheus text exposition format. It implements reqlock.Metrics,
// http.Handler and io.WriterTo; create it with New and pass it to
// reqlock.WithMetrics. It is safe for concurrent use.
type Registry struct {
	names      [numFamilies]string // full metric names, by family
	waitBounds []float64
	holdBounds []float64
	waitLe     []string // the le label values of waitBounds
	holdLe     []string

	routes  *metricdefs.Routes[route]
	reasons metricdefs.Reasons // of the outcomes beyond metricdefs.KnownOutcomes

	lastSize atomic.Int64 // bytes of the last exposition, to size the next one's buffer

	namespace string      // the names' prefix, without its underscore
	outage    outageState // the store's outages and pending releases
	modesSeen atomic.Bool // a reqlock.ModeMetrics event came
	idemSeen  atomic.Bool // a reqlock.IdempotencyMetrics event came
}

// route holds the series of one route label value. Several event labels
// may share one (the empty label and "unlabeled", say). Its counters are
// exported from its creation, at zero for every reason, so that rate()
// and increase() see its first failure; its histograms appear with their
// first observation.
type route struct {
	name         string
	success      atomic.Uint64
	failure      [metricdefs.NumKnownOutcomes]atomic.Uint64 // by metricdefs.OutcomeIndex; [0] unused
	lost         atomic.Uint64
	handoffs     atomic.Uint64
	downRejected atomic.Uint64                                          // refused while the store was counted down
	holders      [metricdefs.NumModes]atomic.Int64                      // by metricdefs.ModeIndex; -1 before the mode's first event
	limitReached atomic.Int64                                           // -1 before the first limited event
	idem         [metricdefs.NumIdempotencyEvents]atomic.Uint64         // by metricdefs.IdempotencyIndex
	idemSeen     atomic.Bool                                            // an idempotency event of the route came
	wait         [metricdefs.NumKnownOutcomes]atomic.Pointer[histogram] // by metricdefs.OutcomeIndex; set on first use
	hold         atomic.Pointer[histogram]                              // set on first use
	other        metricdefs.OtherOutcomes[otherSeries]                  // outcomes beyond metricdefs.KnownOutcomes
}

// otherSeries are the series of a reason beyond the known outcomes.
type otherSeries struct {
	failure atomic.Uint64
	wait    *histogram
}

var _ reqlock.Metrics = (*Registry)(nil)

// New returns an empty Registry; it panics when an option is invalid
// (negative WithMaxRoutes, buckets not increasing strictly, a namespace
// that is not a valid metric name).
func New(opts ...Option) *Registry {
	c := newConfig(opts)
	r := &Registry{
		waitBounds: c.waitBuckets,
		holdBounds: c.holdBuckets,
		waitLe:     leValues(c.waitBuckets),
		holdLe:     leValues(c.holdBuckets),
		routes:     metricdefs.NewRoutes(c.maxRoutes, newRoute),
		namespace:  c.namespace,
	}
	for f, d := range families {
		if c.namespace != "" {
			r.names[f] = c.namespace + "_" + d.name
		} else {
			r.names[f] = d.name
		}
	}
	return r
}

// newRoute returns the series of the route label value name.
func newRoute(name string) *route {
	r := &route{name: name}
	for i := range r.holders {
		r.holders[i].Store(-1)
	}
	r.limitReached.Store(-1)
	return r
}

func leValues(bounds []float64) []string {
	le := make([]string, len(bounds))
	for i, b := range bounds {
		le[i] = string(appendFloat(nil, b))
	}
	return le
}

// Obtained implements reqlock.Metrics: it counts a success or a failure by
// reason and observes wait in lock_wait_seconds.
func (m *Registry) Obtained(label string, outcome reqlock.Outcome, wait time.Duration) {
	r := m.routes.Get(label)
	i := metricdefs.OutcomeIndex(outcome)
	if i < 0 {
		s := r.other.Get(outcome, &m.reasons, func(string) *otherSeries {
			return &otherSeries{wait: newHistogram(m.waitBounds)}
		})
		s.failure.Add(1)
		s.wait.observe(seconds(wait))
		return
	}
	if i == 0 {
		r.success.Add(1)
	} else {
		r.failure[i].Add(1)
	}
	loadOrNew(&r.wait[i], m.waitBounds).observe(seconds(wait))
}

// Held implements reqlock.Metrics: it observes held in lock_hold_seconds.
func (m *Registry) Held(label string, held time.Duration) {
	loadOrNew(&m.routes.Get(label).hold, m.holdBounds).observe(seconds(held))
}

// Lost implements reqlock.Metrics: it counts lock_lost_total.
func (m *Registry) Lost(label string) { m.routes.Get(label).lost.Add(1) }

// HandedOff implements reqlock.Metrics: it counts lock_handoffs_total.
func (m *Registry) HandedOff(label string) { m.routes.Get(label).handoffs.Add(1) }

// seconds converts d for a histogram; a negative d (a clock step) counts as
// zero rather than lowering the sum.
func seconds(d time.Duration) float64 { return max(d, 0).Seconds() }

// loadOrNew returns the histogram p points to, creating it on first use.
func loadOrNew(p *atomic.Pointer[histogram], bounds []float64) *histogram {
	if h := p.Load(); h != nil {
		return h
	}
	p.CompareAndSwap(nil, newHistogram(bounds))
	return p.Load()
}
