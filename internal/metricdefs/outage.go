package metricdefs

import (
	"sync/atomic"
	"time"
)

// Outage is the store-outage bookkeeping both exporters keep: whether an
// outage event came (its families are exported only then), whether the
// store is down, how many outages began and how long they lasted.
type Outage struct {
	seen      atomic.Bool
	down      atomic.Bool
	outages   atomic.Uint64
	downNanos atomic.Int64
}

// StoreDown counts an outage and marks the store down.
func (o *Outage) StoreDown() {
	o.outages.Add(1)
	o.down.Store(true)
	o.seen.Store(true)
}

// StoreBack marks the store up and adds downFor (negative: nothing, a
// clock step) to the time spent down.
func (o *Outage) StoreBack(downFor time.Duration) {
	o.downNanos.Add(int64(max(downFor, 0)))
	o.down.Store(false)
	o.seen.Store(true)
}

// MarkSeen records that an outage event came.
func (o *Outage) MarkSeen() { o.seen.Store(true) }

// Seen reports whether an outage event came.
func (o *Outage) Seen() bool { return o.seen.Load() }

// Down is 1 while the store is down, else 0.
func (o *Outage) Down() float64 {
	if o.down.Load() {
		return 1
	}
	return 0
}

// Outages is how many outages began.
func (o *Outage) Outages() float64 { return float64(o.outages.Load()) }

// DownSeconds is the time spent down, in seconds.
func (o *Outage) DownSeconds() float64 { return time.Duration(o.downNanos.Load()).Seconds() }
