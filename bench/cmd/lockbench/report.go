package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// comparison is reqlock against bsm/redislock in one workload, and the
// targets of issue 3 for that workload.
type comparison struct {
	// ThroughputRatio is reqlock's acquisitions per second over redislock's;
	// WaitP99Ratio is reqlock's p99 wait over redislock's. Both are zero when
	// either library did not run.
	ThroughputRatio float64  `json:"throughput_ratio"`
	WaitP99Ratio    float64  `json:"wait_p99_ratio"`
	Targets         []target `json:"targets"`
	// RueidisThroughputRatio and RueidisWaitP99Ratio are the same ratios
	// for reqlock-rueidis; zero when either library did not run.
	RueidisThroughputRatio float64 `json:"rueidis_throughput_ratio,omitempty"`
	RueidisWaitP99Ratio    float64 `json:"rueidis_wait_p99_ratio,omitempty"`
}

// target is one goal and whether the measurement meets it.
type target struct {
	Goal     string `json:"goal"`
	Measured string `json:"measured"`
	Pass     bool   `json:"pass"`
}

// compare evaluates reqlock against redislock in workload. It returns nil
// when reqlock did not run.
func compare(workload string, results []*libResult) *comparison {
	var mine, rueidis, theirs *libResult
	for _, r := range results {
		switch r.Lib {
		case libReqlock:
			mine = r
		case libRueidis:
			rueidis = r
		case libRedislock:
			theirs = r
		}
	}
	if mine == nil && rueidis == nil {
		return nil
	}
	c := &comparison{}
	if rueidis != nil && theirs != nil {
		c.RueidisThroughputRatio = ratio(rueidis.AcqPerSec, theirs.AcqPerSec)
		c.RueidisWaitP99Ratio = ratio(float64(rueidis.WaitP99), float64(theirs.WaitP99))
	}
	if mine == nil {
		return c
	}
	if theirs != nil {
		c.ThroughputRatio = ratio(mine.AcqPerSec, theirs.AcqPerSec)
		c.WaitP99Ratio = ratio(float64(mine.WaitP99), float64(theirs.WaitP99))
	}
	add := func(goal, measured string, pass bool) {
		c.Targets = append(c.Targets, target{Goal: goal, Measured: measured, Pass: pass})
	}
	throughput := func(want float64) {
		if theirs == nil {
			return
		}
		add(fmt.Sprintf("throughput >= %.1fx bsm/redislock's", want),
			fmt.Sprintf("%.2fx (%.0f vs %.0f acq/s)", c.ThroughputRatio, mine.AcqPerSec, theirs.AcqPerSec),
			c.ThroughputRatio >= want)
	}
	switch workload {
	case "hot":
		throughput(1.0)
		if theirs != nil {
			add("wait p99 <= 0.1x bsm/redislock's",
				fmt.Sprintf("%.3fx (%s vs %s)", c.WaitP99Ratio, fmtDur(mine.WaitP99), fmtDur(theirs.WaitP99)),
				mine.Acquisitions > 0 && c.WaitP99Ratio <= 0.1)
		}
		add("<= 4 Redis commands per acquisition (client round trips)",
			fmt.Sprintf("%.2f round trips (commandstats: %.2f commands)", mine.RoundTripsPerAcq, mine.CommandsPerAcq),
			mine.Acquisitions > 0 && mine.RoundTripsPerAcq <= 4)
	case "multi":
		throughput(2.0)
	case "spread":
		throughput(1.0)
		add("exactly 2 round trips per uncontended cycle",
			fmt.Sprintf("%d round trips for %d acquisitions = %.3f (commandstats: %.2f commands)",
				mine.RoundTrips, mine.Acquisitions, mine.RoundTripsPerAcq, mine.CommandsPerAcq),
			mine.Acquisitions > 0 && mine.RoundTrips == 2*mine.Acquisitions)
	}
	add("lost updates == 0", fmt.Sprint(mine.LostUpdates), mine.LostUpdates == 0)
	return c
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func printHeader(w io.Writer, rep *report) {
	cfg, env := rep.Config, rep.Environment
	fmt.Fprintf(w, "lockbench run %s, %s\n", env.RunID, env.Started.Format(time.RFC3339))
	if cfg.Note != "" {
		fmt.Fprintf(w, "note: %s\n", cfg.Note)
	}
	fmt.Fprintf(w, "redis %s (Redis %s); %s %s/%s; %d CPUs, GOMAXPROCS %d; go-redis pool %d per library client\n",
		cfg.Redis, env.RedisVersion, env.GoVersion, env.GOOS, env.GOARCH, env.NumCPU, env.GOMAXPROCS, env.PoolSize)
	var mods []string
	for _, path := range []string{"github.com/reqlock/reqlock", "github.com/bsm/redislock",
		"github.com/go-redsync/redsync/v4", "github.com/redis/go-redis/v9"} {
		if v, ok := env.Modules[path]; ok {
			mods = append(mods, path+" "+v)
		}
	}
	if len(mods) > 0 {
		fmt.Fprintf(w, "modules: %s\n", strings.Join(mods, ", "))
	}
	if env.LoadStart != "" {
		fmt.Fprintf(w, "load average (1, 5, 15 min) at start: %s\n", env.LoadStart)
	}
	fmt.Fprintf(w, "each library and workload: %v, wait limit %v, ttl %v, hold %v (hot, multi; spread holds nothing)\n",
		cfg.Duration, cfg.Wait, cfg.TTL, cfg.Hold)
	for _, lib := range cfg.Libs {
		fmt.Fprintf(w, "  %-9s %s\n", lib, rep.Settings[lib])
	}
}

func describe(cfg config, workload string) string {
	switch workload {
	case "hot":
		return fmt.Sprintf("1 key, %d goroutines in 1 process, hold %v", cfg.Waiters, cfg.Hold)
	case "spread":
		s := fmt.Sprintf("%d keys, %d workers, no hold, worker w cycles through keys w, w+%d, ...",
			cfg.Keys, cfg.Workers, cfg.Workers)
		if cfg.Keys%cfg.Workers == 0 {
			return s + " (no key shared: every cycle uncontended)"
		}
		return s + " (workers does not divide keys: some keys are shared)"
	case "multi":
		split := splitWaiters(cfg.Waiters, cfg.Procs)
		parts := make([]string, len(split))
		for i, n := range split {
			parts[i] = fmt.Sprint(n)
		}
		return fmt.Sprintf("1 key, %d processes, %d goroutines in total (%s), hold %v",
			cfg.Procs, cfg.Waiters, strings.Join(parts, "+"), cfg.Hold)
	}
	return ""
}

func printWorkload(w io.Writer, cfg config, workload string, results []*libResult, c *comparison) {
	fmt.Fprintf(w, "\n== %s: %s, %v\n", workload, describe(cfg, workload), cfg.Duration)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "lib\tacq\tacq/s\twait p50\twait p99\twait max\ttimeouts\terrors\t"+
		"handover p50\thandover p99\thandovers\tcmds/acq\tscript µs/acq\tredis µs/acq\tclient µs/acq\trt/acq\tlost\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%d\t%.2f\t%.1f\t%.1f\t%.1f\t%.2f\t%d\t\n",
			r.Lib, r.Acquisitions, r.AcqPerSec, fmtDur(r.WaitP50), fmtDur(r.WaitP99), fmtDur(r.WaitMax),
			r.Timeouts, r.Errors, handoverDur(r, r.HandoverP50), handoverDur(r, r.HandoverP99), r.Handovers,
			r.CommandsPerAcq, micros(r.ScriptCPUPerAcq), micros(r.RedisCPUPerAcq), micros(r.ClientCPUPerAcq),
			r.RoundTripsPerAcq, r.LostUpdates)
	}
	_ = tw.Flush()
	for _, r := range results {
		if r.Errors+r.ReleaseErrors+r.RMWErrors > 0 {
			fmt.Fprintf(w, "  %s: %d lock errors, %d release errors, %d counter errors; first: %s\n",
				r.Lib, r.Errors, r.ReleaseErrors, r.RMWErrors, r.FirstError)
		}
		if r.LostUpdates != 0 {
			fmt.Fprintf(w, "  %s: %d LOST UPDATES: two holders overlapped\n", r.Lib, r.LostUpdates)
		}
	}
	if c == nil {
		return
	}
	if c.ThroughputRatio > 0 {
		fmt.Fprintf(w, "reqlock / bsm/redislock: throughput %.2fx, wait p99 %.3fx\n", c.ThroughputRatio, c.WaitP99Ratio)
	}
	if c.RueidisThroughputRatio > 0 {
		fmt.Fprintf(w, "reqlock-rueidis / bsm/redislock: throughput %.2fx, wait p99 %.3fx\n",
			c.RueidisThroughputRatio, c.RueidisWaitP99Ratio)
	}
	fmt.Fprintln(w, "targets (reqlock):")
	for _, t := range c.Targets {
		verdict := "FAIL"
		if t.Pass {
			verdict = "PASS"
		}
		fmt.Fprintf(w, "  %s  %-58s %s\n", verdict, t.Goal, t.Measured)
	}
}

