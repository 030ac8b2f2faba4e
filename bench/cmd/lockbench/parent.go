package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/bench/internal/redisstats"
)

// startDelay is how far ahead of now a workload's common start time is set,
// so that every goroutine is parked on its timer when it comes.
const startDelay = 20 * time.Millisecond

// libResult is one library's measurement in one workload. Durations are in
// nanoseconds in JSON.
type libResult struct {
	Workload  string `json:"workload"`
	Lib       string `json:"lib"`
	Settings  string `json:"settings"`
	Processes int    `json:"processes"`
	Waiters   int    `json:"waiters"`
	Keys      int    `json:"keys"`

	Duration time.Duration `json:"duration_ns"`
	Elapsed  time.Duration `json:"elapsed_ns"` // start until the last goroutine ended

	Acquisitions int64   `json:"acquisitions"`           // every grant, also those after the window
	InWindow     int64   `json:"acquisitions_in_window"` // grants within [start, start+duration]
	AcqPerSec    float64 `json:"acquisitions_per_second"`

	WaitP50 time.Duration `json:"wait_p50_ns"`
	WaitP99 time.Duration `json:"wait_p99_ns"`
	WaitMax time.Duration `json:"wait_max_ns"`
	// WaitCurve is the wait distribution at fixed percentiles, for the
	// chart of -charts (see waitQuantiles); not in the JSON.
	WaitCurve []quantilePoint `json:"-"`

	Timeouts      int64  `json:"timeouts"`
	Errors        int64  `json:"errors"`
	ReleaseErrors int64  `json:"release_errors"`
	RMWErrors     int64  `json:"counter_errors"`
	FirstError    string `json:"first_error,omitempty"`

	Handovers   int           `json:"handovers"`
	HandoverP50 time.Duration `json:"handover_p50_ns"`
	HandoverP99 time.Duration `json:"handover_p99_ns"`

	Commands        int64         `json:"commands"` // from INFO commandstats, see lockCommands
	CommandsPerAcq  float64       `json:"commands_per_acquisition"`
	RedisCPUPerAcq  time.Duration `json:"redis_cpu_per_acquisition_ns"`  // INFO cpu delta (user+sys), all clients
	ScriptCPUPerAcq time.Duration `json:"script_cpu_per_acquisition_ns"` // commandstats usec of eval and evalsha
	ClientCPUPerAcq time.Duration `json:"client_cpu_per_acquisition_ns"` // lockbench's own CPU in its workers, harness included

	CommandDelta     map[string]int64 `json:"commandstats_delta"` // raw, every command
	RoundTrips       int64            `json:"round_trips"`
	RoundTripsPerAcq float64          `json:"round_trips_per_acquisition"`
	Handshakes       int64            `json:"handshake_round_trips"`

	CounterTotal int64 `json:"counter_total"`
	LostUpdates  int64 `json:"lost_updates"`
}

// report is the JSON that -json writes.
type report struct {
	Config      config                 `json:"config"`
	Environment environment            `json:"environment"`
	Settings    map[string]string      `json:"library_settings"`
	Results     []*libResult           `json:"results"`
	Comparisons map[string]*comparison `json:"comparisons"`
}

type environment struct {
	RunID        string            `json:"run_id"`
	Started      time.Time         `json:"started"`
	GoVersion    string            `json:"go_version"`
	GOOS         string            `json:"goos"`
	GOARCH       string            `json:"goarch"`
	NumCPU       int               `json:"num_cpu"`
	GOMAXPROCS   int               `json:"gomaxprocs"`
	RedisVersion string            `json:"redis_version"`
	PoolSize     int               `json:"pool_size"`
	Modules      map[string]string `json:"modules"`
	// LoadStart and LoadEnd are /proc/loadavg before and after the run
	// (Linux only): other work on the machine skews every figure.
	LoadStart string `json:"loadavg_start,omitempty"`
	LoadEnd   string `json:"loadavg_end,omitempty"`
}

