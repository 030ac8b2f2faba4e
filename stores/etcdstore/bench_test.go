package etcdstore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testservers"
)

// The benchmarks compare reqlock (a Locker over a Store) with the peer,
// etcd's concurrency.Mutex (one session per worker, as its documentation
// asks), on the shared etcd, each sub-benchmark right after the other:
//
//	go test -run '^$' -bench . -benchtime 2s -count 2 ./stores/etcdstore/
const (
	benchWorkers = 50
	benchTTL     = 10 * time.Second
	benchWait    = 30 * time.Second
	benchHold    = time.Millisecond
	spreadKeys   = 1000
)

// benchLock is one way of taking a lock: reqlock's or the peer's.
type benchLock interface {
	// lock takes key for worker w and returns the function that releases
	// it.
	lock(ctx context.Context, w int, key string) (unlock func() error, err error)
}

type reqlockBench struct{ locker *reqlock.Locker }

func (r reqlockBench) lock(ctx context.Context, _ int, key string) (func() error, error) {
	l, err := r.locker.Obtain(ctx, key, benchTTL, benchWait)
	if err != nil {
		return nil, err
	}
	return func() error { return l.Release(context.Background()) }, nil
}

type mutexBench struct{ sessions []*concurrency.Session }

func (m mutexBench) lock(ctx context.Context, w int, key string) (func() error, error) {
	mu := concurrency.NewMutex(m.sessions[w], "/bench-mutex/"+key)
	if err := mu.Lock(ctx); err != nil {
		return nil, err
	}
	return func() error { return mu.Unlock(context.Background()) }, nil
}

// contenders returns reqlock's and the peer's way of locking, in that
// order, on the shared etcd.
func contenders(b *testing.B) []struct {
	name string
	l    benchLock
} {
	b.Helper()
	locker, err := reqlock.New(newStore(b))
	if err != nil {
		b.Fatal(err)
	}
	client := newClient(b, testservers.EtcdEndpoints(b))
	sessions := make([]*concurrency.Session, benchWorkers)
	for i := range sessions {
		if sessions[i], err = concurrency.NewSession(client, concurrency.WithTTL(int(benchTTL/time.Second))); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = sessions[i].Close() })
	}
	return []struct {
		name string
		l    benchLock
	}{{"reqlock", reqlockBench{locker}}, {"etcd-mutex", mutexBench{sessions}}}
}

// tally is what one contender measured over the rounds of a benchmark.
type tally struct {
	done    int64
	elapsed time.Duration
	waits   []time.Duration
	lost    int64
}

// compare runs b.N rounds; each round runs round once for reqlock and once
// for the peer, alternating which goes first, and the benchmark reports
// each one's acquisitions per second, p50 and p99 of the time to acquire
// (and release), lost updates, and the ratios reqlock/peer.
func compare(b *testing.B, round func(b *testing.B, l benchLock, t *tally)) {
	cs := contenders(b)
	tallies := make([]tally, len(cs))
	b.ResetTimer()
	for r := range b.N {
		for j := range cs {
			i := (j + r) % len(cs) // alternate the order
			round(b, cs[i].l, &tallies[i])
		}
	}
	b.StopTimer()
	var rate, p99 [2]float64
	for i, c := range cs {
		t := &tallies[i]
		slices.Sort(t.waits)
		pct := func(p float64) float64 {
			if len(t.waits) == 0 {
				return 0
			}
			return float64(t.waits[int(p*float64(len(t.waits)-1))].Microseconds()) / 1000
		}
		rate[i], p99[i] = float64(t.done)/t.elapsed.Seconds(), pct(0.99)
		b.ReportMetric(rate[i], c.name+"-acq/s")
		b.ReportMetric(pct(0.50), c.name+"-p50-ms")
		b.ReportMetric(p99[i], c.name+"-p99-ms")
		b.ReportMetric(float64(t.lost), c.name+"-lost")
	}
	b.ReportMetric(rate[0]/rate[1], "ratio-acq/s")
	b.ReportMetric(p99[0]/p99[1], "ratio-p99")
}

// Work per round.
const (
	hotPerRound    = 300
	spreadPerRound = 2000
	cyclesPerRound = 1000
)

// BenchmarkHot: 50 workers take turns on one key, holding it 1ms around a
// deliberately non-atomic increment; lost updates count overlaps.
func BenchmarkHot(b *testing.B) {
	compare(b, func(b *testing.B, l benchLock, t *tally) {
		key := fmt.Sprintf("hot-%d", time.Now().UnixNano())
		var counter int64 // deliberately not atomic: the lock guards it
		done := work(b, hotPerRound, t, func(ctx context.Context, w, _ int) error {
			unlock, err := l.lock(ctx, w, key)
			if err != nil {
				return err
			}
			v := counter
			time.Sleep(benchHold)
			counter = v + 1
			return unlock()
		})
		t.lost += done - counter
	})
}

// BenchmarkSpread: 50 workers each lock their own keys among 1000, with no
// hold: uncontended acquire and release.
func BenchmarkSpread(b *testing.B) {
	compare(b, func(b *testing.B, l benchLock, t *tally) {
		prefix := fmt.Sprintf("spread-%d-", time.Now().UnixNano())
		work(b, spreadPerRound, t, func(ctx context.Context, w, i int) error {
			key := fmt.Sprintf("%s%d", prefix, (w+benchWorkers*i)%spreadKeys)
			unlock, err := l.lock(ctx, w, key)
			if err != nil {
				return err
			}
			return unlock()
		})
	})
}

// BenchmarkSequential: 1000 acquire and release cycles of one key, one
// after the other, per round; ms/1000cycles is the wall time of 1000.
func BenchmarkSequential(b *testing.B) {
	var took [2]time.Duration
	var rounds [2]int
	compare(b, func(b *testing.B, l benchLock, t *tally) {
		key := fmt.Sprintf("seq-%d", time.Now().UnixNano())
		ctx := context.Background()
		start := time.Now()
		for range cyclesPerRound {
			t0 := time.Now()
			unlock, err := l.lock(ctx, 0, key)
			if err != nil {
				b.Fatal(err)
			}
			if err := unlock(); err != nil {
				b.Fatal(err)
			}
			t.waits = append(t.waits, time.Since(t0))
		}
		i := 0
		if _, ok := l.(mutexBench); ok {
			i = 1
		}
		took[i] += time.Since(start)
		rounds[i]++
		t.done += cyclesPerRound
		t.elapsed += time.Since(start)
	})
	for i, name := range []string{"reqlock", "etcd-mutex"} {
		b.ReportMetric(float64(took[i].Milliseconds())/float64(rounds[i]), name+"-ms/1000cycles")
	}
}

// work spreads n calls of op over benchWorkers workers (op gets the worker
// and its call's number), adds their times and count to t, and returns
// the count.
func work(b *testing.B, n int64, t *tally, op func(ctx context.Context, w, i int) error) int64 {
	ctx := context.Background()
	var (
		next atomic.Int64
		mu   sync.Mutex
		wg   sync.WaitGroup
		done int64
	)
	start := time.Now()
	for w := range benchWorkers {
		wg.Go(func() {
			var mine []time.Duration
			for i := 0; next.Add(1) <= n; i++ {
				t0 := time.Now()
				if err := op(ctx, w, i); err != nil {
					b.Error(err)
					break
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			t.waits = append(t.waits, mine...)
			done += int64(len(mine))
			mu.Unlock()
		})
	}
	wg.Wait()
	t.elapsed += time.Since(start)
	t.done += done
	return done
}
