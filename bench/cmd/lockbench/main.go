// Command lockbench measures distributed locks on Redis side by side: reqlock,
// github.com/bsm/redislock and github.com/go-redsync/redsync, under the same
// workloads against the same Redis in one run.
//
// For each workload and library it reports acquisitions per second, the wait
// for a grant (p50, p99, max), timeouts, the handover latency from one holder's
// release to the next holder's grant, Redis commands per acquisition (from
// INFO commandstats, and as client round trips counted by a go-redis hook), and
// lost updates of a deliberately non-atomic counter increment done inside the
// lock. It then prints the ratios of reqlock to bsm/redislock against the
// targets of issue 3.
//
// Usage:
//
//	lockbench -redis 127.0.0.1:6379 [-workload all|hot,spread,multi] [-lib all|reqlock,redislock,redsync]
//	          [-duration 10s] [-json results.json] [-charts dir] [flags]
//
// With -charts it also writes, per workload, an SVG chart of the wait
// distribution of every library (wait against percentile, both on log-like
// scales) to dir/wait-<workload>.svg.
//
// Workloads:
//
//	hot     1 key, -waiters goroutines (50) in one process, each looping
//	        acquire, -hold (1ms) of work, release
//	spread  -keys keys (1000), -workers goroutines (50), no hold; worker w
//	        cycles through keys w, w+workers, w+2*workers, ... so no two
//	        workers share a key when workers divides keys: every cycle is
//	        uncontended
//	multi   the hot workload split over -procs processes (4): -waiters in
//	        total, divided as evenly as possible, all on one key
//
// The benchmark writes only keys under "lockbench:<run id>:" (and the same
// names under reqlock's "reqlock:" prefix), and deletes them after each run.
// It flushes nothing. Point it at a Redis nobody else uses while it runs:
// INFO commandstats counts every client's commands. bench/run.sh starts a
// private redis-server on a free loopback port and runs lockbench against it.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
