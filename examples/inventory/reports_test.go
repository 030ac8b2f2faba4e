package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// tenant is the X-Tenant header of an export.
func tenant(name string) http.Header { return http.Header{"X-Tenant": {name}} }

// TestReportReadsShareRebuildWaits: on each framework (memstore, the
// default), three reads of one report run their handlers together, a
// rebuild sent meanwhile waits for them and then runs, and reads and
// rebuilds sent together never overlap (the handlers check it).
func TestReportReadsShareRebuildWaits(t *testing.T) {
	for _, fw := range frameworks {
		t.Run(fw, func(t *testing.T) {
			cfg := testConfig(fw)
			cfg.wait = 30 * time.Second
			a, srv := startApp(t, cfg)
			reads := newBarrier(3)
			var rebuildRan atomic.Bool
			a.shop.reports.testHookWork = func(ctx context.Context, route string) {
				switch route {
				case routeReport:
					reads.wait(ctx) // returns once three reads are in at once
				case routeRebuild:
					rebuildRan.Store(true)
				}
			}
			var sentReads []<-chan sent
			for range 3 {
				sentReads = append(sentReads, doAsync(http.MethodGet, srv.URL+"/reports/r1", ""))
			}
			select {
			case <-reads.all:
			case <-time.After(20 * time.Second):
				t.Fatal("three reads of a report never ran together")
			}
			for _, c := range sentReads {
				r := <-c
				if r.err != nil || r.a.status != http.StatusOK || r.a.Version != 0 {
					t.Fatalf("read: %v %v, want 200 at version 0", r.a, r.err)
				}
			}
			if rebuildRan.Load() {
				t.Fatal("a rebuild ran")
			}

			// Reads and rebuilds together: every answer is 200, the
			// handlers saw no overlap, and each rebuild counts once.
			a.shop.reports.testHookWork = nil
			a.shop.work = time.Millisecond
			const n, rebuilds = 40, 5
			answers := concurrently(t, n, func(i int) (string, string, string) {
				if i%(n/rebuilds) == 0 {
					return http.MethodPost, srv.URL + "/reports/r1/rebuild", ""
				}
				return http.MethodGet, srv.URL + "/reports/r1", ""
			})
			for i, ans := range answers {
				if ans.status != http.StatusOK {
					t.Errorf("request %d: %v", i, ans)
				}
			}
			a.shop.reports.mu.Lock()
			overlaps, version := a.shop.reports.overlaps, a.shop.reports.byID["r1"].version
			a.shop.reports.mu.Unlock()
			if overlaps != 0 || version != rebuilds {
				t.Fatalf("%d overlaps (want 0), version %d (want %d)", overlaps, version, rebuilds)
			}
		})
	}
}

// TestRebuildWaitsForReads: a rebuild sent while a read holds the report
// waits for it and runs after.
func TestRebuildWaitsForReads(t *testing.T) {
	cfg := testConfig(frameworkNetHTTP)
	cfg.wait = 30 * time.Second
	a, srv := startApp(t, cfg)
	entered, release := make(chan struct{}, 2), make(chan struct{})
	a.shop.reports.testHookWork = func(ctx context.Context, route string) {
		if route == routeReport {
			entered <- struct{}{}
			<-release
		}
	}
	read := doAsync(http.MethodGet, srv.URL+"/reports/r2", "")
	<-entered
	rebuild := doAsync(http.MethodPost, srv.URL+"/reports/r2/rebuild", "")
	// While the read holds the report shared, an exclusive lock is refused.
	if lock, err := a.locker.Obtain(context.Background(), "report:r2", time.Second, 0); err == nil {
		_ = lock.Release(context.Background())
		t.Fatal("an exclusive lock of the report was granted while a read held it")
	}
	close(release)
	if r := <-read; r.err != nil || r.a.status != http.StatusOK || r.a.Version != 0 {
		t.Fatalf("read: %v %v, want 200 at version 0", r.a, r.err)
	}
	if r := <-rebuild; r.err != nil || r.a.status != http.StatusOK || r.a.Version != 1 {
		t.Fatalf("rebuild: %v %v, want 200 and version 1", r.a, r.err)
	}
}

