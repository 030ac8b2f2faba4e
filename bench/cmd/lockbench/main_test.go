package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/bench/internal/privateredis"
)

// envRedisAddr names a running Redis for the tests (host:port); without it
// they start a private redis-server on a free loopback port. It is not the
// REQLOCK_REDIS_ADDR of scripts/test.sh: the tests read INFO commandstats,
// which counts every client's commands.
const envRedisAddr = "LOCKBENCH_REDIS_ADDR"

// redisAddr is the Redis of the tests: LOCKBENCH_REDIS_ADDR, or a
// redis-server that TestMain started.
var redisAddr string

func TestMain(m *testing.M) {
	// The multi workload re-executes os.Executable(), which in a test is this
	// test binary: behave as lockbench's child then.
	if len(os.Args) > 1 && os.Args[1] == "-child" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	if redisAddr = os.Getenv(envRedisAddr); redisAddr != "" {
		return m.Run()
	}
	s, err := privateredis.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "lockbench tests need a Redis (or %s naming a running one): %v\n", envRedisAddr, err)
		return 1
	}
	defer s.Stop()
	redisAddr = s.Addr()
	return m.Run()
}

// TestAllWorkloads runs every workload briefly with every library, through
// the command line and the JSON file, and checks what every run must show.
func TestAllWorkloads(t *testing.T) {
	goroutines := runtime.NumGoroutine()
	jsonPath := filepath.Join(t.TempDir(), "results.json")
	chartsDir := filepath.Join(t.TempDir(), "charts")
	var stdout, stderr bytes.Buffer
	args := []string{"-redis", redisAddr, "-duration", "300ms", "-wait", "2s",
		"-waiters", "8", "-workers", "8", "-keys", "40", "-procs", "2", "-json", jsonPath, "-charts", chartsDir}
	if code := run(t.Context(), args, strings.NewReader(""), &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, &stderr)
	}
	t.Logf("output:\n%s", &stdout)

	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if got, want := len(rep.Results), len(allWorkloads)*len(allLibs); got != want {
		t.Fatalf("%d results, want %d", got, want)
	}
	for _, r := range rep.Results {
		name := r.Workload + "/" + r.Lib
		switch {
		case r.Acquisitions <= 0 || r.InWindow <= 0:
			t.Errorf("%s: %d acquisitions (%d in the window), want some", name, r.Acquisitions, r.InWindow)
		case r.LostUpdates != 0:
			t.Errorf("%s: %d lost updates", name, r.LostUpdates)
		case r.Errors+r.ReleaseErrors+r.RMWErrors != 0:
			t.Errorf("%s: %d lock, %d release, %d counter errors; first: %s",
				name, r.Errors, r.ReleaseErrors, r.RMWErrors, r.FirstError)
		case !(0 < r.WaitP50 && r.WaitP50 <= r.WaitP99 && r.WaitP99 <= r.WaitMax):
			t.Errorf("%s: waits p50 %v, p99 %v, max %v are not ordered", name, r.WaitP50, r.WaitP99, r.WaitMax)
		case r.HandoverP50 > r.HandoverP99:
			t.Errorf("%s: handover p50 %v > p99 %v", name, r.HandoverP50, r.HandoverP99)
		case r.Commands <= 0 || (r.RoundTrips <= 0) != (r.Lib == libRueidis):
			// reqlock-rueidis runs on a rueidis client, which the go-redis
			// hook does not see.
			t.Errorf("%s: %d commands (commandstats), %d round trips; want commands, and round trips "+
				"but on rueidis", name, r.Commands, r.RoundTrips)
		case r.CommandDelta["info"] == 0:
			t.Errorf("%s: commandstats delta %v lacks the harness's own INFO", name, r.CommandDelta)
		case r.ScriptCPUPerAcq <= 0:
			// Every library releases through a script.
			t.Errorf("%s: script CPU %v per acquisition, want above 0 (commandstats usec)", name, r.ScriptCPUPerAcq)
		case runtime.GOOS == "linux" && r.ClientCPUPerAcq <= 0:
			// The workers' process (a child's, in multi) used some CPU.
			t.Errorf("%s: client CPU %v per acquisition, want above 0 (getrusage)", name, r.ClientCPUPerAcq)
		case r.RedisCPUPerAcq < r.ScriptCPUPerAcq/4:
			// Redis's CPU (its rusage) covers its scripts, but commandstats
			// times a script by the clock, which counts the moments a loaded
			// machine took Redis off the CPU mid-script: the two may differ
			// by some tens of percent, never by a unit.
			t.Errorf("%s: Redis CPU %v per acquisition far below its scripts' %v", name, r.RedisCPUPerAcq, r.ScriptCPUPerAcq)
		}
		wantProcs := 1
		if r.Workload == "multi" {
			wantProcs = 2
		}
		if r.Processes != wantProcs {
			t.Errorf("%s: %d processes, want %d", name, r.Processes, wantProcs)
		}
		// 8 workers own 5 keys each: every spread cycle is uncontended, and
		// every library takes exactly one round trip to lock and one to unlock.
		if r.Workload == "spread" && r.Lib != libRueidis && r.RoundTrips != 2*r.Acquisitions {
			t.Errorf("spread/%s: %d round trips for %d acquisitions, want exactly 2 each", r.Lib, r.RoundTrips, r.Acquisitions)
		}
	}
	for _, w := range allWorkloads {
		c := rep.Comparisons[w]
		if c == nil || c.ThroughputRatio <= 0 || len(c.Targets) == 0 {
			t.Errorf("%s: comparison %+v, want ratios and targets", w, c)
		}
		if !strings.Contains(stdout.String(), "\n== "+w+": ") {
			t.Errorf("no table for %s in the output", w)
		}
		// Each workload's wait chart, with a curve for every library.
		path := filepath.Join(chartsDir, "wait-"+w+".svg")
		if !strings.Contains(stdout.String(), "wait chart: "+path+"\n") {
			t.Errorf("the output does not name the chart %s", path)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Error(err)
			continue
		}
		doc := parseSVG(t, b)
		for _, lib := range allLibs {
			if segs := doc.strokePaths(colorHex(seriesStyle(lib, 0).Color)); len(segs) != 2 || slices.Max(segs) < 2 {
				t.Errorf("%s chart: paths in %s's colour with %v segments, want its legend sample and its curve",
					w, lib, segs)
			}
		}
	}

	// Every run deleted its keys.
	c := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer c.Close()
	keys, _, err := c.Scan(t.Context(), 0, "*lockbench:"+rep.Environment.RunID+":*", 10000).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) > 0 {
		t.Errorf("keys left behind: %q", keys)
	}

	// Every goroutine of the run ended (clients closed, workers returned).
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > goroutines && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > goroutines {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines after the run, %d before:\n%s", n, goroutines, buf[:runtime.Stack(buf, true)])
	}
}

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "-redis host:port is required"},
		{[]string{"-redis", "127.0.0.1:1", "-workload", "cold"}, `unknown "cold"`},
		{[]string{"-redis", "127.0.0.1:1", "-lib", "reqlock,zookeeper"}, `unknown "zookeeper"`},
		{[]string{"-redis", "127.0.0.1:1", "-waiters", "3", "-procs", "4"}, "every process of multi needs a waiter"},
		{[]string{"-redis", "127.0.0.1:1", "-redislock-min", "1s", "-redislock-max", "1ms"}, "need 0 < min <= max"},
	} {
		var stderr bytes.Buffer
		code := run(t.Context(), tc.args, strings.NewReader(""), &bytes.Buffer{}, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("run(%q) = %d, stderr %q; want 2 and %q", tc.args, code, &stderr, tc.want)
		}
	}
	// The child flags stay out of the help text.
	var stderr bytes.Buffer
	if code := run(t.Context(), []string{"-h"}, strings.NewReader(""), &bytes.Buffer{}, &stderr); code != 0 {
		t.Errorf("-h: exit code %d", code)
	}
	if help := stderr.String(); !strings.Contains(help, "-workload") || strings.Contains(help, "-child") {
		t.Errorf("help text shows the wrong flags:\n%s", help)
	}
}

