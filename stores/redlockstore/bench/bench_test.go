package bench_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores/redlockstore"
)

func TestMain(m *testing.M) { os.Exit(testservers.Main(m)) }

const (
	workers  = 50
	hotHold  = time.Millisecond
	spreadN  = 1000
	lockTTL  = 5 * time.Second
	lockWait = 10 * time.Second
)

// locker is one library's lock call: it returns the unlock function.
type locker interface {
	lock(ctx context.Context, key string) (unlock func() error, err error)
}

type reqlockLocker struct{ l *reqlock.Locker }

func (r reqlockLocker) lock(ctx context.Context, key string) (func() error, error) {
	lock, err := r.l.Obtain(ctx, key, lockTTL, lockWait)
	if err != nil {
		return nil, err
	}
	return func() error { return lock.Release(context.Background()) }, nil
}

type redsyncLocker struct{ rs *redsync.Redsync }

func (r redsyncLocker) lock(ctx context.Context, key string) (func() error, error) {
	// A Mutex keeps the value of its last lock: one per acquisition.
	m := r.rs.NewMutex(key, redsync.WithExpiry(lockTTL), redsync.WithTries(math.MaxInt32))
	ctx, cancel := context.WithTimeout(ctx, lockWait)
	defer cancel()
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	return func() error {
		ok, err := m.UnlockContext(context.Background())
		if err == nil && !ok {
			err = errors.New("redsync: unlock found the lock not held")
		}
		return err
	}, nil
}

// libs returns both libraries over the same 5 nodes, each with clients of
// its own (pool of 64 connections per node).
func libs(b *testing.B) []struct {
	name string
	l    locker
} {
	b.Helper()
	addrs := testservers.RedisNodeAddrs(b)
	newClients := func() []*redis.Client {
		out := make([]*redis.Client, len(addrs))
		for i, a := range addrs {
			out[i] = redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true, PoolSize: 64})
			b.Cleanup(func() { _ = out[i].Close() })
		}
		return out
	}
	rc := newClients()
	nodes := make([]redis.Scripter, len(rc))
	for i, c := range rc {
		// New nodes, started just now: admit them (see redlockstore's
		// Restarts documentation).
		if err := c.Set(context.Background(), redlockstore.MarkerKey, 0, 0).Err(); err != nil {
			b.Fatal(err)
		}
		nodes[i] = c
	}
	store, err := redlockstore.New(nodes)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() })
	lk, err := reqlock.New(store)
	if err != nil {
		b.Fatal(err)
	}
	var pools []redsyncredis.Pool
	for _, c := range newClients() {
		pools = append(pools, goredis.NewPool(c))
	}
	return []struct {
		name string
		l    locker
	}{
		{"reqlock", reqlockLocker{lk}},
		{"redsync", redsyncLocker{redsync.New(pools...)}},
	}
}

// BenchmarkRedlock runs each scenario for reqlock over redlockstore and for
// redsync in turn, on the same 5 nodes: hot (one key, 50 goroutines, 1ms
// hold, a non-atomic counter increment inside the lock), spread (1000 keys,
// 50 workers, no hold) and sequential (one goroutine, acquire and release).
func BenchmarkRedlock(b *testing.B) {
	ls := libs(b)
	run := 0
	prefix := func(name string) string {
		run++
		return fmt.Sprintf("bench:%s:%d:%d:", name, time.Now().UnixNano(), run)
	}
	for _, sc := range []struct {
		name    string
		workers int
		keys    int
		hold    time.Duration
	}{
		{"hot", workers, 1, hotHold},
		{"spread", workers, spreadN, 0},
		{"sequential", 1, 1, 0},
	} {
		for _, lib := range ls {
			b.Run(sc.name+"/"+lib.name, func(b *testing.B) {
				measure(b, lib.l, prefix(lib.name), sc.workers, sc.keys, sc.hold, sc.name == "sequential")
			})
		}
	}
}

// measure takes b.N locks with workers goroutines over keys keys, holding
// each for hold while it increments the key's counter non-atomically, and
// reports acquisitions/s, p50 and p99 wait, lost updates and errors; with
// cycles, the wall time of 1000 acquire/release cycles.
func measure(b *testing.B, l locker, prefix string, workers, keys int, hold time.Duration, cycles bool) {
	counters := make([]atomic.Int64, keys)
	waits := make([][]time.Duration, workers)
	var next, errs atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				k := int(i % int64(keys))
				t0 := time.Now()
				unlock, err := l.lock(ctx, prefix+strconv.Itoa(k))
				waits[w] = append(waits[w], time.Since(t0))
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				v := counters[k].Load() // deliberately non-atomic
				if hold > 0 {
					time.Sleep(hold)
				}
				counters[k].Store(v + 1)
				if err := unlock(); err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()

	var total int64
	for i := range counters {
		total += counters[i].Load()
	}
	all := slices.Concat(waits...)
	slices.Sort(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[min(len(all)-1, int(p*float64(len(all))))]) / float64(time.Millisecond)
	}
	granted := int64(b.N) - errs.Load()
	b.ReportMetric(float64(granted)/elapsed.Seconds(), "acq/s")
	b.ReportMetric(pct(0.50), "p50-wait-ms")
	b.ReportMetric(pct(0.99), "p99-wait-ms")
	b.ReportMetric(float64(granted-total), "lost-updates")
	b.ReportMetric(float64(errs.Load()), "errors")
	if cycles {
		b.ReportMetric(elapsed.Seconds()*1000/float64(b.N)*1000, "ms/1000cycles")
	}
	if e := firstErr.Load(); e != nil {
		b.Logf("%d errors, first: %v", errs.Load(), e)
	}
}
