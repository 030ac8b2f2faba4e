package reqlock_test

import (
	"testing"

	"github.com/reqlock/reqlock/internal/hotshare"
)

// BenchmarkHotKey measures hotshare.Issue's run (see hotshare.Benchmark)
// on every backend, each Locker on a Store of its own (as processes have).
// Each iteration is one 3s run; run it with -benchtime 1x:
//
//	go test -run '^$' -bench HotKey -benchtime 1x .
func BenchmarkHotKey(b *testing.B) {
	for _, backend := range hotShareBackends {
		b.Run(backend.name, func(b *testing.B) {
			hotshare.Benchmark(b, func(b *testing.B, n int, cfg hotshare.Config) hotshare.Result {
				return runHotShare(b, backend.store, n, cfg)
			})
		})
	}
}
