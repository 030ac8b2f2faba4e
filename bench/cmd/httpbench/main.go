// Command httpbench measures the uncontended HTTP throughput of the example
// service examples/inventory (reqlock's middleware on gin, fenced writes)
// against the same service hand-written with github.com/bsm/redislock
// (package redislockshop), on one Redis, in one run.
//
// Both services run as processes of their own on loopback ports: the
// example is its real binary (-inventory, or built from -reqlock-dir), run
// with -redis (its stock on go-redis, its locks on rueidisstore), -addr
// 127.0.0.1:0, -stock, -wait and -ttl; the baseline is
// this binary re-executed with a hidden -serve-baseline flag. Each gets the
// same load in turn: -clients HTTP clients (keep-alive, one connection
// each) looping POST /skus/{id}/deduct with {"qty":1} over -skus SKUs,
// client c cycling through SKUs c, c+clients, c+2*clients, ..., so that no
// two requests ever want the same lock (uncontended). A warm-up of -warmup
// per service comes first (scripts loaded, connection pools filled, every
// SKU's keys created), then -rounds rounds, each -duration of the example,
// then -duration of the baseline, in the reverse order every other round
// (so that a drift of the machine's load favours neither).
//
// For each round and service it reports requests per second (every answer
// counts, the answers other than 200 are listed), latency p50 and p99 (from
// sending the request to reading the whole answer), the ratios of the
// example's requests per second and p99 to the baseline's in that round,
// and the median ratios over the rounds. Then, per service over all rounds, Redis
// commands per request from INFO commandstats (commands that scripts call
// included, connection set-up and INFO left out) with the calls of each
// command, and the time Redis spent in script calls per request. Last, it
// checks the stock of every SKU against the 200 answers it got: the initial
// stock less one per 200, and less up to one more per 5xx answer (a
// deduction whose write landed before its answer timed out).
//
// Usage:
//
//	httpbench -redis 127.0.0.1:6379 [-inventory bin | -reqlock-dir ..]
//	          [-clients 50] [-skus 1000] [-duration 5s] [-rounds 3] [-warmup 1s]
//
// # Scenario library
//
// -scenario library measures the lock library alone: three services of
// package plainshop, each httpbench re-executed with a hidden -serve-plain
// flag, run the same handler code (a GET and a SET of the string
// plain:stock:<id> on a go-redis client) behind a different lock on
// sku:<id>: ginlock on redisstore over rueidis (rueidisstore.Open, a
// client of its own), ginlock on redisstore over the handler's go-redis
// client, and a hand-written gin middleware on bsm/redislock over the
// handler's client, the baseline. The load, rounds, report and stock check
// are the deduct scenario's, with every service's ratios to the baseline;
// -inventory and -reqlock-dir are not used.
//
//	httpbench -scenario library -redis 127.0.0.1:6379 [-clients 50] [-skus 1000] [-rounds 3]
//
// # Scenarios reads and limit
//
// -scenario reads and -scenario limit measure the example's lock modes
// (issue 22) on a redis-server httpbench starts itself (-redis is refused),
// each through two instances of the example, client c of -clients on
// instance c%2, each handler working -work (the example's -work) and logging
// its work to a file of its instance (the example's -worklog), which
// httpbench reads to check the locks across both instances.
//
// reads: one report; request i of client c is POST /reports/{id}/rebuild
// when (i+c)%10 == 0, else GET /reports/{id}. Two pairs of instances, one
// with the read shared (the example's table), one with the read exclusive
// (the same table without mode=shared), loaded in turn as the deduct
// scenario's services are. Per round and variant: 200 answers per second,
// read and rebuild latency p50 and p99, other answers, and the handlers'
// own 500 "overlap" answers (one instance's overlaps); then the medians of
// the per-round ratios shared/exclusive of 200s per second and of the
// rebuilds' p99 wait (p99 latency less -work), and the rebuilds whose work
// overlapped any other work on the report in the logs of both instances.
//
// limit: every client sends POST /exports for one tenant (limit=3, the
// example's -wait and -ttl from -wait and -ttl). After -warmup plus
// -duration, once instance 1's holders gauge shows an export holder (2s at
// most), instance 1 is stopped with SIGSTOP for -pause (longer than -ttl),
// then resumed; -duration later Redis is restarted (empty: no persistence);
// -duration later the load ends. From the work logs, with instance 1's
// stopped time cut out of its spans (it ran nothing then): the most export
// handlers running at once, and the utilization of the 3 slots (work time
// over 3 × elapsed) per phase and over the run from -warmup on, the Redis
// downtime (from its stop to its answering PING) left out. From the
// answers: counts by status, and 429s without Retry-After.
//
// Usage:
//
//	httpbench -scenario reads [-rounds 3] [-duration 5s] [-work 20ms] [-clients 50]
//	httpbench -scenario limit [-pause 12s] [-ttl 10s] [-duration 5s] [-work 20ms]
//
// # Scenario idempotency
//
// -scenario idempotency checks issue 23's exactly-once guarantee on a
// redis-server httpbench starts itself (-redis is refused), through two
// instances of the example (locks and stock in that Redis, each handler
// working -work): -keys deductions of 1, key k on SKU k mod -skus, each
// sent 3 times at once with its own Idempotency-Key over both instances,
// -clients keys at a time; once a third of the keys are out Redis is
// stopped with SIGSTOP for -freeze, then resumed. -delay after the last
// answer, every key is sent once more and retried every 100ms until it
// settles (an answer other than 503, 409 or 423). It reports the answers
// by status per round, the keys with a 200, the replays, and the keys whose
// first answer was 503 "outcome unknown" (replayed afterwards, or run once
// on a retry), and exits 1 unless every key got a 200, every 200 of a key
// is the same bytes, and every SKU's stock fell by exactly the number of
// its keys that got a 200.
//
//	httpbench -scenario idempotency [-keys 1000] [-skus 1000] [-clients 50] [-freeze 2s] [-delay 1s] [-work 20ms]
//
// The deduct and library scenarios write only keys whose names hold "hb<run id>",
// deletes them at the end, and flushes nothing. Point it at a Redis nobody else uses while it
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
	if len(os.Args) > 1 && os.Args[1] == servePlainFlag {
		os.Exit(servePlainMain(os.Args[2:], os.Stdout, os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
