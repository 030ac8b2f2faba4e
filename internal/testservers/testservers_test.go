package testservers

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// sharedChecks start (or find) each kind of shared server and check that it
// answers as that kind of server.
var sharedChecks = []struct {
	name  string
	check func(t *testing.T)
}{
	{"Redis", func(t *testing.T) { checkRedis(t, RedisAddr(t)) }},
	{"RedisNodes", func(t *testing.T) {
		addrs := RedisNodeAddrs(t)
		if len(addrs) != 5 {
			t.Fatalf("RedisNodeAddrs = %v, want 5 nodes", addrs)
		}
		checkIndependent(t, addrs)
	}},
	{"RedisCluster", func(t *testing.T) { checkRedisCluster(t, RedisClusterAddrs(t)) }},
	{"Sentinel", func(t *testing.T) {
		addrs, master := SentinelAddrs(t)
		checkSentinel(t, addrs, master)
	}},
	{"Etcd", func(t *testing.T) { checkEtcd(t, EtcdEndpoints(t), 1) }},
	{"EtcdCluster", func(t *testing.T) { checkEtcd(t, EtcdClusterEndpoints(t), 3) }},
	{"ZooKeeper", func(t *testing.T) { checkZooKeeper(t, ZooKeeperAddr(t)) }},
	{"MySQL", func(t *testing.T) { checkMySQL(t, MySQLDSN(t)) }},
	{"Postgres", func(t *testing.T) { checkPostgres(t, PostgresDSN(t)) }},
}

// TestShared checks the shared servers: under ./scripts/test.sh those the
// script started, else the test binary's own.
func TestShared(t *testing.T) {
	for _, c := range sharedChecks {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.check(t)
		})
	}
}

// TestSharedStartedByTheBinary checks the servers the test binary starts
// when no environment variable names one. It starts them one kind after the
// other: at once, they would load the machine enough to upset the timing of
// the tests of packages running meanwhile.
func TestSharedStartedByTheBinary(t *testing.T) {
	for _, env := range []string{EnvRedisAddr, EnvRedisNodes, EnvRedisCluster, EnvSentinelAddrs,
		EnvSentinelMaster, EnvEtcdEndpoints, EnvEtcdCluster, EnvZooKeeperAddr, EnvMySQLDSN, EnvPostgresDSN} {
		t.Setenv(env, "")
	}
	start := time.Now()
	for _, c := range sharedChecks {
		t.Run(c.name, c.check)
	}
	t.Logf("every kind of server started and checked in %v", time.Since(start).Round(time.Millisecond))
}

func TestRedisNodesKillRestartPause(t *testing.T) {
	t.Parallel()
	nodes := RedisNodes(t, 2)
	checkIndependent(t, Addrs(nodes))
	n := nodes[0]
	c := newRedisClient(t, n.Addr())
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}

	n.Kill()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING to a killed node succeeded")
	}
	n.Restart()
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET after Kill and Restart = %q, %v; want the key kept", got, err)
	}

	n.RestartEmpty()
	if got, err := c.Get(ctx, "k").Result(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after RestartEmpty = %q, %v; want no key", got, err)
	}

	n.Pause()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := c.Ping(short).Err()
	cancel()
	if !isTimeout(err) {
		t.Fatalf("PING to a paused node: %v, want a timeout", err)
	}
	n.Resume()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}

	n.Stop()
	n.Stop() // stopping a stopped server does nothing
	n.Restart()
	checkRedis(t, n.Addr())
	checkRedis(t, nodes[1].Addr())
}

