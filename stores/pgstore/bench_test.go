package pgstore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores/pgstore"
)

// The peer is the mechanism of github.com/allisson/go-pglock (and of
// PostgreSQL's own documentation): a session advisory lock, SELECT
// pg_advisory_lock($1) and pg_advisory_unlock($1), on a connection pinned
// to each holder. Neither that module nor cirello.io/pglock can be fetched
// here (the module proxy answers 403), and allisson/go-pglock's Lock is
// nothing but those two statements on a *sql.DB, so the peer runs them
// itself, over pgx, on one dedicated connection per worker: the use that
// library needs to be correct (a pooled *sql.DB may unlock on another
// session than the one that locked).

// Shapes of the comparison, as every store of the project measures them.
const (
	hotWorkers    = 50
	hotHold       = time.Millisecond
	spreadWorkers = 50
	spreadKeys    = 1000
	cycles        = 1000
)

// locker is what a benchmark locks through: reqlock or the peer.
type locker interface {
	// lock takes key for worker and returns the function that releases it.
	lock(ctx context.Context, worker, key int) (unlock func() error, err error)
}

// reqlocker is a reqlock.Locker over a Store.
type reqlocker struct{ l *reqlock.Locker }

func (r reqlocker) lock(ctx context.Context, _, key int) (func() error, error) {
	lock, err := r.l.Obtain(ctx, fmt.Sprint("bench:", key), 10*time.Second, 30*time.Second)
	if err != nil {
		return nil, err
	}
	return func() error { return lock.Release(ctx) }, nil
}

// warmStore returns a Store over a pool of the default size whose
// connections are all open, as the peer's are before the clock starts:
// dialling (and SCRAM authentication) is not what is measured.
func warmStore(b *testing.B) *pgstore.Store {
	ctx := b.Context()
	db := pool(b, testservers.PostgresDSN(b))
	conns := make([]*pgxpool.Conn, db.Config().MaxConns)
	for i := range conns {
		c, err := db.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		conns[i] = c
	}
	for _, c := range conns {
		c.Release()
	}
	s, err := pgstore.New(ctx, db)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// advisory is the peer: one connection per worker.
type advisory struct{ conns []*pgx.Conn }

func newAdvisory(b *testing.B, workers int) advisory {
	dsn := testservers.PostgresDSN(b)
	a := advisory{conns: make([]*pgx.Conn, workers)}
	for i := range a.conns {
		c, err := pgx.Connect(b.Context(), dsn)
		if err != nil {
			b.Fatal(err)
		}
		a.conns[i] = c
		b.Cleanup(func() { _ = c.Close(context.Background()) })
	}
	return a
}

func (a advisory) lock(ctx context.Context, worker, key int) (func() error, error) {
	c := a.conns[worker]
	id := int64(key) + 1<<40 // away from any other user's ids
	if _, err := c.Exec(ctx, `SELECT pg_advisory_lock($1)`, id); err != nil {
		return nil, err
	}
	return func() error {
		var ok bool
		if err := c.QueryRow(ctx, `SELECT pg_advisory_unlock($1)`, id).Scan(&ok); err != nil || !ok {
			return fmt.Errorf("unlock: %v, %v", ok, err)
		}
		return nil
	}, nil
}

// compareRounds is how many times BenchmarkCompare alternates reqlock and
// the peer on each shape.
const compareRounds = 3

// BenchmarkCompare runs each shape for reqlock (a Locker with its defaults
// over a Store whose pool has pgxpool's default max(4, CPUs) connections) and for the peer (one connection per worker), alternating
// them compareRounds times in one run:
//
//	go test -run '^$' -bench Compare -benchtime 1s ./  (in stores/pgstore)
//
// hot: 50 workers on one key, each holding it 1ms and incrementing a
// counter without atomics (lost updates are counted). spread: 50 workers
// over 1000 keys, no hold. cycles: 1000 sequential acquire/release of one
// key by one worker, wall time per 1000.
func BenchmarkCompare(b *testing.B) {
	for _, shape := range []struct {
		name    string
		workers int
		run     func(b *testing.B, l locker, workers int)
	}{
		{"hot", hotWorkers, benchHot},
		{"spread", spreadWorkers, benchSpread},
		{"cycles", 1, benchCycles},
	} {
		for range compareRounds {
			b.Run(shape.name+"/reqlock", func(b *testing.B) {
				shape.run(b, reqlocker{reqlock.MustNew(warmStore(b))}, shape.workers)
			})
			b.Run(shape.name+"/advisory", func(b *testing.B) {
				shape.run(b, newAdvisory(b, shape.workers), shape.workers)
			})
		}
	}
}

// run has workers take b.N locks in all, key(worker, i) each, holding each
// for hold, and reports acquisitions per second, p50 and p99 wait, and lost
// updates of the per-key counters.
func run(b *testing.B, l locker, workers int, hold time.Duration, key func(worker, i int) int) {
	ctx := b.Context()
	counters := make(map[int]*int)
	var countersMu sync.Mutex
	counter := func(k int) *int {
		countersMu.Lock()
		defer countersMu.Unlock()
		if counters[k] == nil {
			counters[k] = new(int)
		}
		return counters[k]
	}
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		waits = make([]time.Duration, 0, b.N)
	)
	b.ResetTimer()
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			var mine []time.Duration
			defer func() { mu.Lock(); waits = append(waits, mine...); mu.Unlock() }()
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				k := key(w, i)
				c := counter(k)
				t0 := time.Now()
				unlock, err := l.lock(ctx, w, k)
				if err != nil {
					b.Errorf("lock: %v", err)
					return
				}
				mine = append(mine, time.Since(t0))
				v := *c
				if hold > 0 {
					time.Sleep(hold) // the work done under the lock
				}
				*c = v + 1
				if err := unlock(); err != nil {
					b.Errorf("unlock: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	total := 0
	for _, c := range counters {
		total += *c
	}
	slices.Sort(waits)
	b.ReportMetric(float64(len(waits))/elapsed.Seconds(), "acq/s")
	b.ReportMetric(ms(percentile(waits, 50)), "p50-ms")
	b.ReportMetric(ms(percentile(waits, 99)), "p99-ms")
	b.ReportMetric(float64(len(waits)-total), "lost")
	b.ReportMetric(0, "ns/op")
}

func benchHot(b *testing.B, l locker, workers int) {
	run(b, l, workers, hotHold, func(int, int) int { return 0 })
}

func benchSpread(b *testing.B, l locker, workers int) {
	run(b, l, workers, 0, func(_, i int) int { return i % spreadKeys })
}

// benchCycles times 1000 sequential acquire/release cycles of one key.
func benchCycles(b *testing.B, l locker, _ int) {
	ctx := b.Context()
	var total time.Duration
	for b.Loop() {
		start := time.Now()
		for range cycles {
			unlock, err := l.lock(ctx, 0, 0)
			if err != nil {
				b.Fatal(err)
			}
			if err := unlock(); err != nil {
				b.Fatal(err)
			}
		}
		total += time.Since(start)
	}
	b.ReportMetric(ms(total/time.Duration(b.N)), "ms/1000cycles")
	b.ReportMetric(0, "ns/op")
}

func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, len(sorted)*p/100)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
