package reqlockprom

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/metricdefs"
)

// modes holds the families of reqlock.ModeMetrics. They are collected once
// the first of their events came, and a route's series with its first
// event of a mode, as the core package's Registry writes them.
type modes struct {
	seen         atomic.Bool
	holders      *prometheus.GaugeVec   // lock_holders; mode, route
	limitReached *prometheus.CounterVec // lock_limit_reached_total; route
}

// routeModes caches a route's children of the mode families, created with
// the route's first event of each.
type routeModes struct {
	holders      [metricdefs.NumModes]atomic.Pointer[gauge]
	limitReached atomic.Pointer[limitCounter]
}

type gauge struct{ prometheus.Gauge }

type limitCounter struct{ prometheus.Counter }

var _ reqlock.ModeMetrics = (*Metrics)(nil)

// newModes creates the mode families with the options of c.
func newModes(c config) *modes {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: c.namespace, Name: name, Help: help, ConstLabels: c.constLabels}
	}
	return &modes{
		holders: prometheus.NewGaugeVec(prometheus.GaugeOpts(opts(metricdefs.NameHolders, metricdefs.HelpHolders)),
			[]string{metricdefs.LabelMode, metricdefs.LabelRoute}),
		limitReached: prometheus.NewCounterVec(prometheus.CounterOpts(opts(metricdefs.NameLimitReached, metricdefs.HelpLimitReached)),
			[]string{metricdefs.LabelRoute}),
	}
}

func (o *modes) collectors() [2]prometheus.Collector {
	return [...]prometheus.Collector{o.holders, o.limitReached}
}

// Holding implements reqlock.ModeMetrics: it adds delta to lock_holders of
// the route and mode; a mode package reqlock did not define when this
// package was written is not counted. A limited mode's first event also
// shows the route's lock_limit_reached_total, at zero.
func (m *Metrics) Holding(label string, mode reqlock.HolderMode, delta int) {
	i := metricdefs.ModeIndex(mode)
	if i < 0 {
		return
	}
	r := m.routes.Get(label)
	if i == metricdefs.LimitedIndex {
		m.limitReachedOf(r)
	}
	g := r.modes.holders[i].Load()
	if g == nil {
		r.modes.holders[i].CompareAndSwap(nil, &gauge{m.modes.holders.WithLabelValues(string(mode), r.name)})
		g = r.modes.holders[i].Load()
	}
	g.Add(float64(delta))
	m.modes.seen.Store(true)
}

// LimitReached implements reqlock.ModeMetrics: it counts
// lock_limit_reached_total.
func (m *Metrics) LimitReached(label string) {
	m.limitReachedOf(m.routes.Get(label)).Inc()
	m.modes.seen.Store(true)
}

// limitReachedOf returns r's lock_limit_reached_total, creating it.
func (m *Metrics) limitReachedOf(r *route) *limitCounter {
	if c := r.modes.limitReached.Load(); c != nil {
		return c
	}
	r.modes.limitReached.CompareAndSwap(nil, &limitCounter{m.modes.limitReached.WithLabelValues(r.name)})
	return r.modes.limitReached.Load()
}
