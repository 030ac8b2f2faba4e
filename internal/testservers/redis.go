package testservers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// SentinelMasterName is the name the Sentinels of SentinelSet know their
// master by; scripts/test.sh uses it too (REQLOCK_SENTINEL_MASTER).
const SentinelMasterName = "reqlock"

const (
	sharedClusterNodeTimeout  = 5 * time.Second // no failover from a node slowed by a busy machine
	privateClusterNodeTimeout = 3 * time.Second // a killed master fails over within seconds
)

// Sentinel is a private Sentinel set: one master, one replica and three
// Sentinels (quorum 2) that fail the master over 1s after it stops
// answering.
type Sentinel struct {
	// Master is the name the Sentinels know the master by.
	Master string
	// Redis holds the monitored servers: Redis[0] starts as the master,
	// Redis[1] as its replica.
	Redis []*Server
	// Sentinels holds the three Sentinels.
	Sentinels []*Server
}

// Addrs returns the Sentinels' addresses.
func (s *Sentinel) Addrs() []string { return Addrs(s.Sentinels) }

// MasterAddr returns the address of the master, as the first Sentinel that
// answers reports it (SENTINEL GET-MASTER-ADDR-BY-NAME).
func (s *Sentinel) MasterAddr() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var errs []error
	for _, sn := range s.Sentinels {
		v, err := redisDo(ctx, sn.Addr(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.Master)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if hp, ok := v.([]any); ok && len(hp) == 2 {
			host, _ := hp[0].(string)
			port, _ := hp[1].(string)
			return host + ":" + port, nil
		}
		errs = append(errs, fmt.Errorf("sentinel %s: reply %v", sn.Addr(), v))
	}
	return "", fmt.Errorf("no Sentinel knows master %q: %w", s.Master, errors.Join(errs...))
}

// RedisNodes starts n independent Redis servers for the calling test, as
// Redlock uses. They keep their keys across Restart (an append-only file
// each) and lose them with RestartEmpty.
func RedisNodes(tb testing.TB, n int) []*Server {
	tb.Helper()
	needPrivate(tb, "RedisNodes", findRedis)
	return private(tb, "redis-nodes", func(g *group) ([]*Server, error) {
		return startRedisNodes(tb, g, n, true)
	})
}

// RedisCluster starts a Redis Cluster of 3 masters and 3 replicas for the
// calling test and waits until every node reports cluster_state:ok and each
// replica is in sync. The nodes are in the order given to redis-cli --cluster
// create, which makes the first three masters; CLUSTER NODES tells the roles
// after a failover. A master that stops answering is failed over after its
// 3s node timeout. Nodes keep their keys and cluster identity across Restart.
func RedisCluster(tb testing.TB) []*Server {
	tb.Helper()
	needPrivate(tb, "RedisCluster", findRedisCLI)
	return private(tb, "redis-cluster", func(g *group) ([]*Server, error) {
		return startRedisCluster(tb, g, true, privateClusterNodeTimeout)
	})
}

// SentinelSet starts a Sentinel set for the calling test, so that it can
// kill the master and watch the failover, and waits until each Sentinel sees
// the master, its replica and the two other Sentinels.
func SentinelSet(tb testing.TB) *Sentinel {
	tb.Helper()
	needPrivate(tb, "SentinelSet", findRedis)
	return private(tb, "sentinel", func(g *group) (*Sentinel, error) {
		return startSentinelSet(tb, g, true)
	})
}

// Addrs returns the servers' addresses, in order.
func Addrs(servers []*Server) []string {
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.Addr()
	}
	return addrs
}

func findRedis() error {
	_, err := findProgram("redis-server")
	return err
}

func findRedisCLI() error {
	if err := findRedis(); err != nil {
		return err
	}
	_, err := findProgram("redis-cli")
	return err
}

// newRedis prepares a redis-server (not started) on port with its
// configuration file; persist keeps its keys in an append-only file, which
// a process kill does not lose (Redis writes it before it replies).
func newRedis(tb testing.TB, g *group, kind string, port int, persist bool, conf ...string) (*Server, error) {
	s, err := g.newServer(tb, kind, port)
	if err != nil {
		return nil, err
	}
	lines := []string{
		"port " + strconv.Itoa(port), "bind 127.0.0.1", "protected-mode no",
		"dir " + strconv.Quote(s.dir), "daemonize no", `logfile ""`, `save ""`,
		"repl-diskless-sync-delay 0", // a replica syncs at once, not after 5s
	}
	if persist {
		lines = append(lines, "appendonly yes", "appendfsync no")
	} else {
		lines = append(lines, "appendonly no")
	}
	lines = append(lines, conf...)
	confPath := s.dir + "/redis.conf"
	if err := os.WriteFile(confPath, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		return nil, err
	}
	s.args = func() []string { return []string{"redis-server", confPath} }
	s.ready = func(ctx context.Context, pid int) error { return redisIs(ctx, s.addr, pid) }
	s.wipe = func() error {
		return errors.Join(os.RemoveAll(s.dir+"/appendonlydir"), os.RemoveAll(s.dir+"/dump.rdb"))
	}
	return s, nil
}

// redisIs reports nil when the Redis (or Sentinel) at addr is process pid.
func redisIs(ctx context.Context, addr string, pid int) error {
	info, err := redisString(ctx, addr, "INFO", "server")
	if err != nil {
		return err
	}
	if got := infoField(info, "process_id"); got != strconv.Itoa(pid) {
		return fmt.Errorf("%s is process %s, not %d", addr, got, pid)
	}
	// INFO answers while a restarted Redis still loads its data, which
	// every other command refuses (LOADING) until it is done. A Sentinel
	// has no persistence section: no loading field, nothing to wait for.
	persistence, err := redisString(ctx, addr, "INFO", "persistence")
	if err != nil {
		return err
	}
	if infoField(persistence, "loading") == "1" {
		return fmt.Errorf("%s is still loading its data", addr)
	}
	return nil
}

