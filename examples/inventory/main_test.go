package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestParseFlags checks valid flag sets and that every invalid one is
// refused with an error naming the flag.
func TestParseFlags(t *testing.T) {
	def := defaultConfig()
	env := func(m map[string]string) func(string) string {
		return func(k string) string { return m[k] }
	}
	valid := []struct {
		name string
		args []string
		env  map[string]string
		want func(config) config
	}{
		{"defaults", nil, nil, func(c config) config { return c }},
		{"all", []string{"-addr", "0.0.0.0:9000", "-framework", "echo", "-stock", "3", "-work", "5ms",
			"-wait", "0", "-ttl", "1s", "-nolock"}, nil, func(c config) config {
			c.addr, c.framework, c.defaultStock, c.work, c.wait, c.ttl, c.noLock =
				"0.0.0.0:9000", "echo", 3, 5*time.Millisecond, 0, time.Second, true
			return c
		}},
		{"nethttp", []string{"-framework=nethttp"}, nil, func(c config) config { c.framework = "nethttp"; return c }},
		{"redis flag", []string{"-redis", "redis://localhost:6379/1"}, nil, func(c config) config {
			c.redisURL = "redis://localhost:6379/1"
			return c
		}},
		{"redis from env", nil, map[string]string{"REDIS_URL": "redis://r:6379"}, func(c config) config {
			c.redisURL = "redis://r:6379"
			return c
		}},
		{"flag beats env", []string{"-redis", "redis://a:1"}, map[string]string{"REDIS_URL": "bad"}, func(c config) config {
			c.redisURL = "redis://a:1"
			return c
		}},
		{"store flag", []string{"-store", "memory://"}, nil, func(c config) config { c.storeURL = "memory://"; return c }},
		{"store from env", nil, map[string]string{"REQLOCK_STORE": "redis://s:1"}, func(c config) config {
			c.storeURL = "redis://s:1"
			return c
		}},
		{"routes", []string{"-routes", "r.yaml", "-stock", "5", "-work", "1ms"}, nil, func(c config) config {
			c.routesFile, c.defaultStock, c.work = "r.yaml", 5, time.Millisecond
			return c
		}},
	}
	for _, tc := range valid {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseFlags(tc.args, env(tc.env), io.Discard)
			if err != nil {
				t.Fatalf("parseFlags(%q): %v", tc.args, err)
			}
			if want := tc.want(def); got != want {
				t.Fatalf("parseFlags(%q) = %+v, want %+v", tc.args, got, want)
			}
		})
	}

	invalid := []struct {
		name string
		args []string
		env  map[string]string
		flag string // the error must contain it
	}{
		{"unknown framework", []string{"-framework", "fiber"}, nil, "-framework"},
		{"negative wait", []string{"-wait", "-1s"}, nil, "-wait"},
		{"negative work", []string{"-work", "-5ms"}, nil, "-work"},
		{"zero ttl", []string{"-ttl", "0"}, nil, "-ttl"},
		{"negative stock", []string{"-stock", "-1"}, nil, "-stock"},
		{"bad wait", []string{"-wait", "soon"}, nil, "-wait"},
		{"bad stock", []string{"-stock", "many"}, nil, "-stock"},
		{"bad addr", []string{"-addr", "localhost"}, nil, "-addr"},
		{"bad redis scheme", []string{"-redis", "http://localhost:6379"}, nil, "-redis"},
		{"bad redis option", []string{"-redis", "redis://localhost:6379?nope=1"}, nil, "-redis"},
		{"bad REDIS_URL", nil, map[string]string{"REDIS_URL": "mysql://x"}, "$REDIS_URL"},
		{"unknown store", []string{"-store", "consul://x"}, nil, `-store: unknown store "consul"`},
		{"store not a URL", []string{"-store", "redis://u:se%cret@x"}, nil, "-store: not a URL"},
		{"bad REQLOCK_STORE", nil, map[string]string{"REQLOCK_STORE": "nope://"}, "-store (from $REQLOCK_STORE)"},
		{"unknown flag", []string{"-port", "80"}, nil, "-port"},
		{"stray argument", []string{"gin"}, nil, `"gin"`},
		{"routes and wait", []string{"-routes", "r.yaml", "-wait", "1s"}, nil, "-wait with -routes"},
		{"routes and default wait", []string{"-wait", "2s", "-routes", "r.yaml"}, nil, "-wait with -routes"},
		{"routes and ttl", []string{"-routes", "r.yaml", "-ttl", "5s"}, nil, "-ttl with -routes"},
		{"routes and nolock", []string{"-routes", "r.yaml", "-nolock"}, nil, "-nolock with -routes"},
	}
	for _, tc := range invalid {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseFlags(tc.args, env(tc.env), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.flag) {
				t.Fatalf("parseFlags(%q) = %v, want an error naming %s", tc.args, err, tc.flag)
			}
		})
	}

	if _, err := parseFlags([]string{"-h"}, nil, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v, want flag.ErrHelp", err)
	}
}

