// Package hotshare measures how Lockers that stand for separate processes
// share one hot key: each Locker runs workers that obtain the key, work
// under it for a while and release it, over and over, for a fixed time, and
// the package counts each Locker's grants. A store that cannot tell other
// processes' waiters of a release (a polling store) starves all but one
// process unless the Locker yields the key long enough for them; the tests
// of the root package and of the stores' modules check the smaller share
// with it (issue 18, defect 21).
package hotshare

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
)

// Config is one measurement.
type Config struct {
	Key      string        // the hot key
	Workers  int           // concurrent requests per Locker
	Hold     time.Duration // the work under the lock
	TTL      time.Duration // of every lock
	Wait     time.Duration // of every request; a request that waits it out counts as a timeout
	Duration time.Duration // of the whole run
}

// Result is what each Locker got.
type Result struct {
	Grants   []int64 // per Locker
	Timeouts []int64 // per Locker: requests that waited Config.Wait in vain
	Handoffs []int64 // per Locker: grants passed on locally (Metrics.HandedOff)
	// MaxGaps is, per Locker, the longest time it went without a grant:
	// from the start to its first, between two, or from its last to the
	// end. A starved Locker's is about the whole run.
	MaxGaps []time.Duration
	Elapsed time.Duration
}

// MinShare returns the smallest Locker's share of the grants, 0 to 1; 0
// when nothing was granted.
func (r Result) MinShare() float64 {
	var total int64
	for _, g := range r.Grants {
		total += g
	}
	if total == 0 {
		return 0
	}
	return float64(slices.Min(r.Grants)) / float64(total)
}

// GrantsPerSecond returns the grants of every Locker together per second.
func (r Result) GrantsPerSecond() float64 {
	var total int64
	for _, g := range r.Grants {
		total += g
	}
	return float64(total) / r.Elapsed.Seconds()
}

// HandoffsPerSecond returns the local handoffs of every Locker together per
// second.
func (r Result) HandoffsPerSecond() float64 {
	var total int64
	for _, h := range r.Handoffs {
		total += h
	}
	return float64(total) / r.Elapsed.Seconds()
}

// String sums r up on one line.
func (r Result) String() string {
	var shares []string
	var total int64
	for _, g := range r.Grants {
		total += g
	}
	for _, g := range r.Grants {
		shares = append(shares, fmt.Sprintf("%.0f%%", 100*float64(g)/float64(max(total, 1))))
	}
	return fmt.Sprintf("grants %v (shares %s, smallest %.1f%%), longest without a grant %v, timeouts %v, %.0f grants/s, %.0f handoffs/s",
		r.Grants, strings.Join(shares, "/"), 100*r.MinShare(), r.MaxGaps, r.Timeouts, r.GrantsPerSecond(), r.HandoffsPerSecond())
}

// Options returns the options Run needs on each Locker it measures, the
// i-th of n: a Metrics that counts its handoffs. Give them to reqlock.New
// with the store of that Locker.
func Options(counters *Counters, i int) []reqlock.Option {
	return []reqlock.Option{reqlock.WithMetrics(&counters.handoffs[i])}
}

// Counters holds the handoff counters of n Lockers; see Options.
type Counters struct{ handoffs []handoffCounter }

// NewCounters returns the counters of n Lockers.
func NewCounters(n int) *Counters { return &Counters{handoffs: make([]handoffCounter, n)} }

// handoffCounter is a reqlock.Metrics that counts handoffs only.
type handoffCounter struct{ n atomic.Int64 }

func (*handoffCounter) Obtained(string, reqlock.Outcome, time.Duration) {}
func (*handoffCounter) Held(string, time.Duration)                      {}
func (*handoffCounter) Lost(string)                                     {}
func (c *handoffCounter) HandedOff(string)                              { c.n.Add(1) }

// Run runs cfg on lockers, whose handoffs counters (nil for none) count,
// and returns what each got. Every error other than a timeout fails t.
func Run(t testing.TB, lockers []*reqlock.Locker, counters *Counters, cfg Config) Result {
	t.Helper()
	r := Result{
		Grants:   make([]int64, len(lockers)),
		Timeouts: make([]int64, len(lockers)),
		Handoffs: make([]int64, len(lockers)),
	}
	grants := make([]atomic.Int64, len(lockers))
	gaps := make([]gapTracker, len(lockers))
	timeouts := make([]atomic.Int64, len(lockers))
	var before []int64
	if counters != nil {
		for i := range lockers {
			before = append(before, counters.handoffs[i].n.Load())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration)
	defer cancel()
	errs := make(chan error, len(lockers)*cfg.Workers)
	start := time.Now()
	for i := range gaps {
		gaps[i].last = start
	}
	var wg sync.WaitGroup
	for i, l := range lockers {
		for range cfg.Workers {
			wg.Go(func() {
				for ctx.Err() == nil {
					lock, err := l.Obtain(context.Background(), cfg.Key, cfg.TTL, cfg.Wait)
					switch {
					case errors.Is(err, reqlock.ErrWaitEnded) && errors.Is(err, reqlock.ErrHeld):
						timeouts[i].Add(1)
						continue
					case err != nil:
						errs <- fmt.Errorf("locker %d: Obtain: %w", i, err)
						return
					}
					if ctx.Err() == nil {
						grants[i].Add(1)
						gaps[i].grant(time.Now())
					}
					time.Sleep(cfg.Hold) // the work under the lock
					if err := lock.Release(context.Background()); err != nil {
						errs <- fmt.Errorf("locker %d: Release: %w", i, err)
						return
					}
				}
			})
		}
	}
	<-ctx.Done()
	end := time.Now()
	r.Elapsed = end.Sub(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range lockers {
		r.Grants[i] = grants[i].Load()
		r.Timeouts[i] = timeouts[i].Load()
		r.MaxGaps = append(r.MaxGaps, gaps[i].grant(end).Round(time.Millisecond))
		if counters != nil {
			r.Handoffs[i] = counters.handoffs[i].n.Load() - before[i]
		}
	}
	return r
}

// MaxGap returns the longest of r.MaxGaps.
func (r Result) MaxGap() time.Duration { return slices.Max(r.MaxGaps) }

// gapTracker tracks the longest time between one Locker's grants.
type gapTracker struct {
	mu      sync.Mutex
	last    time.Time
	longest time.Duration
}

// grant records a grant at now and returns the longest gap so far.
func (g *gapTracker) grant(now time.Time) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if now.After(g.last) {
		g.longest = max(g.longest, now.Sub(g.last))
		g.last = now
	}
	return g.longest
}
