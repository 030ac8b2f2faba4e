package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/bench/internal/redisstats"
)

// run runs httpbench with args and returns its exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "httpbench:", err)
		return 2
	}
	switch cfg.scenario {
	case scenarioReads:
		_, err = benchReads(ctx, cfg, stdout)
	case scenarioLimit:
		_, err = benchLimit(ctx, cfg, stdout)
	case scenarioIdem:
		_, err = benchIdempotency(ctx, cfg, stdout)
	default: // deduct, library
		_, err = bench(ctx, cfg, stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "httpbench:", err)
		return 1
	}
	return 0
}

// roundResult is one service's window in one round.
type roundResult struct {
	w     window
	delta map[string]int64 // INFO commandstats, after minus before
	// The CPU time the service's process and the Redis server used in
	// the window.
	svcCPU, redisCPU time.Duration
}

// report is what bench printed, for tests.
type report struct {
	marker   string          // in the name of every key of the run
	services []string        // deduct: the example, the baseline; library: plainLocks; the baseline last
	rounds   [][]roundResult // per service, per round
	// Per service but the baseline: per round its req/s over the
	// baseline's, and its p99 over the baseline's; then their medians.
	ratios, p99Ratios   [][]float64
	medians, p99Medians []float64
	// Per service over all rounds: the INFO commandstats delta and the
	// requests; over the whole run: the 200 answers and the SKUs whose
	// stock did not match them.
	commands   []map[string]int64
	requests   []int64
	svcCPU     []time.Duration // per request
	redisCPU   []time.Duration // per request
	deductions []int64
	mismatches [][]string
}

