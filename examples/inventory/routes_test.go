package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores/memstore"
)

// shippedRoutes is the route table the repository ships, relative to the
// package directory the tests run in.
const shippedRoutes = "routes.yaml"

// TestShippedRoutesFileIsTheDefault checks that routes.yaml is the built-in
// lock table with the default -wait and -ttl: the same routes, and for each
// the same configuration once defaults are applied (keys, wait, ttl,
// statuses, failure policy, limits, metric name).
func TestShippedRoutesFileIsTheDefault(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	file, err := middleware.LoadRoutes(locker, shippedRoutes)
	if err != nil {
		t.Fatalf("LoadRoutes(%s): %v", shippedRoutes, err)
	}
	def := defaultConfig()
	code, err := lockRoutes(def, locker)
	if err != nil {
		t.Fatalf("the built-in table: %v", err)
	}
	routes := func(rt *middleware.Routes) []string {
		var rs []string
		for _, s := range rt.Routes() {
			rs = append(rs, s.Method+" "+s.Path)
		}
		return rs
	}
	if f, c := routes(file), routes(code); !reflect.DeepEqual(f, c) {
		t.Fatalf("%s locks %q, the built-in table %q", shippedRoutes, f, c)
	}
	for _, s := range code.Routes() {
		fc := file.Guard(s.Method, s.Path).Config()
		cc := code.Guard(s.Method, s.Path).Config()
		if !reflect.DeepEqual(fc, cc) {
			t.Errorf("%s %s:\n%s: %+v\nbuilt in: %+v", s.Method, s.Path, shippedRoutes, fc, cc)
		}
		if cc.Wait != def.wait || cc.TTL != def.ttl {
			t.Errorf("%s %s: wait %v ttl %v, want the defaults %v and %v", s.Method, s.Path, cc.Wait, cc.TTL, def.wait, def.ttl)
		}
	}
}

// TestRoutesFileNoOversell is TestNoOversellUnderContention with the locks
// from the shipped routes.yaml (-routes) instead of the built-in table:
// 200 concurrent deductions of 1 on stock 100, through each framework and
// both routes, and exactly 100 succeed. The table's wait is 2s, which a
// loaded machine may exceed for the last of 200 queued requests, so a
// request whose wait ran out is sent again, as a client would, up to 50
// times. That answer is 423, or 503 when the wait ends just as the request's
// turn in the Locker's local queue comes; either changes nothing, which
// TestLockWaitRunsOut and TestLockStoreDown check.
func TestRoutesFileNoOversell(t *testing.T) {
	for _, fw := range frameworks {
		for _, route := range deductRoutes {
			t.Run(fw+"/"+route.name, func(t *testing.T) {
				cfg := testConfig(fw)
				cfg.routesFile = shippedRoutes
				cfg.work = 2 * time.Millisecond
				a, srv := startApp(t, cfg)
				for _, s := range a.routes.Routes() {
					if !strings.HasPrefix(s.Source, shippedRoutes+":") {
						t.Fatalf("%s %s comes from %q, not from %s", s.Method, s.Path, s.Source, shippedRoutes)
					}
				}
				var retries atomic.Int64
				checkNoOversell(t, srv.URL, route, func(method, url, body string) (answer, error) {
					for try := 1; ; try++ {
						a, err := do(method, url, body)
						again := a.status == http.StatusLocked || a.status == http.StatusServiceUnavailable
						if err != nil || !again || try == 50 {
							return a, err
						}
						retries.Add(1)
					}
				})
				if n := retries.Load(); n > 0 {
					t.Logf("%d times a request's wait ran out and it was sent again", n)
				}
			})
		}
	}
}

