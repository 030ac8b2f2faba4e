package rueidisstore

import (
	"context"
	"crypto/tls"
	"net"
	"testing"

	"github.com/redis/rueidis"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores/redisstore/internal/redistest"
)

// The Sentinel and Cluster tests run on private server sets, as
// redisstore's do, with the same conformance suite and failover under load
// (redistest.Cluster and redistest.Sentinel), on rueidis clients.

// topologyClient returns a rueidis client with o, closed when the test
// ends; with dial, it reaches every server through dial, and pipelines
// every call (as Open's client does).
func topologyClient(tb testing.TB, o rueidis.ClientOption, dial redistest.Dial) rueidis.Client {
	tb.Helper()
	if dial != nil {
		o.DialCtxFn = func(ctx context.Context, addr string, _ *net.Dialer, _ *tls.Config) (net.Conn, error) {
			return dial(ctx, "tcp", addr)
		}
		o.AlwaysPipelining, o.DisableCache = true, true
	}
	c, err := rueidis.NewClient(o)
	if err != nil {
		tb.Fatalf("rueidis.NewClient: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

// TestTopologyCluster runs the conformance suite through a rueidis Cluster
// client on a Redis Cluster of 3 masters and 3 replicas, then kills the
// master of a locked key's slot under load.
func TestTopologyCluster(t *testing.T) {
	t.Parallel()
	nodes := testservers.RedisCluster(t)
	redistest.Cluster(t, nodes, redistest.Clients[rueidis.Client]{
		New: func(t testing.TB, dial redistest.Dial) rueidis.Client {
			c := topologyClient(t, rueidis.ClientOption{InitAddress: testservers.Addrs(nodes)}, dial)
			if c.Mode() != rueidis.ClientModeCluster {
				t.Fatalf("client mode %s, want cluster", c.Mode())
			}
			return c
		},
		Store: storeOf,
	})
}

// TestTopologySentinel runs the conformance suite through a rueidis
// Sentinel client on a Sentinel set (master, replica, 3 Sentinels), then
// kills the master under load.
func TestTopologySentinel(t *testing.T) {
	t.Parallel()
	set := testservers.SentinelSet(t)
	redistest.Sentinel(t, set, redistest.Clients[rueidis.Client]{
		New: func(t testing.TB, dial redistest.Dial) rueidis.Client {
			return topologyClient(t, rueidis.ClientOption{
				InitAddress: set.Addrs(),
				Sentinel:    rueidis.SentinelOption{MasterSet: set.Master},
			}, dial)
		},
		Store: storeOf,
	})
}
