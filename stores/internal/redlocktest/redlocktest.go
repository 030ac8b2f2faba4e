package redlocktest

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/internal/redlockpeek"
	"github.com/reqlock/reqlock/stores/redlockstore"
	"github.com/reqlock/reqlock/stores/storetest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// Client is the client library a suite's Stores run on.
type Client struct {
	// Name names the client in messages.
	Name string
	// New returns a Store over the Redis nodes that nodes reach (the
	// addresses of go-redis clients the test configured: a client of
	// another library takes their addresses only), with opts, and a
	// function that closes the clients it made (none for go-redis: the
	// test owns nodes). The clients it makes are also closed when the test
	// ends.
	New func(t testing.TB, nodes []redis.Scripter, opts ...redlockstore.Option) (s *redlockstore.Store, closeClients func(), err error)
	// Retries tells that the client sends a script again after an
	// attempt that got no reply (go-redis's MaxRetries).
	Retries bool
	// Pipelined tells that the client sends every call of a node on one
	// connection, in order: a request held back holds back the calls sent
	// after it, and a cut connection fails the calls sent on it before
	// the client noticed (go-redis checks a pooled connection first).
	Pipelined bool
}

// GoRedis runs the Stores on the go-redis clients themselves
// (redlockstore.New).
var GoRedis = Client{Name: "go-redis", Retries: true, New: func(_ testing.TB, nodes []redis.Scripter, opts ...redlockstore.Option) (*redlockstore.Store, func(), error) {
	s, err := redlockstore.New(nodes, opts...)
	return s, func() {}, err
}}

// open returns a Store of c over nodes.
func (c Client) open(t testing.TB, nodes []redis.Scripter, opts ...redlockstore.Option) (*redlockstore.Store, error) {
	s, _, err := c.New(t, nodes, opts...)
	return s, err
}

// Addrs returns the addresses of go-redis clients, for a Client's New.
func Addrs(nodes []redis.Scripter) []string {
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = n.(*redis.Client).Options().Addr
	}
	return out
}

// storeGoroutineCount returns how many goroutines run code of a Store
// (redlockstore's, or the redisstore Stores of its release signals), but
// the probes of skipped nodes (one per node, until it answers): what a
// Store keeps running for its calls and its clean-up. The clients' own
// goroutines (connections, pings) and the proxies' are not counted.
func storeGoroutineCount() int {
	n := 0
	for _, g := range allGoroutines() {
		if (strings.Contains(g, "/stores/redlockstore.") || strings.Contains(g, "/stores/redisstore.")) &&
			!strings.Contains(g, "redlockstore.(*Store).startProbe") {
			n++
		}
	}
	return n
}

// allGoroutines returns the stack of every goroutine.
func allGoroutines() []string {
	buf := make([]byte, 1<<22)
	return strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n")
}

// gate, notifyNode and tokenStates read s (see package redlockpeek).
func gate(s *redlockstore.Store, key string) int       { return redlockpeek.Gate(s, key) }
func notifyNode(s *redlockstore.Store, key string) int { return redlockpeek.NotifyNode(s, key) }
func tokenStates(s *redlockstore.Store) int            { return redlockpeek.TokenStates(s) }

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
func newStore(t testing.TB, c Client, nodes []redis.Scripter, opts ...redlockstore.Option) *redlockstore.Store {
	t.Helper()
	s, err := c.open(t, nodes, opts...)
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

func Conformance(t *testing.T, c Client) {
	nodes := clients(t, testservers.RedisNodeAddrs(t))
	admit(t, nodes)
	storetest.Run(t, storetest.Suite{
		New: func(t *testing.T) stores.Store {
			// A long node timeout: the suite races 50 goroutines under
			// -race on a shared machine.
			return newStore(t, c, nodes, redlockstore.WithNodeTimeout(5*time.Second))
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
			return newStore(t, c, clients(t, paddrs), redlockstore.WithNodeTimeout(time.Second)), proxies
		},
		Notify:    true,
		Shared:    true,
		ExpiryTTL: 300 * time.Millisecond,
	})
}
