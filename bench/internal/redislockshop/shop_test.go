package redislockshop

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/testredis"
)

func TestMain(m *testing.M) { os.Exit(testredis.Main(m)) }

// exampleShop is the example's file that holds its stock scripts.
const exampleShop = "../../../examples/inventory/shop.go"

// TestScriptsAreTheExamples checks that ReadScript and WriteScript are the
// example's redisReadScript and redisWriteScript, character for character
// (their SHA1s). They are copies because examples/inventory is a main
// package, which cannot be imported; httpbench's comparison holds only while
// both services run the same stock scripts.
func TestScriptsAreTheExamples(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), exampleShop, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	sources := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || len(vs.Values) != 1 {
			return true
		}
		call, ok := vs.Values[0].(*ast.CallExpr)
		if !ok || len(call.Args) != 1 {
			return true
		}
		if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
			src, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			sources[vs.Names[0].Name] = src
		}
		return true
	})
	for name, ours := range map[string]*redis.Script{"redisReadScript": ReadScript, "redisWriteScript": WriteScript} {
		src, ok := sources[name]
		if !ok {
			t.Errorf("%s: no %s = redis.NewScript(`...`) there", exampleShop, name)
			continue
		}
		if got, want := ours.Hash(), redis.NewScript(src).Hash(); got != want {
			t.Errorf("our copy of %s differs from %s's (SHA1 %s, want %s): copy it again", name, exampleShop, got, want)
		}
	}
}

// roundTrips counts the top-level calls of a client: a script call is one.
type roundTrips struct{ n atomic.Int64 }

