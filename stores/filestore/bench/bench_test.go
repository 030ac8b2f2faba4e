package bench

import (
	"context"
	"flag"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofrs/flock"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores/filestore"
)

// Benchmark shapes, as every store's benchmark has them.
const (
	hotWorkers    = 50               // goroutines on the one hot key
	hotHold       = time.Millisecond // work done under the hot lock
	spreadKeys    = 1000             // keys of the spread benchmark
	spreadWorkers = 50               // goroutines of the spread benchmark
	cycles        = 1000             // sequential acquire/release cycles of one figure
	ttl           = 10 * time.Second // of every lock
	waitLimit     = 30 * time.Second // of every wait
	hotKey        = "sku:hot"        // the hot key
	benchTimeout  = 5 * time.Minute  // of a whole benchmark's context
)

// lockFunc locks key and returns its unlock.
type lockFunc func(ctx context.Context, key string) (unlock func())

// peer is one lock implementation under comparison: open sets it up on dir
// for one benchmark run and returns a maker of each goroutine's lockFunc.
type peer struct {
	name string
	open func(b *testing.B, dir string) (newWorker func() lockFunc)
}

// reqlockPeer is a reqlock.Locker over a filestore.Store, shared by every
// goroutine of a run, as a service shares one.
var reqlockPeer = peer{name: "reqlock", open: func(b *testing.B, dir string) func() lockFunc {
	store, err := filestore.New(dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() })
	locker := reqlock.MustNew(store)
	lock := func(ctx context.Context, key string) func() {
		lock, err := locker.Obtain(ctx, key, ttl, waitLimit)
		if err != nil {
			b.Error(err)
			return func() {}
		}
		return func() {
			if err := lock.Release(ctx); err != nil {
				b.Error(err)
			}
		}
	}
	return func() lockFunc { return lock }
}}

// gofrsPeer is github.com/gofrs/flock: a Flock per goroutine and key (a
// Flock tracks one holder, so goroutines cannot share one), each locking
// with the blocking Lock, the kernel waking its waiters.
var gofrsPeer = peer{name: "gofrs-flock", open: func(b *testing.B, dir string) func() lockFunc {
	return func() lockFunc {
		flocks := make(map[string]*flock.Flock)
		return func(_ context.Context, key string) func() {
			f := flocks[key]
			if f == nil {
				f = flock.New(filepath.Join(dir, key+".lock"))
				flocks[key] = f
			}
			if err := f.Lock(); err != nil {
				b.Error(err)
				return func() {}
			}
			return func() {
				if err := f.Unlock(); err != nil {
					b.Error(err)
				}
			}
		}
	}
}}

// rounds is how many times each benchmark runs every peer, alternating
// them (go test's -count would run one peer's runs in a row).
var rounds = flag.Int("rounds", 1, "runs of each peer per benchmark, alternated")

// peers are the implementations under comparison.
var peers = []peer{reqlockPeer, gofrsPeer}

// eachPeer runs f as a sub-benchmark of b per peer, -rounds times,
// alternating the peers.
func eachPeer(b *testing.B, f func(b *testing.B, p peer)) {
	for range *rounds {
		for _, p := range peers {
			b.Run(p.name, func(b *testing.B) { f(b, p) })
		}
	}
}

// waits collects the wait of every acquisition.
type waits struct {
	mu sync.Mutex
	d  []time.Duration
}

func (w *waits) add(d []time.Duration) {
	w.mu.Lock()
	w.d = append(w.d, d...)
	w.mu.Unlock()
}

// report reports acquisitions per second over elapsed and the p50 and p99
// waits.
func (w *waits) report(b *testing.B, elapsed time.Duration) {
	slices.Sort(w.d)
	if len(w.d) == 0 {
		return
	}
	q := func(p float64) float64 { return float64(w.d[int(p*float64(len(w.d)-1))].Microseconds()) / 1000 }
	b.ReportMetric(float64(len(w.d))/elapsed.Seconds(), "acq/s")
	b.ReportMetric(q(0.50), "p50-wait-ms")
	b.ReportMetric(q(0.99), "p99-wait-ms")
}

// BenchmarkHot: 50 goroutines take turns on one key, each holding it 1ms
// for a deliberately non-atomic increment of a counter; lost-updates
// counts the increments the lock failed to protect.
func BenchmarkHot(b *testing.B) {
	eachPeer(b, func(b *testing.B, p peer) {
		dir := b.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
		defer cancel()
		var (
			counter int // guarded by the lock under test only
			next    atomic.Int64
			all     waits
			wg      sync.WaitGroup
		)
		newWorker := p.open(b, dir)
		workers := make([]lockFunc, hotWorkers)
		for i := range workers {
			workers[i] = newWorker()
		}
		b.ResetTimer()
		start := time.Now()
		for _, lock := range workers {
			wg.Go(func() {
				ctx, cancel := context.WithCancel(ctx) // a context per worker, as per request
				defer cancel()
				var mine []time.Duration
				for next.Add(1) <= int64(b.N) {
					t := time.Now()
					unlock := lock(ctx, hotKey)
					mine = append(mine, time.Since(t))
					v := counter
					time.Sleep(hotHold) // the work under the lock
					counter = v + 1
					unlock()
				}
				all.add(mine)
			})
		}
		wg.Wait()
		elapsed := time.Since(start)
		b.StopTimer()
		all.report(b, elapsed)
		b.ReportMetric(float64(b.N-counter), "lost-updates")
	})
}

// BenchmarkSpread: 50 goroutines lock and unlock 1000 keys, each its own
// share of them, so no two contend: the cost of an uncontended lock.
func BenchmarkSpread(b *testing.B) {
	keys := make([]string, spreadKeys)
	for i := range keys {
		keys[i] = "sku:" + strconv.Itoa(i)
	}
	eachPeer(b, func(b *testing.B, p peer) {
		dir := b.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
		defer cancel()
		var (
			next atomic.Int64
			all  waits
			wg   sync.WaitGroup
		)
		newWorker := p.open(b, dir)
		workers := make([]lockFunc, spreadWorkers)
		for i := range workers {
			workers[i] = newWorker()
		}
		b.ResetTimer()
		start := time.Now()
		for w, lock := range workers {
			wg.Go(func() {
				ctx, cancel := context.WithCancel(ctx) // a context per worker, as per request
				defer cancel()
				var mine []time.Duration
				for i := 0; next.Add(1) <= int64(b.N); i++ {
					key := keys[(w+i*spreadWorkers)%spreadKeys] // worker w's own keys
					t := time.Now()
					unlock := lock(ctx, key)
					mine = append(mine, time.Since(t))
					unlock()
				}
				all.add(mine)
			})
		}
		wg.Wait()
		elapsed := time.Since(start)
		b.StopTimer()
		all.report(b, elapsed)
	})
}

// BenchmarkCycles: 1000 sequential acquire/release cycles of one key by one
// goroutine; the figure is their wall time.
func BenchmarkCycles(b *testing.B) {
	eachPeer(b, func(b *testing.B, p peer) {
		ctx := context.Background()
		lock := p.open(b, b.TempDir())()
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			for range cycles {
				lock(ctx, "sku:1")()
			}
		}
		b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), "ms/1000-cycles")
	})
}
