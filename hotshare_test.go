package reqlock_test

import (
	"os"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/hotshare"
	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/filestore"
	"github.com/reqlock/reqlock/stores/memstore"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// hotShareConfig is the hot-key run of TestHotKeySharedAcrossProcesses: as
// the two instances of the inventory service, 4 concurrent
// deductions each, with the service's wait and TTL, and 1ms of work.
var hotShareConfig = hotshare.Config{
	Key:      "hot",
	Workers:  4,
	Hold:     time.Millisecond,
	TTL:      10 * time.Second,
	Wait:     2 * time.Second,
	Duration: 3 * time.Second,
}

// hotShareBackends are the stores TestHotKeySharedAcrossProcesses and
// BenchmarkHotKey run on; store returns a maker of one process's Store.
var hotShareBackends = []struct {
	name  string
	store func(tb testing.TB) func() stores.Store
}{
	{"filestore", func(tb testing.TB) func() stores.Store {
		dir := tb.TempDir()
		return func() stores.Store {
			s, err := filestore.New(dir)
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() { _ = s.Close() })
			return s
		}
	}},
	{"redis", func(tb testing.TB) func() stores.Store {
		return func() stores.Store {
			s, err := redisstore.New(testredis.Client(tb))
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() { _ = s.Close() })
			return s
		}
	}},
	{"memstore", func(testing.TB) func() stores.Store {
		// One store for both: memstore cannot stand for two processes
		// but as one shared backend that signals every waiter.
		s := memstore.New()
		return func() stores.Store { return s }
	}},
}

// runHotShare runs cfg on n Lockers, each on a Store of its own from store.
func runHotShare(tb testing.TB, store func(testing.TB) func() stores.Store, n int, cfg hotshare.Config) hotshare.Result {
	newStore := store(tb)
	counters := hotshare.NewCounters(n)
	prefix := "reqlock:" + testredis.Prefix(tb)
	var lockers []*reqlock.Locker
	for i := range n {
		opts := append([]reqlock.Option{reqlock.WithKeyPrefix(prefix)}, hotshare.Options(counters, i)...)
		lockers = append(lockers, reqlock.MustNew(newStore(), opts...))
	}
	return hotshare.Run(tb, lockers, counters, cfg)
}

// TestHotKeySharedAcrossProcesses: two Lockers, each on a Store of its own
// over one backend as two processes have, contend for one hot key with 4
// workers each; each must get a fair share of the grants, and get one at
// least every second (issue 18, defect 21). On the file store, whose
// releases reached only the waiters of their own process, one process used
// to get nearly every grant: the holder's process passed the key on
// locally and yielded it to other processes for 100µs between chains, far
// shorter than their poll interval. Run with HOTSHARE_REPORT=1 to log the
// figures without judging them.
func TestHotKeySharedAcrossProcesses(t *testing.T) {
	for _, b := range hotShareBackends {
		t.Run(b.name, func(t *testing.T) {
			r := runHotShare(t, b.store, 2, hotShareConfig)
			t.Log(r)
			if os.Getenv("HOTSHARE_REPORT") != "" {
				return
			}
			if share := r.MinShare(); share < minHotShare || r.MaxGap() > maxHotGap {
				t.Fatalf("want each process to get at least %.0f%% of the grants, and one at least every %v: %v",
					100*minHotShare, maxHotGap, r)
			}
		})
	}
}

// Bounds of TestHotKeySharedAcrossProcesses. Measured on a loaded 2-core
// machine (load 5 to 6, -race), the smaller share stays above 35% and the
// longest time a process goes without a grant below 450ms (MySQL; tens of
// ms on the file store), while a starved process gets 0 to 20% and goes
// 1.3s to the whole run without one: a process that gets its share by luck
// in bursts fails the gap. The bounds leave room for a loaded machine.
const (
	minHotShare = 0.25
	maxHotGap   = time.Second
)
