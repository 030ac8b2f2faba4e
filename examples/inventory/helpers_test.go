package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/internal/testservers"
)

// TestMain stops the redis-server that testredis may start.
func TestMain(m *testing.M) { os.Exit(testservers.Main(m, testredis.Main)) }

// frameworks are the routers every HTTP test runs against.
var frameworks = []string{frameworkGin, frameworkEcho, frameworkNetHTTP}

// testConfig returns the default config for framework with the lock
// middleware's logs silenced.
func testConfig(framework string) config {
	cfg := defaultConfig()
	cfg.framework = framework
	cfg.logger = slog.New(slog.DiscardHandler)
	return cfg
}

// startApp builds the service for cfg and serves it with httptest until
// the test ends.
func startApp(t *testing.T, cfg config) (*app, *httptest.Server) {
	t.Helper()
	a, err := buildApp(cfg)
	if err != nil {
		t.Fatalf("buildApp: %v", err)
	}
	srv := httptest.NewServer(a.handler)
	t.Cleanup(func() {
		srv.Close()
		a.close()
	})
	return a, srv
}

// answer is a response as the tests see it: the union of the service's
// JSON bodies.
type answer struct {
	status      int
	contentType string
	retryAfter  string
	raw         string

	SKU    string      `json:"sku"`
	Stock  *int64      `json:"stock"`
	Fence  int64       `json:"fence"`
	Error  string      `json:"error"`
	Reason string      `json:"reason"` // the middleware's problem details
	Items  []cartLine  `json:"items"`  // a checkout's lines
	Short  []shortItem `json:"short"`  // a short cart's SKUs

	Version int64 `json:"version"` // a report's
	Running int   `json:"running"` // exports of the tenant running
}

// String describes a for failure messages.
func (a answer) String() string { return fmt.Sprintf("%d %s %s", a.status, a.contentType, a.raw) }

// testClient is the HTTP client of the tests: enough idle connections for
// the concurrent tests, and a timeout so that no test hangs.
var testClient = &http.Client{
	Timeout:   60 * time.Second,
	Transport: &http.Transport{MaxIdleConnsPerHost: 256},
}

// do sends one request and decodes the JSON answer. It is safe to call from
// many goroutines: it returns errors instead of failing the test.
func do(method, url, body string) (answer, error) {
	return doCtx(context.Background(), method, url, body)
}

// sent is the outcome of a request sent by doAsync.
type sent struct {
	a   answer
	err error
}

// doAsync sends one request from a goroutine of its own and delivers its
// outcome on the channel it returns; the test reports any error itself, so
// nothing calls t after the test has ended.
func doAsync(method, url, body string) <-chan sent {
	out := make(chan sent, 1)
	go func() {
		a, err := do(method, url, body)
		out <- sent{a, err}
	}()
	return out
}

// awaitHook waits until a request's test hook has run (hooked closes), and
// fails the test if the request answers first, instead of waiting forever
// for a hook it will never run.
func awaitHook(t *testing.T, hooked <-chan struct{}, request <-chan sent) {
	t.Helper()
	select {
	case <-hooked:
	case r := <-request:
		t.Fatalf("the request answered before its test hook ran: %v, %v", r.a, r.err)
	}
}

// doCtx is do with a context, which bounds the request.
func doCtx(ctx context.Context, method, url, body string) (answer, error) {
	return doHeader(ctx, method, url, body, nil)
}

// doHeader is doCtx sending the request with header too.
func doHeader(ctx context.Context, method, url, body string, header http.Header) (answer, error) {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return answer{}, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := testClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	a := answer{
		status:      resp.StatusCode,
		contentType: resp.Header.Get("Content-Type"),
		retryAfter:  resp.Header.Get("Retry-After"),
		raw:         strings.TrimSpace(string(raw)),
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return a, fmt.Errorf("%s %s answered %d with a body that is not JSON: %q", method, url, a.status, raw)
	}
	if !strings.Contains(a.contentType, "json") {
		return a, fmt.Errorf("%s %s answered Content-Type %q, want JSON", method, url, a.contentType)
	}
	return a, nil
}