// bench starts the services of the deduct or the library scenario, loads
// them in turn, prints its report to out and returns it.
func bench(ctx context.Context, cfg config, out io.Writer) (rep *report, err error) {
	// The services get SIGKILL if the thread that started them dies
	// (pdeathsig.Set): keep this goroutine on its thread until they
	// are stopped.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	rdb := redis.NewClient(&redis.Options{Addr: cfg.redisAddr, PoolSize: 2})
	defer rdb.Close()
	version, err := redisstats.RedisVersion(ctx, rdb)
	if err != nil {
		return nil, fmt.Errorf("Redis at %s: %w", cfg.redisAddr, err)
	}

	bin := cfg.inventory
	if bin == "" && cfg.scenario == scenarioDeduct {
		tmp, err := os.MkdirTemp("", "httpbench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		if bin, err = buildInventory(ctx, cfg.reqlockDir, tmp); err != nil {
			return nil, err
		}
	}

	// Every key of the run holds marker: SKUs are marker, a side letter
	// and a number, all characters the example's key template keeps as
	// they are (it escapes others, "-" as %2D).
	var id [4]byte
	_, _ = rand.Read(id[:])
	marker := "hb" + hex.EncodeToString(id[:])
	defer func() {
		// The services are stopped by now (deferred after this): nothing
		// writes these keys any more.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, derr := deleteKeys(cctx, rdb, marker); derr != nil && err == nil {
			err = fmt.Errorf("deleting the run's keys (%s*): %w", marker, derr)
		}
	}()

	// The services, the baseline last, and how to read a SKU's stock
	// from each.
	var svcs []*service
	var stock []stockCmd
	if cfg.scenario == scenarioLibrary {
		for _, lock := range plainLocks {
			svc, err := startPlain(lock, cfg)
			if err != nil {
				return nil, err
			}
			defer svc.stop()
			svcs, stock = append(svcs, svc), append(stock, plainStock)
		}
	} else {
		inv, err := startInventory(bin, cfg)
		if err != nil {
			return nil, err
		}
		defer inv.stop()
		base, err := startBaseline(cfg)
		if err != nil {
			return nil, err
		}
		defer base.stop()
		svcs, stock = []*service{inv, base}, []stockCmd{hashStock, hashStock}
	}

	skus := func(side string) []string {
		s := make([]string, cfg.skus)
		for i := range s {
			s[i] = fmt.Sprintf("%s%s%04d", marker, side, i)
		}
		return s
	}
	var targets []*target
	rep = &report{marker: marker, rounds: make([][]roundResult, len(svcs))}
	for i, svc := range svcs {
		t := newTarget(svc, skus(string(rune('a'+i))), cfg.clients, stock[i])
		defer t.close()
		targets = append(targets, t)
		rep.services = append(rep.services, svc.name)
	}
	baseline := len(targets) - 1
	baseName := rep.services[baseline]
	nw := 0 // the width of the service column
	for _, name := range rep.services {
		nw = max(nw, len(name), len("service"))
	}

	redislockLine := fmt.Sprintf("bsm/redislock %s Obtain, ExponentialBackoff(16ms, 512ms) until the wait, release after the handler",
		moduleVersion("github.com/bsm/redislock"))
	if cfg.scenario == scenarioLibrary {
		fmt.Fprintf(out, "httpbench -scenario library: POST /skus/{id}/deduct {\"qty\":1}, uncontended: %d clients, %d SKUs (client c: SKUs c, c+%d, ...), "+
			"%d rounds of %v per service (the order reversed every other round) after a %v warm-up each\n",
			cfg.clients, cfg.skus, cfg.clients, cfg.rounds, cfg.duration, cfg.warmup)
		fmt.Fprintf(out, "handler (the same code in every service): GET plain:stock:<id>, SET it less 1, on a go-redis client; lock on sku:<id> in front of it:\n")
		fmt.Fprintf(out, "  %-15s  ginlock, redisstore on rueidis %s (rueidisstore.Open: a client of its own, every call pipelined)\n",
			lockRueidis, moduleVersion("github.com/redis/rueidis"))
		fmt.Fprintf(out, "  %-15s  ginlock, redisstore on go-redis %s (the handler's client)\n", lockGoRedis, moduleVersion("github.com/redis/go-redis/v9"))
		fmt.Fprintf(out, "  %-15s  hand-written gin middleware: %s (the handler's client)\n", lockRedislock, redislockLine)
	} else {
		fmt.Fprintf(out, "httpbench: POST /skus/{id}/deduct {\"qty\":1}, uncontended: %d clients, %d SKUs (client c: SKUs c, c+%d, ...), "+
			"%d rounds of %v per service (the order reversed every other round) after a %v warm-up each\n",
			cfg.clients, cfg.skus, cfg.clients, cfg.rounds, cfg.duration, cfg.warmup)
		fmt.Fprintf(out, "reqlock:   examples/inventory %s (-framework gin, -redis: locks in rueidisstore): reqlock's ginlock route table, fenced stock scripts\n", bin)
		fmt.Fprintf(out, "redislock: redislockshop (gin): %s; the same stock scripts, unfenced\n", redislockLine)
	}
	fmt.Fprintf(out, "all: wait %v, ttl %v, stock %d per SKU; Redis %s at %s; %d CPUs, GOMAXPROCS %d here\n",
		cfg.wait, cfg.ttl, cfg.stock, version, cfg.redisAddr, runtime.NumCPU(), runtime.GOMAXPROCS(0))
	if cfg.note != "" {
		fmt.Fprintf(out, "note: %s\n", cfg.note)
	}

	if cfg.warmup > 0 {
		for _, t := range targets {
			if _, err := t.load(ctx, cfg.warmup); err != nil {
				return nil, fmt.Errorf("warm-up: %w", err)
			}
		}
	}

	fmt.Fprintf(out, "\n%-5s  %-*s  %8s  %8s  %8s  %8s  %8s  %11s  %13s  %14s  %16s  %s\n",
		"round", nw, "service", "requests", "req/s", "p50", "p99", "cmds/req", "scripts/req", "script µs/req",
		"svc cpu µs/req", "redis cpu µs/req", "other answers")
	results := rep.rounds
	rep.ratios, rep.p99Ratios = make([][]float64, baseline), make([][]float64, baseline)
	for r := 1; r <= cfg.rounds; r++ {
		// Every other round in reverse order, so that a drift of the
		// machine's load favours no service.
		order := make([]int, len(targets))
		for i := range order {
			order[i] = i
			if r%2 == 0 {
				order[i] = len(targets) - 1 - i
			}
		}
		for _, i := range order {
			t := targets[i]
			before, err := redisstats.CommandStats(ctx, rdb)
			if err != nil {
				return nil, err
			}
			svcBefore, redisBefore, err := cpuTimes(ctx, t.svc, rdb)
			if err != nil {
				return nil, err
			}
			w, err := t.load(ctx, cfg.duration)
			if err != nil {
				return nil, fmt.Errorf("round %d: %w", r, err)
			}
			svcAfter, redisAfter, err := cpuTimes(ctx, t.svc, rdb)
			if err != nil {
				return nil, err
			}
			after, err := redisstats.CommandStats(ctx, rdb)
			if err != nil {
				return nil, err
			}
			// Without the overhead commands: neither set-up nor INFO nor the
			// example's start-up PING serves a request.
			res := roundResult{w: w, delta: redisstats.WithoutOverhead(redisstats.Delta(before, after)),
				svcCPU: svcAfter - svcBefore, redisCPU: redisAfter - redisBefore}
			results[i] = append(results[i], res)
			n := float64(max(w.requests, 1))
			fmt.Fprintf(out, "%-5d  %-*s  %8d  %8.0f  %8s  %8s  %8.2f  %11.2f  %13.1f  %14.1f  %16.1f  %s\n",
				r, nw, t.svc.name, w.requests, w.rate(), round(percentile(w.latency, 0.50)), round(percentile(w.latency, 0.99)),
				float64(commandCount(res.delta))/n, float64(redisstats.ScriptCalls(res.delta))/n, float64(redisstats.ScriptMicros(res.delta))/n,
				micros(res.svcCPU)/n, micros(res.redisCPU)/n, otherAnswers(w.status))
		}
		base := results[baseline][r-1].w
		for i := range baseline {
			w := results[i][r-1].w
			ratio := w.rate() / base.rate()
			p99 := float64(percentile(w.latency, 0.99)) / float64(percentile(base.latency, 0.99))
			rep.ratios[i], rep.p99Ratios[i] = append(rep.ratios[i], ratio), append(rep.p99Ratios[i], p99)
			fmt.Fprintf(out, "%-5d  %s/%s req/s: %.3fx, p99: %.3fx\n", r, rep.services[i], baseName, ratio, p99)
		}
	}
	fmt.Fprintln(out)
	for i := range baseline {
		rep.medians = append(rep.medians, median(rep.ratios[i]))
		rep.p99Medians = append(rep.p99Medians, median(rep.p99Ratios[i]))
		fmt.Fprintf(out, "median %s/%s over %d rounds: req/s %.3fx (rounds: %s), p99 %.3fx (rounds: %s)\n",
			rep.services[i], baseName, cfg.rounds, rep.medians[i], ratioList(rep.ratios[i]), rep.p99Medians[i], ratioList(rep.p99Ratios[i]))
	}

	fmt.Fprintf(out, "\nRedis commands per request over all rounds (INFO commandstats; script calls include the commands they make):\n")
	for i, t := range targets {
		total := map[string]int64{}
		var requests int64
		var svcCPU, redisCPU time.Duration
		for _, res := range results[i] {
			addDelta(total, res.delta)
			requests += res.w.requests
			svcCPU, redisCPU = svcCPU+res.svcCPU, redisCPU+res.redisCPU
		}
		rep.commands = append(rep.commands, total)
		rep.requests = append(rep.requests, requests)
		rep.svcCPU = append(rep.svcCPU, svcCPU/time.Duration(max(requests, 1)))
		rep.redisCPU = append(rep.redisCPU, redisCPU/time.Duration(max(requests, 1)))
		fmt.Fprintf(out, "  %-*s  %s\n", nw, t.svc.name, perRequest(total, requests))
	}

	// CPU per request does not depend on how much CPU the machine's other
	// work left the run, as throughput does (but a busy machine's caches
	// and context switches still raise it).
	fmt.Fprintf(out, "\nCPU per request over all rounds (the service's process from /proc, Redis from INFO cpu; the load generator left out):\n")
	for i, name := range rep.services {
		both := rep.svcCPU[i] + rep.redisCPU[i]
		fmt.Fprintf(out, "  %-*s  service %6.1f µs, Redis %5.1f µs, both %6.1f µs", nw, name,
			micros(rep.svcCPU[i]), micros(rep.redisCPU[i]), micros(both))
		if i != baseline {
			fmt.Fprintf(out, " (%.3fx %s's; Redis %.3fx)", float64(both)/float64(rep.svcCPU[baseline]+rep.redisCPU[baseline]), baseName,
				float64(rep.redisCPU[i])/float64(rep.redisCPU[baseline]))
		}
		fmt.Fprintln(out)
	}

	fmt.Fprintf(out, "\nstock check (initial stock less one per 200 answer, and maybe per 5xx answer, warm-up included):\n")
	var bad []string
	for _, t := range targets {
		mism, unsure, err := stockMismatches(ctx, rdb, t, cfg.stock)
		if err != nil {
			return nil, err
		}
		var oks, fives int64
		for i := range t.ok {
			oks, fives = oks+t.ok[i], fives+t.unsure[i]
		}
		rep.deductions = append(rep.deductions, oks)
		rep.mismatches = append(rep.mismatches, mism)
		fmt.Fprintf(out, "  %-*s  %d of %d SKUs exact after %d deductions", nw, t.svc.name, len(t.skus)-len(mism)-unsure, len(t.skus), oks)
		if fives > 0 {
			fmt.Fprintf(out, "; %d 5xx answers, %d SKUs below by at most theirs (the deduction landed, its answer timed out)", fives, unsure)
		}
		fmt.Fprintln(out)
		for _, m := range mism[:min(len(mism), 5)] {
			fmt.Fprintf(out, "  %*s  %s\n", nw, "", m)
		}
		bad = append(bad, mism...)
	}
	if len(bad) > 0 {
		return rep, fmt.Errorf("%d SKUs with a stock other than their 200 answers say", len(bad))
	}
	return rep, nil
}

