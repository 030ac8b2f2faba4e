package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/bench/internal/privateredis"
	"github.com/reqlock/reqlock/bench/internal/redisstats"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// The tests run against a redis-server of their own, always: they read
// INFO commandstats, which counts every client's commands, and expect only
// theirs. inventoryBin is examples/inventory, built once.
var redisAddr, inventoryBin string

func TestMain(m *testing.M) {
	// startBaseline re-executes os.Executable(), which in a test is this
	// test binary: serve the baseline then, as httpbench does.
	if len(os.Args) > 1 && os.Args[1] == serveBaselineFlag {
		os.Exit(serveBaselineMain(os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == servePlainFlag {
		os.Exit(servePlainMain(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	s, err := privateredis.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "httpbench tests need redis-server: %v\n", err)
		return 1
	}
	defer s.Stop()
	redisAddr = s.Addr()
	tmp, err := os.MkdirTemp("", "httpbench-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	if inventoryBin, err = buildInventory(context.Background(), "../../..", tmp); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// testConfig is httpbench's configuration for the tests.
func testConfig(t *testing.T, args ...string) config {
	t.Helper()
	cfg, err := parseFlags(append([]string{"-redis", redisAddr, "-inventory", inventoryBin}, args...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// testSKU returns a SKU unique to the test.
func testSKU(name string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "t" + hex.EncodeToString(b[:]) + name
}

// deductAnswer is a deduction's answer as the tests see it.
type deductAnswer struct {
	status     int
	retryAfter string
	Stock      *int64 `json:"stock"`
}

func deduct(t *testing.T, svc *service, sku string) deductAnswer {
	t.Helper()
	resp, err := http.Post(svc.base+"/skus/"+sku+"/deduct", "application/json", strings.NewReader(`{"qty":1}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	a := deductAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatalf("%s: answer %d is not JSON: %v", svc.name, resp.StatusCode, err)
	}
	return a
}

// storedStock reads the stock of sku from Redis with stock: -1 when never
// set.
func storedStock(t *testing.T, rdb *redis.Client, stock stockCmd, sku string) int64 {
	t.Helper()
	cmd := stock(t.Context(), rdb, sku)
	v, err := cmd.Int64()
	if errors.Is(err, redis.Nil) {
		return -1
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestServicesAnswer starts every service of the deduct and library
// scenarios as httpbench does, with stock 3 and a wait of 300ms, and checks
// on each: deductions answer 200 with the stock left, which Redis holds,
// down to 0, then 409; a deduction of a SKU whose lock another instance
// holds (reqlock's Locker in front of the example and ginlock, redislock in
// front of the others, on the key sku:<id>) answers 423 with Retry-After
// once the wait is out, and changes nothing; once it is released, 200.
func TestServicesAnswer(t *testing.T) {
	cfg := testConfig(t, "-stock", "3", "-wait", "300ms")
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	store, err := redisstore.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	locker, err := reqlock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	type hold func(ctx context.Context, key string) (release func() error, err error)
	var holdReqlock hold = func(ctx context.Context, key string) (func() error, error) {
		l, err := locker.Obtain(ctx, key, 10*time.Second, 0)
		if err != nil {
			return nil, err
		}
		return func() error { return l.Release(context.Background()) }, nil
	}
	var holdRedislock hold = func(ctx context.Context, key string) (func() error, error) {
		l, err := redislock.Obtain(ctx, rdb, key, 10*time.Second, nil)
		if err != nil {
			return nil, err
		}
		return func() error { return l.Release(context.Background()) }, nil
	}
	plain := func(lock string) func() (*service, error) {
		return func() (*service, error) { return startPlain(lock, cfg) }
	}
	for _, tc := range []struct {
		name  string
		start func() (*service, error)
		hold  hold
		stock stockCmd
	}{
		{"reqlock", func() (*service, error) { return startInventory(cfg.inventory, cfg) }, holdReqlock, hashStock},
		{"redislock", func() (*service, error) { return startBaseline(cfg) }, holdRedislock, hashStock},
		{"plain-" + lockRueidis, plain(lockRueidis), holdReqlock, plainStock},
		{"plain-" + lockGoRedis, plain(lockGoRedis), holdReqlock, plainStock},
		{"plain-" + lockRedislock, plain(lockRedislock), holdRedislock, plainStock},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			svc, err := tc.start()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(svc.stop)
			stored := func(sku string) int64 { return storedStock(t, rdb, tc.stock, sku) }

			sku := testSKU("x")
			for want := cfg.stock - 1; want >= 0; want-- {
				a := deduct(t, svc, sku)
				if a.status != http.StatusOK || a.Stock == nil || *a.Stock != want {
					t.Fatalf("deduction: %d %+v, want 200 with stock %d", a.status, a, want)
				}
				if got := stored(sku); got != want {
					t.Fatalf("Redis holds stock %d, want %d", got, want)
				}
			}
			if a := deduct(t, svc, sku); a.status != http.StatusConflict {
				t.Fatalf("deduction at stock 0: %d, want 409", a.status)
			}
			if got := stored(sku); got != 0 {
				t.Fatalf("Redis holds stock %d after a 409, want 0", got)
			}

			held := testSKU("held")
			release, err := tc.hold(t.Context(), "sku:"+held)
			if err != nil {
				t.Fatal(err)
			}
			begin := time.Now()
			a := deduct(t, svc, held)
			if took := time.Since(begin); a.status != http.StatusLocked || a.retryAfter == "" || took < cfg.wait {
				t.Fatalf("held: %d Retry-After %q after %v, want 423 with Retry-After after the wait %v",
					a.status, a.retryAfter, took, cfg.wait)
			}
			if got := stored(held); got != -1 {
				t.Fatalf("held: Redis holds stock %d, want never set", got)
			}
			if err := release(); err != nil {
				t.Fatal(err)
			}
			if a := deduct(t, svc, held); a.status != http.StatusOK || a.Stock == nil || *a.Stock != cfg.stock-1 {
				t.Fatalf("released: %d %+v, want 200 with stock %d", a.status, a, cfg.stock-1)
			}
		})
	}
}

// TestLoadRun runs httpbench briefly (2 rounds of 300ms, 4 clients, 40
// SKUs) and checks its report: every round of each service answered only
// 200s, the ratios are those of the rates, both services make 4 script
// calls (round trips) per request, the baseline exactly 9 commands and the
// example more (its fences), every SKU's stock matches its 200 answers, and
// no key of the run is left in Redis.
func TestLoadRun(t *testing.T) {
	cfg := testConfig(t, "-clients", "4", "-skus", "40", "-duration", "300ms", "-rounds", "2", "-warmup", "200ms")
	var out bytes.Buffer
	rep, err := bench(t.Context(), cfg, &out)
	t.Logf("report:\n%s", &out)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(rep.services, ","); got != "reqlock,redislock" {
		t.Fatalf("services %s", got)
	}
	checkAllOK(t, cfg, rep)
	for i, name := range rep.services {
		if got := redisstats.ScriptCalls(rep.commands[i]); got != 4*rep.requests[i] {
			t.Errorf("%s: %d script calls for %d requests, want 4 each", name, got, rep.requests[i])
		}
	}
	if got := commandCount(rep.commands[1]); got != 9*rep.requests[1] {
		t.Errorf("redislock: %d commands for %d requests, want 9 each: %v", got, rep.requests[1], rep.commands[1])
	}
	if commandCount(rep.commands[0])*rep.requests[1] <= commandCount(rep.commands[1])*rep.requests[0] {
		t.Errorf("reqlock: %v per %d requests, want more commands per request than redislock's %v per %d (it fences)",
			rep.commands[0], rep.requests[0], rep.commands[1], rep.requests[1])
	}
	checkRatios(t, cfg, rep)
	for _, line := range []string{
		fmt.Sprintf("median reqlock/redislock over 2 rounds: req/s %.3fx", rep.medians[0]),
		"  reqlock    40 of 40 SKUs exact after " + strconv.FormatInt(rep.deductions[0], 10) + " deductions",
		"  redislock  40 of 40 SKUs exact after " + strconv.FormatInt(rep.deductions[1], 10) + " deductions",
		"  redislock  9.00 commands, 4.00 script calls",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("the report has no line with %q", line)
		}
	}
	checkNoKeys(t, rep.marker)
}

// checkRatios checks the ratios of a 2-round report against its rounds:
// per round each service's req/s and p99 over the baseline's (the last
// service), and their medians (the means of two).
func checkRatios(t *testing.T, cfg config, rep *report) {
	t.Helper()
	base := len(rep.services) - 1
	if len(rep.ratios) != base || len(rep.p99Ratios) != base || len(rep.medians) != base || len(rep.p99Medians) != base {
		t.Fatalf("ratios of %d, %d services, medians of %d, %d; want %d each",
			len(rep.ratios), len(rep.p99Ratios), len(rep.medians), len(rep.p99Medians), base)
	}
	for i := range base {
		if len(rep.ratios[i]) != cfg.rounds || len(rep.p99Ratios[i]) != cfg.rounds {
			t.Fatalf("%s: %d and %d ratios, want %d", rep.services[i], len(rep.ratios[i]), len(rep.p99Ratios[i]), cfg.rounds)
		}
		for r := range cfg.rounds {
			w, b := rep.rounds[i][r].w, rep.rounds[base][r].w
			if want := w.rate() / b.rate(); rep.ratios[i][r] != want {
				t.Errorf("%s round %d: ratio %v, want %v", rep.services[i], r+1, rep.ratios[i][r], want)
			}
			if want := float64(percentile(w.latency, 0.99)) / float64(percentile(b.latency, 0.99)); rep.p99Ratios[i][r] != want {
				t.Errorf("%s round %d: p99 ratio %v, want %v", rep.services[i], r+1, rep.p99Ratios[i][r], want)
			}
		}
		if want := (rep.ratios[i][0] + rep.ratios[i][1]) / 2; rep.medians[i] != want {
			t.Errorf("%s: median %v, want %v", rep.services[i], rep.medians[i], want)
		}
		if want := (rep.p99Ratios[i][0] + rep.p99Ratios[i][1]) / 2; rep.p99Medians[i] != want {
			t.Errorf("%s: p99 median %v, want %v", rep.services[i], rep.p99Medians[i], want)
		}
	}
}

// checkAllOK checks that every round of every service of rep answered some
// requests, only 200s, with sane latencies.
func checkAllOK(t *testing.T, cfg config, rep *report) {
	t.Helper()
	for i, name := range rep.services {
		if len(rep.rounds[i]) != cfg.rounds {
			t.Fatalf("%s: %d rounds, want %d", name, len(rep.rounds[i]), cfg.rounds)
		}
		for r, res := range rep.rounds[i] {
			w := res.w
			if w.requests == 0 || w.status[http.StatusOK] != w.requests || int64(len(w.latency)) != w.requests {
				t.Errorf("%s round %d: %d requests, answers %v, %d latencies: want some, all 200", name, r+1, w.requests, w.status, len(w.latency))
			}
			if w.elapsed < cfg.duration || percentile(w.latency, 0.5) <= 0 || percentile(w.latency, 0.5) > percentile(w.latency, 0.99) {
				t.Errorf("%s round %d: elapsed %v, p50 %v, p99 %v", name, r+1, w.elapsed, percentile(w.latency, 0.5), percentile(w.latency, 0.99))
			}
		}
		if len(rep.mismatches[i]) != 0 {
			t.Errorf("%s: stock mismatches %v", name, rep.mismatches[i])
		}
		if rep.deductions[i] < rep.requests[i] {
			t.Errorf("%s: %d deductions in all, fewer than the %d requests of the rounds", name, rep.deductions[i], rep.requests[i])
		}
		// Hundreds of requests take some CPU of the service and of Redis.
		if rep.svcCPU[i] <= 0 || rep.redisCPU[i] <= 0 || rep.svcCPU[i] > time.Second || rep.redisCPU[i] > time.Second {
			t.Errorf("%s: CPU per request: service %v, Redis %v; want each above 0 and below 1s", name, rep.svcCPU[i], rep.redisCPU[i])
		}
	}
}

// TestParseProcCPU reads utime + stime from a /proc/<pid>/stat line whose
// command name holds spaces and a ')', and refuses a short one.
func TestParseProcCPU(t *testing.T) {
	stat := "27679 (a b) c) R 27630 27630 3858 0 -1 4194304 97 0 0 0 150 25 0 0 20 0 1 0 4302457 3133440 394"
	if got, err := parseProcCPU(stat); err != nil || got != 1750*time.Millisecond {
		t.Errorf("got %v, %v; want 1.75s", got, err)
	}
	if _, err := parseProcCPU("27679 (cat) R 1 2 3"); err == nil {
		t.Error("a short line: no error")
	}
}

// checkNoKeys checks that no key of the run is left in Redis.
func checkNoKeys(t *testing.T, marker string) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	if keys, err := rdb.Keys(t.Context(), "*"+marker+"*").Result(); err != nil || len(keys) != 0 {
		t.Errorf("after the run: keys %v (%v), want none with %s", keys[:min(len(keys), 5)], err, marker)
	}
}

// TestLibraryRun runs -scenario library briefly (2 rounds of 300ms, 4
// clients, 40 SKUs) and checks its report: the three services, the
// baseline last; every round of each answered only 200s; the ratios are
// those of the rates and p99s; the second round ran in reverse order; each
// service makes 2 script calls (lock and release) and 2 plain commands
// (GET and SET of the stock) per request; redislock 7 commands in all;
// ginlock the same count on both clients (one Store's scripts), more than
// redislock (its fence); every SKU's stock matches its 200 answers; no key
// of the run is left.
func TestLibraryRun(t *testing.T) {
	cfg := testConfig(t, "-scenario", "library", "-clients", "4", "-skus", "40", "-duration", "300ms", "-rounds", "2", "-warmup", "200ms")
	var out bytes.Buffer
	rep, err := bench(t.Context(), cfg, &out)
	t.Logf("report:\n%s", &out)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(rep.services, ","); got != "ginlock-rueidis,ginlock-goredis,redislock" {
		t.Fatalf("services %s", got)
	}
	checkAllOK(t, cfg, rep)
	checkRatios(t, cfg, rep)
	for i, name := range rep.services {
		if got := redisstats.ScriptCalls(rep.commands[i]); got != 2*rep.requests[i] {
			t.Errorf("%s: %d script calls for %d requests, want 2 each", name, got, rep.requests[i])
		}
	}
	// redislock: EVALSHA (SET NX) to lock, the handler's GET and SET,
	// EVALSHA (GET, DEL) to release.
	n := rep.requests[2]
	if want := map[string]int64{"evalsha": 2 * n, "get": 2 * n, "set": 2 * n, "del": n}; !maps.Equal(withoutUsec(rep.commands[2]), want) {
		t.Errorf("redislock: %v for %d requests, want %v", rep.commands[2], n, want)
	}
	// ginlock: the same commands per request on both clients.
	for name, calls := range withoutUsec(rep.commands[0]) {
		if a, b := float64(calls)/float64(rep.requests[0]), float64(rep.commands[1][name])/float64(rep.requests[1]); a != b {
			t.Errorf("%s per request: ginlock-rueidis %v, ginlock-goredis %v; want the same", name, a, b)
		}
	}
	per := func(i int) float64 { return float64(commandCount(rep.commands[i])) / float64(rep.requests[i]) }
	if per(0) != per(1) || per(0) != float64(int64(per(0))) || per(0) <= per(2) {
		t.Errorf("commands per request: ginlock-rueidis %v, ginlock-goredis %v, redislock %v; want the same whole number on both ginlock clients, more than redislock's",
			per(0), per(1), per(2))
	}
	// Round 2 ran redislock first: its line comes first.
	text := out.String()
	if a, b := strings.Index(text, "\n2      redislock "), strings.Index(text, "\n2      ginlock-rueidis "); a < 0 || b < 0 || a > b {
		t.Errorf("round 2: redislock's line at %d, ginlock-rueidis's at %d: want both, redislock's first (reverse order)", a, b)
	}
	for _, line := range []string{
		fmt.Sprintf("median ginlock-rueidis/redislock over 2 rounds: req/s %.3fx", rep.medians[0]),
		fmt.Sprintf("median ginlock-goredis/redislock over 2 rounds: req/s %.3fx", rep.medians[1]),
		"  redislock        7.00 commands, 2.00 script calls",
		"CPU per request over all rounds",
		"  ginlock-goredis  40 of 40 SKUs exact after " + strconv.FormatInt(rep.deductions[1], 10) + " deductions",
	} {
		if !strings.Contains(text, line) {
			t.Errorf("the report has no line with %q", line)
		}
	}
	checkNoKeys(t, rep.marker)
}

// withoutUsec returns the calls of d, without its usec entries.
func withoutUsec(d map[string]int64) map[string]int64 {
	calls := map[string]int64{}
	for k, v := range d {
		if !redisstats.IsUsec(k) {
			calls[k] = v
		}
	}
	return calls
}

// TestRunExitCodes checks run's exit codes and that a bad flag is named.
func TestRunExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-h"}, 0, "-clients"},
		{nil, 2, "-redis is required"},
		{[]string{"-redis", "127.0.0.1:1", "-clients", "0"}, 2, "-clients 0"},
		{[]string{"-redis", "127.0.0.1:1", "-skus", "3", "-clients", "4"}, 2, "-skus 3"},
		{[]string{"-redis", "127.0.0.1:1", "-duration", "0s"}, 2, "-duration 0s"},
		{[]string{"-redis", "127.0.0.1:1", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"-scenario", "writes"}, 2, `-scenario "writes"`},
		{[]string{"-scenario", "library"}, 2, "-redis is required"},
		{[]string{"-scenario", "library", "-redis", "127.0.0.1:1", "-skus", "3", "-clients", "4"}, 2, "-skus 3"},
		{[]string{"-scenario", "reads", "-redis", "127.0.0.1:1"}, 2, "drop -redis"},
		{[]string{"-scenario", "limit", "-pause", "10s", "-ttl", "10s"}, 2, "-pause 10s"},
		{[]string{"-scenario", "reads", "-clients", "1"}, 2, "-clients 1"},
		{[]string{"-scenario", "idempotency", "-redis", "127.0.0.1:1"}, 2, "drop -redis"},
		{[]string{"-scenario", "idempotency", "-keys", "0"}, 2, "-keys 0"},
		{[]string{"-scenario", "idempotency", "-freeze", "0s"}, 2, "-freeze 0s"},
		{[]string{"-scenario", "idempotency", "-delay", "-1s"}, 2, "-delay -1s"},
		{[]string{"-scenario", "idempotency", "-skus", "0"}, 2, "-skus 0"},
		{[]string{"-scenario", "idempotency", "-keys", "10", "-stock", "9"}, 2, "-stock 9"},
		{[]string{"-redis", redisAddr, "-inventory", "/nonexistent/inventory", "-duration", "10ms"}, 1, "/nonexistent/inventory"},
	} {
		var stderr bytes.Buffer
		if code := run(t.Context(), tc.args, io.Discard, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", tc.args, code, stderr.String(), tc.code, tc.want)
		}
	}
}

// TestStockMismatches: a SKU's stock must be the initial stock less its 200
// answers, or less up to its 5xx answers more (a deduction that landed
// after its answer timed out); anything else is a mismatch.
func TestStockMismatches(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	skus := []string{testSKU("exact"), testSKU("unsure"), testSKU("below"), testSKU("lost"), testSKU("never")}
	tg := &target{skus: skus, stock: plainStock,
		ok:     []int64{2, 2, 2, 2, 0},
		unsure: []int64{1, 1, 1, 0, 0}}
	for i, stock := range []int64{8, 7, 6, 9} { // initial 10
		if err := rdb.Set(t.Context(), "plain:stock:"+skus[i], stock, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	bad, unsure, err := stockMismatches(t.Context(), rdb, tg, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{skus[2] + ": stock 6, want 7 to 8 (1 answers 5xx)", skus[3] + ": stock 9, want 8"}
	if unsure != 1 || !slices.Equal(bad, want) {
		t.Errorf("got %q and %d unsure; want %q and 1", bad, unsure, want)
	}
}

// TestIdempotencyRun runs the idempotency scenario small: 90 keys on 30
// SKUs, Redis stopped for 1s. Every key gets a 200, every 200 of a key is
// the same bytes, and each SKU fell by its keys' 200s; some answers were
// 503 while Redis was stopped, and some 200s were replays.
func TestIdempotencyRun(t *testing.T) {
	cfg, err := parseFlags([]string{"-scenario", "idempotency", "-inventory", inventoryBin, "-keys", "90", "-skus", "30",
		"-clients", "15", "-freeze", "1s", "-delay", "100ms"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep, err := benchIdempotency(t.Context(), cfg, &out)
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	if rep.ok != 90 || rep.fell != 90 || len(rep.differ)+len(rep.twice)+len(rep.noOK) != 0 {
		t.Fatalf("report %+v: want 90 keys with a 200, a fall of 90, no violation", rep)
	}
	if rep.statuses[0][http.StatusServiceUnavailable] == 0 || rep.replays == 0 {
		t.Fatalf("round 1 answered %v with %d replays: want 503s while Redis was stopped, and replays", rep.statuses[0], rep.replays)
	}
}
