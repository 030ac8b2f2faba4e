package metrics

import (
	"math"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
)

// histogram counts observations in buckets with the scheme of the
// Prometheus client library, so that a snapshot taken while observations
// go on is consistent (the buckets add up to the count, and the sum is
// that of the counted observations) without a lock on the request path.
//
// Observations go to the hot one of two sets of counts. A snapshot flips
// hot and cold, waits until the observations that started on the now cold
// set have finished, reads it, adds it into the new hot set and clears it.
type histogram struct {
	bounds []float64 // finite upper bounds, increasing; shared, read only

	// countAndHotIdx: the top bit is the index of the hot counts, the
	// other 63 bits count the observations started.
	countAndHotIdx atomic.Uint64
	snapMu         sync.Mutex // serialises snapshots
	counts         [2]histCounts
}

type histCounts struct {
	count   atomic.Uint64   // observations finished
	sumBits atomic.Uint64   // math.Float64bits of the sum
	buckets []atomic.Uint64 // by bound, not cumulative; beyond the last bound: none
}

func newHistogram(bounds []float64) *histogram {
	h := &histogram{bounds: bounds}
	h.counts[0].buckets = make([]atomic.Uint64, len(bounds))
	h.counts[1].buckets = make([]atomic.Uint64, len(bounds))
	return h
}

// bucket returns the index of the first bound v does not exceed, or
// len(bounds) for the +Inf bucket.
func (h *histogram) bucket(v float64) int {
	b := h.bounds
	if len(b) < 32 {
		for i, bound := range b {
			if v <= bound {
				return i
			}
		}
		return len(b)
	}
	return sort.SearchFloat64s(b, v)
}

// observe counts v, in seconds. It does not allocate.
func (h *histogram) observe(v float64) {
	i := h.bucket(v)
	n := h.countAndHotIdx.Add(1)
	hot := &h.counts[n>>63]
	if i < len(hot.buckets) {
		hot.buckets[i].Add(1)
	}
	addFloat(&hot.sumBits, v)
	hot.count.Add(1) // last: the observation is complete
}

// snapshot stores the cumulative bucket counts into cum, which has
// len(h.bounds) elements, and returns the count and the sum.
func (h *histogram) snapshot(cum []uint64) (count uint64, sum float64) {
	h.snapMu.Lock()
	defer h.snapMu.Unlock()
	n := h.countAndHotIdx.Add(1 << 63) // flip hot and cold
	count = n & (1<<63 - 1)
	hot, cold := &h.counts[n>>63], &h.counts[(^n)>>63]
	for cold.count.Load() != count {
		runtime.Gosched() // an observation on cold is under way
	}
	sum = math.Float64frombits(cold.sumBits.Load())
	var c uint64
	for i := range cold.buckets {
		v := cold.buckets[i].Load()
		c += v
		cum[i] = c
		hot.buckets[i].Add(v)
		cold.buckets[i].Store(0)
	}
	hot.count.Add(count)
	cold.count.Store(0)
	addFloat(&hot.sumBits, sum)
	cold.sumBits.Store(0)
	return count, sum
}

// addFloat adds v to the float64 whose bits *bits holds.
func addFloat(bits *atomic.Uint64, v float64) {
	for {
		old := bits.Load()
		if bits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}