// cpuTimes returns the CPU time used so far by svc's process and by Redis.
func cpuTimes(ctx context.Context, svc *service, rdb *redis.Client) (svcCPU, redisCPU time.Duration, err error) {
	if svcCPU, err = svc.cpu(); err != nil {
		return 0, 0, err
	}
	redisCPU, err = redisstats.ServerCPU(ctx, rdb)
	return svcCPU, redisCPU, err
}

// micros is d in microseconds.
func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// round rounds a latency for printing.
func round(d time.Duration) time.Duration {
	switch {
	case d >= 100*time.Millisecond:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}

// otherAnswers lists the answers other than 200 by status, or "-".
func otherAnswers(status map[int]int64) string {
	var parts []string
	for _, s := range slices.Sorted(maps.Keys(status)) {
		if s != http.StatusOK {
			parts = append(parts, fmt.Sprintf("%d: %d", s, status[s]))
		}
	}
	if parts == nil {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// median returns the median of xs (the mean of the middle two for an even
// count).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// ratioList prints ratios as "0.950x, 0.961x".
func ratioList(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.3fx", x)
	}
	return strings.Join(parts, ", ")
}

// perRequest prints the commands of d per request: the total, the script
// calls, then each command, most called first.
func perRequest(d map[string]int64, requests int64) string {
	n := float64(max(requests, 1))
	var names []string
	for k := range d {
		if !redisstats.IsUsec(k) {
			names = append(names, k)
		}
	}
	slices.SortFunc(names, func(a, b string) int {
		return cmp.Or(cmp.Compare(d[b], d[a]), strings.Compare(a, b))
	})
	parts := make([]string, len(names))
	for i, name := range names {
		parts[i] = fmt.Sprintf("%s %.2f", name, float64(d[name])/n)
	}
	return fmt.Sprintf("%.2f commands, %.2f script calls, %.1f µs in scripts: %s",
		float64(commandCount(d))/n, float64(redisstats.ScriptCalls(d))/n, float64(redisstats.ScriptMicros(d))/n, strings.Join(parts, ", "))
}

// moduleVersion returns the version of the module path this program was
// built with.
func moduleVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == path {
				return m.Version
			}
		}
	}
	return "(unknown version)"
}
