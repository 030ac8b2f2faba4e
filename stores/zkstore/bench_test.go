package zkstore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores/zkstore"
)

// The benchmarks compare reqlock (a Locker over a Store, plain and in fair
// mode, which hands no grant on locally) with the lock recipe of go-zookeeper (zk.NewLock: ephemeral sequential nodes, each
// waiter watching the one before it) on the same server, in the same run,
// one after the other for each workload:
//
//	cd stores/zkstore && go test -run '^$' -bench . -benchtime 3s .
//
// Each workload runs benchRounds rounds, each round every side in turn, so
// that the sides alternate on a machine whose disk (ZooKeeper syncs every
// write) is not always as fast. Both sides use one ZooKeeper session for
// all their goroutines, as a service process would.

const (
	benchWorkers = 50
	benchHold    = time.Millisecond
	benchTTL     = 10 * time.Second
	benchKeys    = 1000
	benchCycles  = 1000
	benchLease   = 2 * time.Second // of a fair waiter
	benchRounds  = 2
)

// eachSide runs bench for every side, benchRounds times in turn.
func eachSide(b *testing.B, bench func(b *testing.B, l locker)) {
	sides := benchLockers(b)
	for r := range benchRounds {
		for _, l := range sides {
			b.Run(fmt.Sprintf("round=%d/%s", r+1, l.name), func(b *testing.B) { bench(b, l) })
		}
	}
}

// locker is one side of a comparison: lock(key) blocks until key is held
// and returns its unlock.
type locker struct {
	name string
	lock func(b *testing.B, key string) (unlock func())
}

// benchLockers returns reqlock and the peer, each with a session of its own.
func benchLockers(b *testing.B) []locker {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr := testservers.ZooKeeperAddr(b)
	store, err := zkstore.New(ctx, []string{addr}, zkstore.WithRoot(testRoot()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() })
	l, err := reqlock.New(store)
	if err != nil {
		b.Fatal(err)
	}
	fair, err := reqlock.New(store, reqlock.WithFairness(benchLease), reqlock.WithKeyPrefix("fair:"))
	if err != nil {
		b.Fatal(err)
	}
	conn, _, err := zk.Connect([]string{addr}, zkstore.DefaultSessionTimeout, zk.WithLogger(discard{}))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(conn.Close)
	peerRoot := testRoot()
	obtain := func(l *reqlock.Locker) func(b *testing.B, key string) func() {
		return func(b *testing.B, key string) func() {
			lock, err := l.Obtain(context.Background(), key, benchTTL, time.Minute)
			if err != nil {
				b.Fatalf("Obtain: %v", err)
			}
			return func() {
				if err := lock.Release(context.Background()); err != nil {
					b.Errorf("Release: %v", err)
				}
			}
		}
	}
	return []locker{
		{"reqlock", obtain(l)},
		{"reqlock-fair", obtain(fair)},
		{"zk.NewLock", func(b *testing.B, key string) func() {
			lock := zk.NewLock(conn, peerRoot+"/"+key, zk.WorldACL(zk.PermAll))
			if err := lock.Lock(); err != nil {
				b.Fatalf("Lock: %v", err)
			}
			return func() {
				if err := lock.Unlock(); err != nil {
					b.Errorf("Unlock: %v", err)
				}
			}
		}},
	}
}

// reportWaits reports acquisitions per second over elapsed and the p50 and
// p99 of waits.
func reportWaits(b *testing.B, waits []time.Duration, elapsed time.Duration) {
	b.Helper()
	slices.Sort(waits)
	pct := func(p float64) float64 {
		return float64(waits[int(p*float64(len(waits)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(float64(len(waits))/elapsed.Seconds(), "acq/s")
	b.ReportMetric(pct(0.50), "p50-wait-ms")
	b.ReportMetric(pct(0.99), "p99-wait-ms")
	b.ReportMetric(0, "ns/op")
}

// run runs b.N acquisitions from benchWorkers goroutines, the i-th on key
// number key(i) of nkeys, each holding for hold while it increments the
// key's counter with a load and a store (no atomic add: two holders of one
// key at once lose an update), and reports the figures and the lost
// updates.
func run(b *testing.B, l locker, nkeys int, key func(i int) int, hold time.Duration) {
	var (
		next     atomic.Int64
		counters = make([]atomic.Int64, nkeys)
		names    = make([]string, nkeys)
		waits    = make([]time.Duration, b.N)
		wg       sync.WaitGroup
	)
	for k := range names {
		names[k] = fmt.Sprintf("k%d", k)
	}
	b.ResetTimer()
	start := time.Now()
	for range benchWorkers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				k := key(i)
				t0 := time.Now()
				unlock := l.lock(b, names[k])
				waits[i] = time.Since(t0)
				v := counters[k].Load()
				if hold > 0 {
					time.Sleep(hold)
				}
				counters[k].Store(v + 1)
				unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	reportWaits(b, waits, elapsed)
	var sum int64
	for k := range counters {
		sum += counters[k].Load()
	}
	b.ReportMetric(float64(int64(b.N)-sum), "lost-updates")
}

// BenchmarkHot: 50 goroutines take turns on one key, each holding it 1ms.
func BenchmarkHot(b *testing.B) {
	eachSide(b, func(b *testing.B, l locker) {
		run(b, l, 1, func(int) int { return 0 }, benchHold)
	})
}

// BenchmarkSpread: 50 workers lock 1000 keys in turn, the i-th acquisition
// key i mod 1000, so that the ~50 in flight never contend; no hold.
func BenchmarkSpread(b *testing.B) {
	eachSide(b, func(b *testing.B, l locker) {
		run(b, l, benchKeys, func(i int) int { return i % benchKeys }, 0)
	})
}

// BenchmarkCycles: 1000 acquire/release cycles on one key, one after the
// other; an op is the 1000 cycles.
func BenchmarkCycles(b *testing.B) {
	eachSide(b, func(b *testing.B, l locker) {
		for range b.N {
			for range benchCycles {
				l.lock(b, "cycles")()
			}
		}
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/1000-cycles")
	})
}