func TestRedisClusterFailsOver(t *testing.T) {
	t.Parallel()
	nodes := RedisCluster(t)
	checkRedisCluster(t, Addrs(nodes))
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: Addrs(nodes), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close() })
	ctx := context.Background()
	for i := range 20 {
		if err := cc.Set(ctx, fmt.Sprintf("k%d", i), i, 0).Err(); err != nil {
			t.Fatalf("SET through the cluster: %v", err)
		}
	}
	if err := cc.Wait(ctx, 1, time.Second).Err(); err != nil {
		t.Logf("WAIT: %v", err) // only to let the replicas catch up before the kill
	}

	master := nodes[0]
	if role := redisInfo(t, master.Addr(), "replication", "role"); role != "master" {
		t.Fatalf("node 0 is a %s, want the first master", role)
	}
	var replica *Server
	for _, n := range nodes[1:] {
		if redisInfo(t, n.Addr(), "replication", "master_port") == portOf(master.Addr()) {
			replica = n
		}
	}
	if replica == nil {
		t.Fatalf("no node replicates %s", master.Addr())
	}

	master.Kill()
	eventually(t, 30*time.Second, func() error {
		if err := roleIs(replica.Addr(), "master"); err != nil {
			return err
		}
		return clusterOK(ctx, slices.DeleteFunc(Addrs(nodes), func(a string) bool { return a == master.Addr() }), 6)
	})

	master.Restart()
	eventually(t, 30*time.Second, func() error {
		if err := roleIs(master.Addr(), "slave"); err != nil {
			return fmt.Errorf("old master: %w", err)
		}
		return clusterOK(ctx, Addrs(nodes), 6)
	})
	for i := range 20 {
		if got, err := cc.Get(ctx, fmt.Sprintf("k%d", i)).Int(); err != nil || got != i {
			t.Fatalf("GET k%d after the failover = %d, %v", i, got, err)
		}
	}
}

func TestSentinelSetFailsOver(t *testing.T) {
	t.Parallel()
	set := SentinelSet(t)
	checkSentinel(t, set.Addrs(), set.Master)
	if got, err := set.MasterAddr(); err != nil || got != set.Redis[0].Addr() {
		t.Fatalf("MasterAddr = %q, %v; want Redis[0] %s", got, err, set.Redis[0].Addr())
	}
	fc := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: set.Master, SentinelAddrs: set.Addrs(), ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = fc.Close() })
	ctx := context.Background()
	if err := fc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET through the Sentinels: %v", err)
	}
	if err := fc.Do(ctx, "WAIT", 1, 5000).Err(); err != nil {
		t.Fatalf("WAIT for the replica: %v", err)
	}

	start := time.Now()
	set.Redis[0].Kill()
	eventually(t, 30*time.Second, func() error {
		got, err := set.MasterAddr()
		if err == nil && got != set.Redis[1].Addr() {
			err = fmt.Errorf("master is still %s", got)
		}
		return err
	})
	t.Logf("failover in %v", time.Since(start).Round(time.Millisecond))
	eventually(t, 30*time.Second, func() error { return fc.Get(ctx, "k").Err() })
	if got, err := fc.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET from the new master = %q, %v", got, err)
	}

	set.Redis[0].Restart()
	// Sentinels reconfigure a returning master after about 8s, but a CI
	// run saw one that had not yet learned of the failover announce the
	// returning master again, and the old master was still a master 30s
	// on with no Sentinel in TILT mode: the set converges by its epochs,
	// so the wait is 60s. A Sentinel that a loaded machine stalled for
	// over 2s is in TILT mode for 30s, and acts on nothing meanwhile: the
	// wait goes on while one is.
	deadline, limit := time.Now().Add(60*time.Second), time.Now().Add(150*time.Second)
	for {
		err := roleIs(set.Redis[0].Addr(), "slave")
		if err == nil {
			return
		}
		tilted := 0
		for _, addr := range set.Addrs() {
			if tilt, _ := infoOf(addr, "sentinel", "sentinel_tilt"); tilt == "1" {
				tilted++
			}
		}
		if later := time.Now().Add(10 * time.Second); tilted > 0 && later.After(deadline) {
			deadline = later
		}
		if now := time.Now(); now.After(deadline) || now.After(limit) {
			t.Fatalf("old master: %v (%d of %d Sentinels in TILT mode)", err, tilted, len(set.Sentinels))
		}
		time.Sleep(200 * time.Millisecond) // polling the old master's role
	}
}

