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
	default:
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
}

// report is what bench printed, for tests.
type report struct {
	marker   string          // in the name of every key of the run
	services []string        // the example, then the baseline
	rounds   [][]roundResult // per service, per round
	ratios   []float64       // per round: the example's req/s over the baseline's
	median   float64         // of ratios
	// Per service over all rounds: the INFO commandstats delta and the
	// requests; over the whole run: the 200 answers and the SKUs whose
	// stock did not match them.
	commands   []map[string]int64
	requests   []int64
	deductions []int64
	mismatches [][]string
}

// bench starts both services, loads them in turn, prints its report to out
// and returns it.
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
	if bin == "" {
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

	skus := func(side string) []string {
		s := make([]string, cfg.skus)
		for i := range s {
			s[i] = fmt.Sprintf("%s%s%04d", marker, side, i)
		}
		return s
	}
	targets := []*target{newTarget(inv, skus("a"), cfg.clients), newTarget(base, skus("b"), cfg.clients)}
	rep = &report{marker: marker, rounds: make([][]roundResult, len(targets))}
	for _, t := range targets {
		defer t.close()
		rep.services = append(rep.services, t.svc.name)
	}

	fmt.Fprintf(out, "httpbench: POST /skus/{id}/deduct {\"qty\":1}, uncontended: %d clients, %d SKUs (client c: SKUs c, c+%d, ...), "+
		"%d rounds of %v per service after a %v warm-up each\n",
		cfg.clients, cfg.skus, cfg.clients, cfg.rounds, cfg.duration, cfg.warmup)
	fmt.Fprintf(out, "reqlock:   examples/inventory %s (-framework gin): reqlock's ginlock route table, fenced stock scripts\n", bin)
	fmt.Fprintf(out, "redislock: redislockshop (gin): bsm/redislock %s Obtain, ExponentialBackoff(16ms, 512ms) until the wait, release after the handler; the same stock scripts, unfenced\n",
		moduleVersion("github.com/bsm/redislock"))
	fmt.Fprintf(out, "both: wait %v, ttl %v, stock %d per SKU; Redis %s at %s; %d CPUs, GOMAXPROCS %d here\n",
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

	fmt.Fprintf(out, "\n%-5s  %-9s  %8s  %8s  %8s  %8s  %8s  %11s  %13s  %s\n",
		"round", "service", "requests", "req/s", "p50", "p99", "cmds/req", "scripts/req", "redis µs/req", "other answers")
	results := rep.rounds
	for r := 1; r <= cfg.rounds; r++ {
		for i, t := range targets {
			before, err := redisstats.CommandStats(ctx, rdb)
			if err != nil {
				return nil, err
			}
			w, err := t.load(ctx, cfg.duration)
			if err != nil {
				return nil, fmt.Errorf("round %d: %w", r, err)
			}
			after, err := redisstats.CommandStats(ctx, rdb)
			if err != nil {
				return nil, err
			}
			// Without the overhead commands: neither set-up nor INFO nor the
			// example's start-up PING serves a request.
			res := roundResult{w: w, delta: redisstats.WithoutOverhead(redisstats.Delta(before, after))}
			results[i] = append(results[i], res)
			n := float64(max(w.requests, 1))
			fmt.Fprintf(out, "%-5d  %-9s  %8d  %8.0f  %8s  %8s  %8.2f  %11.2f  %12.1f  %s\n",
				r, t.svc.name, w.requests, w.rate(), round(percentile(w.latency, 0.50)), round(percentile(w.latency, 0.99)),
				float64(commandCount(res.delta))/n, float64(redisstats.ScriptCalls(res.delta))/n, float64(redisstats.ScriptMicros(res.delta))/n,
				otherAnswers(w.status))
		}
		ratio := results[0][r-1].w.rate() / results[1][r-1].w.rate()
		rep.ratios = append(rep.ratios, ratio)
		fmt.Fprintf(out, "%-5d  reqlock/redislock req/s: %.3fx\n", r, ratio)
	}
	rep.median = median(rep.ratios)
	fmt.Fprintf(out, "\nmedian reqlock/redislock req/s over %d rounds: %.3fx (rounds: %s)\n", cfg.rounds, rep.median, ratioList(rep.ratios))

	fmt.Fprintf(out, "\nRedis commands per request over all rounds (INFO commandstats; script calls include the commands they make):\n")
	for i, t := range targets {
		total := map[string]int64{}
		var requests int64
		for _, res := range results[i] {
			addDelta(total, res.delta)
			requests += res.w.requests
		}
		rep.commands = append(rep.commands, total)
		rep.requests = append(rep.requests, requests)
		fmt.Fprintf(out, "  %-9s  %s\n", t.svc.name, perRequest(total, requests))
	}

	fmt.Fprintf(out, "\nstock check (initial stock less one per 200 answer, warm-up included):\n")
	var bad []string
	for _, t := range targets {
		mism, err := stockMismatches(ctx, rdb, t, cfg.stock)
		if err != nil {
			return nil, err
		}
		var oks int64
		for _, n := range t.ok {
			oks += n
		}
		rep.deductions = append(rep.deductions, oks)
		rep.mismatches = append(rep.mismatches, mism)
		fmt.Fprintf(out, "  %-9s  %d of %d SKUs exact after %d deductions\n", t.svc.name, len(t.skus)-len(mism), len(t.skus), oks)
		for _, m := range mism[:min(len(mism), 5)] {
			fmt.Fprintf(out, "             %s\n", m)
		}
		bad = append(bad, mism...)
	}
	if len(bad) > 0 {
		return rep, fmt.Errorf("%d SKUs with a stock other than their 200 answers say", len(bad))
	}
	return rep, nil
}

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