func (*roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch cmd.Name() {
		case "hello", "client": // connection set-up
		default:
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (c *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

// shopUnderTest is a service on the test Redis, with the round trips its
// client makes.
type shopUnderTest struct {
	url    string
	rdb    *redis.Client // a client of the test's own
	trips  *roundTrips
	prefix string // of the test's SKUs
}

func startShop(t *testing.T, cfg Config) *shopUnderTest {
	t.Helper()
	client, err := NewClient("redis://" + testredis.Addr(t) + "/0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	trips := &roundTrips{}
	client.AddHook(trips)
	h, err := New(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	// SKUs of "test:<name>:<random>:" need escaping in a path; the
	// random part alone is unique enough.
	p := testredis.Prefix(t)
	parts := strings.Split(strings.TrimSuffix(p, ":"), ":")
	return &shopUnderTest{url: srv.URL, rdb: testredis.Client(t), trips: trips, prefix: "t" + parts[len(parts)-1]}
}

// answer is a response as the tests see it.
type answer struct {
	status     int
	retryAfter string
	SKU        string `json:"sku"`
	Stock      *int64 `json:"stock"`
	Error      string `json:"error"`
}

func (s *shopUnderTest) do(t *testing.T, method, path, body string) answer {
	t.Helper()
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatalf("%s %s: %d with a body that is not JSON: %v", method, path, resp.StatusCode, err)
	}
	return a
}

func (s *shopUnderTest) deduct(t *testing.T, sku string, qty int) answer {
	t.Helper()
	return s.do(t, http.MethodPost, "/skus/"+sku+"/deduct", `{"qty":`+strconv.Itoa(qty)+`}`)
}

// stock reads the stock of sku from Redis itself; -1 when never set.
func (s *shopUnderTest) stock(t *testing.T, sku string) int64 {
	t.Helper()
	v, err := s.rdb.HGet(t.Context(), StockPrefix+sku, "stock").Int64()
	if err == redis.Nil {
		return -1
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func wantStock(t *testing.T, a answer, status int, stock int64) {
	t.Helper()
	if a.status != status || a.Stock == nil || *a.Stock != stock {
		got := "none"
		if a.Stock != nil {
			got = strconv.FormatInt(*a.Stock, 10)
		}
		t.Fatalf("answer %d with stock %s (%q), want %d with stock %d", a.status, got, a.Error, status, stock)
	}
}

// TestDeduct deducts from a new SKU (the default stock), then from one
// whose stock is set: each answer gives the stock left, Redis holds it,
// each deduction makes 4 round trips (obtain, read, write, release: every
// one a script call, EVALSHA) and
// leaves no lock behind; a deduction above the stock is 409 with the stock,
// and changes nothing.
func TestDeduct(t *testing.T) {
	cfg := DefaultConfig()
	s := startShop(t, cfg)
	// The first deduction loads the scripts (EVALSHA, NOSCRIPT, EVAL) and
	// dials: count from the second.
	wantStock(t, s.deduct(t, s.prefix+"warm", 1), http.StatusOK, cfg.DefaultStock-1)
	sku := s.prefix + "new"
	for i := range int64(3) {
		before := s.trips.n.Load()
		a := s.deduct(t, sku, 1)
		wantStock(t, a, http.StatusOK, cfg.DefaultStock-1-i)
		if a.SKU != sku {
			t.Errorf("answer names SKU %q, want %q", a.SKU, sku)
		}
		if got := s.stock(t, sku); got != cfg.DefaultStock-1-i {
			t.Fatalf("Redis holds stock %d, want %d", got, cfg.DefaultStock-1-i)
		}
		if got := s.trips.n.Load() - before; got != 4 {
			t.Errorf("deduction %d made %d round trips, want 4", i+1, got)
		}
		if n, err := s.rdb.Exists(t.Context(), LockPrefix+sku).Result(); err != nil || n != 0 {
			t.Errorf("lock key %s after the answer: exists %d (%v), want released", LockPrefix+sku, n, err)
		}
	}
	wantStock(t, s.do(t, http.MethodGet, "/skus/"+sku, ""), http.StatusOK, cfg.DefaultStock-3)

	set := s.prefix + "set"
	if err := s.rdb.HSet(t.Context(), StockPrefix+set, "stock", 5).Err(); err != nil {
		t.Fatal(err)
	}
	wantStock(t, s.deduct(t, set, 3), http.StatusOK, 2)
	wantStock(t, s.deduct(t, set, 3), http.StatusConflict, 2)
	wantStock(t, s.deduct(t, set, 2), http.StatusOK, 0)
	wantStock(t, s.deduct(t, set, 1), http.StatusConflict, 0)
	if got := s.stock(t, set); got != 0 {
		t.Fatalf("Redis holds stock %d, want 0", got)
	}
}

// TestBadRequests checks the 400 answers, which change nothing.
func TestBadRequests(t *testing.T) {
	s := startShop(t, DefaultConfig())
	sku := s.prefix + "bad"
	for _, body := range []string{``, `{`, `{"qty":0}`, `{"qty":-1}`, `{}`, `{"qty":"1"}`} {
		if a := s.do(t, http.MethodPost, "/skus/"+sku+"/deduct", body); a.status != http.StatusBadRequest || a.Error == "" {
			t.Errorf("body %q: %d %q, want 400 with an error", body, a.status, a.Error)
		}
	}
	if got := s.stock(t, sku); got != -1 {
		t.Errorf("stock %d after bad requests, want never set", got)
	}
}

// TestHeldIs423 holds a SKU's lock with redislock, as another instance
// would: a deduction waits its wait out and answers 423 with Retry-After,
// changing nothing; once the lock is released it succeeds. With wait 0 it
// answers 423 at once.
func TestHeldIs423(t *testing.T) {
	for _, wait := range []time.Duration{150 * time.Millisecond, 0} {
		t.Run("wait="+wait.String(), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Wait = wait
			s := startShop(t, cfg)
			sku := s.prefix + "held"
			lock, err := redislock.Obtain(t.Context(), s.rdb, LockPrefix+sku, 10*time.Second, nil)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			a := s.deduct(t, sku, 1)
			took := time.Since(start)
			if a.status != http.StatusLocked || a.retryAfter != "1" || a.SKU != sku {
				t.Fatalf("held: %d Retry-After %q SKU %q, want 423 Retry-After 1 SKU %q", a.status, a.retryAfter, a.SKU, sku)
			}
			if took < wait {
				t.Errorf("held: answered after %v, before the wait %v ran out", took, wait)
			}
			if got := s.stock(t, sku); got != -1 {
				t.Errorf("held: stock %d, want never set", got)
			}
			if err := lock.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			wantStock(t, s.deduct(t, sku, 1), http.StatusOK, cfg.DefaultStock-1)
		})
	}
}

// TestContendedDeductionsAreExact sends 2*stock concurrent deductions of 1
// to one SKU: the lock serializes them, so exactly stock answer 200 with
// distinct remaining stocks, the others 409, and the stock ends at 0.
func TestContendedDeductionsAreExact(t *testing.T) {
	const stock = 10
	cfg := DefaultConfig()
	cfg.Wait = 10 * time.Second
	s := startShop(t, cfg)
	sku := s.prefix + "hot"
	if err := s.rdb.HSet(t.Context(), StockPrefix+sku, "stock", stock).Err(); err != nil {
		t.Fatal(err)
	}
	answers := make([]answer, 2*stock)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			req, err := http.NewRequest(http.MethodPost, s.url+"/skus/"+sku+"/deduct", strings.NewReader(`{"qty":1}`))
			if err != nil {
				t.Error(err)
				return
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			answers[i].status = resp.StatusCode
			if err := json.NewDecoder(resp.Body).Decode(&answers[i]); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	left := map[int64]bool{}
	var ok, conflict int
	for _, a := range answers {
		switch {
		case a.status == http.StatusOK && a.Stock != nil:
			ok++
			if left[*a.Stock] {
				t.Errorf("two deductions left stock %d: an update was lost", *a.Stock)
			}
			left[*a.Stock] = true
		case a.status == http.StatusConflict:
			conflict++
		default:
			t.Errorf("answer %d %q", a.status, a.Error)
		}
	}
	if ok != stock || conflict != stock {
		t.Errorf("%d answered 200 and %d 409, want %d each", ok, conflict, stock)
	}
	if got := s.stock(t, sku); got != 0 {
		t.Errorf("stock %d at the end, want 0", got)
	}
}

// TestNewRefusesBadConfigs checks New's validation.
func TestNewRefusesBadConfigs(t *testing.T) {
	client := redis.NewClient(&redis.Options{}) // never used
	t.Cleanup(func() { _ = client.Close() })
	for name, change := range map[string]func(*Config){
		"negative wait":  func(c *Config) { c.Wait = -time.Second },
		"tiny ttl":       func(c *Config) { c.TTL = time.Microsecond },
		"backoff range":  func(c *Config) { c.RetryMin, c.RetryMax = time.Second, time.Millisecond },
		"no stock time":  func(c *Config) { c.StockTimeout = 0 },
		"negative stock": func(c *Config) { c.DefaultStock = -1 },
	} {
		cfg := DefaultConfig()
		change(&cfg)
		if _, err := New(client, cfg); err == nil {
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
}
