package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"
)

// Workload and library names, in the order they run and print.
var (
	allWorkloads = []string{"hot", "spread", "multi"}
	allLibs      = []string{libReqlock, libRueidis, libRedislock, libRedsync}
)

// config is one run's settings. JSON names end in _ns for durations.
type config struct {
	Redis        string        `json:"redis"`
	Workloads    []string      `json:"workloads"`
	Libs         []string      `json:"libs"`
	Duration     time.Duration `json:"duration_ns"`
	Hold         time.Duration `json:"hold_ns"`
	Wait         time.Duration `json:"wait_ns"`
	TTL          time.Duration `json:"ttl_ns"`
	Waiters      int           `json:"waiters"`
	Workers      int           `json:"workers"`
	Keys         int           `json:"keys"`
	Procs        int           `json:"procs"`
	PoolSize     int           `json:"pool_size"`
	RedislockMin time.Duration `json:"redislock_min_backoff_ns"`
	RedislockMax time.Duration `json:"redislock_max_backoff_ns"`
	Fair         bool          `json:"reqlock_fair"`
	JSONPath     string        `json:"-"`
	ChartsDir    string        `json:"-"`
	CPUProfile   string        `json:"-"`
	Note         string        `json:"note,omitempty"`

	// Child mode: set by the parent of a multi run only.
	child        bool
	childPrefix  string
	childWaiters int
}

// hiddenFlags are the flags of child mode, left out of the usage text.
var hiddenFlags = map[string]bool{"child": true, "child-prefix": true, "child-waiters": true}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var (
		cfg                config
		workloads, libsArg string
	)
	fs := flag.NewFlagSet("lockbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Redis, "redis", "", "Redis `host:port` to run against (required); use one nobody else uses meanwhile")
	fs.StringVar(&workloads, "workload", "all", "workloads to run: all, or a comma list of hot, spread, multi")
	fs.StringVar(&libsArg, "lib", "all", "libraries to run: all, or a comma list of reqlock, reqlock-rueidis, redislock, redsync")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "how long each workload runs per library")
	fs.DurationVar(&cfg.Hold, "hold", time.Millisecond, "critical section of the hot and multi workloads (spread holds nothing)")
	fs.DurationVar(&cfg.Wait, "wait", 5*time.Second, "wait limit of each acquisition; a wait that reaches it counts as a timeout")
	fs.DurationVar(&cfg.TTL, "ttl", 10*time.Second, "lock TTL")
	fs.IntVar(&cfg.Waiters, "waiters", 50, "goroutines on the one key of hot, and in total over all processes of multi")
	fs.IntVar(&cfg.Workers, "workers", 50, "goroutines of spread")
	fs.IntVar(&cfg.Keys, "keys", 1000, "keys of spread")
	fs.IntVar(&cfg.Procs, "procs", 4, "processes of multi")
	fs.IntVar(&cfg.PoolSize, "poolsize", 0, "go-redis PoolSize of each library's client; 0 keeps go-redis's default (10 x GOMAXPROCS)")
	fs.DurationVar(&cfg.RedislockMin, "redislock-min", 16*time.Millisecond,
		"min of bsm/redislock's ExponentialBackoff (its doc recommends at least 16ms)")
	fs.DurationVar(&cfg.RedislockMax, "redislock-max", 512*time.Millisecond, "max of bsm/redislock's ExponentialBackoff")
	fs.BoolVar(&cfg.Fair, "fair", false, "run reqlock in fair mode (reqlock.WithFairness, default lease)")
	fs.StringVar(&cfg.JSONPath, "json", "", "also write all results as JSON to `file`")
	fs.StringVar(&cfg.ChartsDir, "charts", "",
		"also write a chart of each workload's wait distribution per library to `dir`/wait-<workload>.svg")
	fs.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write a CPU profile of lockbench (the parent process) to `file`")
	fs.StringVar(&cfg.Note, "note", "", "free text for the header and the JSON, such as the reqlock commit (run.sh sets it)")
	fs.BoolVar(&cfg.child, "child", false, "internal: run as a child process of the multi workload")
	fs.StringVar(&cfg.childPrefix, "child-prefix", "", "internal: key prefix of the child's run")
	fs.IntVar(&cfg.childWaiters, "child-waiters", 0, "internal: goroutines of the child")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: lockbench -redis host:port [flags]\n\n"+
			"Runs lock workloads against a real Redis for reqlock, bsm/redislock and go-redsync/redsync\n"+
			"and prints a table per workload. Flags:\n\n")
		fs.VisitAll(func(f *flag.Flag) {
			if hiddenFlags[f.Name] {
				return
			}
			name, usage := flag.UnquoteUsage(f)
			fmt.Fprintf(fs.Output(), "  -%s %s\n    \t%s", f.Name, name, usage)
			if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" {
				fmt.Fprintf(fs.Output(), " (default %s)", f.DefValue)
			}
			fmt.Fprintln(fs.Output())
		})
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if cfg.Workloads, err = parseList(workloads, allWorkloads, "workload"); err != nil {
		return cfg, err
	}
	if cfg.Libs, err = parseList(libsArg, allLibs, "lib"); err != nil {
		return cfg, err
	}
	return cfg, cfg.validate()
}

