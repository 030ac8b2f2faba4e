package reqlockprom

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/metricdefs"
)

// idempotency holds the family of reqlock.IdempotencyMetrics. It is
// collected once the first of its events came, and a route's series of
// every event with its first event, as the core package's Registry writes
// them.
type idempotency struct {
	seen   atomic.Bool
	events *prometheus.CounterVec // lock_idempotency_total; event, route
}

// routeIdempotency is a route's children of the family, created together
// with its first event.
type routeIdempotency [metricdefs.NumIdempotencyEvents]prometheus.Counter

var _ reqlock.IdempotencyMetrics = (*Metrics)(nil)

// newIdempotency creates the family with the options of c.
func newIdempotency(c config) *idempotency {
	return &idempotency{events: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: c.namespace, Name: metricdefs.NameIdempotency, Help: metricdefs.HelpIdempotency, ConstLabels: c.constLabels,
	}, []string{metricdefs.LabelEvent, metricdefs.LabelRoute})}
}

// Idempotency implements reqlock.IdempotencyMetrics: it counts
// lock_idempotency_total of the route and event; an event package reqlock
// did not define when this package was written is not counted. A route's
// first event shows its series of every event, at zero.
func (m *Metrics) Idempotency(label string, event reqlock.IdempotencyEvent) {
	i := metricdefs.IdempotencyIndex(event)
	if i < 0 {
		return
	}
	r := m.routes.Get(label)
	cs := r.idem.Load()
	if cs == nil {
		var created routeIdempotency
		for j, e := range metricdefs.IdempotencyEvents {
			created[j] = m.idem.events.WithLabelValues(string(e), r.name)
		}
		r.idem.CompareAndSwap(nil, &created)
		cs = r.idem.Load()
	}
	cs[i].Inc()
	m.idem.seen.Store(true)
}