func TestEtcdClusterLosesAndReplacesMembers(t *testing.T) {
	t.Parallel()
	members := EtcdCluster(t, 3)
	checkEtcd(t, urls(members), 3)
	etcdctl(t, members[1:], "put", "k", "v1")

	members[0].Kill()
	// Two of three still make a quorum, once they have a leader (members[0]
	// may have been it).
	eventually(t, 30*time.Second, func() error { return etcdPut(members[1:], "k", "v2") })
	members[0].Restart()
	eventually(t, 30*time.Second, func() error { return etcdGetIs(members[0], "k", "v2") })

	members[1].RestartEmpty()
	eventually(t, 30*time.Second, func() error { return etcdGetIs(members[1], "k", "v2") })
	checkEtcd(t, urls(members), 3)
	list := etcdctl(t, members[:1], "member", "list")
	if n := strings.Count(list, ", started, "); n != 3 {
		t.Fatalf("after RestartEmpty, member list shows %d started members, want 3:\n%s", n, list)
	}

	// With two members down there is no quorum; restarting them one by
	// one brings it back.
	members[1].Kill()
	members[2].Kill()
	members[1].Restart()
	members[2].Restart()
	eventually(t, 30*time.Second, func() error { return etcdGetIs(members[2], "k", "v2") })

	members[0].Pause()
	short, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, err := exec.CommandContext(short, "etcdctl", "--endpoints="+members[0].Addr(),
		"--command-timeout=300ms", "get", "k").CombinedOutput()
	cancel()
	if err == nil {
		t.Fatal("etcdctl get from a paused member succeeded")
	}
	members[0].Resume()
	eventually(t, 30*time.Second, func() error { return etcdGetIs(members[0], "k", "v2") })
}

func TestPrivateServersStopWithTheirTest(t *testing.T) {
	var addrs []string
	t.Run("owner", func(t *testing.T) {
		addrs = Addrs(RedisNodes(t, 1))
		checkRedis(t, addrs[0])
	})
	var d net.Dialer
	if c, err := d.Dial("tcp", addrs[0]); err == nil {
		_ = c.Close()
		t.Fatalf("%s still accepts connections after its test ended", addrs[0])
	}
}

func TestFailsWithoutPrograms(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if _, err := findProgram("redis-server"); err == nil {
		t.Skip("redis-server is found off PATH too") // never on Debian
	}
	ft := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		RedisNodes(ft, 1)
	}()
	<-done
	if !strings.Contains(ft.msg, "./scripts/test.sh") {
		t.Fatalf("RedisNodes without redis-server failed with %q, want a pointer to ./scripts/test.sh", ft.msg)
	}
}

// fatalRecorder records a Fatalf instead of failing the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func checkRedis(t *testing.T, addr string) {
	t.Helper()
	if got, err := newRedisClient(t, addr).Ping(context.Background()).Result(); err != nil || got != "PONG" {
		t.Fatalf("PING %s = %q, %v; want PONG", addr, got, err)
	}
}

// checkIndependent checks each address is a Redis that answers, and a
// different server from the others (its own run_id), not a replica.
func checkIndependent(t *testing.T, addrs []string) {
	t.Helper()
	ids := map[string]bool{}
	for _, a := range addrs {
		checkRedis(t, a)
		if role := redisInfo(t, a, "replication", "role"); role != "master" {
			t.Fatalf("node %s is a %s, want an independent master", a, role)
		}
		ids[redisInfo(t, a, "server", "run_id")] = true
	}
	if len(ids) != len(addrs) {
		t.Fatalf("%d addresses reach only %d servers", len(addrs), len(ids))
	}
}

func checkRedisCluster(t *testing.T, addrs []string) {
	t.Helper()
	if len(addrs) != 6 {
		t.Fatalf("cluster nodes %v, want 6", addrs)
	}
	ctx := context.Background()
	masters := 0
	for _, a := range addrs {
		c := newRedisClient(t, a)
		info, err := c.ClusterInfo(ctx).Result()
		if err != nil || !strings.Contains(info, "cluster_state:ok") {
			t.Fatalf("CLUSTER INFO on %s = %q, %v; want cluster_state:ok", a, info, err)
		}
		if redisInfo(t, a, "replication", "role") == "master" {
			masters++
		}
	}
	if masters != 3 {
		t.Fatalf("%d masters, want 3", masters)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	defer cc.Close()
	key := "testservers:" + t.Name()
	for i := range 10 {
		k := fmt.Sprintf("%s:%d", key, i) // keys over several slots
		if err := cc.Set(ctx, k, i, time.Minute).Err(); err != nil {
			t.Fatalf("SET %s through the cluster: %v", k, err)
		}
		if got, err := cc.Get(ctx, k).Int(); err != nil || got != i {
			t.Fatalf("GET %s through the cluster = %d, %v", k, got, err)
		}
	}
}

func checkSentinel(t *testing.T, addrs []string, master string) {
	t.Helper()
	if len(addrs) != 3 {
		t.Fatalf("Sentinels %v, want 3", addrs)
	}
	ctx := context.Background()
	for _, a := range addrs {
		sc := redis.NewSentinelClient(&redis.Options{Addr: a})
		m, err := sc.Master(ctx, master).Result()
		_ = sc.Close()
		if err != nil {
			t.Fatalf("SENTINEL MASTER %s on %s: %v", master, a, err)
		}
		if m["flags"] != "master" || m["num-other-sentinels"] != "2" || m["num-slaves"] != "1" {
			t.Fatalf("Sentinel %s sees master %s as %v", a, master, m)
		}
	}
	fc := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: master, SentinelAddrs: addrs, ContextTimeoutEnabled: true,
	})
	defer fc.Close()
	key := "testservers:" + t.Name()
	if err := fc.Set(ctx, key, "v", time.Minute).Err(); err != nil {
		t.Fatalf("SET through the Sentinels: %v", err)
	}
	if got, err := fc.Get(ctx, key).Result(); err != nil || got != "v" {
		t.Fatalf("GET through the Sentinels = %q, %v", got, err)
	}
}

