package reqlock_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/hotshare"
)

// BenchmarkHotKey measures hotShareConfig's run, with its 1ms of work and
// with none, with one Locker and with two, each on a Store of its own (as
// processes have): the grants and local handoffs per second, the smaller
// Locker's share and the longest time a Locker went without a grant. Each
// iteration is one 3s run; run it with -benchtime 1x:
//
//	go test -run '^$' -bench HotKey -benchtime 1x .
func BenchmarkHotKey(b *testing.B) {
	for _, backend := range hotShareBackends {
		for _, hold := range []time.Duration{hotShareConfig.Hold, 0} {
			for _, n := range []int{1, 2} {
				b.Run(fmt.Sprintf("%s/hold=%v/lockers=%d", backend.name, hold, n), func(b *testing.B) {
					cfg := hotShareConfig
					cfg.Hold = hold
					for range b.N {
						reportHotShare(b, runHotShare(b, backend.store, n, cfg))
					}
				})
			}
		}
	}
}

// reportHotShare reports r's figures as the benchmark's metrics.
func reportHotShare(b *testing.B, r hotshare.Result) {
	b.ReportMetric(r.GrantsPerSecond(), "grants/s")
	b.ReportMetric(r.HandoffsPerSecond(), "handoffs/s")
	b.ReportMetric(100*r.MinShare(), "min-share-%")
	b.ReportMetric(float64(r.MaxGap())/float64(time.Millisecond), "max-gap-ms")
}
