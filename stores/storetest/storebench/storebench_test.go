package storebench_test

import (
	"context"
	"testing"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
	"github.com/reqlock/reqlock/stores/storetest/storebench"
)

// noLock is a side that locks nothing: its holders overlap.
func noLock(context.Context, int, string) (func() error, error) {
	return func() error { return nil }, nil
}

func memSide() storebench.Side {
	return storebench.Reqlock("reqlock", func(*testing.B) stores.Store { return memstore.New() })
}

// TestRunCountsLostUpdates: the hot workload counts the overlaps of a lock
// that does not exclude, and none for reqlock over memstore.
func TestRunCountsLostUpdates(t *testing.T) {
	run := func(open func(b *testing.B) storebench.Lock) testing.BenchmarkResult {
		return testing.Benchmark(func(b *testing.B) {
			storebench.Run(b, storebench.Hot, open(b), "test:")
		})
	}
	if r := run(func(*testing.B) storebench.Lock { return noLock }); r.Extra["lost-updates"] == 0 {
		t.Errorf("no lock: lost-updates = 0, want > 0 (%v)", r.Extra)
	}
	r := run(func(b *testing.B) storebench.Lock { return memSide().Open(b, storebench.Hot.Workers) })
	if r.Extra["lost-updates"] != 0 || r.Extra["acq/s"] == 0 || r.Extra["p99-wait-ms"] == 0 {
		t.Errorf("reqlock: want no lost update and a rate and waits, got %v", r.Extra)
	}
}

// TestCyclesReportsPerThousand: one worker's runs report ms/1000cycles.
func TestCyclesReportsPerThousand(t *testing.T) {
	r := testing.Benchmark(func(b *testing.B) {
		storebench.Run(b, storebench.Cycles, memSide().Open(b, 1), "test:")
	})
	if r.Extra["ms/1000cycles"] <= 0 || r.Extra["lost-updates"] != 0 {
		t.Errorf("got %v, want ms/1000cycles > 0 and no lost update", r.Extra)
	}
}

// BenchmarkMemstore runs every workload on reqlock over memstore, as the
// store modules run theirs.
func BenchmarkMemstore(b *testing.B) {
	for _, w := range storebench.Workloads() {
		b.Run(w.Name, func(b *testing.B) { storebench.Compare(b, w, 1, memSide()) })
	}
}
