package redlockstore_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redlockstore"
	"github.com/reqlock/reqlock/stores/storetest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

func TestMain(m *testing.M) { os.Exit(testservers.Main(m)) }

// clients returns a client per address, closed when the test ends.
func clients(t testing.TB, addrs []string) []redis.Scripter {
	t.Helper()
	out := make([]redis.Scripter, len(addrs))
	for i, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 64})
		t.Cleanup(func() { _ = c.Close() })
		out[i] = c
	}
	return out
}

// admit sets the marker on every node, as an operator does on a new
// deployment, so that nodes started just now take part at once.
func admit(t testing.TB, nodes []redis.Scripter) {
	t.Helper()
	for _, n := range nodes {
		if err := n.(*redis.Client).Set(context.Background(), redlockstore.MarkerKey, 0, 0).Err(); err != nil {
			t.Fatalf("admit: %v", err)
		}
	}
}

// newStore returns a Store over nodes, closed when the test ends.
func newStore(t testing.TB, nodes []redis.Scripter, opts ...redlockstore.Option) *redlockstore.Store {
	t.Helper()
	s, err := redlockstore.New(nodes, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestConformance(t *testing.T) {
	nodes := clients(t, testservers.RedisNodeAddrs(t))
	admit(t, nodes)
	storetest.Run(t, storetest.Suite{
		New: func(t *testing.T) stores.Store {
			// A long node timeout: the suite races 50 goroutines under
			// -race on a shared machine.
			return newStore(t, nodes, redlockstore.WithNodeTimeout(5*time.Second))
		},
		// One proxy per node, each in front of its node.
		Proxied: func(t *testing.T) (stores.Store, []*faultproxy.Proxy) {
			addrs := testservers.RedisNodeAddrs(t)
			proxies := make([]*faultproxy.Proxy, len(addrs))
			paddrs := make([]string, len(addrs))
			for i, a := range addrs {
				proxies[i] = faultproxy.New(t, a)
				paddrs[i] = proxies[i].Addr()
			}
			return newStore(t, clients(t, paddrs), redlockstore.WithNodeTimeout(time.Second)), proxies
		},
		Notify:    true,
		Shared:    true,
		ExpiryTTL: 300 * time.Millisecond,
	})
}