// mustDoHeader sends a request with header and fails the test on an error.
func mustDoHeader(t *testing.T, method, url string, header http.Header) answer {
	t.Helper()
	a, err := doHeader(context.Background(), method, url, "", header)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestExportLimit: on each framework (memstore), three exports of a tenant
// run at once; the fourth waits out the route's wait and is answered 429
// with Retry-After and a problem+json body with reason "limit"; another
// tenant's export runs meanwhile, and the tenant's next export runs once a
// place is free.
func TestExportLimit(t *testing.T) {
	for _, fw := range frameworks {
		t.Run(fw, func(t *testing.T) {
			cfg := testConfig(fw)
			cfg.wait = 100 * time.Millisecond
			a, srv := startApp(t, cfg)
			var mu sync.Mutex
			held := 0
			entered, release := make(chan struct{}, 3), make(chan struct{})
			var once sync.Once
			free := func() { once.Do(func() { close(release) }) }
			t.Cleanup(free)
			a.shop.reports.testHookWork = func(ctx context.Context, route string) {
				mu.Lock()
				block := held < 3
				if block {
					held++
				}
				mu.Unlock()
				if block {
					entered <- struct{}{}
					<-release
				}
			}
			var exports []<-chan sent
			for range 3 {
				c := make(chan sent, 1)
				go func() {
					ans, err := doHeader(context.Background(), http.MethodPost, srv.URL+"/exports", "", tenant("acme"))
					c <- sent{ans, err}
				}()
				exports = append(exports, c)
			}
			for range 3 {
				select {
				case <-entered:
				case <-time.After(20 * time.Second):
					t.Fatal("three exports of a tenant never ran together")
				}
			}
			over := mustDoHeader(t, http.MethodPost, srv.URL+"/exports", tenant("acme"))
			if over.status != http.StatusTooManyRequests || over.retryAfter != "1" || over.Reason != "limit" ||
				!strings.HasPrefix(over.contentType, "application/problem+json") && fw != frameworkEcho {
				t.Fatalf("fourth export: %v (Retry-After %q), want 429, Retry-After 1, reason limit", over, over.retryAfter)
			}
			if other := mustDoHeader(t, http.MethodPost, srv.URL+"/exports", tenant("globex")); other.status != http.StatusOK || other.Running != 1 {
				t.Fatalf("another tenant's export: %v", other)
			}
			if missing := mustDoHeader(t, http.MethodPost, srv.URL+"/exports", nil); missing.status != http.StatusBadRequest || missing.Reason != "bad_key" {
				t.Fatalf("an export without X-Tenant: %v, want 400 bad_key", missing)
			}
			free()
			for _, c := range exports {
				if r := <-c; r.err != nil || r.a.status != http.StatusOK {
					t.Fatalf("held export: %v %v", r.a, r.err)
				}
			}
			if next := mustDoHeader(t, http.MethodPost, srv.URL+"/exports", tenant("acme")); next.status != http.StatusOK {
				t.Fatalf("export after the others: %v", next)
			}
			text := scrape(t, srv.URL)
			for _, want := range []string{
				`reqlock_lock_limit_reached_total{route="POST /exports"} 1`,
				`reqlock_lock_holders{mode="limited",route="POST /exports"} 0`,
			} {
				if !strings.Contains(text, want+"\n") {
					t.Errorf("no %s in /metrics:\n%s", want, text)
				}
			}
		})
	}
}

// TestWorkLog: with -worklog, a read, a rebuild and an export each append
// one line with their start and end, whether their work ran to its end,
// their key and their route.
func TestWorkLog(t *testing.T) {
	cfg := testConfig(frameworkGin)
	cfg.workLog = filepath.Join(t.TempDir(), "work.log")
	cfg.work = 5 * time.Millisecond
	_, srv := startApp(t, cfg)
	mustDo(t, http.MethodGet, srv.URL+"/reports/r 1", "")
	mustDo(t, http.MethodPost, srv.URL+"/reports/r 1/rebuild", "")
	mustDoHeader(t, http.MethodPost, srv.URL+"/exports", tenant("t1"))
	data, err := os.ReadFile(cfg.workLog)
	if err != nil {
		t.Fatal(err)
	}
	want := [][2]string{{"r 1", routeReport}, {"r 1", routeRebuild}, {"t1", routeExports}}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != len(want) {
		t.Fatalf("work log:\n%s\nwant %d lines", data, len(want))
	}
	for i, line := range lines {
		var start, end int64
		var ok bool
		var key, route string
		if _, err := fmt.Sscanf(line, "%d %d %t %q %q", &start, &end, &ok, &key, &route); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if !ok || key != want[i][0] || route != want[i][1] || end-start < int64(cfg.work) {
			t.Errorf("line %q: want ok, key %q, route %q, end at least %v after start", line, want[i][0], want[i][1], cfg.work)
		}
	}
}