// checkEtcd checks with etcdctl that every endpoint is healthy and that the
// cluster has n members and stores a key.
func checkEtcd(t *testing.T, endpoints []string, n int) {
	t.Helper()
	if len(endpoints) != n {
		t.Fatalf("endpoints %v, want %d", endpoints, n)
	}
	all := strings.Join(endpoints, ",")
	health := runTool(t, "etcdctl", "--endpoints="+all, "endpoint", "health")
	for _, e := range endpoints {
		if !strings.Contains(health, e+" is healthy") {
			t.Fatalf("etcdctl endpoint health does not call %s healthy:\n%s", e, health)
		}
	}
	if list := runTool(t, "etcdctl", "--endpoints="+endpoints[0], "member", "list"); strings.Count(list, ", started, ") != n {
		t.Fatalf("etcdctl member list, want %d started members:\n%s", n, list)
	}
	key := "testservers/" + t.Name()
	runTool(t, "etcdctl", "--endpoints="+all, "put", key, "v")
	if got := runTool(t, "etcdctl", "--endpoints="+endpoints[len(endpoints)-1], "get", "--print-value-only", key); strings.TrimSpace(got) != "v" {
		t.Fatalf("etcdctl get %s = %q, want v", key, got)
	}
}

func checkZooKeeper(t *testing.T, addr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if got, err := zooKeeperWord(ctx, addr, "ruok"); err != nil || got != "imok" {
		t.Fatalf("ZooKeeper ruok on %s = %q, %v; want imok", addr, got, err)
	}
	if got, err := zooKeeperWord(ctx, addr, "srvr"); err != nil || !strings.Contains(got, "Mode: standalone") {
		t.Fatalf("ZooKeeper srvr on %s = %q, %v; want Mode: standalone", addr, got, err)
	}
}

var mysqlDSN = regexp.MustCompile(`^([^:]+):([^@]*)@tcp\(([^:]+):(\d+)\)/(\w+)$`)

// checkMySQL logs in with the DSN's user over TCP and creates, fills and
// reads a table.
func checkMySQL(t *testing.T, dsn string) {
	t.Helper()
	m := mysqlDSN.FindStringSubmatch(dsn)
	if m == nil {
		t.Fatalf("MySQL DSN %q is not user:pass@tcp(host:port)/db", dsn)
	}
	table := "t_" + strings.ToLower(rand8())
	out := runTool(t, "mariadb", "--no-defaults", "-h"+m[3], "-P"+m[4], "-u"+m[1], "-p"+m[2], m[5], "-N", "-e",
		fmt.Sprintf("select 1; CREATE TABLE %[1]s (id INT PRIMARY KEY); INSERT INTO %[1]s VALUES (7); "+
			"SELECT id FROM %[1]s; DROP TABLE %[1]s;", table))
	if strings.Fields(out)[0] != "1" || strings.Fields(out)[1] != "7" {
		t.Fatalf("mariadb answered %q, want 1 then 7", out)
	}
}