func (cfg config) validate() error {
	var errs []error
	check := func(bad bool, format string, args ...any) {
		if bad {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(cfg.Redis == "", "-redis host:port is required")
	check(cfg.Duration <= 0, "-duration %v is not positive", cfg.Duration)
	check(cfg.Hold < 0, "-hold %v is negative", cfg.Hold)
	check(cfg.Wait <= 0, "-wait %v is not positive", cfg.Wait)
	check(cfg.TTL < 10*time.Millisecond, "-ttl %v is below 10ms", cfg.TTL)
	check(cfg.Waiters < 1, "-waiters %d is below 1", cfg.Waiters)
	check(cfg.Workers < 1, "-workers %d is below 1", cfg.Workers)
	check(cfg.Keys < 1, "-keys %d is below 1", cfg.Keys)
	check(cfg.Procs < 1, "-procs %d is below 1", cfg.Procs)
	check(!cfg.child && slices.Contains(cfg.Workloads, "multi") && cfg.Waiters < cfg.Procs,
		"-waiters %d is below -procs %d: every process of multi needs a waiter", cfg.Waiters, cfg.Procs)
	check(cfg.PoolSize < 0, "-poolsize %d is negative", cfg.PoolSize)
	check(cfg.RedislockMin <= 0 || cfg.RedislockMax < cfg.RedislockMin,
		"-redislock-min %v and -redislock-max %v: need 0 < min <= max", cfg.RedislockMin, cfg.RedislockMax)
	if cfg.child {
		check(len(cfg.Libs) != 1, "-child needs exactly one -lib")
		check(cfg.childPrefix == "", "-child needs -child-prefix")
		check(cfg.childWaiters < 1, "-child needs -child-waiters of at least 1")
	}
	return errors.Join(errs...)
}

// parseList parses "all" or a comma list of names from known, keeping the
// order of known.
func parseList(s string, known []string, what string) ([]string, error) {
	if strings.TrimSpace(s) == "all" {
		return slices.Clone(known), nil
	}
	want := map[string]bool{}
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if !slices.Contains(known, name) {
			return nil, fmt.Errorf("-%s: unknown %q; want all or a comma list of %s", what, name, strings.Join(known, ", "))
		}
		want[name] = true
	}
	var out []string
	for _, name := range known {
		if want[name] {
			out = append(out, name)
		}
	}
	return out, nil
}

// run is the whole program: parent or child, by the -child flag. It returns
// the exit code: 0 when everything ran (targets that FAIL still exit 0: they
// are measurements), 1 when a run failed, 2 for bad flags.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	// Children of the multi workload write their stderr here concurrently.
	stderr = &syncWriter{w: stderr}
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "lockbench: %v\n", err)
		return 2
	}
	if cfg.child {
		err = runChild(ctx, cfg, stdin, stdout)
	} else {
		err = withCPUProfile(cfg.CPUProfile, func() error { return runParent(ctx, cfg, stdout, stderr) })
	}
	if err != nil {
		fmt.Fprintf(stderr, "lockbench: %v\n", err)
		return 1
	}
	return 0
}

// syncWriter serializes writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// withCPUProfile runs f, writing a CPU profile of it to path when path is
// not empty.
func withCPUProfile(path string, f func() error) error {
	if path == "" {
		return f()
	}
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("-cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		_ = out.Close()
		return fmt.Errorf("-cpuprofile: %w", err)
	}
	err = f()
	pprof.StopCPUProfile()
	return errors.Join(err, out.Close())
}