func TestHandovers(t *testing.T) {
	grants := []grant{
		{key: 0, start: 0, at: 10},   // first grant: no release before it
		{key: 0, start: 5, at: 30},   // waited since 5; key 0 released at 20: handover 10
		{key: 0, start: 45, at: 50},  // started after the release at 40: a re-acquire, no handover
		{key: 1, start: 0, at: 100},  // key 1: released at 60 (key 0's releases do not count)
		{key: 0, start: 55, at: 75},  // latest release before 75 is 70: handover 5
		{key: 2, start: 0, at: 1000}, // no release of key 2 at all
	}
	releases := []release{{0, 70}, {0, 20}, {0, 40}, {1, 60}}
	got := handovers(grants, releases)
	if want := []int64{10, 40, 5}; !slices.Equal(got, want) {
		t.Errorf("handovers = %v, want %v", got, want)
	}
}

func TestPercentile(t *testing.T) {
	var s []int64
	for i := range 100 {
		s = append(s, int64(i+1))
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{0.5, 50}, {0.99, 99}, {1, 100}, {0.001, 1}} {
		if got := percentile(s, tc.p); got != tc.want {
			t.Errorf("percentile(1..100, %v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := percentile(nil, 0.5); got != 0 {
		t.Errorf("percentile(nil) = %v, want 0", got)
	}
	// 0.07*100 is 7.000000000000001 in floating point: still the 7th
	// smallest, not the 8th.
	if got := percentile(s, 0.07); got != 7 {
		t.Errorf("percentile(1..100, 0.07) = %v, want 7", got)
	}
}

func TestSplitWaiters(t *testing.T) {
	if got, want := splitWaiters(50, 4), []int{13, 13, 12, 12}; !slices.Equal(got, want) {
		t.Errorf("splitWaiters(50, 4) = %v, want %v", got, want)
	}
}

func TestLockCommands(t *testing.T) {
	delta := map[string]int64{"evalsha": 10, "set": 25, "get": 22, "del": 5, "info": 1, "hello": 3, "client|setinfo": 6}
	// 20 GETs and 20 SETs were the harness's counter increments.
	if got := lockCommands(delta, 20, 20); got != 10+5+2+5 {
		t.Errorf("lockCommands = %d, want 22", got)
	}
}

// noLock is a locker that locks nothing.
type noLock struct{}

func (noLock) lock(context.Context, string) (func() error, error) {
	return func() error { return nil }, nil
}

// TestLostUpdatesAreDetected checks the detector itself: without mutual
// exclusion the GET-then-SET increments of concurrent holders interleave, and
// the count of lost updates shows it.
func TestLostUpdatesAreDetected(t *testing.T) {
	cfg := config{Redis: redisAddr, Waiters: 8}
	harness := newHarnessClient(cfg)
	defer harness.Close()
	prefix := fmt.Sprintf("lockbench:test-%d:", time.Now().UnixNano())
	defer cleanup(harness, prefix, os.Stderr)
	s := hotSpec(prefix, 8, 0)
	start := time.Now()
	res := runWorkers(t.Context(), noLock{}, harness, s, time.Second, start, start.Add(200*time.Millisecond))
	total, err := counterTotal(t.Context(), harness, s)
	if err != nil {
		t.Fatal(err)
	}
	grants := int64(len(res.GrantAt))
	if res.RMWErrors != 0 || grants == 0 || total >= grants {
		t.Fatalf("%d grants, counter %d, %d counter errors: want lost updates without a lock",
			grants, total, res.RMWErrors)
	}
	t.Logf("%d grants without a lock lost %d updates", grants, grants-total)
}
