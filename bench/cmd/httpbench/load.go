package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sync"
	"time"
)

// deductBody is the body of every request: deduct 1.
var deductBody = []byte(`{"qty":1}`)

// target is one service under load: its SKUs, its HTTP transport, and the
// 200 answers each SKU got over the whole run.
type target struct {
	svc       *service
	skus      []string // index i: the SKU of index i
	transport *http.Transport
	client    *http.Client
	ok        []int64 // per SKU index; client c writes only its own indexes
	// Per SKU index, the 5xx answers: a deduction whose write reached
	// Redis but whose reply came too late answers 503 (its timeout
	// under load), so each may or may not have deducted.
	unsure []int64
	next   []int // per client: how many of its SKUs it has sent so far
	stock  stockCmd
}

// newTarget prepares the load on svc over skus with n clients; stock reads
// a SKU's stock from svc's Redis data.
func newTarget(svc *service, skus []string, clients int, stock stockCmd) *target {
	tr := &http.Transport{
		MaxIdleConns:        clients,
		MaxIdleConnsPerHost: clients,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}
	return &target{
		svc: svc, skus: skus, transport: tr, client: &http.Client{Transport: tr},
		ok: make([]int64, len(skus)), unsure: make([]int64, len(skus)), next: make([]int, clients), stock: stock,
	}
}

// close closes the target's idle connections.
func (t *target) close() { t.transport.CloseIdleConnections() }

// window is what one stretch of load measured.
type window struct {
	requests int64
	elapsed  time.Duration   // from the start to the last answer
	latency  []time.Duration // every request's, sorted
	status   map[int]int64   // answers by status
}

// rate is the requests per second of w.
func (w window) rate() float64 {
	if w.elapsed <= 0 {
		return 0
	}
	return float64(w.requests) / w.elapsed.Seconds()
}

// load runs the target's clients for d: each client sends a request, reads
// the whole answer, and sends the next, to the next of its own SKUs (client
// c has the SKU indexes c, c+clients, c+2*clients, ...), until d has passed.
// A request that fails in transport ends the load with its error.
func (t *target) load(ctx context.Context, d time.Duration) (window, error) {
	clients := len(t.next)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	type clientResult struct {
		latency []time.Duration
		status  map[int]int64
	}
	results := make([]clientResult, clients)
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for c := range clients {
		wg.Go(func() {
			r := clientResult{latency: make([]time.Duration, 0, 4096), status: map[int]int64{}}
			mine := (len(t.skus) - c + clients - 1) / clients // how many SKUs client c has
			for ctx.Err() == nil && time.Now().Before(deadline) {
				i := c + clients*(t.next[c]%mine)
				t.next[c]++
				begin := time.Now()
				status, err := t.post(ctx, t.skus[i])
				if err != nil {
					cancel(fmt.Errorf("%s: POST /skus/%s/deduct: %w", t.svc.name, t.skus[i], err))
					break
				}
				r.latency = append(r.latency, time.Since(begin))
				r.status[status]++
				switch {
				case status == http.StatusOK:
					t.ok[i]++
				case status >= 500:
					t.unsure[i]++
				}
			}
			results[c] = r
		})
	}
	wg.Wait()
	w := window{elapsed: time.Since(start), status: map[int]int64{}}
	if err := context.Cause(ctx); err != nil {
		return w, err
	}
	for _, r := range results {
		w.latency = append(w.latency, r.latency...)
		for s, n := range r.status {
			w.status[s] += n
		}
	}
	w.requests = int64(len(w.latency))
	slices.Sort(w.latency)
	return w, nil
}

// post deducts 1 from sku and returns the answer's status, once it has read
// the whole answer.
func (t *target) post(ctx context.Context, sku string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.svc.base+"/skus/"+sku+"/deduct", bytes.NewReader(deductBody))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := t.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, err
	}
	return resp.StatusCode, nil
}

// percentile returns the nearest-rank p-quantile (0 < p <= 1) of sorted:
// the ceil(p*n)-th smallest, as lockbench's.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted))-1e-6)) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