// writeFile writes data to name in a new temporary directory and returns
// its path.
func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// badTables are route tables with an error, and what the error must name.
var badTables = []struct {
	name, file, data string
	line             int    // the line the error names
	want             string // also in the error
}{
	{"bad duration", "bad.yaml", `# a bad wait
routes:
  POST /skus/{id}/deduct: "@lock key=sku:<id> wait=2x ttl=10s"
  POST /orders: "@lock key=sku:<json:sku>"
`, 3, `"2x" is not a duration`},
	{"unknown route", "typo.yaml", `routes:
  POST /skus/{id}/deduct: "@lock key=sku:<id>"
  POST /orders: "@lock key=sku:<json:sku>"
  POST /cart/checkout: "@lock key=sku:<json:items[*].sku>"
`, 4, "POST /cart/checkout"},
	{"path parameter the route lacks", "param.json", `{
  "routes": {
    "POST /skus/{id}/deduct": "@lock key=sku:<id>",
    "POST /orders": "@lock key=sku:<id>"
  }
}
`, 4, `path parameter "id"`},
	{"negative ttl", "ttl.json", `{
  "routes": {
    "POST /orders": "@lock key=sku:<json:sku> ttl=-1s"
  }
}
`, 3, `"-1s" is negative`},
}

// TestRoutesFileErrors runs the service with each bad table, on each
// framework, on an address the test already listens on: run must return
// the table's error, naming the file and the line, and not the address's,
// so it checked the table before it listened; and it printed nothing.
func TestRoutesFileErrors(t *testing.T) {
	for _, fw := range frameworks {
		for _, tc := range badTables {
			t.Run(fw+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				cfg := testConfig(fw)
				cfg.addr = ln.Addr().String()
				cfg.routesFile = writeFile(t, tc.file, tc.data)
				var out bytes.Buffer
				err = run(context.Background(), cfg, &out)
				where := fmt.Sprintf("%s:%d", cfg.routesFile, tc.line)
				if err == nil || !strings.Contains(err.Error(), where) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("run: %v\nwant an error naming %s and %q", err, where, tc.want)
				}
				if out.Len() > 0 {
					t.Errorf("run printed, so it got past the table:\n%s", out.String())
				}
			})
		}
	}
	t.Run("missing file", func(t *testing.T) {
		cfg := testConfig(frameworkGin)
		cfg.routesFile = filepath.Join(t.TempDir(), "none.yaml")
		if _, err := buildApp(cfg); err == nil || !strings.Contains(err.Error(), cfg.routesFile) {
			t.Fatalf("buildApp: %v, want an error naming %s", err, cfg.routesFile)
		}
	})
}

// TestTableOutsideSKUKeySpace runs a table whose keys are not the sku: keys
// the stock is fenced by: the requests get a lock, but it has no fence for
// the SKU they write, so they answer 500 and change nothing rather than
// write with another key's fence.
func TestTableOutsideSKUKeySpace(t *testing.T) {
	table := writeFile(t, "other.yaml", `routes:
  POST /skus/{id}/deduct: "@lock key=item:<id>"
  POST /carts/checkout: "@lock key=cart:<json:items[*].sku>"
`)
	for _, fw := range frameworks {
		t.Run(fw, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(fw)
			cfg.routesFile = table
			_, srv := startApp(t, cfg)
			got := mustDo(t, http.MethodPost, srv.URL+"/skus/X/deduct", `{"qty":1}`)
			if got.status != http.StatusInternalServerError || !strings.Contains(got.Error, "does not cover") {
				t.Errorf("deduct: %v, want 500 naming the uncovered SKU", got)
			}
			got = mustDo(t, http.MethodPost, srv.URL+"/carts/checkout", `{"items":[{"sku":"X","qty":1},{"sku":"Y","qty":1}]}`)
			if got.status != http.StatusInternalServerError || !strings.Contains(got.Error, "does not cover") {
				t.Errorf("checkout: %v, want 500 naming the uncovered SKU", got)
			}
			// /orders has no entry: it runs unlocked and unfenced.
			got = mustDo(t, http.MethodPost, srv.URL+"/orders", `{"sku":"Z","qty":1}`)
			if got.status != http.StatusOK || got.Fence != 0 {
				t.Errorf("orders, without an entry: %v, want 200 unfenced", got)
			}
			for _, sku := range []string{"X", "Y"} {
				if got := stockOf(t, srv.URL, sku); got != 100 {
					t.Errorf("stock of %s is %d, want 100: a refused request changed it", sku, got)
				}
			}
		})
	}
}
