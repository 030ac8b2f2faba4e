package redisstore

import (
	"crypto/rand"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores/redisstore/internal/redistest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// The Sentinel and Cluster tests run on private server sets (testservers.
// RedisCluster and SentinelSet), one per topology, first for the
// conformance suite and then for a failover under load: the shared sets
// (RedisClusterAddrs, SentinelAddrs) need testservers.Main in TestMain,
// which this package's TestMain (testredis.Main) does not run.

// newClusterClient returns a client of the Cluster nodes, closed when the
// test ends.
func newClusterClient(tb testing.TB, nodes []*testservers.Server) *redis.ClusterClient {
	tb.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: testservers.Addrs(nodes),
		// go-redis's default ClusterStateReloadInterval (60s): the Store
		// reloads the slot map itself when a call finds a node gone (see
		// noteFailure), and the failover test shows it recovering by
		// that alone.
		ContextTimeoutEnabled: true,
	})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// newFailoverClient returns a Sentinel failover client of set's master,
// closed when the test ends.
func newFailoverClient(tb testing.TB, set *testservers.Sentinel) *redis.Client {
	tb.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            set.Master,
		SentinelAddrs:         set.Addrs(),
		ContextTimeoutEnabled: true,
	})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// TestTopologyCluster runs the conformance suite through a
// *redis.ClusterClient on a Redis Cluster of 3 masters and 3 replicas, then
// kills the master of a locked key's slot under load (see
// testFailoverUnderLoad).
func TestTopologyCluster(t *testing.T) {
	t.Parallel()
	nodes := testservers.RedisCluster(t)
	t.Run("Conformance", func(t *testing.T) {
		runConformance(t, newClusterClient(t, nodes), func(t *testing.T) (redis.Scripter, []*faultproxy.Proxy) {
			dial, proxies := redistest.ProxiedDialer(t, testservers.Addrs(nodes))
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testservers.Addrs(nodes), Dialer: dial, ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			return c, proxies
		})
	})
	t.Run("FailoverUnderLoad", func(t *testing.T) {
		key := "topology:{" + rand.Text() + "}:sku"
		master, replica := redistest.SlotServers(t, nodes, redistest.LockerKeyPrefix+key)
		redistest.FailoverUnderLoad(t, redistest.Failover{
			Key:       key,
			NewLocker: func(t *testing.T) *reqlock.Locker { return newLocker(t, newClusterClient(t, nodes)) },
			Kill:      master.Kill,
			NewMaster: func() error { return redistest.RoleIs(replica.Addr(), "master") },
		})
	})
}

// TestTopologySentinel runs the conformance suite through a Sentinel
// failover client on a Sentinel set (master, replica, 3 Sentinels), then
// kills the master under load (see redistest.FailoverUnderLoad).
func TestTopologySentinel(t *testing.T) {
	t.Parallel()
	set := testservers.SentinelSet(t)
	t.Run("Conformance", func(t *testing.T) {
		runConformance(t, newFailoverClient(t, set), func(t *testing.T) (redis.Scripter, []*faultproxy.Proxy) {
			// The data nodes go through proxies; the Sentinels, which
			// hold no lock, are reached directly.
			dial, proxies := redistest.ProxiedDialer(t, testservers.Addrs(set.Redis), set.Addrs()...)
			c := redis.NewFailoverClient(&redis.FailoverOptions{
				MasterName: set.Master, SentinelAddrs: set.Addrs(), Dialer: dial, ContextTimeoutEnabled: true,
			})
			t.Cleanup(func() { _ = c.Close() })
			return c, proxies
		})
	})
	t.Run("FailoverUnderLoad", func(t *testing.T) {
		if got, err := set.MasterAddr(); err != nil || got != set.Redis[0].Addr() {
			t.Fatalf("MasterAddr = %q, %v; want Redis[0] %s", got, err, set.Redis[0].Addr())
		}
		redistest.FailoverUnderLoad(t, redistest.Failover{
			Key:       "topology:{" + rand.Text() + "}:sku",
			NewLocker: func(t *testing.T) *reqlock.Locker { return newLocker(t, newFailoverClient(t, set)) },
			Kill:      set.Redis[0].Kill,
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

// newLocker returns a Locker over a Store on client: one process of the
// service under load.
func newLocker(t *testing.T, client redis.Scripter) *reqlock.Locker {
	t.Helper()
	l, err := reqlock.New(newStore(t, client), reqlock.WithKeyPrefix(redistest.LockerKeyPrefix))
	if err != nil {
		t.Fatalf("reqlock.New: %v", err)
	}
	return l
}
