package main

// The exactly-once scenario of issue 23 in small: two instances on one
// private Redis, every deduction sent 3 times with one Idempotency-Key
// (concurrently, and again after a delay), Redis frozen for 2s in the
// middle. The deduct route writes its idempotency record in the script that
// deducts (deductRecorded), so a key whose first answer was 503 "outcome
// unknown" deducts once, whatever the retry lands on.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/middleware"
)

// idemAnswer is one answer of a deduction with an idempotency key.
type idemAnswer struct {
	status      int
	contentType string
	replayed    bool
	body        []byte
	err         error
}

// sendKeyed posts a deduction of 1 from sku to base with the idempotency
// key.
func sendKeyed(ctx context.Context, base, sku, key string) idemAnswer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/skus/"+sku+"/deduct", strings.NewReader(`{"qty":1}`))
	if err != nil {
		return idemAnswer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := testClient.Do(req)
	if err != nil {
		return idemAnswer{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return idemAnswer{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"),
		replayed: resp.Header.Get(middleware.ReplayedHeader) == "true", body: body, err: err}
}

// definite reports whether an answer settles its key: not a transport
// error, a 503 (store down, or an unknown outcome), a 409 (the key's first
// request still runs, or a lost claim) nor a 423 (the SKU's lock was busy).
func (a idemAnswer) definite() bool {
	return a.err == nil && a.status != http.StatusServiceUnavailable && a.status != http.StatusConflict &&
		a.status != http.StatusLocked
}

func TestIdempotentDeductsOnceAcrossFreeze(t *testing.T) {
	const keys, skus = 240, 12
	cfg := outageConfig(nil)
	cfg.framework = frameworkGin // the other instance serves net/http: the same records
	server := redisOutage.start(t, &cfg)
	appA, a := startApp(t, cfg)
	cfg.framework = frameworkNetHTTP
	_, b := startApp(t, cfg)
	bases := []string{a.URL, b.URL}
	skuOf := func(k int) string { return fmt.Sprintf("idem%d", k%skus) }

	// One request is caught after its read, Redis is frozen under it, and
	// it goes on: its script meets the frozen Redis, and it answers 503.
	gate := newHoldGate(appA, "sku:gated")
	gate.armed.Store(true)
	gated := make(chan idemAnswer, 1)
	go func() { gated <- sendKeyed(context.Background(), a.URL, "gated", "gated-key") }()
	select {
	case <-gate.holding:
	case <-time.After(30 * time.Second):
		t.Fatal("the gated request did not take its lock within 30s")
	}

	var (
		mu       sync.Mutex
		answers  = make([][]idemAnswer, keys)
		sent     atomic.Int32
		frozeAt  = keys / 3
		thawed   = make(chan struct{})
		freezeMu sync.Once
	)
	freeze := func() {
		freezeMu.Do(func() {
			server.Pause()
			close(gate.proceed)
			go func() {
				time.Sleep(2 * time.Second) // the fault's duration
				server.Resume()
				close(thawed)
			}()
		})
	}
	record := func(k int, ans idemAnswer) {
		mu.Lock()
		answers[k] = append(answers[k], ans)
		mu.Unlock()
	}
	// Round 1: each key's 3 sends at once, over both instances, 16 keys
	// at a time; Redis freezes once a third of the keys are out.
	work := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for k := range work {
				var sends sync.WaitGroup
				for i := range 3 {
					sends.Go(func() {
						record(k, sendKeyed(context.Background(), bases[(k+i)%2], skuOf(k), fmt.Sprintf("key-%d", k)))
					})
				}
				sends.Wait()
			}
		})
	}
	for k := range keys {
		if int(sent.Add(1)) == frozeAt {
			freeze()
		}
		work <- k
	}
	close(work)
	wg.Wait()
	<-thawed
	first := <-gated
	if first.status != http.StatusServiceUnavailable || !bytes.Contains(first.body, []byte("outcome is unknown")) {
		t.Fatalf("the gated request answered %d %s, want 503 outcome unknown", first.status, first.body)
	}

	// Round 2, after a delay: each key once more, retried until it settles.
	time.Sleep(300 * time.Millisecond) // the client's delay before it retries
	settle := func(base, sku, key string) []idemAnswer {
		var got []idemAnswer
		deadline := time.Now().Add(20 * time.Second)
		for {
			ans := sendKeyed(context.Background(), base, sku, key)
			got = append(got, ans)
			if ans.definite() || time.Now().After(deadline) {
				return got
			}
			time.Sleep(100 * time.Millisecond) // the client's backoff
		}
	}
	work = make(chan int)
	for range 16 {
		wg.Go(func() {
			for k := range work {
				for _, ans := range settle(bases[k%2], skuOf(k), fmt.Sprintf("key-%d", k)) {
					record(k, ans)
				}
			}
		})
	}
	for k := range keys {
		work <- k
	}
	close(work)
	wg.Wait()
	gatedRetry := settle(b.URL, "gated", "gated-key")
	if last := gatedRetry[len(gatedRetry)-1]; last.status != http.StatusOK {
		t.Fatalf("the gated key's retry answered %d %s, want 200", last.status, last.body)
	}
	if got := stockOf(t, a.URL, "gated"); got != cfg.defaultStock-1 {
		t.Fatalf("the gated SKU's stock is %d, want %d: one deduction for its key", got, cfg.defaultStock-1)
	}
	t.Logf("the gated key: first 503 outcome unknown, then %d %s (replayed %v)", gatedRetry[len(gatedRetry)-1].status,
		bytes.TrimSpace(gatedRetry[len(gatedRetry)-1].body), gatedRetry[len(gatedRetry)-1].replayed)

	// The checks.
	ok := map[string]int64{} // SKU → keys with a 200
	statuses := map[int]int{}
	replays, total, unknown, unknownReplayed := 0, 0, 0, 0
	for k, as := range answers {
		var ok200 []byte
		var ct string
		sawUnknown := false
		for _, ans := range as {
			if ans.err != nil {
				t.Fatalf("key %d: %v", k, ans.err)
			}
			total++
			statuses[ans.status]++
			if ans.status == http.StatusServiceUnavailable && bytes.Contains(ans.body, []byte("outcome is unknown")) && ok200 == nil {
				sawUnknown = true
			}
			if ans.status != http.StatusOK {
				continue
			}
			if ans.replayed {
				replays++
			}
			if sawUnknown && ok200 == nil && ans.replayed {
				unknownReplayed++
			}
			if ok200 == nil {
				ok200, ct = ans.body, ans.contentType
				continue
			}
			if !bytes.Equal(ans.body, ok200) || ans.contentType != ct {
				t.Errorf("key %d: a 200 answered %s %q, another %s %q: want the same bytes", k, ct, ok200, ans.contentType, ans.body)
			}
		}
		if ok200 == nil {
			t.Errorf("key %d never got a 200: %d answers, the last %d %s", k, len(as), as[len(as)-1].status, as[len(as)-1].body)
			continue
		}
		if sawUnknown {
			unknown++
		}
		var body deductBody
		if err := json.Unmarshal(ok200, &body); err != nil || body.SKU != skuOf(k) {
			t.Errorf("key %d: the 200 %q is not a deduction of %s", k, ok200, skuOf(k))
		}
		ok[skuOf(k)]++
	}
	var fell int64
	for i := range skus {
		sku := fmt.Sprintf("idem%d", i)
		got := cfg.defaultStock - stockOf(t, a.URL, sku)
		fell += got
		if got != ok[sku] {
			t.Errorf("SKU %s fell by %d, but %d keys got a 200: a key deducted twice, or one deducted without its 200", sku, got, ok[sku])
		}
	}
	if statuses[http.StatusServiceUnavailable] == 0 {
		t.Errorf("no 503 while Redis was frozen: the freeze missed the load (%v)", statuses)
	}
	t.Logf("%d keys, %d answers %v; %d replays of a 200; %d keys answered 503 outcome unknown before their 200, "+
		"%d of them then replayed (the script had run); the stock fell by %d", keys, total, statuses, replays, unknown, unknownReplayed, fell)
}

