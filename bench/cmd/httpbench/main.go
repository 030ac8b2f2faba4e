// Command httpbench measures the uncontended HTTP throughput of the example
// service examples/inventory (reqlock's middleware on gin, fenced writes)
// against the same service hand-written with github.com/bsm/redislock
// (package redislockshop), on one Redis, in one run.
//
// Both services run as processes of their own on loopback ports: the
// example is its real binary (-inventory, or built from -reqlock-dir), run
// with -redis, -addr 127.0.0.1:0, -stock, -wait and -ttl; the baseline is
// this binary re-executed with a hidden -serve-baseline flag. Each gets the
// same load in turn: -clients HTTP clients (keep-alive, one connection
// each) looping POST /skus/{id}/deduct with {"qty":1} over -skus SKUs,
// client c cycling through SKUs c, c+clients, c+2*clients, ..., so that no
// two requests ever want the same lock (uncontended). A warm-up of -warmup
// per service comes first (scripts loaded, connection pools filled, every
// SKU's keys created), then -rounds rounds, each -duration of the example,
// then -duration of the baseline.
//
// For each round and service it reports requests per second (every answer
// counts, the answers other than 200 are listed), latency p50 and p99 (from
// sending the request to reading the whole answer), the ratio of the
// example's requests per second to the baseline's in that round, and the
// median ratio over the rounds. Then, per service over all rounds, Redis
// commands per request from INFO commandstats (commands that scripts call
// included, connection set-up and INFO left out) with the calls of each
// command, and the time Redis spent in script calls per request. Last, it
// checks the stock of every SKU against the 200 answers it got: the initial
// stock less one per 200.
//
// Usage:
//
//	httpbench -redis 127.0.0.1:6379 [-inventory bin | -reqlock-dir ..]
//	          [-clients 50] [-skus 1000] [-duration 5s] [-rounds 3] [-warmup 1s]
//
// It writes only keys whose names hold "hb<run id>", deletes them at the
// end, and flushes nothing. Point it at a Redis nobody else uses while it
// runs: INFO commandstats counts every client's commands. bench/httpbench.sh
// starts a private redis-server on a free loopback port, builds both
// programs and runs httpbench against it.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == serveBaselineFlag {
		os.Exit(serveBaselineMain(os.Args[2:], os.Stdout, os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
