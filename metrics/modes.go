package metrics

import (
	"cmp"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/metricdefs"
)

var _ reqlock.ModeMetrics = (*Registry)(nil)

// Holding implements reqlock.ModeMetrics: it adds delta to lock_holders of
// the route and mode; a mode package reqlock did not define when this
// package was written is not counted. A limited mode's first event also
// shows the route's lock_limit_reached_total, at zero.
func (m *Registry) Holding(label string, mode reqlock.HolderMode, delta int) {
	i := metricdefs.ModeIndex(mode)
	if i < 0 {
		return
	}
	r := m.routes.Get(label)
	if i == metricdefs.LimitedIndex {
		seen(&r.limitReached)
	}
	seen(&r.holders[i])
	r.holders[i].Add(int64(delta))
	m.modesSeen.Store(true)
}

// LimitReached implements reqlock.ModeMetrics: it counts
// lock_limit_reached_total.
func (m *Registry) LimitReached(label string) {
	r := m.routes.Get(label)
	seen(&r.limitReached)
	r.limitReached.Add(1)
	m.modesSeen.Store(true)
}

// seen turns the -1 of a series not yet shown to 0.
func seen(v *atomic.Int64) {
	if v.Load() < 0 {
		v.CompareAndSwap(-1, 0)
	}
}

// appendHolders appends lock_holders, whose name falls between
// lock_hold_seconds and lock_limit_reached_total, once a mode event came:
// the series of each mode a route has seen, by mode then route.
func (m *Registry) appendHolders(b []byte, routes []*route) []byte {
	if !m.modesSeen.Load() {
		return b
	}
	type sample struct {
		mode, route string
		v           int64
	}
	var samples []sample
	for _, r := range routes {
		for i := range r.holders {
			if v := r.holders[i].Load(); v >= 0 {
				samples = append(samples, sample{string(metricdefs.Modes[i]), r.name, v})
			}
		}
	}
	if len(samples) == 0 {
		return b
	}
	slices.SortFunc(samples, func(x, y sample) int {
		return cmp.Or(strings.Compare(x.mode, y.mode), strings.Compare(x.route, y.route))
	})
	n := m.name(metricdefs.NameHolders)
	b = appendFamilyHeader(b, n, metricdefs.HelpHolders, "gauge")
	for _, s := range samples {
		b = appendSample(b, n, "", metricdefs.LabelMode, s.mode, s.route, "", float64(s.v))
	}
	return b
}

// appendLimitReached appends lock_limit_reached_total for the routes that
// have seen a limited event.
func (m *Registry) appendLimitReached(b []byte, routes []*route) []byte {
	if !m.modesSeen.Load() {
		return b
	}
	header := false
	n := m.name(metricdefs.NameLimitReached)
	for _, r := range routes {
		v := r.limitReached.Load()
		if v < 0 {
			continue
		}
		if !header {
			b = appendFamilyHeader(b, n, metricdefs.HelpLimitReached, "counter")
			header = true
		}
		b = appendSample(b, n, "", "", "", r.name, "", float64(v))
	}
	return b
}

// name is the full name of the family n.
func (m *Registry) name(n string) string {
	if m.namespace != "" {
		return m.namespace + "_" + n
	}
	return n
}

// appendFamilyHeader appends the HELP and TYPE lines of the family n.
func appendFamilyHeader(b []byte, n, help, typ string) []byte {
	b = append(b, "# HELP "...)
	b = append(b, n...)
	b = append(b, ' ')
	b = appendEscaped(b, help, false)
	b = append(b, "\n# TYPE "...)
	b = append(b, n...)
	b = append(b, ' ')
	b = append(b, typ...)
	return append(b, '\n')
}