// TestIdempotentRoutesReplay: on every router, with the stock and the locks
// in Redis (the handler records its answer in its script) and in memory
// (the middleware records it), a deduction and a checkout sent twice with
// one key deduct once, and the retry replays the first answer byte for
// byte; a short cart's 409 is replayed too, and a request without a key
// runs as before.
func TestIdempotentRoutesReplay(t *testing.T) {
	for _, where := range []string{"redis", "memory"} {
		for _, fw := range frameworks {
			t.Run(where+"/"+fw, func(t *testing.T) {
				cfg := testConfig(fw)
				logs := &syncBuffer{}
				cfg.logger = slog.New(slog.NewTextHandler(logs, nil))
				if where == "redis" {
					cfg.redisURL = "redis://" + testredis.Addr(t)
				}
				a, srv := startApp(t, cfg)
				if got := a.shop.records; got != (where == "redis") {
					t.Fatalf("shop.records = %v", got)
				}
				sku, pear := redisSKU(t, "apple"), redisSKU(t, "pear")
				key := "k-" + sku
				send := func(path, body, key string) idemAnswer {
					req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
					if key != "" {
						req.Header.Set("Idempotency-Key", key)
					}
					resp, err := testClient.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					defer resp.Body.Close()
					b, _ := io.ReadAll(resp.Body)
					return idemAnswer{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"),
						replayed: resp.Header.Get(middleware.ReplayedHeader) == "true", body: b}
				}
				same := func(what string, first, retry idemAnswer, status int) {
					t.Helper()
					if first.status != status || first.replayed || retry.status != status || !retry.replayed ||
						!bytes.Equal(first.body, retry.body) || first.contentType != retry.contentType {
						t.Fatalf("%s: first %d %s %q (replayed %v), retry %d %s %q (replayed %v): want %d, then its replay",
							what, first.status, first.contentType, first.body, first.replayed,
							retry.status, retry.contentType, retry.body, retry.replayed, status)
					}
				}
				first := send("/skus/"+sku+"/deduct", `{"qty":3}`, key)
				same("deduct", first, send("/skus/"+sku+"/deduct", `{"qty":3}`, key), http.StatusOK)
				if got := stockOf(t, srv.URL, sku); got != cfg.defaultStock-3 {
					t.Fatalf("stock %d after a deduction of 3 sent twice, want %d", got, cfg.defaultStock-3)
				}
				cart := fmt.Sprintf(`{"items":[{"sku":%q,"qty":1},{"sku":%q,"qty":2}]}`, sku, pear)
				first = send("/carts/checkout", cart, key+"-cart")
				same("checkout", first, send("/carts/checkout", cart, key+"-cart"), http.StatusOK)
				if got := stockOf(t, srv.URL, pear); got != cfg.defaultStock-2 {
					t.Fatalf("stock of pear %d after a checkout sent twice, want %d", got, cfg.defaultStock-2)
				}
				short := fmt.Sprintf(`{"items":[{"sku":%q,"qty":%d}]}`, pear, cfg.defaultStock)
				first = send("/carts/checkout", short, key+"-short")
				same("short cart", first, send("/carts/checkout", short, key+"-short"), http.StatusConflict)
				if plain := send("/skus/"+sku+"/deduct", `{"qty":1}`, ""); plain.status != http.StatusOK || plain.replayed {
					t.Fatalf("a deduction without a key answered %d (replayed %v) %s", plain.status, plain.replayed, plain.body)
				}
				if got := stockOf(t, srv.URL, sku); got != cfg.defaultStock-5 {
					t.Fatalf("stock %d, want %d", got, cfg.defaultStock-5)
				}
				// The answers the handler recorded itself are the ones it wrote.
				if strings.Contains(logs.String(), "differs") || strings.Contains(logs.String(), "level=WARN") {
					t.Fatalf("the middleware warned:\n%s", logs)
				}
			})
		}
	}
}
