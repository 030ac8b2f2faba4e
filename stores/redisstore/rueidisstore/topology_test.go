package rueidisstore

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"net"
	"testing"

	"github.com/redis/rueidis"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores/redisstore/internal/redistest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// The Sentinel and Cluster tests run on private server sets, as
// redisstore's do, with the same conformance suite and failover under load
// (redistest.FailoverUnderLoad), on rueidis clients.

// newTopologyClient returns a rueidis client with o, closed when the test
// ends; with dial set, it reaches every server through it.
func newTopologyClient(tb testing.TB, o rueidis.ClientOption, dial func(ctx context.Context, network, addr string) (net.Conn, error)) rueidis.Client {
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

// clusterOption is a rueidis client of the Cluster nodes.
func clusterOption(nodes []*testservers.Server) rueidis.ClientOption {
	return rueidis.ClientOption{InitAddress: testservers.Addrs(nodes)}
}

// sentinelOption is a rueidis client of set's master, through its
// Sentinels.
func sentinelOption(set *testservers.Sentinel) rueidis.ClientOption {
	return rueidis.ClientOption{InitAddress: set.Addrs(), Sentinel: rueidis.SentinelOption{MasterSet: set.Master}}
}

// newLocker returns a Locker over a Store on client: one process of the
// service under load.
func newLocker(t *testing.T, client rueidis.Client) *reqlock.Locker {
	t.Helper()
	l, err := reqlock.New(newStore(t, client), reqlock.WithKeyPrefix(redistest.LockerKeyPrefix))
	if err != nil {
		t.Fatalf("reqlock.New: %v", err)
	}
	return l
}

// TestTopologyCluster runs the conformance suite through a rueidis Cluster
// client on a Redis Cluster of 3 masters and 3 replicas, then kills the
// master of a locked key's slot under load.
func TestTopologyCluster(t *testing.T) {
	t.Parallel()
	nodes := testservers.RedisCluster(t)
	t.Run("Conformance", func(t *testing.T) {
		client := newTopologyClient(t, clusterOption(nodes), nil)
		if client.Mode() != rueidis.ClientModeCluster {
			t.Fatalf("client mode %s, want cluster", client.Mode())
		}
		runConformance(t, client, func(t *testing.T) (rueidis.Client, []*faultproxy.Proxy) {
			dial, proxies := redistest.ProxiedDialer(t, testservers.Addrs(nodes))
			return newTopologyClient(t, clusterOption(nodes), dial), proxies
		})
	})
	t.Run("FailoverUnderLoad", func(t *testing.T) {
		key := "topology:{" + rand.Text() + "}:sku"
		master, replica := redistest.SlotServers(t, nodes, redistest.LockerKeyPrefix+key)
		redistest.FailoverUnderLoad(t, redistest.Failover{
			Key: key,
			NewLocker: func(t *testing.T) *reqlock.Locker {
				return newLocker(t, newTopologyClient(t, clusterOption(nodes), nil))
			},
			Kill:      master.Kill,
			NewMaster: func() error { return redistest.RoleIs(replica.Addr(), "master") },
		})
	})
}

// TestTopologySentinel runs the conformance suite through a rueidis
// Sentinel client on a Sentinel set (master, replica, 3 Sentinels), then
// kills the master under load.
func TestTopologySentinel(t *testing.T) {
	t.Parallel()
	set := testservers.SentinelSet(t)
	t.Run("Conformance", func(t *testing.T) {
		runConformance(t, newTopologyClient(t, sentinelOption(set), nil), func(t *testing.T) (rueidis.Client, []*faultproxy.Proxy) {
			// The data nodes go through proxies; the Sentinels, which
			// hold no lock, are reached directly.
			dial, proxies := redistest.ProxiedDialer(t, testservers.Addrs(set.Redis), set.Addrs()...)
			return newTopologyClient(t, sentinelOption(set), dial), proxies
		})
	})
	t.Run("FailoverUnderLoad", func(t *testing.T) {
		if got, err := set.MasterAddr(); err != nil || got != set.Redis[0].Addr() {
			t.Fatalf("MasterAddr = %q, %v; want Redis[0] %s", got, err, set.Redis[0].Addr())
		}
		redistest.FailoverUnderLoad(t, redistest.Failover{
			Key: "topology:{" + rand.Text() + "}:sku",
			NewLocker: func(t *testing.T) *reqlock.Locker {
				return newLocker(t, newTopologyClient(t, sentinelOption(set), nil))
			},
			Kill: set.Redis[0].Kill,
			NewMaster: func() error {
				got, err := set.MasterAddr()
				if err == nil && got != set.Redis[1].Addr() {
					err = fmt.Errorf("the Sentinels' master is still %s", got)
				}
				return err
			},
		})
	})
}