// checkPostgres logs in with the DSN over TCP and creates, fills and reads
// a table.
func checkPostgres(t *testing.T, dsn string) {
	t.Helper()
	bin, err := findPostgres()
	if err != nil {
		t.Fatalf("psql: %v", err)
	}
	table := "t_" + strings.ToLower(rand8())
	out := runTool(t, filepath.Join(bin, "psql"), dsn, "-v", "ON_ERROR_STOP=1", "-Atq",
		"-c", "select 1",
		"-c", fmt.Sprintf("CREATE TABLE %[1]s (id int PRIMARY KEY); INSERT INTO %[1]s VALUES (7)", table),
		"-c", fmt.Sprintf("SELECT id FROM %[1]s", table),
		"-c", fmt.Sprintf("DROP TABLE %[1]s", table))
	if got := strings.Fields(out); len(got) != 2 || got[0] != "1" || got[1] != "7" {
		t.Fatalf("psql answered %q, want 1 then 7", out)
	}
}

func newRedisClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// redisInfo returns one field of INFO section, or fails the test.
func redisInfo(t *testing.T, addr, section, field string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := redisString(ctx, addr, "INFO", section)
	if err != nil {
		t.Fatalf("INFO %s on %s: %v", section, addr, err)
	}
	return infoField(info, field)
}

func urls(members []*Server) []string {
	out := make([]string, len(members))
	for i, m := range members {
		out[i] = "http://" + m.Addr()
	}
	return out
}

// etcdctl runs etcdctl against the members, failing the test on an error.
func etcdctl(t *testing.T, members []*Server, args ...string) string {
	t.Helper()
	return runTool(t, "etcdctl", append([]string{"--endpoints=" + strings.Join(urls(members), ",")}, args...)...)
}

// etcdPut puts key through the members.
func etcdPut(members []*Server, key, value string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "etcdctl", "--endpoints="+strings.Join(urls(members), ","),
		"--command-timeout=2s", "put", key, value).CombinedOutput()
	if err != nil {
		return fmt.Errorf("etcdctl put: %w: %s", err, out)
	}
	return nil
}

// etcdGetIs reports nil when the member itself (a serializable read, from
// its own copy) has key set to want.
func etcdGetIs(member *Server, key, want string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "etcdctl", "--endpoints="+member.Addr(), "--command-timeout=2s",
		"get", "--consistency=s", "--print-value-only", key).CombinedOutput()
	if err != nil {
		return fmt.Errorf("etcdctl get on %s: %w: %s", member.Addr(), err, out)
	}
	if got := strings.TrimSpace(string(out)); got != want {
		return fmt.Errorf("%s on %s = %q, want %q", key, member.Addr(), got, want)
	}
	return nil
}

