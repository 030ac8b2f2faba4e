package bench

import (
	"context"
	"flag"
	"path/filepath"
	"testing"

	"github.com/gofrs/flock"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/filestore"
	"github.com/reqlock/reqlock/stores/storetest/storebench"
)

// reqlockSide is a reqlock.Locker over a filestore.Store in a directory of
// its own, shared by every goroutine of a run, as a service shares one.
var reqlockSide = storebench.Reqlock("reqlock", func(b *testing.B) stores.Store {
	store, err := filestore.New(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() })
	return store
})

// gofrsSide is github.com/gofrs/flock: a Flock per goroutine and key (a
// Flock tracks one holder, so goroutines cannot share one), each locking
// with the blocking Lock, the kernel waking its waiters.
var gofrsSide = storebench.Side{Name: "gofrs-flock", Open: func(b *testing.B, workers int) storebench.Lock {
	dir := b.TempDir()
	flocks := make([]map[string]*flock.Flock, workers)
	for w := range flocks {
		flocks[w] = make(map[string]*flock.Flock)
	}
	return func(_ context.Context, w int, key string) (func() error, error) {
		f := flocks[w][key]
		if f == nil {
			f = flock.New(filepath.Join(dir, key+".lock"))
			flocks[w][key] = f
		}
		if err := f.Lock(); err != nil {
			return nil, err
		}
		return f.Unlock, nil
	}
}}

// rounds is how many times each benchmark runs every side, alternating
// them (go test's -count would run one side's runs in a row).
var rounds = flag.Int("rounds", 1, "runs of each peer per benchmark, alternated")

// BenchmarkHot: storebench.Hot, 50 goroutines take turns on one key.
func BenchmarkHot(b *testing.B) {
	storebench.Compare(b, storebench.Hot, *rounds, reqlockSide, gofrsSide)
}

// BenchmarkSpread: storebench.Spread, 50 goroutines on 1000 keys, each its
// own share of them: the cost of an uncontended lock.
func BenchmarkSpread(b *testing.B) {
	storebench.Compare(b, storebench.Spread, *rounds, reqlockSide, gofrsSide)
}

// BenchmarkCycles: storebench.Cycles, sequential acquire/release cycles of
// one key by one goroutine.
func BenchmarkCycles(b *testing.B) {
	storebench.Compare(b, storebench.Cycles, *rounds, reqlockSide, gofrsSide)
}
