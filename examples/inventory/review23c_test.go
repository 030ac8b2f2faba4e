package main

// Review of issue 23's exactly-once path (deductRecorded): a script that ran
// but whose reply was lost, retried by go-redis on a new connection.

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// TestReview23cRetriedScriptAnswersItsRecord: the deduct-and-record script
// reaches Redis and runs, and its reply is lost with its connection; go-redis
// sends it again on a new connection, where it finds the key holding the
// record it wrote itself. The request must answer that record (200), not
// 409 "the idempotency claim was lost; nothing was changed": the stock fell,
// and a retry of the key replays the 200.
func TestReview23cRetriedScriptAnswersItsRecord(t *testing.T) {
	for _, fw := range frameworks {
		t.Run(fw, func(t *testing.T) {
			addr := testredis.Addr(t)
			proxy := faultproxy.New(t, addr)
			cfg := testConfig(fw)
			cfg.redisURL = "redis://" + proxy.Addr()
			_, srv := startApp(t, cfg)
			sku := redisSKU(t, "retried")
			key := "k-" + sku

			// The script is loaded, so that go-redis sends EVALSHA with its
			// hash, the chunk cut after it reached Redis.
			direct := redis.NewClient(&redis.Options{Addr: addr})
			defer direct.Close()
			if err := redisDeductRecordScript.Load(context.Background(), direct).Err(); err != nil {
				t.Fatal(err)
			}
			hash := []byte(redisDeductRecordScript.Hash())
			proxy.CutWhen(faultproxy.ToServer, func(chunk []byte) bool { return bytes.Contains(chunk, hash) }, true)

			send := func() idemAnswer {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/skus/"+sku+"/deduct", strings.NewReader(`{"qty":2}`))
				req.Header.Set("Idempotency-Key", key)
				return sendReq(t, req)
			}
			first := send()
			if proxy.Armed() != 0 {
				t.Fatalf("the script's reply was not cut (first answer %d %s)", first.status, first.body)
			}
			stock := stockOf(t, srv.URL, sku)
			if stock != cfg.defaultStock-2 {
				t.Fatalf("stock %d after one deduction of 2, want %d (first answer %d %s)", stock, cfg.defaultStock-2, first.status, first.body)
			}
			// The first answer is the record (200), or 503 "outcome unknown"
			// when the stock client does not resend; never a 409 saying
			// nothing changed. The retry replays the 200, byte for byte.
			unknown := first.status == http.StatusServiceUnavailable && bytes.Contains(first.body, []byte("outcome is unknown"))
			retry := send()
			if first.status != http.StatusOK && !unknown || retry.status != http.StatusOK || !retry.replayed ||
				first.status == http.StatusOK && !bytes.Equal(first.body, retry.body) {
				t.Fatalf("the stock fell by 2; first answer %d %s, retry %d %s (replayed %v): want a 200 (or 503 outcome unknown), then the 200's replay",
					first.status, bytes.TrimSpace(first.body), retry.status, bytes.TrimSpace(retry.body), retry.replayed)
			}
		})
	}
}

// sendReq sends req and reads its answer.
func sendReq(t *testing.T, req *http.Request) idemAnswer {
	t.Helper()
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	return idemAnswer{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"),
		replayed: resp.Header.Get("Idempotent-Replayed") == "true", body: b.Bytes()}
}

