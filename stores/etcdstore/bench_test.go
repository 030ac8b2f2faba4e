package etcdstore_test

import (
	"context"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest/storebench"
)

// The benchmarks compare reqlock (a Locker over a Store) with the peer,
// etcd's concurrency.Mutex (one session per worker, as its documentation
// asks), on the shared etcd, alternated three times in one run; the
// workloads and their figures are storebench's:
//
//	go test -run '^$' -bench . -benchtime 2s ./stores/etcdstore/

// mutex is the peer: a concurrency.Mutex per lock, on the worker's session.
var mutex = storebench.Side{Name: "etcd-mutex", Open: func(b *testing.B, workers int) storebench.Lock {
	client := newClient(b, testservers.EtcdEndpoints(b))
	sessions := make([]*concurrency.Session, workers)
	for i := range sessions {
		var err error
		if sessions[i], err = concurrency.NewSession(client, concurrency.WithTTL(int(storebench.TTL/time.Second))); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = sessions[i].Close() })
	}
	return func(ctx context.Context, w int, key string) (func() error, error) {
		mu := concurrency.NewMutex(sessions[w], "/bench-mutex/"+key)
		if err := mu.Lock(ctx); err != nil {
			return nil, err
		}
		return func() error { return mu.Unlock(context.Background()) }, nil
	}
}}

// compare runs w for reqlock and the peer.
func compare(b *testing.B, w storebench.Workload) {
	reqlock := storebench.Reqlock("reqlock", func(b *testing.B) stores.Store { return newStore(b) })
	storebench.Compare(b, w, 3, reqlock, mutex)
}

// BenchmarkHot: storebench.Hot, 50 workers take turns on one key.
func BenchmarkHot(b *testing.B) { compare(b, storebench.Hot) }

// BenchmarkSpread: storebench.Spread, 50 workers each on their own keys.
func BenchmarkSpread(b *testing.B) { compare(b, storebench.Spread) }

// BenchmarkSequential: storebench.Cycles, acquire and release cycles of one
// key, one after the other.
func BenchmarkSequential(b *testing.B) { compare(b, storebench.Cycles) }
