package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/bench/internal/redislockshop"
)

// commandStats reads INFO commandstats: for each command (lower case, with
// "|subcommand"), calls plus rejected_calls, and under usecKey its usec.
// Commands that Lua scripts call are counted too, under their own names.
func commandStats(ctx context.Context, c *redis.Client) (map[string]int64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("INFO commandstats: %w", err)
	}
	stats := map[string]int64{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, fields, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		for f := range strings.SplitSeq(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			if k != "calls" && k != "rejected_calls" && k != "usec" {
				continue
			}
			x, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("INFO commandstats: %q: %w", sc.Text(), err)
			}
			if k == "usec" {
				stats[usecKey(name)] += x
			} else {
				stats[name] += x
			}
		}
	}
	return stats, nil
}

// usecKey is the key under which commandStats keeps a command's usec.
func usecKey(command string) string { return command + " usec" }

// isUsec reports whether a commandStats key is a usec one.
func isUsec(key string) bool { return strings.HasSuffix(key, " usec") }

// isOverhead reports whether a command (as commandStats names it) is
// connection set-up, or INFO, which httpbench itself sends: neither serves
// a request.
func isOverhead(name string) bool {
	switch name {
	case "hello", "auth", "select", "info", "client", "ping":
		return true
	}
	return strings.HasPrefix(name, "client|")
}

// commandDelta is after minus before, without the overhead commands and
// leaving out those that did not change.
func commandDelta(before, after map[string]int64) map[string]int64 {
	d := map[string]int64{}
	for name, n := range after {
		base, _ := strings.CutSuffix(name, " usec")
		if isOverhead(base) {
			continue
		}
		if diff := n - before[name]; diff != 0 {
			d[name] = diff
		}
	}
	return d
}

// addDelta adds d to into.
func addDelta(into, d map[string]int64) {
	for k, v := range d {
		into[k] += v
	}
}

// commandCount sums the calls of d.
func commandCount(d map[string]int64) int64 {
	var n int64
	for k, v := range d {
		if !isUsec(k) {
			n += v
		}
	}
	return n
}

// scriptCalls sums the calls of EVAL and EVALSHA in d: both services make
// every Redis call of a deduction as a script, so this is their round trips.
func scriptCalls(d map[string]int64) int64 {
	return d["evalsha"] + d["eval"] + d["evalsha_ro"] + d["eval_ro"]
}

// scriptMicros sums the usec of the script calls in d: the time Redis spent
// running them, the commands they call included.
func scriptMicros(d map[string]int64) int64 {
	return d[usecKey("evalsha")] + d[usecKey("eval")] + d[usecKey("evalsha_ro")] + d[usecKey("eval_ro")]
}

// redisVersion returns the server's redis_version.
func redisVersion(ctx context.Context, c *redis.Client) (string, error) {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v, nil
		}
	}
	return "unknown", nil
}

// stockMismatches reads the stock of every SKU of t and returns those that
// differ from initial less their 200 answers, as "sku: got N, want M".
func stockMismatches(ctx context.Context, c *redis.Client, t *target, initial int64) ([]string, error) {
	cmds := make([]*redis.StringCmd, len(t.skus))
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, sku := range t.skus {
			cmds[i] = p.HGet(ctx, redislockshop.StockPrefix+sku, "stock")
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("reading the stock: %w", err)
	}
	var bad []string
	for i, cmd := range cmds {
		got := initial
		if s, err := cmd.Result(); err == nil {
			if got, err = strconv.ParseInt(s, 10, 64); err != nil {
				return nil, fmt.Errorf("stock of %s: %q: %w", t.skus[i], s, err)
			}
		} else if !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("stock of %s: %w", t.skus[i], err)
		}
		if want := initial - t.ok[i]; got != want {
			bad = append(bad, fmt.Sprintf("%s: stock %d, want %d", t.skus[i], got, want))
		}
	}
	return bad, nil
}

// deleteKeys deletes every key whose name contains marker.
func deleteKeys(ctx context.Context, c *redis.Client, marker string) (int, error) {
	n := 0
	iter := c.Scan(ctx, 0, "*"+marker+"*", 1000).Iterator()
	var batch []string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := c.Del(ctx, batch...).Err()
		n += len(batch)
		batch = batch[:0]
		return err
	}
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 500 {
			if err := flush(); err != nil {
				return n, err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return n, err
	}
	return n, flush()
}
