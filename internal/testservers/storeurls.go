package testservers

import (
	"context"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"
)

// redlockMarkerKey is redlockstore.MarkerKey (this package imports no
// store): a node that holds it takes part in quorums at once.
const redlockMarkerKey = "reqlock:redlock:node"

// StoreRedisURL returns the redisstore URL of the shared Redis:
// REQLOCK_STORE_REDIS, else redis://RedisAddr/0.
func StoreRedisURL(tb testing.TB) string {
	tb.Helper()
	if v := os.Getenv(EnvStoreRedis); v != "" {
		return v
	}
	return "redis://" + RedisAddr(tb) + "/0"
}

// StoreRedlockURL returns the redlockstore URL of the 5 shared Redis nodes:
// REQLOCK_STORE_REDLOCK, else redlock://RedisNodeAddrs, after admitting the
// nodes (setting redlockstore.MarkerKey on each, as scripts/servers.sh
// does), so that a Store on them grants at once.
func StoreRedlockURL(tb testing.TB) string {
	tb.Helper()
	if v := os.Getenv(EnvStoreRedlock); v != "" {
		return v
	}
	nodes := RedisNodeAddrs(tb)
	for _, addr := range nodes {
		if err := admitRedlockNode(addr); err != nil {
			tb.Fatalf("testservers: admitting Redis node %s for Redlock: %v", addr, err)
		}
	}
	return "redlock://" + strings.Join(nodes, ",")
}

// admitRedlockNode sets redlockMarkerKey on the Redis at addr.
func admitRedlockNode(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := redisDo(ctx, addr, "SET", redlockMarkerKey, "0")
	return err
}

// StoreEtcdURL returns the etcdstore URL of the shared etcd:
// REQLOCK_STORE_ETCD, else etcd:// and the host:port of EtcdEndpoints.
func StoreEtcdURL(tb testing.TB) string {
	tb.Helper()
	if v := os.Getenv(EnvStoreEtcd); v != "" {
		return v
	}
	return etcdURL(EtcdEndpoints(tb))
}

// StoreEtcdClusterURL returns the etcdstore URL of the shared 3-member etcd
// cluster: REQLOCK_STORE_ETCD_CLUSTER, else built from EtcdClusterEndpoints.
func StoreEtcdClusterURL(tb testing.TB) string {
	tb.Helper()
	if v := os.Getenv(EnvStoreEtcdCluster); v != "" {
		return v
	}
	return etcdURL(EtcdClusterEndpoints(tb))
}

// etcdURL turns client URLs (http://host:port) into an etcdstore URL.
func etcdURL(endpoints []string) string {
	hps := make([]string, len(endpoints))
	for i, e := range endpoints {
		hps[i] = strings.TrimPrefix(e, "http://")
	}
	return "etcd://" + strings.Join(hps, ",")
}

// StoreZooKeeperURL returns the zkstore URL of the shared ZooKeeper:
// REQLOCK_STORE_ZK, else zk://ZooKeeperAddr.
func StoreZooKeeperURL(tb testing.TB) string {
	tb.Helper()
	if v := os.Getenv(EnvStoreZooKeeper); v != "" {
		return v
	}
	return "zk://" + ZooKeeperAddr(tb)
}

// StoreMySQLURL returns the mysqlstore URL of the shared MariaDB database:
// REQLOCK_STORE_MYSQL, else MySQLDSN (user:pass@tcp(host:port)/db) as
// mysql://user:pass@host:port/db.
func StoreMySQLURL(tb testing.TB) string {
	tb.Helper()
	if v := os.Getenv(EnvStoreMySQL); v != "" {
		return v
	}
	dsn := MySQLDSN(tb)
	cred, rest, ok1 := strings.Cut(dsn, "@tcp(")
	addr, db, ok2 := strings.Cut(rest, ")/")
	user, pass, ok3 := strings.Cut(cred, ":")
	if !ok1 || !ok2 || !ok3 {
		tb.Fatalf("testservers: %s is not user:pass@tcp(host:port)/db", EnvMySQLDSN)
	}
	return (&url.URL{Scheme: "mysql", User: url.UserPassword(user, pass), Host: addr, Path: "/" + db}).String()
}

// StorePostgresURL returns the pgstore URL of the shared PostgreSQL
// database: REQLOCK_STORE_POSTGRES, else PostgresDSN, which is one.
func StorePostgresURL(tb testing.TB) string {
	tb.Helper()
	if v := os.Getenv(EnvStorePostgres); v != "" {
		return v
	}
	return PostgresDSN(tb)
}
