package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/bench/internal/redisstats"
)

// newLibClient returns the client a library runs on: ContextTimeoutEnabled
// (which reqlock requires, and which lets every library's wait limit bound its
// Redis calls), the pool size of -poolsize, and a hook that counts round trips.
func newLibClient(cfg config) (*redis.Client, *roundTripCounter) {
	client := redis.NewClient(&redis.Options{
		Addr:                  cfg.Redis,
		ContextTimeoutEnabled: true,
		PoolSize:              cfg.PoolSize,
	})
	counter := &roundTripCounter{}
	client.AddHook(counter)
	return client, counter
}

// newHarnessClient returns the benchmark's own client, without the hook: the
// counter increments inside the lock, INFO, and cleanup go through it. Its pool
// is large enough that no goroutine queues for a connection.
func newHarnessClient(cfg config) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                  cfg.Redis,
		ContextTimeoutEnabled: true,
		PoolSize:              max(cfg.Waiters, cfg.Workers, cfg.childWaiters) + 4,
	})
}

// warmPool opens n connections of client (holding them all at once, so each
// is a separate one) and pings on each, so that dialing does not fall into the
// measured window.
func warmPool(ctx context.Context, client *redis.Client, n int) error {
	n = min(n, client.Options().PoolSize)
	conns := make([]*redis.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range n {
		c := client.Conn()
		conns = append(conns, c)
		if err := c.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("warm up the pool: %w", err)
		}
	}
	return nil
}

// roundTripCounter is a go-redis hook that counts top-level round trips: a
// command, or a pipeline, is one. The connection handshake (HELLO, AUTH,
// SELECT, CLIENT SETINFO, ...) that go-redis sends when it dials, and any
// other command redisstats.IsOverhead names (warmPool's PINGs), is counted
// apart, in handshakes.
type roundTripCounter struct {
	trips      atomic.Int64
	handshakes atomic.Int64
}

// DialHook implements redis.Hook; it counts nothing.
func (c *roundTripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (c *roundTripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (c *roundTripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.count(cmds...)
		return next(ctx, cmds)
	}
}

func (c *roundTripCounter) count(cmds ...redis.Cmder) {
	for _, cmd := range cmds {
		if redisstats.IsOverhead(cmd.Name()) {
			c.handshakes.Add(1)
			return
		}
	}
	c.trips.Add(1)
}

// lockCommands sums delta over the commands that take part in locking: all
// but connection set-up, INFO and PING (redisstats.IsOverhead), and minus the harness's own GET and SET of
// the lost-update counter (harnessGets, harnessSets), which Redis counts
// under the same names as the GET and SET a library's script may call.
func lockCommands(delta map[string]int64, harnessGets, harnessSets int64) int64 {
	var n int64
	for name, d := range delta {
		if !redisstats.IsOverhead(name) && !redisstats.IsUsec(name) {
			n += d
		}
	}
	return n - harnessGets - harnessSets
}

// serverCPU returns the CPU time the Redis server has used, user plus
// system, from INFO cpu.
func serverCPU(ctx context.Context, c *redis.Client) (time.Duration, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO cpu: %w", err)
	}
	var total float64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok || (name != "used_cpu_user" && name != "used_cpu_sys") {
			continue
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu: %q: %w", sc.Text(), err)
		}
		total += x
	}
	return time.Duration(total * float64(time.Second)), nil
}

// percentile returns the nearest-rank p-quantile (0 < p <= 1) of sorted:
// the ceil(p*n)-th smallest. A p*n a rounding error above a whole number
// (0.07*100 is 7.000000000000001) counts as that number.
func percentile(sorted []int64, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted))-1e-6)) - 1
	return time.Duration(sorted[min(max(i, 0), len(sorted)-1)])
}

// handovers pairs each grant with the latest release before it on the same
// key, and returns grant minus release, in nanoseconds, for the grants whose
// lock call had started by that release: the new holder was already waiting
// when the lock came free. A holder that re-acquires right after its own
// release, and every cycle of an uncontended key, is not a handover.
func handovers(grants []grant, releases []release) []int64 {
	byKey := map[int32][]int64{}
	for _, r := range releases {
		byKey[r.key] = append(byKey[r.key], r.at)
	}
	for _, ts := range byKey {
		slices.Sort(ts)
	}
	var out []int64
	for _, g := range grants {
		ts := byKey[g.key]
		i := sort.Search(len(ts), func(i int) bool { return ts[i] > g.at }) - 1
		if i < 0 || g.start > ts[i] {
			continue
		}
		out = append(out, g.at-ts[i])
	}
	return out
}
