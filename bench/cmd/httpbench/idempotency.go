package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// idemReport is what benchIdempotency printed, for tests.
type idemReport struct {
	keys     int
	statuses [2]map[int]int64 // per round: answers by status (0: transport error)
	frozen   time.Duration    // how long Redis was stopped
	// Keys with a 200 (a first answer or a replay), the 200s that were
	// replays, the keys whose first answer was 503 "outcome unknown" and,
	// of those, the ones whose 200 was a replay (the script had run).
	ok, replays, unknown, unknownReplayed int
	fell                                  int64    // the stock's fall over every SKU
	differ                                []string // keys whose 200s differ
	noOK                                  []string // keys that never got a 200
	twice                                 []string // SKUs whose fall is not their keys' 200s
}

// idemAnswer is one answer to a deduction with an idempotency key.
type idemAnswer struct {
	status      int // 0: the request failed in transport
	replayed    bool
	contentType string
	body        []byte
}

// settled reports whether an answer settles its key: not a transport
// error, nor a 503 (Redis down, or an outcome unknown), a 409 (the key's
// first request still runs) or a 423 (the SKU's lock was busy).
func (a idemAnswer) settled() bool {
	switch a.status {
	case 0, http.StatusServiceUnavailable, http.StatusConflict, http.StatusLocked:
		return false
	}
	return true
}

