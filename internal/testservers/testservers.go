// Package testservers gives tests real servers: Redis (one, five
// independent nodes, a Cluster, a Sentinel set), etcd (one, a cluster),
// ZooKeeper, MariaDB and PostgreSQL. Never mocks.
//
// Shared servers. RedisAddr, RedisNodeAddrs, RedisClusterAddrs,
// SentinelAddrs, EtcdEndpoints, EtcdClusterEndpoints, ZooKeeperAddr,
// MySQLDSN and PostgresDSN return the servers named by the REQLOCK_*
// environment variables, which ./scripts/test.sh (scripts/servers.sh) sets
// after starting every server once for all the test binaries. Without the
// variable, the first call starts a server (or set) for the test binary on
// free loopback ports, and Main stops it when the tests end; tests share it,
// so they keep to keys, paths and tables of their own. Tests never skip:
// with neither the variable nor the server's program installed they fail,
// pointing at ./scripts/test.sh, which installs the programs.
//
// Store URLs. StoreRedisURL, StoreRedlockURL, StoreEtcdURL,
// StoreEtcdClusterURL, StoreZooKeeperURL, StoreMySQLURL and StorePostgresURL
// return the REQLOCK_STORE_* variables scripts/servers.sh exports: for the
// shared servers above, a URL that works verbatim as the store package's
// Open URL and as examples/inventory's -store. Without the variable they
// build the same URL from the server's address (starting the server as
// above when its variable is unset too).
//
// Private servers. RedisNodes, RedisCluster, SentinelSet, EtcdCluster,
// ZooKeeperServer, PostgresServer and MySQLServer start servers that one
// test owns, for failure tests or a configuration of their own (MySQLServer
// takes server options): each Server can be
// killed, stopped, restarted on its port (with or without its data) and
// paused. They are stopped when the test ends.
//
// On Linux every server this package starts dies with the test binary, even
// one that crashes before its cleanups run.
//
// A package whose tests use the shared servers must have
//
//	func TestMain(m *testing.M) { os.Exit(testservers.Main(m)) }
package testservers

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// The environment variables that name the shared servers; scripts/test.sh
// sets them all. Addresses are host:port, lists are comma-separated.
const (
	EnvRedisAddr      = "REQLOCK_REDIS_ADDR"      // one Redis (as in internal/testredis)
	EnvRedisNodes     = "REQLOCK_REDIS_NODES"     // 5 independent Redis nodes
	EnvRedisCluster   = "REQLOCK_REDIS_CLUSTER"   // the nodes of a Redis Cluster, 3 masters and 3 replicas
	EnvSentinelAddrs  = "REQLOCK_SENTINEL_ADDRS"  // 3 Sentinels watching 1 master and 1 replica
	EnvSentinelMaster = "REQLOCK_SENTINEL_MASTER" // the master's name; SentinelMasterName when unset
	EnvEtcdEndpoints  = "REQLOCK_ETCD_ENDPOINTS"  // one etcd, as client URLs
	EnvEtcdCluster    = "REQLOCK_ETCD_CLUSTER"    // a 3-member etcd cluster, as client URLs
	EnvZooKeeperAddr  = "REQLOCK_ZK_ADDR"         // a standalone ZooKeeper
	EnvMySQLDSN       = "REQLOCK_MYSQL_DSN"       // MariaDB: user:pass@tcp(127.0.0.1:port)/reqlock
	EnvPostgresDSN    = "REQLOCK_POSTGRES_DSN"    // postgres://user:pass@127.0.0.1:port/reqlock?sslmode=disable
)

// The environment variables that give, for the same servers, a URL that
// works verbatim as a store's Open URL and as examples/inventory's -store.
const (
	EnvStoreRedis       = "REQLOCK_STORE_REDIS"        // redis://127.0.0.1:port/0
	EnvStoreRedlock     = "REQLOCK_STORE_REDLOCK"      // redlock://host:port,... (5 nodes, admitted)
	EnvStoreEtcd        = "REQLOCK_STORE_ETCD"         // etcd://127.0.0.1:port
	EnvStoreEtcdCluster = "REQLOCK_STORE_ETCD_CLUSTER" // etcd://host:port,host:port,host:port
	EnvStoreZooKeeper   = "REQLOCK_STORE_ZK"           // zk://127.0.0.1:port
	EnvStoreMySQL       = "REQLOCK_STORE_MYSQL"        // mysql://user:pass@127.0.0.1:port/reqlock
	EnvStorePostgres    = "REQLOCK_STORE_POSTGRES"     // postgres://user:pass@127.0.0.1:port/reqlock?sslmode=disable
)

