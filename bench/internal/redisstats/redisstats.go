// Package redisstats reads what lockbench and httpbench measure on the Redis
// server: INFO commandstats, per command, the server's CPU time (INFO cpu)
// and its version.
//
// Stats, as CommandStats returns them, map each command (lower case, a
// subcommand as "command|subcommand", as INFO names it) to its calls plus
// rejected_calls, and UsecKey(command) to its usec: the time Redis spent in
// it, the commands a script calls included. Commands that Lua scripts call
// with redis.call are counted too, under their own names.
package redisstats

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// CommandStats reads INFO commandstats from c.
func CommandStats(ctx context.Context, c *redis.Client) (map[string]int64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("INFO commandstats: %w", err)
	}
	return ParseCommandStats(info)
}

// ParseCommandStats parses the text of INFO commandstats: one line per
// command, "cmdstat_<name>:calls=N,usec=N,usec_per_call=F,rejected_calls=N,
// failed_calls=N" (rejected_calls and failed_calls since Redis 6.2). It
// keeps calls plus rejected_calls (commands refused before they ran; calls
// already counts the failed ones) and usec. A command named on two lines is
// an error: INFO has one line per command, so a repeat means the text is not
// what this parser takes it for, and neither summing nor keeping one line
// would be known to be right.
func ParseCommandStats(info string) (map[string]int64, error) {
	stats := map[string]int64{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, fields, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		if _, dup := stats[name]; dup {
			return nil, fmt.Errorf("INFO commandstats: %s on two lines", name)
		}
		var calls, usec int64
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
				usec = x
			} else {
				calls += x
			}
		}
		stats[name] = calls
		stats[UsecKey(name)] = usec
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("INFO commandstats: %w", err)
	}
	return stats, nil
}

// usecSuffix ends the key of a command's usec.
const usecSuffix = " usec"

// UsecKey is the key under which CommandStats keeps a command's usec, beside
// its calls under the command's name. lockbench's JSON shows these keys
// ("evalsha usec").
func UsecKey(command string) string { return command + usecSuffix }

// IsUsec reports whether a key of the stats is a usec one.
func IsUsec(key string) bool { return strings.HasSuffix(key, usecSuffix) }

// IsOverhead reports whether a command, as CommandStats names it, or as
// go-redis's Cmder.Name gives it, is one that neither takes part in a lock
// nor serves a request: the connection set-up go-redis sends when it dials
// (HELLO, AUTH, SELECT, CLIENT SETINFO and the other CLIENT subcommands),
// the benchmarks' own INFO, and PING. Both programs ping outside their
// measured windows (lockbench warms its pools with it before the first
// snapshot), but examples/inventory pings Redis once after it prints its
// listening line, which can land in httpbench's first round; no lock library
// or service pings to serve a request.
func IsOverhead(command string) bool {
	switch command {
	case "hello", "auth", "select", "info", "client", "ping":
		return true
	}
	return strings.HasPrefix(command, "client|")
}

// Delta is after minus before, for every key of after (calls and usec
// alike), leaving out those that did not change.
func Delta(before, after map[string]int64) map[string]int64 {
	d := map[string]int64{}
	for k, n := range after {
		if diff := n - before[k]; diff != 0 {
			d[k] = diff
		}
	}
	return d
}

// WithoutOverhead returns d without the calls and usec of the commands
// IsOverhead names.
func WithoutOverhead(d map[string]int64) map[string]int64 {
	out := make(map[string]int64, len(d))
	for k, v := range d {
		if command, _ := strings.CutSuffix(k, usecSuffix); !IsOverhead(command) {
			out[k] = v
		}
	}
	return out
}

// scriptCommands are the commands that run a Lua script. Every library and
// service measured calls its scripts with EVALSHA, falling back to EVAL;
// the read-only variants are counted alike should one use them.
var scriptCommands = [...]string{"eval", "evalsha", "eval_ro", "evalsha_ro"}

// ScriptCalls sums the calls of the script commands in d.
func ScriptCalls(d map[string]int64) int64 {
	var n int64
	for _, c := range scriptCommands {
		n += d[c]
	}
	return n
}

// ScriptMicros sums the usec of the script commands in d: the time Redis
// spent running scripts, the commands they call included.
func ScriptMicros(d map[string]int64) int64 {
	var n int64
	for _, c := range scriptCommands {
		n += d[UsecKey(c)]
	}
	return n
}

// RedisVersion returns the server's redis_version, from INFO server, or
// "unknown" when INFO does not say.
func RedisVersion(ctx context.Context, c *redis.Client) (string, error) {
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

// ServerCPU returns the CPU time the Redis server has used, user plus
// system (used_cpu_user + used_cpu_sys of INFO cpu).
func ServerCPU(ctx context.Context, c *redis.Client) (time.Duration, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO cpu: %w", err)
	}
	return ParseServerCPU(info)
}

// ParseServerCPU returns used_cpu_user + used_cpu_sys of an INFO cpu
// answer; an answer with neither is an error.
func ParseServerCPU(info string) (time.Duration, error) {
	var total float64
	found := 0
	for line := range strings.SplitSeq(info, "\n") {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "used_cpu_user" && name != "used_cpu_sys") {
			continue
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu: %q: %w", line, err)
		}
		total += x
		found++
	}
	if found == 0 {
		return 0, errors.New("INFO cpu: no used_cpu_user or used_cpu_sys")
	}
	return time.Duration(total * float64(time.Second)), nil
}