// runTool runs a command-line client, failing the test on an error.
func runTool(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// eventually polls check until it reports nil, failing the test with its
// last error after timeout.
func eventually(t *testing.T, timeout time.Duration, check func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := poll(ctx, nil, func(context.Context) error { return check() }); err != nil {
		t.Fatal(err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

func rand8() string { return rand.Text()[:8] }

// infoOf returns one field of INFO section.
func infoOf(addr, section, field string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := redisString(ctx, addr, "INFO", section)
	return infoField(info, field), err
}

// roleIs reports nil when the Redis at addr has that replication role.
func roleIs(addr, want string) error {
	role, err := infoOf(addr, "replication", "role")
	if err == nil && role != want {
		err = fmt.Errorf("%s is a %s, want a %s", addr, role, want)
	}
	return err
}

func TestSweepStaleRemovesOnlyDeadOwners(t *testing.T) {
	dead, err := os.MkdirTemp(tempBase(), groupPrefix+"test-dead-")
	if err != nil {
		t.Fatal(err)
	}
	live, err := os.MkdirTemp(tempBase(), groupPrefix+"test-live-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dead); _ = os.RemoveAll(live) })
	// pid 1 runs, but not since the start time 1: that owner is gone.
	if err := os.WriteFile(dead+"/owner", []byte("1 1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(live+"/owner", []byte(self()), 0o644); err != nil {
		t.Fatal(err)
	}
	sweepStale()
	if _, err := os.Stat(dead); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the directory of a dead owner is still there: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("the directory of this process was removed: %v", err)
	}
}

// TestZooKeeperServerKillRestartPause: a private ZooKeeper stops answering
// when paused or killed, answers again when resumed or restarted, and keeps
// its znodes across Restart but not RestartEmpty.
func TestZooKeeperServerKillRestartPause(t *testing.T) {
	t.Parallel()
	s := ZooKeeperServer(t)
	checkZooKeeper(t, s.Addr())
	if shared := os.Getenv(EnvZooKeeperAddr); shared == s.Addr() {
		t.Fatalf("ZooKeeperServer is the shared ZooKeeper %s", shared)
	}
	words := func(ctx context.Context) error {
		got, err := zooKeeperWord(ctx, s.Addr(), "ruok")
		if err == nil && got != "imok" {
			err = fmt.Errorf("ruok answered %q", got)
		}
		return err
	}
	s.Pause()
	short, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	if err := words(short); err == nil {
		t.Fatal("a paused ZooKeeper answered ruok")
	}
	cancel()
	s.Resume()
	eventually(t, 30*time.Second, func() error { return words(context.Background()) })

	znodes := func() int { return statNodes(t, zooKeeperWordT(t, s.Addr(), "stat")) }
	empty := znodes()
	runTool(t, "/usr/share/zookeeper/bin/zkCli.sh", "-server", s.Addr(), "create", "/testservers", "v")
	before := znodes()
	if before != empty+1 {
		t.Fatalf("ZooKeeper has %d znodes after a create, want %d", before, empty+1)
	}
	s.Kill()
	short, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	if err := words(short); err == nil {
		t.Fatal("a killed ZooKeeper answered ruok")
	}
	cancel()
	s.Restart()
	checkZooKeeper(t, s.Addr())
	if after := znodes(); after != before {
		t.Fatalf("after Restart ZooKeeper has %d znodes, want the %d it had", after, before)
	}
	s.RestartEmpty()
	checkZooKeeper(t, s.Addr())
	if after := znodes(); after != empty {
		t.Fatalf("after RestartEmpty ZooKeeper has %d znodes, want %d", after, empty)
	}
}

// TestPostgresServerKillRestartPause: a private PostgreSQL answers nothing
// on an open connection while paused (its backends are paused too), and
// keeps its tables across Kill and Restart.
func TestPostgresServerKillRestartPause(t *testing.T) {
	t.Parallel()
	s, dsn := PostgresServer(t)
	if shared := os.Getenv(EnvPostgresDSN); shared == dsn {
		t.Fatalf("PostgresServer is the shared PostgreSQL")
	}
	checkPostgres(t, dsn)
	bin, err := findPostgres()
	if err != nil {
		t.Fatal(err)
	}
	psql := filepath.Join(bin, "psql")
	runTool(t, psql, dsn, "-v", "ON_ERROR_STOP=1", "-Atqc", "CREATE TABLE kept (id int); INSERT INTO kept VALUES (7)")

	// A session that is open when the server pauses: its query must not
	// answer until the server resumes.
	cmd := exec.Command(psql, dsn, "-Atq")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	if _, err := io.WriteString(stdin, "select 1;\n"); err != nil {
		t.Fatal(err)
	}
	if got := <-lines; got != "1" { // the session's backend is up
		t.Fatalf("psql answered %q, want 1", got)
	}
	s.Pause()
	if _, err := io.WriteString(stdin, "select 2;\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-lines:
		t.Fatalf("psql on a paused PostgreSQL answered %q", got)
	case <-time.After(time.Second): // the time it is given to answer
	}
	s.Resume()
	select {
	case got := <-lines:
		if got != "2" {
			t.Fatalf("psql after Resume answered %q, want 2", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("psql did not answer after Resume")
	}
	_ = stdin.Close()

	s.Kill()
	if _, err := exec.Command(psql, dsn, "-Atc", "select 1").CombinedOutput(); err == nil {
		t.Fatal("a killed PostgreSQL answered")
	}
	s.Restart()
	if got := strings.TrimSpace(runTool(t, psql, dsn, "-Atc", "SELECT id FROM kept")); got != "7" {
		t.Fatalf("after Kill and Restart, SELECT id FROM kept = %q, want 7", got)
	}
}

func zooKeeperWordT(t *testing.T, addr, word string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := zooKeeperWord(ctx, addr, word)
	if err != nil {
		t.Fatalf("ZooKeeper %s on %s: %v", word, addr, err)
	}
	return got
}

// statNodes returns the "Node count" of a ZooKeeper stat answer.
func statNodes(t *testing.T, stat string) int {
	t.Helper()
	m := regexp.MustCompile(`Node count: (\d+)`).FindStringSubmatch(stat)
	if m == nil {
		t.Fatalf("no node count in ZooKeeper stat: %q", stat)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