// mustDo is do for the test goroutine: it fails the test on an error.
func mustDo(t *testing.T, method, url, body string) answer {
	t.Helper()
	a, err := do(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// stockOf returns the stock GET /skus/{sku} reports.
func stockOf(t *testing.T, base, sku string) int64 {
	t.Helper()
	a := mustDo(t, http.MethodGet, base+"/skus/"+sku, "")
	if a.status != http.StatusOK || a.Stock == nil {
		t.Fatalf("GET /skus/%s: %v", sku, a)
	}
	return *a.Stock
}

// concurrently sends n requests at once (released together by a start
// gate); req(i) gives the method, URL and body of the i-th. It returns the
// answers in order and fails the test on any transport error.
func concurrently(t *testing.T, n int, req func(i int) (method, url, body string)) []answer {
	t.Helper()
	return concurrentlyVia(t, n, do, req)
}

// concurrentlyVia is concurrently sending each request with send.
func concurrentlyVia(t *testing.T, n int, send func(method, url, body string) (answer, error),
	req func(i int) (method, url, body string)) []answer {
	t.Helper()
	answers := make([]answer, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		method, url, body := req(i)
		wg.Go(func() {
			<-start
			answers[i], errs[i] = send(method, url, body)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	return answers
}

// tally counts the answers of a deduction run by status and checks the
// invariants every run must hold: a 200 carries the remaining stock, a 409
// is "insufficient stock" with the current stock, nothing else happens.
// It returns the 200s and the number of 409s.
func tally(t *testing.T, answers []answer) (ok []answer, conflicts int) {
	t.Helper()
	for i, a := range answers {
		switch {
		case a.status == http.StatusOK && a.Stock != nil:
			ok = append(ok, a)
		case a.status == http.StatusConflict && a.Error == "insufficient stock" && a.Stock != nil:
			conflicts++
		default:
			t.Errorf("request %d: unexpected answer %v", i, a)
		}
	}
	return ok, conflicts
}

// checkSerialized checks that the 200s of a run on a SKU with stock n and
// qty 1 are what one-at-a-time deductions give: their remaining stocks are
// exactly n-1 … 0 and their fences are distinct and positive.
func checkSerialized(t *testing.T, ok []answer, n int64) {
	t.Helper()
	fences := make(map[int64]bool, len(ok))
	remaining := make(map[int64]bool, len(ok))
	for _, a := range ok {
		if a.Fence <= 0 {
			t.Errorf("a locked deduction answered fence %d, want > 0: %v", a.Fence, a)
		}
		if fences[a.Fence] {
			t.Errorf("fence %d answered twice", a.Fence)
		}
		fences[a.Fence] = true
		if remaining[*a.Stock] {
			t.Errorf("remaining stock %d answered twice: two deductions read the same stock", *a.Stock)
		}
		remaining[*a.Stock] = true
	}
	for s := range n {
		if !remaining[s] {
			t.Errorf("no deduction left %d in stock", s)
		}
	}
}

// barrier holds its first n callers until all n have arrived (or their
// context ends): with it, every request reads the stock before any writes.
type barrier struct {
	n       int
	mu      sync.Mutex
	arrived int
	all     chan struct{}
}

// newBarrier returns a barrier for n callers.
func newBarrier(n int) *barrier { return &barrier{n: n, all: make(chan struct{})} }

// wait arrives at the barrier and waits for the others.
func (b *barrier) wait(ctx context.Context) {
	b.mu.Lock()
	b.arrived++
	if b.arrived == b.n {
		close(b.all)
	}
	b.mu.Unlock()
	select {
	case <-b.all:
	case <-ctx.Done():
	}
}

// countingStore wraps a stockStore and counts the calls that reach it; a
// DeductAll counts as a write.
type countingStore struct {
	stockStore
	reads, writes atomic.Int64
}

// Read implements stockStore.
func (c *countingStore) Read(ctx context.Context, sku string, fence int64) (int64, bool, error) {
	c.reads.Add(1)
	return c.stockStore.Read(ctx, sku, fence)
}

// Write implements stockStore.
func (c *countingStore) Write(ctx context.Context, sku string, stock, fence int64) error {
	c.writes.Add(1)
	return c.stockStore.Write(ctx, sku, stock, fence)
}

// DeductAll implements stockStore.
func (c *countingStore) DeductAll(ctx context.Context, ds []deduction, defaultStock int64) ([]int64, error) {
	c.writes.Add(1)
	return c.stockStore.DeductAll(ctx, ds, defaultStock)
}

// redisSKU returns a SKU name unique to the test, safe in a URL path.
func redisSKU(t *testing.T, name string) string {
	t.Helper()
	return strings.ReplaceAll(testredis.Prefix(t), ":", "-") + name
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a logger.
type syncBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
