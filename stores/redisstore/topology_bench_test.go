package redisstore

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testservers"
)

// BenchmarkTopology measures what one lock costs through each Redis
// topology, for the "Which Redis topology" table of docs/stores.md: uncontended
// Obtain+Release cycles of a reqlock.Locker, one after the other over 1000
// keys (which a Cluster spreads over its 3 masters), through a
// *redis.Client on a single Redis, a Sentinel failover client on a Sentinel
// set (master, replica, 3 Sentinels) and a *redis.ClusterClient on a
// Cluster of 3 masters and 3 replicas. Every server keeps an append-only
// file, without fsync. Each iteration runs one cycle through each topology
// in turn, so that the three share the machine's load alike; ns/op is the
// three cycles. It reports, per topology, cycles/s (one over the mean
// cycle) and the p50 and p99 of a cycle:
//
//	go test -run '^$' -bench BenchmarkTopology -count 3 ./stores/redisstore/
func BenchmarkTopology(b *testing.B) {
	single := testservers.RedisNodes(b, 1)[0]
	singleClient := redis.NewClient(&redis.Options{Addr: single.Addr(), ContextTimeoutEnabled: true})
	b.Cleanup(func() { _ = singleClient.Close() })
	topologies := []*benchTopology{
		{name: "single", client: singleClient},
		{name: "sentinel", client: newFailoverClient(b, testservers.SentinelSet(b), nil)},
		{name: "cluster", client: newClusterClient(b, testservers.RedisCluster(b), nil)},
	}
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench:topology:%d", i)
	}
	ctx := context.Background()
	for _, tp := range topologies {
		store, err := New(tp.client)
		if err != nil {
			b.Fatalf("%s: New: %v", tp.name, err)
		}
		b.Cleanup(func() { _ = store.Close() })
		if err := store.Load(ctx); err != nil {
			b.Fatalf("%s: Load: %v", tp.name, err)
		}
		if tp.locker, err = reqlock.New(store); err != nil {
			b.Fatalf("%s: reqlock.New: %v", tp.name, err)
		}
		for _, k := range keys { // connections to every master, and warm scripts
			tp.cycle(b, ctx, k)
		}
	}
	i := 0
	for b.Loop() {
		for _, tp := range topologies {
			start := time.Now()
			tp.cycle(b, ctx, keys[i%len(keys)])
			tp.latencies = append(tp.latencies, time.Since(start))
		}
		i++
	}
	for _, tp := range topologies {
		var total time.Duration
		for _, d := range tp.latencies {
			total += d
		}
		slices.Sort(tp.latencies)
		quantile := func(q float64) float64 {
			return float64(tp.latencies[int(q*float64(len(tp.latencies)-1))].Microseconds())
		}
		b.ReportMetric(float64(len(tp.latencies))/total.Seconds(), tp.name+"-cycles/s")
		b.ReportMetric(quantile(0.50), tp.name+"-p50-us")
		b.ReportMetric(quantile(0.99), tp.name+"-p99-us")
	}
}

// benchTopology is one topology of BenchmarkTopology.
type benchTopology struct {
	name      string
	client    redis.Scripter
	locker    *reqlock.Locker
	latencies []time.Duration
}

// cycle obtains and releases key.
func (tp *benchTopology) cycle(b *testing.B, ctx context.Context, key string) {
	lock, err := tp.locker.Obtain(ctx, key, 10*time.Second, time.Second)
	if err != nil {
		b.Fatalf("%s: Obtain: %v", tp.name, err)
	}
	if err := lock.Release(ctx); err != nil {
		b.Fatalf("%s: Release: %v", tp.name, err)
	}
}
