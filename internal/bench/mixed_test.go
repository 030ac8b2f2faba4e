package bench_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// BenchmarkMixedKeys replays the mixed run of issue 10: 70 withdrawals from
// account A (one key) against 70 transfers A->B and 70 transfers B->A (two
// keys each), all started at once, each holding its lock for mixedWork,
// waiting at most mixedWait, on Redis. It reports how many of each kind
// got their lock (the rest timed out), per run: whether requests for
// several keys starve behind a stream of single-key requests. "1locker" is
// one service instance; "2lockers" splits every kind across two instances
// sharing Redis, where only the store orders them.
//
//	go test -run '^$' -bench MixedKeys -benchtime 3x ./internal/bench
func BenchmarkMixedKeys(b *testing.B) {
	for _, instances := range []int{1, 2} {
		b.Run(map[int]string{1: "1locker", 2: "2lockers"}[instances], func(b *testing.B) {
			client := testredis.Client(b)
			prefix := testredis.Prefix(b)
			lockers := make([]*reqlock.Locker, instances)
			for i := range lockers {
				store, err := redisstore.New(client)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = store.Close() })
				lockers[i] = reqlock.MustNew(store, reqlock.WithKeyPrefix(prefix))
			}
			var withdrawals, transfers int
			for b.Loop() {
				w, tr := mixedRun(b, lockers)
				withdrawals += w
				transfers += tr
			}
			n := float64(b.N)
			b.ReportMetric(float64(withdrawals)/n, "withdrawals-granted/70")
			b.ReportMetric(float64(transfers)/n, "transfers-granted/140")
		})
	}
}

const (
	mixedEach = 70
	mixedWork = 20 * time.Millisecond
	mixedWait = 2 * time.Second
)

// mixedRun runs one mixed burst and returns how many withdrawals and
// transfers got their lock.
func mixedRun(b *testing.B, lockers []*reqlock.Locker) (withdrawals, transfers int) {
	ctx := context.Background()
	var mu sync.Mutex
	var wg sync.WaitGroup
	var failed error
	run := func(i int, keys []string, granted *int) {
		defer wg.Done()
		lock, err := lockers[i%len(lockers)].ObtainAll(ctx, keys, 10*time.Second, mixedWait)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil:
			*granted++
		case !errors.Is(err, reqlock.ErrHeld) && !errors.Is(err, reqlock.ErrWaitEnded):
			failed = err
		}
		if err != nil {
			return
		}
		mu.Unlock()
		time.Sleep(mixedWork) // the critical section
		err = lock.Release(ctx)
		mu.Lock()
		if err != nil {
			failed = err
		}
	}
	for i := range mixedEach {
		wg.Add(3)
		go run(i, []string{"acct:A"}, &withdrawals)
		go run(i, []string{"acct:A", "acct:B"}, &transfers)
		go run(i, []string{"acct:B", "acct:A"}, &transfers)
	}
	wg.Wait()
	if failed != nil {
		b.Fatal(failed)
	}
	return withdrawals, transfers
}
