package redisstore

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redisstore/internal/redistest"
)

// The Sentinel and Cluster tests run on private server sets (testservers.
// RedisCluster and SentinelSet), one per topology, first for the
// conformance suite and then for a failover under load: the shared sets
// (RedisClusterAddrs, SentinelAddrs) need testservers.Main in TestMain,
// which this package's TestMain (testredis.Main) does not run.

// newClusterClient returns a client of the Cluster nodes, closed when the
// test ends; with dial, it reaches every node through dial.
func newClusterClient(tb testing.TB, nodes []*testservers.Server, dial redistest.Dial) *redis.ClusterClient {
	tb.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:  testservers.Addrs(nodes),
		Dialer: dial,
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
// closed when the test ends; with dial, it reaches every server through
// dial.
func newFailoverClient(tb testing.TB, set *testservers.Sentinel, dial redistest.Dial) *redis.Client {
	tb.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            set.Master,
		SentinelAddrs:         set.Addrs(),
		Dialer:                dial,
		ContextTimeoutEnabled: true,
	})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// storeOf returns a Store over client, closed when the test ends.
func storeOf(t testing.TB, client redis.Scripter) stores.Store { return newStore(t, client) }

// TestTopologyCluster runs the conformance suite through a
// *redis.ClusterClient on a Redis Cluster of 3 masters and 3 replicas, then
// kills the master of a locked key's slot under load (see
// redistest.Cluster).
func TestTopologyCluster(t *testing.T) {
	t.Parallel()
	nodes := testservers.RedisCluster(t)
	redistest.Cluster(t, nodes, redistest.Clients[redis.Scripter]{
		New:   func(t testing.TB, dial redistest.Dial) redis.Scripter { return newClusterClient(t, nodes, dial) },
		Store: storeOf,
	})
}

// TestTopologySentinel runs the conformance suite through a Sentinel
// failover client on a Sentinel set (master, replica, 3 Sentinels), then
// kills the master under load (see redistest.Sentinel).
func TestTopologySentinel(t *testing.T) {
	t.Parallel()
	set := testservers.SentinelSet(t)
	redistest.Sentinel(t, set, redistest.Clients[redis.Scripter]{
		New:   func(t testing.TB, dial redistest.Dial) redis.Scripter { return newFailoverClient(t, set, dial) },
		Store: storeOf,
	})
}
