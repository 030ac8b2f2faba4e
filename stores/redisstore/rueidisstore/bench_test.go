package rueidisstore

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// BenchmarkLockedCycle measures one uncontended Obtain and Release of a
// Locker, each on a key of its own, with a request's context (a deadline,
// cancellable), on go-redis and on rueidis: run with -benchmem for the
// allocations per locked request, and -cpu for the workers. BenchmarkTwoPings
// is its yardstick: two bare PINGs on the same clients.
func BenchmarkLockedCycle(b *testing.B) {
	for _, tc := range []struct {
		name  string
		store func(b *testing.B) stores.Store
	}{
		{"go-redis", func(b *testing.B) stores.Store {
			c := redis.NewClient(&redis.Options{Addr: testredis.Addr(b), ContextTimeoutEnabled: true, PoolSize: 128})
			b.Cleanup(func() { _ = c.Close() })
			s, err := redisstore.New(c)
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
		{"rueidis", func(b *testing.B) stores.Store { return newStore(b, newClient(b, testredis.Addr(b), true)) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			l := reqlock.MustNew(tc.store(b))
			prefix := testredis.Prefix(b)
			var n atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					key := prefix + strconv.FormatInt(n.Add(1)%1024, 10)
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					lock, err := l.Obtain(ctx, key, 10*time.Second, time.Second)
					if err != nil {
						b.Error(err)
						cancel()
						return
					}
					if err := lock.Release(ctx); err != nil {
						b.Error(err)
					}
					cancel()
				}
			})
		})
	}
}

func BenchmarkTwoPings(b *testing.B) {
	for _, tc := range []struct {
		name string
		ping func(b *testing.B) func(ctx context.Context) error
	}{
		{"go-redis", func(b *testing.B) func(ctx context.Context) error {
			c := redis.NewClient(&redis.Options{Addr: testredis.Addr(b), ContextTimeoutEnabled: true, PoolSize: 128})
			b.Cleanup(func() { _ = c.Close() })
			return func(ctx context.Context) error { return c.Ping(ctx).Err() }
		}},
		{"rueidis", func(b *testing.B) func(ctx context.Context) error {
			c := newClient(b, testredis.Addr(b), true)
			return func(ctx context.Context) error { return c.Do(ctx, c.B().Ping().Build()).Error() }
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ping := tc.ping(b)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					for range 2 {
						if err := ping(ctx); err != nil {
							b.Error(err)
						}
					}
					cancel()
				}
			})
		})
	}
}