// TestNewAppRejectsInvalidConfig checks that newApp validates its config
// as the flags do.
func TestNewAppRejectsInvalidConfig(t *testing.T) {
	cfg := testConfig("fiber")
	if _, _, err := newApp(cfg); err == nil || !strings.Contains(err.Error(), "-framework") {
		t.Fatalf("newApp with framework fiber: %v, want an error naming -framework", err)
	}
	h, closeApp, err := newApp(testConfig(frameworkNetHTTP))
	if err != nil || h == nil {
		t.Fatalf("newApp: %v", err)
	}
	closeApp()
}

// TestMainBinary builds the real command. Run with an invalid flag, it must
// exit 2 naming the flag. Run on a free port, it prints where it listens:
// the test waits for that line, checks the startup lines, a GET, a
// deduction and its metric, and stops it with SIGINT: it must shut down gracefully and
// exit 0.
func TestMainBinary(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "inventory")
	build := exec.Command(goBin, "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	// An invalid flag: exit 2, naming the flag, before listening.
	bad, err := exec.Command(bin, "-framework", "fiber").CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Errorf("-framework fiber: exit %v, want status 2; output:\n%s", err, bad)
	}
	if !strings.Contains(string(bad), "-framework") || strings.Contains(string(bad), "listening") {
		t.Errorf("-framework fiber: the output does not name -framework, or it listened:\n%s", bad)
	}

	// -routes with -wait: exit 2, naming both, before listening.
	bad, err = exec.Command(bin, "-routes", "routes.yaml", "-wait", "5s").CombinedOutput()
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Errorf("-routes with -wait: exit %v, want status 2; output:\n%s", err, bad)
	}
	if !strings.Contains(string(bad), "-wait with -routes") || strings.Contains(string(bad), "listening") {
		t.Errorf("-routes with -wait: the output does not name both flags, or it listened:\n%s", bad)
	}

	// A route table with an error on line 3, then one with an entry that
	// matches no route on line 4: exit non-zero, stderr naming the file and
	// the line, and nothing on stdout (it never listened).
	for _, tc := range badTables[:2] {
		table := writeFile(t, tc.file, tc.data)
		cmd := exec.Command(bin, "-addr", "127.0.0.1:0", "-routes", table)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Errorf("%s: exit %v, want a non-zero status", tc.name, err)
		}
		if where := fmt.Sprintf("%s:%d", table, tc.line); !strings.Contains(stderr.String(), where) {
			t.Errorf("%s: stderr does not name %s:\n%s", tc.name, where, stderr.String())
		}
		if stdout.Len() > 0 {
			t.Errorf("%s: stdout shows it started:\n%s", tc.name, stdout.String())
		}
	}

	cmd := exec.Command(bin, "-addr", "127.0.0.1:0", "-framework", "nethttp", "-stock", "42")
	cmd.Env = append(os.Environ(), "REDIS_URL=") // memory stores whatever the environment says
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	})

	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	next := func() string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the command exited early: %v", <-exited)
			}
			return l
		case <-deadline.C:
			t.Fatal("no output from the command within 30s")
		}
		return ""
	}
	var base string
	var out []string
	for { // read up to the last startup line, the GET to try
		l := next()
		out = append(out, l)
		if rest, ok := strings.CutPrefix(l, "inventory: listening on "); ok {
			base = rest
		}
		if base != "" && strings.TrimSpace(l) == "curl -s "+base+"/skus/apple" {
			break
		}
	}
	all := strings.Join(out, "\n")
	for _, want := range []string{"framework nethttp", "memstore", "wait 2s, ttl 10s",
		"inventory: lock POST /carts/checkout: @lock key=sku:<json:items[*].sku> idempotency=optional on-timeout=423 on-store-error=503 wait=2s ttl=10s",
		"curl -s -X POST -d '{\"qty\":1}' " + base + "/skus/apple/deduct", base + "/carts/checkout", "curl -s " + base + "/metrics", "curl -s " + base + "/skus/apple"} {
		if !strings.Contains(all, want) {
			t.Errorf("startup output lacks %q:\n%s", want, all)
		}
	}

	got := mustDo(t, http.MethodGet, base+"/skus/a", "")
	if got.status != http.StatusOK || got.SKU != "a" || got.Stock == nil || *got.Stock != 42 {
		t.Fatalf("GET /skus/a: %v, want 200 with stock 42", got)
	}
	got = mustDo(t, http.MethodPost, base+"/skus/a/deduct", `{"qty":2}`)
	if got.status != http.StatusOK || *got.Stock != 40 || got.Fence <= 0 {
		t.Fatalf("POST /skus/a/deduct: %v, want 200 with stock 40 and a fence", got)
	}
	const series = `reqlock_lock_success_total{route="POST /skus/{id}/deduct"}`
	if v, ok := sample(scrape(t, base), series); !ok || v != "1" {
		t.Errorf("GET /metrics: %s = %q (present %v), want 1", series, v, ok)
	}

	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for l := range lines {
		out = append(out, l)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGINT: %v", err)
		}
	case <-deadline.C:
		t.Fatal("the command did not exit within 30s of SIGINT")
	}
	if all := strings.Join(out, "\n"); !strings.Contains(all, "inventory: stopped") {
		t.Errorf("no graceful shutdown line in:\n%s", all)
	}
}