func startRedisNodes(tb testing.TB, g *group, n int, persist bool) ([]*Server, error) {
	ports, err := freePorts(n)
	if err != nil {
		return nil, err
	}
	servers := make([]*Server, n)
	for i, p := range ports {
		if servers[i], err = newRedis(tb, g, "redis-server", p, persist); err != nil {
			return nil, err
		}
	}
	return servers, startAll(servers...)
}

func startRedisCluster(tb testing.TB, g *group, persist bool, nodeTimeout time.Duration) ([]*Server, error) {
	ports, err := freePorts(12)
	if err != nil {
		return nil, err
	}
	nodes := make([]*Server, 6)
	for i := range nodes {
		// The bus port is set too: the default, port+10000, may be taken.
		nodes[i], err = newRedis(tb, g, "redis-server (cluster)", ports[i], persist,
			"cluster-enabled yes", "cluster-port "+strconv.Itoa(ports[6+i]),
			"cluster-config-file nodes.conf", // in its dir, kept by RestartEmpty
			"cluster-node-timeout "+strconv.FormatInt(nodeTimeout.Milliseconds(), 10))
		if err != nil {
			return nil, err
		}
	}
	if err := startAll(nodes...); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, Addrs(nodes)...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if _, err := run(ctx, g.dir, nil, "redis-cli", args...); err != nil {
		return nil, err
	}
	if err := poll(ctx, nil, func(ctx context.Context) error { return clusterOK(ctx, Addrs(nodes), len(nodes)) }); err != nil {
		return nil, fmt.Errorf("redis cluster: %w", err)
	}
	return nodes, nil
}

// clusterOK reports nil when every node at addrs sees the cluster healthy
// (state ok, all slots covered, known nodes known) and every replica's link
// to its master is up.
func clusterOK(ctx context.Context, addrs []string, known int) error {
	for _, a := range addrs {
		info, err := redisString(ctx, a, "CLUSTER", "INFO")
		if err != nil {
			return err
		}
		if infoField(info, "cluster_state") != "ok" || infoField(info, "cluster_slots_ok") != "16384" ||
			infoField(info, "cluster_known_nodes") != strconv.Itoa(known) {
			return fmt.Errorf("node %s: %s", a, strings.Join(strings.Fields(info), " "))
		}
		if err := replicaOK(ctx, a); err != nil {
			return err
		}
	}
	return nil
}

// replicaOK reports nil when the Redis at addr is a master or a replica
// whose link to its master is up.
func replicaOK(ctx context.Context, addr string) error {
	info, err := redisString(ctx, addr, "INFO", "replication")
	if err != nil {
		return err
	}
	if infoField(info, "role") == "slave" && infoField(info, "master_link_status") != "up" {
		return fmt.Errorf("replica %s: link to its master is %s", addr, infoField(info, "master_link_status"))
	}
	return nil
}

func startSentinelSet(tb testing.TB, g *group, persist bool) (*Sentinel, error) {
	ports, err := freePorts(5)
	if err != nil {
		return nil, err
	}
	set := &Sentinel{Master: SentinelMasterName}
	master, err := newRedis(tb, g, "redis-server (sentinel master)", ports[0], persist)
	if err != nil {
		return nil, err
	}
	replica, err := newRedis(tb, g, "redis-server (sentinel replica)", ports[1], persist,
		"replicaof 127.0.0.1 "+strconv.Itoa(ports[0]))
	if err != nil {
		return nil, err
	}
	set.Redis = []*Server{master, replica}
	if err := startAll(master, replica); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	// A Sentinel learns of the replica from the master's INFO, which it
	// asks for every 10s: the replica must be there at its first look.
	if err := poll(ctx, nil, func(ctx context.Context) error { return replicaOK(ctx, replica.addr) }); err != nil {
		return nil, err
	}
	for _, p := range ports[2:] {
		s, err := g.newServer(tb, "redis-sentinel", p)
		if err != nil {
			return nil, err
		}
		conf := strings.Join([]string{
			"port " + strconv.Itoa(p), "bind 127.0.0.1", "dir " + strconv.Quote(s.dir),
			"daemonize no", `logfile ""`,
			fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2", set.Master, ports[0]),
			fmt.Sprintf("sentinel down-after-milliseconds %s 1000", set.Master),
			fmt.Sprintf("sentinel failover-timeout %s 3000", set.Master),
			fmt.Sprintf("sentinel parallel-syncs %s 1", set.Master),
		}, "\n") + "\n"
		confPath := s.dir + "/sentinel.conf" // a Sentinel rewrites it with what it learns
		if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		s.args = func() []string { return []string{"redis-server", confPath, "--sentinel"} }
		s.ready = func(ctx context.Context, pid int) error { return redisIs(ctx, s.addr, pid) }
		set.Sentinels = append(set.Sentinels, s)
	}
	if err := startAll(set.Sentinels...); err != nil {
		return nil, err
	}
	want := fmt.Sprintf("name=%s,status=ok,address=%s,slaves=1,sentinels=3", set.Master, master.addr)
	for _, s := range set.Sentinels {
		err := poll(ctx, nil, func(ctx context.Context) error {
			info, err := redisString(ctx, s.addr, "INFO", "sentinel")
			if err != nil {
				return err
			}
			if !strings.Contains(info, want+"\r\n") {
				return fmt.Errorf("sentinel %s: %s, want %s", s.addr, infoField(info, "master0"), want)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return set, nil
}
