// Package storebench is the benchmark harness every store module shares: the
// workloads by which a store, through a reqlock.Locker, is compared with its
// usual Go peer (hot key, spread keys, sequential acquire/release cycles),
// each with a lost-update check on a counter the lock alone guards.
//
// A store's benchmark builds its Sides (Reqlock over a stores.Store factory,
// and the peer's own Lock) and runs a Workload for them with Compare:
//
//	func BenchmarkHot(b *testing.B) {
//		storebench.Compare(b, storebench.Hot, 3, storebench.Reqlock("reqlock", newStore), peer)
//	}
//
// Compare opens every side once, warms it up, then runs the sides as
// sub-benchmarks named by side, rounds times, alternated, so that the sides
// share the machine's load alike. A run takes b.N locks in all and reports
// acq/s, p50-wait-ms and p99-wait-ms (the time to obtain), lost-updates
// (holders that overlapped: each increments the key's counter by a load
// and a store around the hold) and, for one worker, ms/1000cycles.
package storebench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores"
)

// Lock takes key for worker (0 ≤ worker < the workers its Side was opened
// for) and returns the function that releases it.
type Lock func(ctx context.Context, worker int, key string) (unlock func() error, err error)

// Side is one lock implementation under comparison.
type Side struct {
	// Name names the side's sub-benchmarks and its keys.
	Name string
	// Open sets the side up for runs of up to workers goroutines (a
	// connection or session per worker, say), with cleanups on b.
	Open func(b *testing.B, workers int) Lock
}

// TTL and Wait are what Reqlock's Obtain asks: neither is reached in a
// benchmark that works.
const (
	TTL  = 10 * time.Second
	Wait = 30 * time.Second
)

// Reqlock returns the side name: a reqlock.Locker with opts over the store
// newStore returns (once per Compare), shared by every worker as a service
// shares one.
func Reqlock(name string, newStore func(b *testing.B) stores.Store, opts ...reqlock.Option) Side {
	return Side{Name: name, Open: func(b *testing.B, _ int) Lock {
		l, err := reqlock.New(newStore(b), opts...)
		if err != nil {
			b.Fatalf("storebench: reqlock.New: %v", err)
		}
		return func(ctx context.Context, _ int, key string) (func() error, error) {
			lock, err := l.Obtain(ctx, key, TTL, Wait)
			if err != nil {
				return nil, err
			}
			return func() error { return lock.Release(context.WithoutCancel(ctx)) }, nil
		}
	}}
}

// Workload is a shape of load: Workers goroutines take b.N locks in all,
// worker w's i-th on key (w + i*Workers) mod Keys (so that with Keys a
// multiple of Workers no two workers contend), each held for Hold.
type Workload struct {
	Name    string
	Workers int
	Keys    int
	Hold    time.Duration
}

// The workloads every store measures.
var (
	// Hot: 50 goroutines take turns on one key, holding it 1ms.
	Hot = Workload{Name: "hot", Workers: 50, Keys: 1, Hold: time.Millisecond}
	// Spread: 50 goroutines on 1000 keys, each on its own, no hold: the
	// cost of an uncontended lock under concurrency.
	Spread = Workload{Name: "spread", Workers: 50, Keys: 1000}
	// Cycles: one goroutine acquires and releases one key in turn.
	Cycles = Workload{Name: "cycles", Workers: 1, Keys: 1}
)

// Workloads returns Hot, Spread and Cycles.
func Workloads() []Workload { return []Workload{Hot, Spread, Cycles} }

// warmUps is how many keys each worker obtains and releases before the
// first run of a side, to open its connections and prepare its statements
// as in a service that has been running.
const warmUps = 4

// Compare runs w for every side as sub-benchmarks of b named by the side,
// rounds times, alternating the sides, after opening and warming up each.
func Compare(b *testing.B, w Workload, rounds int, sides ...Side) {
	b.Helper()
	locks := make([]Lock, len(sides))
	for i, s := range sides {
		locks[i] = s.Open(b, w.Workers)
		warmUp(b, locks[i], w.Workers, keyPrefix(s.Name, "warm-up"))
	}
	for range max(rounds, 1) {
		for i, s := range sides {
			b.Run(s.Name, func(b *testing.B) { Run(b, w, locks[i], keyPrefix(s.Name, w.Name)) })
		}
	}
}

// keyPrefix returns a prefix no earlier run used.
func keyPrefix(side, what string) string {
	return fmt.Sprintf("bench:%s:%s:%d:", side, what, time.Now().UnixNano())
}

// warmUp has workers goroutines obtain and release warmUps keys each.
func warmUp(b *testing.B, lock Lock, workers int, prefix string) {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for n := range warmUps {
				unlock, err := lock(b.Context(), w, fmt.Sprintf("%sw%d-%d", prefix, w, n))
				if err == nil {
					err = unlock()
				}
				if err != nil {
					b.Errorf("storebench: warm-up: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// Run runs w once on lock, b.N locks in all, on keys that start with prefix,
// and reports its figures (see the package documentation). A lock or unlock
// error fails b and stops its worker.
func Run(b *testing.B, w Workload, lock Lock, prefix string) {
	b.Helper()
	ctx := b.Context()
	keys := make([]string, w.Keys)
	for k := range keys {
		keys[k] = fmt.Sprintf("%sk%d", prefix, k)
	}
	var (
		next     atomic.Int64
		granted  atomic.Int64
		counters = make([]atomic.Int64, w.Keys)
		mu       sync.Mutex
		waits    = make([]time.Duration, 0, b.N)
		wg       sync.WaitGroup
	)
	b.ResetTimer()
	start := time.Now()
	for worker := range w.Workers {
		wg.Go(func() {
			var mine []time.Duration
			defer func() { mu.Lock(); waits = append(waits, mine...); mu.Unlock() }()
			for i := 0; next.Add(1) <= int64(b.N); i++ {
				k := (worker + i*w.Workers) % w.Keys
				t0 := time.Now()
				unlock, err := lock(ctx, worker, keys[k])
				if err != nil {
					b.Errorf("storebench: lock: %v", err)
					return
				}
				mine = append(mine, time.Since(t0))
				granted.Add(1)
				v := counters[k].Load() // a load and a store: overlapping holders lose one
				if w.Hold > 0 {
					time.Sleep(w.Hold) // the work done under the lock
				}
				counters[k].Store(v + 1)
				if err := unlock(); err != nil {
					b.Errorf("storebench: unlock: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	var total int64
	for k := range counters {
		total += counters[k].Load()
	}
	report(b, waits, elapsed)
	b.ReportMetric(float64(granted.Load()-total), "lost-updates")
	if w.Workers == 1 && len(waits) > 0 {
		b.ReportMetric(float64(elapsed)/float64(time.Millisecond)*1000/float64(len(waits)), "ms/1000cycles")
	}
}

// report reports acquisitions per second over elapsed and the p50 and p99
// of waits.
func report(b *testing.B, waits []time.Duration, elapsed time.Duration) {
	if len(waits) == 0 {
		return
	}
	slices.Sort(waits)
	pct := func(p float64) float64 {
		return float64(waits[int(p*float64(len(waits)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(float64(len(waits))/elapsed.Seconds(), "acq/s")
	b.ReportMetric(pct(0.50), "p50-wait-ms")
	b.ReportMetric(pct(0.99), "p99-wait-ms")
}