func runParent(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	harness := newHarnessClient(cfg)
	defer harness.Close()
	version, err := redisstats.RedisVersion(ctx, harness)
	if err != nil {
		return fmt.Errorf("redis %s: %w", cfg.Redis, err)
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	env := environment{
		RunID:        hex.EncodeToString(id[:]),
		Started:      time.Now().UTC(),
		GoVersion:    runtime.Version(),
		GOOS:         runtime.GOOS,
		GOARCH:       runtime.GOARCH,
		NumCPU:       runtime.NumCPU(),
		GOMAXPROCS:   runtime.GOMAXPROCS(0),
		RedisVersion: version,
		PoolSize:     cfg.PoolSize,
		Modules:      modules(),
		LoadStart:    loadAvg(),
	}
	if env.PoolSize == 0 {
		env.PoolSize = 10 * runtime.GOMAXPROCS(0) // go-redis's default
	}
	rep := report{Config: cfg, Environment: env, Settings: map[string]string{},
		Comparisons: map[string]*comparison{}}
	for _, lib := range cfg.Libs {
		rep.Settings[lib] = libSettings(lib, cfg)
	}
	printHeader(stdout, &rep)

	for _, workload := range cfg.Workloads {
		var results []*libResult
		for _, lib := range cfg.Libs {
			fmt.Fprintf(stderr, "lockbench: %s / %s: running for %v\n", workload, lib, cfg.Duration)
			r, err := runLib(ctx, cfg, harness, env.RunID, workload, lib, stderr)
			if err != nil {
				return fmt.Errorf("%s / %s: %w", workload, lib, err)
			}
			results = append(results, r)
		}
		rep.Results = append(rep.Results, results...)
		if c := compare(workload, results); c != nil {
			rep.Comparisons[workload] = c
		}
		printWorkload(stdout, cfg, workload, results, rep.Comparisons[workload])
		if cfg.ChartsDir != "" {
			path, err := writeWaitChart(cfg.ChartsDir, cfg, workload, results)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "wait chart: %s\n", path)
		}
	}
	rep.Environment.LoadEnd = loadAvg()
	if rep.Environment.LoadEnd != "" {
		fmt.Fprintf(stdout, "\nload average (1, 5, 15 min) at start %s, at end %s\n",
			rep.Environment.LoadStart, rep.Environment.LoadEnd)
	}
	printNotes(stdout)
	if cfg.JSONPath != "" {
		b, err := json.MarshalIndent(&rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(cfg.JSONPath, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// loadAvg returns the first three fields of /proc/loadavg, or "" where
// there is none.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// modules returns the versions of the lock libraries and go-redis this binary
// was built with.
func modules() map[string]string {
	out := map[string]string{}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return out
	}
	for _, m := range info.Deps {
		switch m.Path {
		case "github.com/bsm/redislock", "github.com/go-redsync/redsync/v4", "github.com/redis/go-redis/v9",
			"github.com/reqlock/reqlock":
			v := m.Version
			if m.Replace != nil {
				v = "=> " + m.Replace.Path
				if m.Replace.Version != "" {
					v += " " + m.Replace.Version
				}
			}
			out[m.Path] = v
		}
	}
	return out
}

// runLib runs one workload with one library and measures it.
func runLib(ctx context.Context, cfg config, harness *redis.Client, runID, workload, lib string,
	stderr io.Writer) (*libResult, error) {
	prefix := "lockbench:" + runID + ":" + workload + ":" + lib + ":"
	var s spec
	procs := 1
	switch workload {
	case "hot":
		s = hotSpec(prefix, cfg.Waiters, cfg.Hold)
	case "spread":
		s = spreadSpec(prefix, cfg.Keys, cfg.Workers)
	case "multi":
		s = hotSpec(prefix, cfg.Waiters, cfg.Hold)
		procs = cfg.Procs
	}
	defer cleanup(harness, prefix, stderr)

	client, counter := newLibClient(cfg)
	defer client.Close()
	lk, err := newLocker(lib, client, cfg)
	if err != nil {
		return nil, err
	}
	defer closeLocker(lk)
	// One cycle outside the window: caches the library's scripts in Redis
	// (go-redis falls back from EVALSHA to EVAL once), for every library alike.
	if err := warmUp(ctx, lk, prefix+"warmup", cfg.Wait); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}

	var (
		before     map[string]int64
		cpuBefore  time.Duration
		res        *procResult
		start      time.Time
		snapBefore = func() (err error) {
			if before, err = redisstats.CommandStats(ctx, harness); err != nil {
				return err
			}
			cpuBefore, err = serverCPU(ctx, harness)
			return err
		}
	)
	if procs > 1 {
		res, start, err = runChildren(ctx, cfg, lib, prefix, snapBefore, stderr)
		if err != nil {
			return nil, err
		}
	} else {
		if err := warmPool(ctx, client, s.waiters); err != nil {
			return nil, err
		}
		if err := snapBefore(); err != nil {
			return nil, err
		}
		trips, handshakes := counter.trips.Load(), counter.handshakes.Load()
		start = time.Now().Add(startDelay)
		res = runWorkers(ctx, lk, harness, s, cfg.Wait, start, start.Add(cfg.Duration))
		res.RoundTrips = counter.trips.Load() - trips
		res.Handshakes = counter.handshakes.Load() - handshakes
	}
	elapsed := time.Since(start)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	after, err := redisstats.CommandStats(ctx, harness)
	if err != nil {
		return nil, err
	}
	cpuAfter, err := serverCPU(ctx, harness)
	if err != nil {
		return nil, err
	}
	total, err := counterTotal(ctx, harness, s)
	if err != nil {
		return nil, err
	}
	r := summarize(res, start, cfg.Duration)
	r.Workload, r.Lib, r.Settings = workload, lib, libSettings(lib, cfg)
	r.Processes, r.Waiters, r.Keys = procs, s.waiters, s.keys
	r.Elapsed = elapsed
	r.CommandDelta = redisstats.Delta(before, after)
	r.Commands = lockCommands(r.CommandDelta, res.HarnessGets, res.HarnessSets)
	r.RoundTrips, r.Handshakes = res.RoundTrips, res.Handshakes
	if r.Acquisitions > 0 {
		r.CommandsPerAcq = float64(r.Commands) / float64(r.Acquisitions)
		r.RoundTripsPerAcq = float64(r.RoundTrips) / float64(r.Acquisitions)
		r.RedisCPUPerAcq = (cpuAfter - cpuBefore) / time.Duration(r.Acquisitions)
		r.ScriptCPUPerAcq = time.Duration(redisstats.ScriptMicros(r.CommandDelta)) * time.Microsecond / time.Duration(r.Acquisitions)
		r.ClientCPUPerAcq = time.Duration(res.CPU) / time.Duration(r.Acquisitions)
	}
	r.CounterTotal = total
	r.LostUpdates = r.Acquisitions - res.RMWErrors - total
	return r, nil
}

// warmUp takes and releases key once.
func warmUp(ctx context.Context, lk locker, key string, wait time.Duration) error {
	lctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	unlock, err := lk.lock(lctx, key)
	if err != nil {
		return err
	}
	return unlock()
}

// summarize computes the statistics of res, whose window began at start.
func summarize(res *procResult, start time.Time, duration time.Duration) *libResult {
	r := &libResult{Duration: duration}
	grants := res.grants()
	end := start.Add(duration).UnixNano()
	waits := make([]int64, len(grants))
	for i, g := range grants {
		waits[i] = g.at - g.start
		if g.at <= end {
			r.InWindow++
		}
	}
	slices.Sort(waits)
	r.Acquisitions = int64(len(grants))
	r.AcqPerSec = float64(r.InWindow) / duration.Seconds()
	r.WaitP50, r.WaitP99 = percentile(waits, 0.50), percentile(waits, 0.99)
	if len(waits) > 0 {
		r.WaitMax = time.Duration(waits[len(waits)-1])
	}
	r.WaitCurve = waitQuantiles(waits)
	h := handovers(grants, res.releases())
	slices.Sort(h)
	r.Handovers = len(h)
	r.HandoverP50, r.HandoverP99 = percentile(h, 0.50), percentile(h, 0.99)
	r.Timeouts, r.Errors, r.ReleaseErrors, r.RMWErrors = res.Timeouts, res.Errors, res.ReleaseErrors, res.RMWErrors
	r.FirstError = res.FirstError
	return r
}

// counterTotal sums the lost-update counters of s's keys.
func counterTotal(ctx context.Context, c *redis.Client, s spec) (int64, error) {
	var total int64
	const chunk = 500
	for lo := 0; lo < s.keys; lo += chunk {
		keys := make([]string, 0, chunk)
		for i := lo; i < min(lo+chunk, s.keys); i++ {
			keys = append(keys, s.counterKey(i))
		}
		vals, err := c.MGet(ctx, keys...).Result()
		if err != nil {
			return 0, fmt.Errorf("read counters: %w", err)
		}
		for _, v := range vals {
			if v == nil {
				continue
			}
			str, _ := v.(string)
			n, err := strconv.ParseInt(str, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("read counters: %q: %w", str, err)
			}
			total += n
		}
	}
	return total, nil
}

// cleanup deletes every key of the run with prefix: lock keys, counters, and
// reqlock's prefixed lock and fence keys. It runs outside the measured window.
func cleanup(c *redis.Client, prefix string, stderr io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cursor uint64
	var errs []error
	for {
		keys, next, err := c.Scan(ctx, cursor, "*"+prefix+"*", 1000).Result()
		if err != nil {
			errs = append(errs, err)
			break
		}
		if len(keys) > 0 {
			if err := c.Unlink(ctx, keys...).Err(); err != nil {
				errs = append(errs, err)
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintf(stderr, "lockbench: cleanup of %s*: %v\n", prefix, err)
	}
}
