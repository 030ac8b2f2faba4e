package metrics

import (
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/metricdefs"
)

// outageState holds the Registry's store and pending-release series. They
// are exported once the first of their events came.
type outageState struct {
	metricdefs.Outage
	pending [len(metricdefs.PendingEvents)]atomic.Uint64
}

var _ reqlock.OutageMetrics = (*Registry)(nil)

// StoreDown implements reqlock.OutageMetrics: it counts
// lock_store_outages_total and sets lock_store_down.
func (m *Registry) StoreDown() { m.outage.StoreDown() }

// StoreBack implements reqlock.OutageMetrics: it clears lock_store_down and
// adds downFor to lock_store_down_seconds_total.
func (m *Registry) StoreBack(downFor time.Duration, _ int64) { m.outage.StoreBack(downFor) }

// RejectedStoreDown implements reqlock.OutageMetrics: it counts
// lock_store_down_rejected_total.
func (m *Registry) RejectedStoreDown(label string) {
	m.routes.Get(label).downRejected.Add(1)
	m.outage.MarkSeen()
}

// PendingRelease implements reqlock.OutageMetrics: it counts
// lock_pending_releases_total by event.
func (m *Registry) PendingRelease(event reqlock.PendingEvent) {
	if i := slices.Index(metricdefs.PendingEvents[:], event); i >= 0 {
		m.outage.pending[i].Add(1)
		m.outage.MarkSeen()
	}
}

// appendOutage appends the outage families, in the order of their names,
// once an outage event came; routes are sorted.
func (m *Registry) appendOutage(b []byte, routes []*route) []byte {
	o := &m.outage
	if !o.Seen() {
		return b
	}
	name, header := m.name, appendFamilyHeader
	plain := func(b []byte, n string, v float64) []byte {
		b = append(b, n...)
		b = append(b, ' ')
		b = appendFloat(b, v)
		return append(b, '\n')
	}
	// In the order of the names: pending releases, store down, down
	// rejected, down seconds, outages.
	n := name(metricdefs.NamePendingReleases)
	b = header(b, n, metricdefs.HelpPendingReleases, "counter")
	for i, e := range metricdefs.PendingEvents {
		b = append(b, n...)
		b = append(b, `{`+metricdefs.LabelEvent+`="`...)
		b = append(b, e...)
		b = append(b, `"} `...)
		b = appendFloat(b, float64(o.pending[i].Load()))
		b = append(b, '\n')
	}
	n = name(metricdefs.NameStoreDown)
	b = header(b, n, metricdefs.HelpStoreDown, "gauge")
	b = plain(b, n, o.Down())
	if len(routes) > 0 {
		n = name(metricdefs.NameStoreRejected)
		b = header(b, n, metricdefs.HelpStoreRejected, "counter")
		for _, r := range routes {
			b = appendSample(b, n, "", "", "", r.name, "", float64(r.downRejected.Load()))
		}
	}
	n = name(metricdefs.NameStoreDownFor)
	b = header(b, n, metricdefs.HelpStoreDownFor, "counter")
	b = plain(b, n, o.DownSeconds())
	n = name(metricdefs.NameStoreOutages)
	b = header(b, n, metricdefs.HelpStoreOutages, "counter")
	return plain(b, n, o.Outages())
}

// outageNamesSorted reports whether the outage families are in the order
// appendOutage writes them (for the tests).
func outageNamesSorted() bool {
	return slices.IsSortedFunc([]string{metricdefs.NamePendingReleases, metricdefs.NameStoreDown,
		metricdefs.NameStoreRejected, metricdefs.NameStoreDownFor, metricdefs.NameStoreOutages}, strings.Compare)
}