// benchIdempotency runs the idempotency scenario (issue 23): two instances
// of the example on one private Redis; -keys deductions of 1, each sent 3
// times at once with its Idempotency-Key over both instances (-clients keys
// at a time, key k on SKU k mod -skus), Redis stopped (SIGSTOP) for
// -freeze once a third of the keys are out; then, -delay after the last
// answer, each key once more, retried every 100ms until it settles. It
// checks that every SKU's stock fell by the number of its keys that got a
// 200, that every 200 of a key is the same bytes, and that every key got
// one.
func benchIdempotency(ctx context.Context, cfg config, out io.Writer) (*idemReport, error) {
	runtime.LockOSThread() // the services and Redis die with this thread (pdeathsig)
	defer runtime.UnlockOSThread()
	srv, bin, dir, marker, cleanup, err := scenarioSetup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	defer func() { _ = srv.Resume() }() // before cleanup stops it, on every path
	svcs, _, err := instances(bin, srv.Addr(), cfg.work, dir, "idem", "-wait", cfg.wait.String(), "-ttl", cfg.ttl.String(),
		"-stock", strconv.FormatInt(cfg.stock, 10))
	if err != nil {
		return nil, err
	}
	for _, s := range svcs {
		defer s.stop()
	}
	urls := bases(svcs)
	fmt.Fprintf(out, "httpbench -scenario idempotency: %d deductions of 1, each sent 3 times at once with one Idempotency-Key over 2 instances, "+
		"%d keys at a time, on %d SKUs; Redis stopped for %v once %d keys are out; every key again %v later, retried every 100ms until it settles; "+
		"handler work %v; wait %v, ttl %v; examples/inventory %s, Redis at %s; %d CPUs\n",
		cfg.keys, cfg.clients, cfg.skus, cfg.freeze, cfg.keys/3, cfg.delay, cfg.work, cfg.wait, cfg.ttl, bin, srv.Addr(), runtime.NumCPU())

	tr := &http.Transport{MaxIdleConns: 3 * cfg.clients, MaxIdleConnsPerHost: 3 * cfg.clients, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: time.Minute}
	sku := func(k int) string { return fmt.Sprintf("%s-%d", marker, k%cfg.skus) }
	key := func(k int) string { return fmt.Sprintf("%s-key-%d", marker, k) }
	send := func(base string, k int) idemAnswer {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/skus/"+sku(k)+"/deduct", strings.NewReader(`{"qty":1}`))
		if err != nil {
			panic(err) // the URLs are ours
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key(k))
		resp, err := client.Do(req)
		if err != nil {
			return idemAnswer{}
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return idemAnswer{}
		}
		return idemAnswer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true",
			contentType: resp.Header.Get("Content-Type"), body: body}
	}

	var (
		mu      sync.Mutex
		answers = make([][]idemAnswer, cfg.keys)
		rep     = &idemReport{keys: cfg.keys, statuses: [2]map[int]int64{{}, {}}}
	)
	record := func(round, k int, a idemAnswer) {
		mu.Lock()
		answers[k] = append(answers[k], a)
		rep.statuses[round][a.status]++
		mu.Unlock()
	}
	each := func(f func(k int)) {
		work := make(chan int)
		var wg sync.WaitGroup
		for range cfg.clients {
			wg.Go(func() {
				for k := range work {
					f(k)
				}
			})
		}
		for k := range cfg.keys {
			if ctx.Err() != nil {
				break
			}
			work <- k
		}
		close(work)
		wg.Wait()
	}

	// Round 1, with Redis stopped in the middle.
	var dispatched atomic.Int64
	thawed := make(chan error, 1)
	each(func(k int) {
		if dispatched.Add(1) == int64(max(cfg.keys/3, 1)) {
			go func() {
				if err := srv.Pause(); err != nil {
					thawed <- err
					return
				}
				stoppedAt := time.Now()
				select {
				case <-time.After(cfg.freeze): // the fault's duration
				case <-ctx.Done():
				}
				err := srv.Resume()
				rep.frozen = time.Since(stoppedAt)
				thawed <- err
			}()
		}
		var sends sync.WaitGroup
		for i := range 3 {
			sends.Go(func() { record(0, k, send(urls[(k+i)%2], k)) })
		}
		sends.Wait()
	})
	if err := errors.Join(<-thawed, ctx.Err()); err != nil {
		return nil, err
	}

	// Round 2, after the delay.
	select {
	case <-time.After(cfg.delay): // the client's delay before it retries
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	each(func(k int) {
		deadline := time.Now().Add(30 * time.Second)
		for {
			a := send(urls[k%2], k)
			record(1, k, a)
			if a.settled() || time.Now().After(deadline) || ctx.Err() != nil {
				return
			}
			time.Sleep(100 * time.Millisecond) // the client's backoff
		}
	})
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	// The checks.
	okBySKU := map[string]int64{}
	for k, as := range answers {
		var first *idemAnswer
		unknown := false
		for i := range as {
			a := &as[i]
			if a.status == http.StatusServiceUnavailable && first == nil && bytes.Contains(a.body, []byte("outcome is unknown")) {
				unknown = true
			}
			if a.status != http.StatusOK {
				continue
			}
			if a.replayed {
				rep.replays++
			}
			if first == nil {
				first = a
				if unknown && a.replayed {
					rep.unknownReplayed++
				}
				continue
			}
			if !bytes.Equal(a.body, first.body) || a.contentType != first.contentType {
				rep.differ = append(rep.differ, fmt.Sprintf("%s: %s %q, then %s %q", key(k), first.contentType, first.body, a.contentType, a.body))
			}
		}
		if unknown {
			rep.unknown++
		}
		if first == nil {
			last := as[len(as)-1]
			rep.noOK = append(rep.noOK, fmt.Sprintf("%s: the last of %d answers %d %q", key(k), len(as), last.status, bytes.TrimSpace(last.body)))
			continue
		}
		rep.ok++
		okBySKU[sku(k)]++
	}
	for s := range min(cfg.skus, cfg.keys) {
		name := sku(s)
		stock, err := stockOf(ctx, client, urls[0], name)
		if err != nil {
			return nil, err
		}
		fell := cfg.stock - stock
		rep.fell += fell
		if fell != okBySKU[name] {
			rep.twice = append(rep.twice, fmt.Sprintf("%s fell by %d, %d keys got a 200", name, fell, okBySKU[name]))
		}
	}

	statuses := func(m map[int]int64) string {
		var parts []string
		for _, s := range slices.Sorted(maps.Keys(m)) {
			parts = append(parts, fmt.Sprintf("%d: %d", s, m[s]))
		}
		return strings.Join(parts, ", ")
	}
	fmt.Fprintf(out, "Redis stopped for %v\n", rep.frozen.Round(time.Millisecond))
	fmt.Fprintf(out, "round 1 (3 sends per key at once): %s\n", statuses(rep.statuses[0]))
	fmt.Fprintf(out, "round 2 (each key again, until it settles): %s\n", statuses(rep.statuses[1]))
	fmt.Fprintf(out, "keys with a 200: %d of %d; 200s that were replays: %d; keys whose first answer was 503 \"outcome unknown\": %d, "+
		"%d of them then replayed (the script had run), %d ran once on a retry\n",
		rep.ok, rep.keys, rep.replays, rep.unknown, rep.unknownReplayed, rep.unknown-rep.unknownReplayed)
	fmt.Fprintf(out, "stock fell by %d over %d SKUs; keys with a 200: %d; keys whose 200s differ: %d; SKUs deducted other than their keys' 200s: %d; keys without a 200: %d\n",
		rep.fell, min(cfg.skus, cfg.keys), rep.ok, len(rep.differ), len(rep.twice), len(rep.noOK))
	var errs []error
	for _, list := range [][]string{rep.differ, rep.twice, rep.noOK} {
		for i, l := range list {
			if i == 5 {
				errs = append(errs, fmt.Errorf("... and %d more", len(list)-5))
				break
			}
			errs = append(errs, errors.New(l))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return rep, fmt.Errorf("idempotency violated:\n%w", err)
	}
	return rep, nil
}

// stockOf reads a SKU's stock from base.
func stockOf(ctx context.Context, client *http.Client, base, sku string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/skus/"+sku, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /skus/%s: %d %q %v", sku, resp.StatusCode, body, err)
	}
	var v struct {
		Stock int64 `json:"stock"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return 0, fmt.Errorf("GET /skus/%s: %q: %w", sku, body, err)
	}
	return v.Stock, nil
}