func handoverDur(r *libResult, d time.Duration) string {
	if r.Handovers == 0 {
		return "-"
	}
	return fmtDur(d)
}

func printNotes(w io.Writer) {
	fmt.Fprint(w, `
How to read this:
  acq/s      grants within the window / duration. No lock call starts after the window; calls in
             flight then complete (at most the wait limit) and count in acq, waits, timeouts,
             commands and lost updates.
  wait       start of the lock call to its grant, over granted calls; a call that reaches the wait
             limit is a timeout instead.
  handover   next holder's grant minus the previous holder's release on the same key (wall clock,
             taken right before it calls unlock; merged over processes), for grants whose lock call
             had started by that release. A holder re-acquiring right after its own release, or an
             uncontended cycle, is no handover.
  cmds/acq   INFO commandstats delta over the run (calls + rejected_calls of every command; this
             counts the commands that Lua scripts call too), minus connection set-up (HELLO,
             CLIENT ...), INFO and the harness's own counter GET + SET, per acquisition.
  script µs/acq  time Redis spent running the library's scripts (INFO commandstats usec of eval
             and evalsha, the commands a script calls included), per acquisition. A library that
             also sends bare commands (redsync's SET NX) spends more than this.
  redis µs/acq  CPU time of the Redis server (INFO cpu, user + system) over the run, per
             acquisition: every client's commands, the harness's counter, and the server's own
             housekeeping, so a library with fewer acquisitions pays more of the latter.
  client µs/acq  CPU time of the lockbench processes that ran the workers (getrusage, user +
             system) from their start to their end, per acquisition: the library, its client's
             own goroutines, the harness's counter GET + SET and Go's runtime. Judge it beside
             redis µs/acq: on one machine the two share the CPUs.
  rt/acq     top-level round trips of the library's go-redis client, counted by a hook (a script
             call is one, EVALSHA falling back to EVAL two; connection handshakes excluded), per
             acquisition. The counter GET + SET go through a separate client.
  lost       acquisitions minus the final counter value. Inside the lock each holder increments a
             per-key counter with a GET and then a SET: only mutual exclusion keeps it exact.
`)
}

// fmtDur prints d with three significant digits.
func fmtDur(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < 10*time.Microsecond:
		return fmt.Sprintf("%.2fµs", float64(d)/1e3)
	case d < 100*time.Microsecond:
		return fmt.Sprintf("%.1fµs", float64(d)/1e3)
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	case d < 100*time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/1e6)
	case d < time.Second:
		return fmt.Sprintf("%.0fms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
}

// micros returns d in microseconds.
func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
