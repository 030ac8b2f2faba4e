package bench_test

import (
	"context"
	"errors"
	"flag"
	"math"
	"os"
	"testing"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redisstore/rueidisstore"
	"github.com/reqlock/reqlock/stores/redlockstore"
	"github.com/reqlock/reqlock/stores/storetest/storebench"
)

func TestMain(m *testing.M) { os.Exit(testservers.Main(m)) }

// rounds is how many times BenchmarkRedlock runs each side, alternated.
var rounds = flag.Int("bench-rounds", 1, "BenchmarkRedlock: rounds of every side, alternated")

// lockTTL and lockWait are redsync's expiry and wait, as reqlock's.
const (
	lockTTL  = storebench.TTL
	lockWait = storebench.Wait
)

// redsyncSide is go-redsync/redsync on the 5 nodes, with clients of its own
// (pool of 64 connections per node).
var redsyncSide = storebench.Side{Name: "redsync", Open: func(b *testing.B, _ int) storebench.Lock {
	var pools []redsyncredis.Pool
	for _, c := range newClients(b) {
		pools = append(pools, goredis.NewPool(c))
	}
	rs := redsync.New(pools...)
	return func(ctx context.Context, _ int, key string) (func() error, error) {
		// A Mutex keeps the value of its last lock: one per acquisition.
		m := rs.NewMutex(key, redsync.WithExpiry(lockTTL), redsync.WithTries(math.MaxInt32))
		ctx, cancel := context.WithTimeout(ctx, lockWait)
		defer cancel()
		if err := m.LockContext(ctx); err != nil {
			return nil, err
		}
		return func() error {
			ok, err := m.UnlockContext(context.Background())
			if err == nil && !ok {
				err = errors.New("redsync: unlock found the lock not held")
			}
			return err
		}, nil
	}
}}

// newClients returns a client per node, pool of 64 connections each.
func newClients(b *testing.B) []*redis.Client {
	addrs := testservers.RedisNodeAddrs(b)
	out := make([]*redis.Client, len(addrs))
	for i, a := range addrs {
		out[i] = redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true, PoolSize: 64})
		b.Cleanup(func() { _ = out[i].Close() })
	}
	return out
}

// newStore returns a redlockstore.Store over the 5 nodes, with clients of
// its own.
func newStore(b *testing.B) stores.Store {
	rc := newClients(b)
	nodes := make([]redis.Scripter, len(rc))
	for i, c := range rc {
		// New nodes, started just now: admit them (see redlockstore's
		// Restarts documentation).
		if err := c.Set(context.Background(), redlockstore.MarkerKey, 0, 0).Err(); err != nil {
			b.Fatal(err)
		}
		nodes[i] = c
	}
	store, err := redlockstore.New(nodes)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() })
	return store
}

// newRueidisStore returns a redlockstore.Store over the 5 nodes on rueidis
// clients of its own (rueidisstore.NewRedlock), each as rueidisstore.Open
// makes it: one Redis, every call pipelined, no client-side cache.
func newRueidisStore(b *testing.B) stores.Store {
	addrs := testservers.RedisNodeAddrs(b)
	nodes := make([]rueidis.Client, len(addrs))
	for i, a := range addrs {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{a},
			ForceSingleClient: true, AlwaysPipelining: true, DisableCache: true})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Close)
		if err := c.Do(context.Background(), c.B().Set().Key(redlockstore.MarkerKey).Value("0").Build()).Error(); err != nil {
			b.Fatal(err)
		}
		nodes[i] = c
	}
	store, err := rueidisstore.NewRedlock(nodes)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() })
	return store
}

// BenchmarkRedlock runs each workload of storebench for reqlock over
// redlockstore on go-redis (reqlock) and on rueidis (reqlock-rueidis), and
// for redsync, in turn, alternated over -bench-rounds rounds, on the same 5
// nodes: hot, spread and sequential (storebench.Cycles).
func BenchmarkRedlock(b *testing.B) {
	sides := []storebench.Side{storebench.Reqlock("reqlock", newStore),
		storebench.Reqlock("reqlock-rueidis", newRueidisStore), redsyncSide}
	for _, w := range storebench.Workloads() {
		name := w.Name
		if w == storebench.Cycles {
			name = "sequential"
		}
		b.Run(name, func(b *testing.B) { storebench.Compare(b, w, *rounds, sides...) })
	}
}
