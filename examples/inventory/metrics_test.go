package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// scrape returns the body of GET /metrics on the service at base, which
// must answer 200 in the Prometheus text format.
func scrape(t *testing.T, base string) string {
	t.Helper()
	resp, err := testClient.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Fatalf("GET /metrics: %d %q, want 200 in the text format 0.0.4:\n%s", resp.StatusCode, ct, body)
	}
	return string(body)
}

// sample returns the value of the series (name and labels, as exposed) in
// the exposition text, and whether it is there.
func sample(text, series string) (string, bool) {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v, true
		}
	}
	return "", false
}

// TestMetrics sends known requests, on each framework, with the built-in
// lock table and with the shipped routes.yaml, and reads GET /metrics: each
// route's successes are counted exactly, under the route's label; a 423
// counts as a failure with reason="timeout"; the unlocked GETs, /metrics
// itself included, report nothing; and each held lock's hold time was
// observed. With -nolock /metrics serves no series.
func TestMetrics(t *testing.T) {
	for _, fw := range frameworks {
		for _, table := range []string{"built-in", shippedRoutes} {
			t.Run(fw+"/"+table, func(t *testing.T) {
				t.Parallel()
				cfg := testConfig(fw)
				cfg.wait = 50 * time.Millisecond
				if table == shippedRoutes {
					cfg.routesFile, cfg.wait = shippedRoutes, defaultConfig().wait
				}
				a, srv := startApp(t, cfg)

				send := func(n int, method, path, body string, status int) {
					t.Helper()
					for range n {
						if got := mustDo(t, method, srv.URL+path, body); got.status != status {
							t.Fatalf("%s %s %s: %v, want %d", method, path, body, got, status)
						}
					}
				}
				send(3, http.MethodPost, "/skus/X/deduct", `{"qty":1}`, http.StatusOK)
				send(1, http.MethodPost, "/skus/X/deduct", `{"qty":500}`, http.StatusConflict) // locked, then short
				send(2, http.MethodPost, "/orders", `{"sku":"Y","qty":1}`, http.StatusOK)
				send(1, http.MethodPost, "/carts/checkout", cartBody(cartItem{"X", 1}, cartItem{"Y", 1}), http.StatusOK)
				send(1, http.MethodPost, "/orders", `{"qty":1}`, http.StatusBadRequest) // no key: bad_key
				send(2, http.MethodGet, "/skus/X", "", http.StatusOK)
				scrape(t, srv.URL) // unlocked: it must add no series either

				// Another holder of sku:Y: a deduction of Y waits, then 423.
				// The 2s wait of routes.yaml makes that one slower.
				held, err := a.locker.Obtain(context.Background(), "sku:Y", time.Minute, 0)
				if err != nil {
					t.Fatal(err)
				}
				send(1, http.MethodPost, "/skus/Y/deduct", `{"qty":1}`, http.StatusLocked)
				if err := held.Release(context.Background()); err != nil {
					t.Fatal(err)
				}

				text := scrape(t, srv.URL)
				const (
					deduct   = `route="POST /skus/{id}/deduct"`
					orders   = `route="POST /orders"`
					checkout = `route="POST /carts/checkout"`
				)
				for series, value := range map[string]string{
					"reqlock_lock_success_total{" + deduct + "}":                       "4",
					"reqlock_lock_success_total{" + orders + "}":                       "2",
					"reqlock_lock_success_total{" + checkout + "}":                     "1",
					`reqlock_lock_failure_total{reason="timeout",` + deduct + "}":      "1",
					`reqlock_lock_failure_total{reason="timeout",` + orders + "}":      "0",
					`reqlock_lock_failure_total{reason="bad_key",` + orders + "}":      "1",
					`reqlock_lock_failure_total{reason="store_error",` + deduct + "}":  "0",
					"reqlock_lock_hold_seconds_count{" + deduct + "}":                  "4",
					"reqlock_lock_hold_seconds_count{" + checkout + "}":                "1",
					`reqlock_lock_wait_seconds_count{result="timeout",` + deduct + "}": "1",
				} {
					if got, ok := sample(text, series); !ok || got != value {
						t.Errorf("%s = %q (present %v), want %s", series, got, ok, value)
					}
				}
				for _, absent := range []string{`route="GET /skus/{id}"`, `route="GET /metrics"`, `route="PUT /skus/{id}"`} {
					if strings.Contains(text, absent) {
						t.Errorf("the metrics have series of %s, which no request locked:\n%s", absent, text)
					}
				}
				if t.Failed() {
					t.Logf("GET /metrics:\n%s", text)
				}
			})
		}
	}
	t.Run("nolock", func(t *testing.T) {
		cfg := testConfig(frameworkGin)
		cfg.noLock = true
		_, srv := startApp(t, cfg)
		mustDo(t, http.MethodPost, srv.URL+"/skus/X/deduct", `{"qty":1}`)
		if text := scrape(t, srv.URL); strings.TrimSpace(text) != "" {
			t.Errorf("-nolock: GET /metrics serves series:\n%s", text)
		}
	})
}
