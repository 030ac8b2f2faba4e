package reqlockprom

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/metricdefs"
)

// outage holds the families of the store's outages and pending releases.
// They are collected once the first of their events came, as the core
// package's Registry writes them.
type outage struct {
	metricdefs.Outage

	downGauge prometheus.GaugeFunc   // lock_store_down
	downFor   prometheus.CounterFunc // lock_store_down_seconds_total
	outagesC  prometheus.CounterFunc // lock_store_outages_total
	rejected  *prometheus.CounterVec // lock_store_down_rejected_total; route
	pendingV  *prometheus.CounterVec // lock_pending_releases_total; event
	pending   [len(metricdefs.PendingEvents)]prometheus.Counter
}

var _ reqlock.OutageMetrics = (*Metrics)(nil)

// newOutage creates the outage families with the options of c.
func newOutage(c config) *outage {
	o := new(outage)
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: c.namespace, Name: name, Help: help, ConstLabels: c.constLabels}
	}
	o.downGauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts(metricdefs.NameStoreDown, metricdefs.HelpStoreDown)),
		o.Down)
	o.downFor = prometheus.NewCounterFunc(prometheus.CounterOpts(opts(metricdefs.NameStoreDownFor, metricdefs.HelpStoreDownFor)),
		o.DownSeconds)
	o.outagesC = prometheus.NewCounterFunc(prometheus.CounterOpts(opts(metricdefs.NameStoreOutages, metricdefs.HelpStoreOutages)),
		o.Outages)
	o.rejected = prometheus.NewCounterVec(prometheus.CounterOpts(opts(metricdefs.NameStoreRejected, metricdefs.HelpStoreRejected)),
		[]string{metricdefs.LabelRoute})
	o.pendingV = prometheus.NewCounterVec(prometheus.CounterOpts(opts(metricdefs.NamePendingReleases, metricdefs.HelpPendingReleases)),
		[]string{metricdefs.LabelEvent})
	for i, e := range metricdefs.PendingEvents {
		o.pending[i] = o.pendingV.WithLabelValues(string(e))
	}
	return o
}

func (o *outage) collectors() [5]prometheus.Collector {
	return [...]prometheus.Collector{o.downGauge, o.downFor, o.outagesC, o.rejected, o.pendingV}
}

// StoreDown implements reqlock.OutageMetrics: it counts
// lock_store_outages_total and sets lock_store_down.
func (m *Metrics) StoreDown() { m.outage.StoreDown() }

// StoreBack implements reqlock.OutageMetrics: it clears lock_store_down and
// adds downFor to lock_store_down_seconds_total.
func (m *Metrics) StoreBack(downFor time.Duration, _ int64) { m.outage.StoreBack(downFor) }

// RejectedStoreDown implements reqlock.OutageMetrics: it counts
// lock_store_down_rejected_total.
func (m *Metrics) RejectedStoreDown(label string) {
	m.routes.Get(label).downRejected.Inc()
	m.outage.MarkSeen()
}

// PendingRelease implements reqlock.OutageMetrics: it counts
// lock_pending_releases_total by event; an event package reqlock did not
// define when this package was written is not counted.
func (m *Metrics) PendingRelease(event reqlock.PendingEvent) {
	if i := slices.Index(metricdefs.PendingEvents[:], event); i >= 0 {
		m.outage.pending[i].Inc()
		m.outage.MarkSeen()
	}
}
