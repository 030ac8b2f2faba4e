package metrics

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/reqlock/reqlock"
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
// counted as reason "other". The Prometheus adapter has the same cap.
const maxOtherResults = 8

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

	maxRoutes int64
	routes    sync.Map     // event label -> *route; at most maxRoutes entries
	nroutes   atomic.Int64 // entries of routes; written under mu
	other     atomic.Pointer[route]

	mu           sync.Mutex                // serialises adding routes and other results
	byName       map[string]*route         // guarded by mu: route label value -> its series
	list         []*route                  // guarded by mu: the values of byName, in order of creation
	otherResults map[reqlock.Result]string // guarded by mu: result -> its reason label

	lastSize atomic.Int64 // bytes of the last exposition, to size the next one's buffer
}

// route holds the series of one route label value. Several event labels
// may share one (the empty label and "unlabeled", say).
type route struct {
	name     string
	success  atomic.Uint64
	failure  [numKnown]atomic.Uint64 // by resultIndex; [0] unused
	lost     atomic.Uint64
	handoffs atomic.Uint64
	wait     [numKnown]atomic.Pointer[histogram] // by resultIndex; set on first use
	hold     atomic.Pointer[histogram]           // set on first use

	otherMu  sync.Mutex
	byResult map[reqlock.Result]*otherSeries // cache of results beyond knownResults
	byReason map[string]*otherSeries         // their series, by reason label
}

// otherSeries are the series of a reason beyond the known results.
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
		waitBounds:   c.waitBuckets,
		holdBounds:   c.holdBuckets,
		waitLe:       leValues(c.waitBuckets),
		holdLe:       leValues(c.holdBuckets),
		maxRoutes:    int64(c.maxRoutes),
		byName:       make(map[string]*route),
		otherResults: make(map[reqlock.Result]string),
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

func leValues(bounds []float64) []string {
	le := make([]string, len(bounds))
	for i, b := range bounds {
		le[i] = string(appendFloat(nil, b))
	}
	return le
}

// Obtained implements reqlock.Metrics: it counts a success or a failure by
// reason and observes wait in lock_wait_seconds.
func (m *Registry) Obtained(label string, result reqlock.Result, wait time.Duration) {
	r := m.route(label)
	i := resultIndex(result)
	if i < 0 {
		m.obtainedOther(r, result, seconds(wait))
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
	loadOrNew(&m.route(label).hold, m.holdBounds).observe(seconds(held))
}

// Lost implements reqlock.Metrics: it counts lock_lost_total.
func (m *Registry) Lost(label string) { m.route(label).lost.Add(1) }

// HandedOff implements reqlock.Metrics: it counts lock_handoffs_total.
func (m *Registry) HandedOff(label string) { m.route(label).handoffs.Add(1) }

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

// route returns the series of label, adding them on first sight, or those
// of OverflowRoute once the cap is reached.
func (m *Registry) route(label string) *route {
	if r, ok := m.routes.Load(label); ok {
		return r.(*route)
	}
	return m.addRoute(label)
}

func (m *Registry) addRoute(label string) *route {
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
			r = m.series(OverflowRoute)
			m.other.Store(r)
		}
		return r
	}
	r := m.series(routeName(label))
	m.routes.Store(label, r)
	m.nroutes.Add(1)
	return r
}

// series returns the route of the label value name, creating it; m.mu is
// held. A new route's counters are exported at once, at zero for every
// reason, so that rate() and increase() see its first failure; its
// histograms appear with their first observation.
func (m *Registry) series(name string) *route {
	if r := m.byName[name]; r != nil {
		return r
	}
	r := &route{name: name}
	m.byName[name] = r
	m.list = append(m.list, r)
	return r
}

// routeName is the label value of an event label: label values must be
// valid UTF-8, and an empty label is reqlock.UnlabeledRoute.
func routeName(label string) string {
	if label == "" {
		return reqlock.UnlabeledRoute
	}
	if !utf8.ValidString(label) {
		return strings.ToValidUTF8(label, "\uFFFD")
	}
	return label
}

// obtainedOther counts a result that package reqlock did not define when
// this package was written: a failure under its own reason, for the first
// maxOtherResults such results, or under reason "other".
func (m *Registry) obtainedOther(r *route, result reqlock.Result, secs float64) {
	r.otherMu.Lock()
	s := r.byResult[result]
	if s == nil {
		reason := m.otherReason(result) // takes m.mu, never held while taking otherMu
		s = r.byReason[reason]
		if s == nil {
			s = &otherSeries{wait: newHistogram(m.waitBounds)}
			if r.byReason == nil {
				r.byReason = make(map[string]*otherSeries)
				r.byResult = make(map[reqlock.Result]*otherSeries)
			}
			r.byReason[reason] = s
		}
		if len(r.byResult) < maxOtherResults+1 {
			r.byResult[result] = s
		}
	}
	r.otherMu.Unlock()
	s.failure.Add(1)
	s.wait.observe(secs)
}

func (m *Registry) otherReason(result reqlock.Result) string {
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
