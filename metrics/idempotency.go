package metrics

import (
	"cmp"
	"slices"
	"strings"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/metricdefs"
)

var _ reqlock.IdempotencyMetrics = (*Registry)(nil)

// Idempotency implements reqlock.IdempotencyMetrics: it counts
// lock_idempotency_total of the route and event; an event package reqlock
// did not define when this package was written is not counted. A route's
// first event shows its series of every event, at zero.
func (m *Registry) Idempotency(label string, event reqlock.IdempotencyEvent) {
	i := metricdefs.IdempotencyIndex(event)
	if i < 0 {
		return
	}
	r := m.routes.Get(label)
	r.idemSeen.Store(true)
	r.idem[i].Add(1)
	m.idemSeen.Store(true)
}

// appendIdempotency appends lock_idempotency_total, whose name falls
// between lock_holders and lock_limit_reached_total, for the routes that
// have seen an idempotency event: by event, then route.
func (m *Registry) appendIdempotency(b []byte, routes []*route) []byte {
	if !m.idemSeen.Load() {
		return b
	}
	var samples []counterSample
	for _, r := range routes {
		if !r.idemSeen.Load() {
			continue
		}
		for i, e := range metricdefs.IdempotencyEvents {
			samples = append(samples, counterSample{string(e), r.name, r.idem[i].Load()})
		}
	}
	if len(samples) == 0 {
		return b
	}
	slices.SortFunc(samples, func(x, y counterSample) int {
		return cmp.Or(strings.Compare(x.first, y.first), strings.Compare(x.route, y.route))
	})
	n := m.name(metricdefs.NameIdempotency)
	b = appendFamilyHeader(b, n, metricdefs.HelpIdempotency, "counter")
	for _, s := range samples {
		b = appendSample(b, n, "", metricdefs.LabelEvent, s.first, s.route, "", float64(s.value))
	}
	return b
}
