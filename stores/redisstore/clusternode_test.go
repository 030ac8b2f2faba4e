package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redisstore/internal/redistest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// clusterNode starts a redis-server in cluster mode that owns all 16384
// slots: a one-node Redis Cluster, which enforces the slot rules (CROSSSLOT)
// as a larger one does. It is stopped when the test ends. Without
// redis-server on PATH the test skips when REQLOCK_REDIS_ADDR names an outside
// Redis (which cannot be switched to cluster mode), and fails otherwise.
func clusterNode(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv(testredis.EnvAddr) != "" {
			t.Skipf("no redis-server on PATH to start a cluster node; %s names an outside Redis", testredis.EnvAddr)
		}
		t.Fatalf("no redis-server on PATH: install it or run ./scripts/test.sh")
	}
	var errs []error
	for range 3 { // the port may be taken between unusedAddr and the start
		addr, err := startClusterNode(t, path)
		if err == nil {
			return addr
		}
		errs = append(errs, err)
	}
	t.Fatalf("cluster node did not start: %v", errors.Join(errs...))
	return ""
}

// startClusterNode starts one node on a free port and gives it every slot.
func startClusterNode(t *testing.T, path string) (string, error) {
	addr := unusedAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	dir := t.TempDir()
	cmd := exec.Command(path, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	exited := make(chan struct{})
	started := make(chan error, 1)
	// The process is started from a goroutine locked to its thread, which
	// lives until the process exits: see dieWithParentThread.
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		defer close(exited)
		dieWithParentThread(cmd)
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
	}()
	if err := <-started; err != nil {
		return "", err
	}
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer client.Close()
	ctx := context.Background()
	ready := func() error {
		info, err := client.ClusterInfo(ctx).Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "cluster_state:ok") {
			if err := client.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil &&
				!strings.Contains(err.Error(), "already busy") {
				return err
			}
			return errors.New("cluster_state is not ok yet")
		}
		return nil
	}
	deadline := time.Now().Add(10 * time.Second)
	ticker := time.NewTicker(10 * time.Millisecond)
	defer ticker.Stop()
	for {
		err := ready()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			stop()
			return "", fmt.Errorf("port %s: cluster not ready within 10s: %w", port, err)
		}
		select {
		case <-exited:
			return "", fmt.Errorf("port %s: redis-server exited: %w", port, err)
		case <-ticker.C:
		}
	}
	t.Cleanup(stop)
	return addr, nil
}

func clusterClient(t *testing.T, addr string) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestOnOneNodeCluster runs the conformance suite through a
// *redis.ClusterClient on a real (one-node) Redis Cluster, declaring
// release notification and fair mode, and checks that the server's
// CROSSSLOT refusal of keys in two slots comes back as ErrCrossSlot (and so
// stores.ErrInvalid) when the client check cannot see the cluster.
func TestOnOneNodeCluster(t *testing.T) {
	addr := clusterNode(t)
	client := clusterClient(t, addr)
	t.Run("Conformance", func(t *testing.T) {
		runConformance(t, client, func(t *testing.T) (redis.Scripter, []*faultproxy.Proxy) {
			dial, proxies := redistest.ProxiedDialer(t, []string{addr})
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, Dialer: dial, ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			return c, proxies
		})
	})

	t.Run("CrossSlotReply", func(t *testing.T) {
		// Behind a wrapper the store cannot tell it talks to a Cluster,
		// so the keys reach Redis, which refuses them.
		s := newStore(t, client)
		hidden := newStore(t, scripterOnly{client})
		if hidden.routing != RouteOne {
			t.Fatal("the wrapper did not hide the Cluster")
		}
		ctx := context.Background()
		p := testredis.Prefix(t)
		keys := []string{p + "a", p + "b"}
		if slot(keys[0]) == slot(keys[1]) {
			t.Fatal("test keys share a slot")
		}
		_, err := hidden.Acquire(ctx, keys, "t", time.Minute)
		var rerr redis.Error
		if !errors.Is(err, ErrCrossSlot) || !errors.Is(err, stores.ErrInvalid) || !errors.As(err, &rerr) ||
			!strings.Contains(err.Error(), strconv.Quote(keys[1])) {
			t.Fatalf("Acquire of keys in two slots on a Cluster: got %v, want ErrCrossSlot and ErrInvalid wrapping Redis's reply", err)
		}
		for _, keep := range []time.Duration{0, time.Minute} {
			if err := hidden.Release(ctx, keys, "t", keep); !errors.Is(err, ErrCrossSlot) || !errors.Is(err, stores.ErrInvalid) {
				t.Fatalf("Release with keep %v: got %v, want ErrCrossSlot and ErrInvalid", keep, err)
			}
		}
		if err := hidden.Refresh(ctx, keys, "t", time.Minute); !errors.Is(err, ErrCrossSlot) || !errors.Is(err, stores.ErrInvalid) {
			t.Fatalf("Refresh: got %v, want ErrCrossSlot and ErrInvalid", err)
		}
		// The store on the bare client refuses before sending.
		if _, err := s.Acquire(ctx, keys, "t", time.Minute); !errors.Is(err, ErrCrossSlot) || !errors.Is(err, stores.ErrInvalid) {
			t.Fatalf("Acquire through the ClusterClient: got %v, want ErrCrossSlot and ErrInvalid", err)
		}
		// One key with '}' and no hash tag has its fence key in another
		// slot: Redis refuses the one-key script, and the store maps it.
		odd := []string{p + "x{}{y}"}
		if slot(fenceKey(odd[0])) == slot(odd[0]) {
			t.Fatal("the odd key shares a slot with its fence key")
		}
		for name, st := range map[string]*Store{"ClusterClient": s, "hidden": hidden} {
			if _, err := st.Acquire(ctx, odd, "t", time.Minute); !errors.Is(err, ErrCrossSlot) || !errors.Is(err, stores.ErrInvalid) {
				t.Fatalf("Acquire of one key whose fence key is in another slot, through the %s: got %v, want ErrCrossSlot and ErrInvalid", name, err)
			}
		}
		for _, k := range append(keys, odd...) {
			if n := client.Exists(ctx, k).Val(); n != 0 {
				t.Fatalf("a refused call left %q behind", k)
			}
		}
	})
}