var (
	mainRunning atomic.Bool

	sharedMu     sync.Mutex
	sharedGroups []*group // the servers started for the test binary
)

// Main runs the tests, then stops the servers started for the test binary
// and removes their directories. It returns the tests' exit code. With run
// (at most one), Main calls run(m) instead of m.Run(), so that another
// package's Main wraps the tests too:
//
//	func TestMain(m *testing.M) { os.Exit(testservers.Main(m, testredis.Main)) }
func Main(m *testing.M, run ...func(*testing.M) int) int {
	if len(run) > 1 {
		panic("testservers.Main: more than one run function")
	}
	mainRunning.Store(true)
	var code int
	if len(run) == 1 {
		code = run[0](m)
	} else {
		code = m.Run()
	}
	sharedMu.Lock()
	groups := sharedGroups
	sharedGroups = nil
	sharedMu.Unlock()
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() {
			if err := g.close(true); err != nil {
				fmt.Fprintf(os.Stderr, "testservers: %v\n", err)
			}
		})
	}
	wg.Wait()
	return code
}

// RedisAddr returns the host:port of a Redis: REQLOCK_REDIS_ADDR, else one
// started for the test binary.
func RedisAddr(tb testing.TB) string {
	tb.Helper()
	if a := os.Getenv(EnvRedisAddr); a != "" {
		return a
	}
	return shared(tb, &redisShared, "Redis", EnvRedisAddr, "redis-server", findRedis,
		func(g *group) (string, error) {
			nodes, err := startRedisNodes(nil, g, 1, false)
			if err != nil {
				return "", err
			}
			return nodes[0].Addr(), nil
		})
}

// RedisNodeAddrs returns the host:port of 5 independent Redis servers, for
// Redlock: REQLOCK_REDIS_NODES, else 5 started for the test binary.
func RedisNodeAddrs(tb testing.TB) []string {
	tb.Helper()
	if v := os.Getenv(EnvRedisNodes); v != "" {
		return splitList(v)
	}
	return shared(tb, &redisNodesShared, "Redis nodes", EnvRedisNodes, "redis-server", findRedis,
		func(g *group) ([]string, error) {
			nodes, err := startRedisNodes(nil, g, 5, false)
			return Addrs(nodes), err
		})
}

// RedisClusterAddrs returns the host:port of the nodes of a Redis Cluster
// of 3 masters and 3 replicas: REQLOCK_REDIS_CLUSTER, else one started for
// the test binary.
func RedisClusterAddrs(tb testing.TB) []string {
	tb.Helper()
	if v := os.Getenv(EnvRedisCluster); v != "" {
		return splitList(v)
	}
	return shared(tb, &redisClusterShared, "Redis Cluster", EnvRedisCluster, "redis-server and redis-tools",
		findRedisCLI, func(g *group) ([]string, error) {
			nodes, err := startRedisCluster(nil, g, false, sharedClusterNodeTimeout)
			return Addrs(nodes), err
		})
}

// SentinelAddrs returns the host:port of 3 Sentinels and the name they know
// their master by: REQLOCK_SENTINEL_ADDRS and REQLOCK_SENTINEL_MASTER, else
// a Sentinel set (master, replica, 3 Sentinels) started for the test binary.
func SentinelAddrs(tb testing.TB) (addrs []string, master string) {
	tb.Helper()
	if v := os.Getenv(EnvSentinelAddrs); v != "" {
		master = os.Getenv(EnvSentinelMaster)
		if master == "" {
			master = SentinelMasterName
		}
		return splitList(v), master
	}
	set := shared(tb, &sentinelShared, "Redis Sentinel", EnvSentinelAddrs, "redis-server", findRedis,
		func(g *group) (*Sentinel, error) { return startSentinelSet(nil, g, false) })
	return set.Addrs(), set.Master
}

// EtcdEndpoints returns the client URLs of a single etcd:
// REQLOCK_ETCD_ENDPOINTS, else one started for the test binary.
func EtcdEndpoints(tb testing.TB) []string {
	tb.Helper()
	if v := os.Getenv(EnvEtcdEndpoints); v != "" {
		return splitList(v)
	}
	return shared(tb, &etcdShared, "etcd", EnvEtcdEndpoints, "etcd-server", findEtcd,
		func(g *group) ([]string, error) { return startEtcdURLs(g, 1) })
}