// TestReview23cRetriedCheckoutDeductsOnce: a checkout without an
// idempotency key deducts in one script (redisDeductAllScript); when that
// script runs and its reply is lost with its connection, go-redis must not
// send it again: HINCRBY under the same fence would deduct a second time.
func TestReview23cRetriedCheckoutDeductsOnce(t *testing.T) {
	addr := testredis.Addr(t)
	proxy := faultproxy.New(t, addr)
	cfg := testConfig(frameworkNetHTTP)
	cfg.redisURL = "redis://" + proxy.Addr()
	_, srv := startApp(t, cfg)
	apple, pear := redisSKU(t, "apple"), redisSKU(t, "pear")

	direct := redis.NewClient(&redis.Options{Addr: addr})
	defer direct.Close()
	if err := redisDeductAllScript.Load(context.Background(), direct).Err(); err != nil {
		t.Fatal(err)
	}
	hash := []byte(redisDeductAllScript.Hash())
	proxy.CutWhen(faultproxy.ToServer, func(chunk []byte) bool { return bytes.Contains(chunk, hash) }, true)

	cart := `{"items":[{"sku":"` + apple + `","qty":1},{"sku":"` + pear + `","qty":2}]}`
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/carts/checkout", strings.NewReader(cart))
	ans := sendReq(t, req)
	if proxy.Armed() != 0 {
		t.Fatalf("the script's reply was not cut (answer %d %s)", ans.status, ans.body)
	}
	if got := stockOf(t, srv.URL, pear); got != cfg.defaultStock-2 {
		t.Fatalf("pear's stock is %d after one checkout of 2 (answered %d %s), want %d: the script ran twice",
			got, ans.status, bytes.TrimSpace(ans.body), cfg.defaultStock-2)
	}
}

// TestReview23cStockClientNeverResends: the stock client does not resend a
// call (go-redis's max_retries), and a -redis URL that asks it to is
// refused.
func TestReview23cStockClientNeverResends(t *testing.T) {
	c, _, err := newRedisClient("redis://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.Options().MaxRetries; got != 0 { // -1, as NewClient keeps it: 0 tries again
		t.Fatalf("the stock client's MaxRetries is %d, want 0 (no resend)", got)
	}
	if _, _, err := newRedisClient("redis://127.0.0.1:1?max_retries=2"); err == nil || !strings.Contains(err.Error(), "max_retries") {
		t.Fatalf("a URL with max_retries=2: %v, want it refused", err)
	}
}

// TestReview23cLateScriptAfterRelease: the deduct-and-record script is held
// on its way to Redis past the request's stock budget; the request answers
// 503 "outcome unknown" and the middleware releases its claim. A retry of
// the key claims it again and deducts; then the first script reaches Redis:
// its owner check finds another token's claim or record and changes
// nothing. The stock fell once, and a third send replays the retry's 200.
func TestReview23cLateScriptAfterRelease(t *testing.T) {
	proxy := faultproxy.New(t, testredis.Addr(t))
	cfg := testConfig(frameworkNetHTTP)
	cfg.redisURL = "redis://" + proxy.Addr()
	a, srv := startApp(t, cfg)
	sku := redisSKU(t, "late")
	key := "k-" + sku
	var armed atomic.Bool
	armed.Store(true)
	answered := make(chan (<-chan struct{}), 1)
	a.shop.testHookAfterRead = func(context.Context) {
		if armed.CompareAndSwap(true, false) {
			answered <- proxy.DelayNextRequest(3 * time.Second) // the script, next on the wire
		}
	}
	send := func() idemAnswer {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/skus/"+sku+"/deduct", strings.NewReader(`{"qty":2}`))
		req.Header.Set("Idempotency-Key", key)
		return sendReq(t, req)
	}
	first := send()
	if first.status != http.StatusServiceUnavailable || !bytes.Contains(first.body, []byte("outcome is unknown")) {
		t.Fatalf("first answer %d %s, want 503 outcome unknown", first.status, first.body)
	}
	var retry idemAnswer
	deadline := time.Now().Add(20 * time.Second)
	for {
		retry = send() // 409 while the first's claim is not released yet
		if retry.status != http.StatusConflict || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if retry.status != http.StatusOK || retry.replayed {
		t.Fatalf("the retry answered %d %s (replayed %v), want a 200 of its own", retry.status, retry.body, retry.replayed)
	}
	select {
	case <-<-answered:
	case <-time.After(30 * time.Second):
		t.Fatal("the held script never reached Redis")
	}
	if got := stockOf(t, srv.URL, sku); got != cfg.defaultStock-2 {
		t.Fatalf("stock %d, want %d: the late script deducted after the retry did", got, cfg.defaultStock-2)
	}
	third := send()
	if third.status != http.StatusOK || !third.replayed || !bytes.Equal(third.body, retry.body) {
		t.Fatalf("third send %d %s (replayed %v), want the retry's 200 replayed", third.status, third.body, third.replayed)
	}
}
