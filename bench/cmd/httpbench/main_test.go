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
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/bench/internal/privateredis"
	"github.com/reqlock/reqlock/bench/internal/redislockshop"
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

// storedStock reads the stock of sku from Redis: -1 when never set.
func storedStock(t *testing.T, rdb *redis.Client, sku string) int64 {
	t.Helper()
	v, err := rdb.HGet(t.Context(), redislockshop.StockPrefix+sku, "stock").Int64()
	if errors.Is(err, redis.Nil) {
		return -1
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestServicesAnswer starts both services as httpbench does, with stock 3
// and a wait of 300ms, and checks on each: deductions answer 200 with the
// stock left, which Redis holds, down to 0, then 409; a deduction of a SKU
// whose lock another instance holds (reqlock's Locker for the example,
// redislock for the baseline, on the key sku:<id>) answers 423 with
// Retry-After once the wait is out, and changes nothing; once it is
// released, 200.
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
	hold := map[string]func(ctx context.Context, key string) (release func() error, err error){
		"reqlock": func(ctx context.Context, key string) (func() error, error) {
			l, err := locker.Obtain(ctx, key, 10*time.Second, 0)
			if err != nil {
				return nil, err
			}
			return func() error { return l.Release(context.Background()) }, nil
		},
		"redislock": func(ctx context.Context, key string) (func() error, error) {
			l, err := redislock.Obtain(ctx, rdb, key, 10*time.Second, nil)
			if err != nil {
				return nil, err
			}
			return func() error { return l.Release(context.Background()) }, nil
		},
	}
	start := map[string]func() (*service, error){
		"reqlock":   func() (*service, error) { return startInventory(cfg.inventory, cfg) },
		"redislock": func() (*service, error) { return startBaseline(cfg) },
	}
	for _, name := range []string{"reqlock", "redislock"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			svc, err := start[name]()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(svc.stop)

			sku := testSKU("x")
			for want := cfg.stock - 1; want >= 0; want-- {
				a := deduct(t, svc, sku)
				if a.status != http.StatusOK || a.Stock == nil || *a.Stock != want {
					t.Fatalf("deduction: %d %+v, want 200 with stock %d", a.status, a, want)
				}
				if got := storedStock(t, rdb, sku); got != want {
					t.Fatalf("Redis holds stock %d, want %d", got, want)
				}
			}
			if a := deduct(t, svc, sku); a.status != http.StatusConflict {
				t.Fatalf("deduction at stock 0: %d, want 409", a.status)
			}
			if got := storedStock(t, rdb, sku); got != 0 {
				t.Fatalf("Redis holds stock %d after a 409, want 0", got)
			}

			held := testSKU("held")
			release, err := hold[name](t.Context(), "sku:"+held)
			if err != nil {
				t.Fatal(err)
			}
			begin := time.Now()
			a := deduct(t, svc, held)
			if took := time.Since(begin); a.status != http.StatusLocked || a.retryAfter == "" || took < cfg.wait {
				t.Fatalf("held: %d Retry-After %q after %v, want 423 with Retry-After after the wait %v",
					a.status, a.retryAfter, took, cfg.wait)
			}
			if got := storedStock(t, rdb, held); got != -1 {
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
		if got := redisstats.ScriptCalls(rep.commands[i]); got != 4*rep.requests[i] {
			t.Errorf("%s: %d script calls for %d requests, want 4 each", name, got, rep.requests[i])
		}
		if len(rep.mismatches[i]) != 0 {
			t.Errorf("%s: stock mismatches %v", name, rep.mismatches[i])
		}
		if rep.deductions[i] < rep.requests[i] {
			t.Errorf("%s: %d deductions in all, fewer than the %d requests of the rounds", name, rep.deductions[i], rep.requests[i])
		}
	}
	if got := commandCount(rep.commands[1]); got != 9*rep.requests[1] {
		t.Errorf("redislock: %d commands for %d requests, want 9 each: %v", got, rep.requests[1], rep.commands[1])
	}
	if commandCount(rep.commands[0])*rep.requests[1] <= commandCount(rep.commands[1])*rep.requests[0] {
		t.Errorf("reqlock: %v per %d requests, want more commands per request than redislock's %v per %d (it fences)",
			rep.commands[0], rep.requests[0], rep.commands[1], rep.requests[1])
	}
	if len(rep.ratios) != cfg.rounds {
		t.Fatalf("%d ratios, want %d", len(rep.ratios), cfg.rounds)
	}
	for r, ratio := range rep.ratios {
		if want := rep.rounds[0][r].w.rate() / rep.rounds[1][r].w.rate(); ratio != want {
			t.Errorf("round %d: ratio %v, want %v", r+1, ratio, want)
		}
	}
	if want := (rep.ratios[0] + rep.ratios[1]) / 2; rep.median != want {
		t.Errorf("median %v, want %v", rep.median, want)
	}
	for _, line := range []string{
		fmt.Sprintf("median reqlock/redislock req/s over 2 rounds: %.3fx", rep.median),
		"  reqlock    40 of 40 SKUs exact after " + strconv.FormatInt(rep.deductions[0], 10) + " deductions",
		"  redislock  40 of 40 SKUs exact after " + strconv.FormatInt(rep.deductions[1], 10) + " deductions",
		"  redislock  9.00 commands, 4.00 script calls",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("the report has no line with %q", line)
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	if keys, err := rdb.Keys(t.Context(), "*"+rep.marker+"*").Result(); err != nil || len(keys) != 0 {
		t.Errorf("after the run: keys %v (%v), want none with %s", keys[:min(len(keys), 5)], err, rep.marker)
	}
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
		{[]string{"-scenario", "reads", "-redis", "127.0.0.1:1"}, 2, "drop -redis"},
		{[]string{"-scenario", "limit", "-pause", "10s", "-ttl", "10s"}, 2, "-pause 10s"},
		{[]string{"-scenario", "reads", "-clients", "1"}, 2, "-clients 1"},
		{[]string{"-redis", redisAddr, "-inventory", "/nonexistent/inventory", "-duration", "10ms"}, 1, "/nonexistent/inventory"},
	} {
		var stderr bytes.Buffer
		if code := run(t.Context(), tc.args, io.Discard, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", tc.args, code, stderr.String(), tc.code, tc.want)
		}
	}
}