// EtcdClusterEndpoints returns the client URLs of a 3-member etcd cluster:
// REQLOCK_ETCD_CLUSTER, else one started for the test binary.
func EtcdClusterEndpoints(tb testing.TB) []string {
	tb.Helper()
	if v := os.Getenv(EnvEtcdCluster); v != "" {
		return splitList(v)
	}
	return shared(tb, &etcdClusterShared, "etcd cluster", EnvEtcdCluster, "etcd-server", findEtcd,
		func(g *group) ([]string, error) { return startEtcdURLs(g, 3) })
}

// ZooKeeperAddr returns the host:port of a standalone ZooKeeper (four-letter
// words ruok, srvr, stat, conf, mntr and isro allowed): REQLOCK_ZK_ADDR,
// else one started for the test binary.
func ZooKeeperAddr(tb testing.TB) string {
	tb.Helper()
	if a := os.Getenv(EnvZooKeeperAddr); a != "" {
		return a
	}
	return shared(tb, &zooKeeperShared, "ZooKeeper", EnvZooKeeperAddr, "zookeeper", findZooKeeper,
		func(g *group) (string, error) {
			s, err := startZooKeeper(nil, g)
			if err != nil {
				return "", err
			}
			return s.Addr(), nil
		})
}

// MySQLDSN returns the DSN, in go-sql-driver/mysql form, of a MariaDB
// database reqlock that its user may do anything in: REQLOCK_MYSQL_DSN,
// else a MariaDB started for the test binary.
func MySQLDSN(tb testing.TB) string {
	tb.Helper()
	if v := os.Getenv(EnvMySQLDSN); v != "" {
		return v
	}
	return shared(tb, &mysqlShared, "MariaDB", EnvMySQLDSN, "mariadb-server", findMariaDB, func(g *group) (string, error) {
		_, dsn, err := startMySQL(nil, g)
		return dsn, err
	})
}

// PostgresDSN returns the URL of a PostgreSQL database reqlock owned by its
// user: REQLOCK_POSTGRES_DSN, else a PostgreSQL started for the test binary.
func PostgresDSN(tb testing.TB) string {
	tb.Helper()
	if v := os.Getenv(EnvPostgresDSN); v != "" {
		return v
	}
	return shared(tb, &postgresShared, "PostgreSQL", EnvPostgresDSN, "postgresql",
		func() error { _, err := findPostgres(); return err }, func(g *group) (string, error) {
			_, dsn, err := startPostgres(nil, g)
			return dsn, err
		})
}

func startEtcdURLs(g *group, n int) ([]string, error) {
	members, err := startEtcd(nil, g, n)
	urls := make([]string, len(members))
	for i, m := range members {
		urls[i] = "http://" + m.Addr()
	}
	return urls, err
}

// lazy is a server (or set) started at most once per test binary.
type lazy[T any] struct {
	once sync.Once
	v    T
	err  error
}

var (
	redisShared        lazy[string]
	redisNodesShared   lazy[[]string]
	redisClusterShared lazy[[]string]
	sentinelShared     lazy[*Sentinel]
	etcdShared         lazy[[]string]
	etcdClusterShared  lazy[[]string]
	zooKeeperShared    lazy[string]
	mysqlShared        lazy[string]
	postgresShared     lazy[string]
)

// shared starts l's servers once for the test binary and returns what they
// are reached by, or fails the test saying what is missing.
func shared[T any](tb testing.TB, l *lazy[T], what, env, pkg string, find func() error,
	start func(*group) (T, error)) T {
	tb.Helper()
	if err := find(); err != nil {
		tb.Fatalf("testservers: no %s for tests: set %s or install %s (%v); "+
			"the README test command ./scripts/test.sh does both", what, env, pkg, err)
	}
	if !mainRunning.Load() {
		tb.Fatalf("testservers: %s is unset, so the test binary starts its %s, but this package has no "+
			"func TestMain(m *testing.M) { os.Exit(testservers.Main(m)) } to stop it", env, what)
	}
	l.once.Do(func() {
		var g *group
		l.v, g, l.err = withRetries(strings.ToLower(strings.ReplaceAll(what, " ", "-")), start)
		if g != nil {
			sharedMu.Lock()
			sharedGroups = append(sharedGroups, g)
			sharedMu.Unlock()
		}
	})
	if l.err != nil {
		tb.Fatalf("testservers: %s: %v", what, l.err)
	}
	return l.v
}

// needPrivate fails the test when a program that fn starts is missing.
func needPrivate(tb testing.TB, fn string, find func() error) {
	tb.Helper()
	if err := find(); err != nil {
		tb.Fatalf("testservers: %s: %v; the README test command ./scripts/test.sh installs it", fn, err)
	}
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
