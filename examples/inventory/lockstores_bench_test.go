package main

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
)

// BenchmarkStoreCycles measures, for every -store scheme against its real
// server, sequential uncontended cycles of one Locker: Obtain then Release
// of a key, the "1000 acquire/release cycles" figure of the source
// documents, reported as ms/1000cycles. The stores run one after the other
// in one run, so their figures share the machine's state:
//
//	go -C examples/inventory test -run '^$' -bench StoreCycles -benchtime 1000x .
func BenchmarkStoreCycles(b *testing.B) {
	schemes := make([]string, 0, len(storeURLs))
	for s := range storeURLs {
		schemes = append(schemes, s)
	}
	slices.Sort(schemes)
	for _, scheme := range schemes {
		b.Run(scheme, func(b *testing.B) {
			ctx := context.Background()
			opened, err := openLockStore(ctx, storeURLs[scheme](b))
			if err != nil {
				b.Fatal(err)
			}
			if opened.close != nil {
				defer opened.close()
			}
			locker, err := reqlock.New(opened.store)
			if err != nil {
				b.Fatal(err)
			}
			prefix := "bench-cycles:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
			cycle := func(i int) {
				lock, err := locker.Obtain(ctx, prefix+strconv.Itoa(i%100), 10*time.Second, time.Second)
				if err != nil {
					b.Fatalf("Obtain: %v", err)
				}
				if err := lock.Release(ctx); err != nil {
					b.Fatalf("Release: %v", err)
				}
			}
			for i := range 100 { // connections, scripts, statements, tables
				cycle(i)
			}
			b.ResetTimer()
			start := time.Now()
			for i := 0; b.Loop(); i++ {
				cycle(i)
			}
			b.ReportMetric(float64(time.Since(start).Milliseconds())*1000/float64(b.N), "ms/1000cycles")
		})
	}
}
