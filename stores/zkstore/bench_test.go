package zkstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest/storebench"
	"github.com/reqlock/reqlock/stores/zkstore"
)

// The benchmarks compare reqlock (a Locker over a Store, plain and in fair
// mode, which hands no grant on locally) with the lock recipe of go-zookeeper (zk.NewLock: ephemeral sequential nodes, each
// waiter watching the one before it) on the same server, in the same run,
// one after the other for each workload:
//
//	cd stores/zkstore && go test -run '^$' -bench . -benchtime 3s .
//
// Each workload (storebench's) runs benchRounds rounds, each round every
// side in turn, so that the sides alternate on a machine whose disk
// (ZooKeeper syncs every write) is not always as fast. Every side uses one
// ZooKeeper session for all its goroutines, as a service process would.

// benchLease is a fair waiter's lease.
const benchLease = 2 * time.Second

// benchRounds is how many times each workload runs every side.
const benchRounds = 2

// sides returns reqlock, plain and fair, and the peer, each with a session
// of its own.
func sides() []storebench.Side {
	newStore := func(b *testing.B) stores.Store {
		ctx, cancel := context.WithTimeout(b.Context(), 10*time.Second)
		defer cancel()
		store, err := zkstore.New(ctx, []string{testservers.ZooKeeperAddr(b)}, zkstore.WithRoot(testRoot()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = store.Close() })
		return store
	}
	return []storebench.Side{
		storebench.Reqlock("reqlock", newStore),
		storebench.Reqlock("reqlock-fair", newStore, reqlock.WithFairness(benchLease)),
		{Name: "zk.NewLock", Open: func(b *testing.B, _ int) storebench.Lock {
			conn, _, err := zk.Connect([]string{testservers.ZooKeeperAddr(b)}, zkstore.DefaultSessionTimeout, zk.WithLogger(discard{}))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(conn.Close)
			root := testRoot()
			return func(_ context.Context, _ int, key string) (func() error, error) {
				lock := zk.NewLock(conn, root+"/"+key, zk.WorldACL(zk.PermAll))
				if err := lock.Lock(); err != nil {
					return nil, err
				}
				return lock.Unlock, nil
			}
		}},
	}
}

// BenchmarkHot: storebench.Hot, 50 goroutines take turns on one key.
func BenchmarkHot(b *testing.B) { storebench.Compare(b, storebench.Hot, benchRounds, sides()...) }

// BenchmarkSpread: storebench.Spread, 50 workers on 1000 keys, never
// contending; no hold.
func BenchmarkSpread(b *testing.B) { storebench.Compare(b, storebench.Spread, benchRounds, sides()...) }

// BenchmarkCycles: storebench.Cycles, acquire/release cycles on one key,
// one after the other.
func BenchmarkCycles(b *testing.B) { storebench.Compare(b, storebench.Cycles, benchRounds, sides()...) }
