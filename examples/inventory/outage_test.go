package main

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/internal/testservers"
)

// redisFaults are the ways the tests make a real Redis fail under a
// request: it freezes (SIGSTOP: it keeps its connections and answers
// nothing, as in a long pause or behind a partition), or it dies (SIGKILL).
// restore brings it back with its data.
var redisFaults = []struct {
	name          string
	fail, restore func(*testservers.Server)
}{
	{"frozen", (*testservers.Server).Pause, (*testservers.Server).Resume},
	{"killed", (*testservers.Server).Kill, (*testservers.Server).Restart},
}

// answerSlack is what the answer-time tests allow beyond the bound the
// service keeps, for the HTTP round trip and a loaded machine.
const answerSlack = 250 * time.Millisecond

// TestRedisFailureAnswersInTime: Redis freezes or dies under a request that
// holds its lock, one that first waited for it most of its lock wait. The
// request still answers 503 with Retry-After within its wait plus
// redisGrace (its work is 0): its stock calls share what is left of
// redisGrace after the release's share, and the release is bounded by
// releaseTimeout. A request that tries once (-wait 0) and a GET answer
// within redisGrace too. Once Redis is back the stock is as the fences
// allow (the frozen write may land once Redis thaws; the dead one never
// left) and the SKU sells on.
func TestRedisFailureAnswersInTime(t *testing.T) {
	for _, fw := range frameworks {
		for _, fault := range redisFaults {
			t.Run(fw+"/"+fault.name, func(t *testing.T) {
				t.Parallel()
				server := testservers.RedisNodes(t, 1)[0]
				cfg := testConfig(fw)
				cfg.redisURL = "redis://" + server.Addr()
				// Longer than the request's hold, short enough that the
				// lock a failed release left behind expires within the
				// next request's wait.
				cfg.ttl = 1500 * time.Millisecond
				a, srv := startApp(t, cfg)
				const sku = "Z"
				key, err := skuKeysOf(a.routes, routeDeduct).key(sku)
				if err != nil {
					t.Fatal(err)
				}
				held, err := a.locker.Obtain(context.Background(), key, 10*time.Second, 0)
				if err != nil {
					t.Fatalf("Obtain: %v", err)
				}

				read, failed := make(chan time.Time, 1), make(chan struct{})
				a.shop.testHookAfterRead = func(ctx context.Context) {
					read <- time.Now()
					select {
					case <-failed:
					case <-ctx.Done():
					}
				}
				holdFor := cfg.wait - 400*time.Millisecond
				start := time.Now()
				answer := doAsync(deductRoutes[0].req(srv.URL, sku))
				select {
				case r := <-answer:
					t.Fatalf("answered %v, %v while another held the lock", r.a, r.err)
				case <-time.After(holdFor): // the request waits meanwhile
				}
				if err := held.Release(context.Background()); err != nil {
					t.Fatalf("Release: %v", err)
				}
				var readAt time.Time
				select {
				case readAt = <-read:
				case r := <-answer:
					t.Fatalf("answered %v, %v before it read the stock", r.a, r.err)
				}
				fault.fail(server)
				close(failed)
				r := <-answer
				took := time.Since(start)
				if r.err != nil {
					t.Fatal(r.err)
				}
				if waited := readAt.Sub(start); waited < holdFor {
					t.Fatalf("the request had its lock after %v, before the holder's %v: it did not wait", waited, holdFor)
				}
				if r.a.status != http.StatusServiceUnavailable || r.a.retryAfter == "" {
					t.Errorf("deduction while Redis is %s: %v, want 503 with Retry-After", fault.name, r.a)
				}
				if limit := cfg.wait + redisGrace + answerSlack; took > limit {
					t.Errorf("a request that held its lock when Redis failed answered after %v, above its wait %v + %v", took, cfg.wait, redisGrace)
				}
				t.Logf("had the lock after %v, answered after %v", readAt.Sub(start).Round(time.Millisecond), took.Round(time.Millisecond))

				// Started while Redis is down: connect=lazy, or start-up
				// would fail (as it must by default).
				tryOnce := cfg
				tryOnce.wait = 0
				tryOnce.redisURL += "?connect=lazy"
				_, srvB := startApp(t, tryOnce)
				for _, req := range []struct{ method, url, body string }{
					{http.MethodPost, srvB.URL + "/skus/Y/deduct", `{"qty":1}`},
					{http.MethodGet, srvB.URL + "/skus/Y", ""},
				} {
					start := time.Now()
					got := mustDo(t, req.method, req.url, req.body)
					if took := time.Since(start); took > redisGrace+answerSlack {
						t.Errorf("%s %s (-wait 0) while Redis is %s answered after %v, above %v", req.method, req.url, fault.name, took, redisGrace)
					}
					if got.status != http.StatusServiceUnavailable {
						t.Errorf("%s %s (-wait 0) while Redis is %s: %v, want 503", req.method, req.url, fault.name, got)
					}
				}

				fault.restore(server)
				a.shop.testHookAfterRead = nil
				stock := stockOf(t, srv.URL, sku)
				switch {
				case fault.name == "killed" && stock != 100:
					t.Errorf("stock %d after Redis died before the write, want 100", stock)
				case stock != 100 && stock != 99:
					t.Errorf("stock %d after the deduction whose write Redis held back, want 100 or 99", stock)
				}
				got := deductRoutes[1].send(t, srv.URL, sku)
				if got.status != http.StatusOK || *got.Stock != stock-1 {
					t.Errorf("deduction once Redis is back: %v, want 200 with stock %d", got, stock-1)
				}
			})
		}
	}
}

// TestLeaseLapsesDuringWrite: Redis freezes while a deduction's write is on
// its way, and the request's lease lapses before the write's call gives up.
// The write may still land (here it does, once Redis thaws: nobody newer
// came, so its fence lets it), so the request must not answer 409 "lock
// lost", which says nothing more was written: it answers 503, outcome
// unknown. The stock then shows the sale, exactly once.
func TestLeaseLapsesDuringWrite(t *testing.T) {
	for _, fw := range frameworks {
		t.Run(fw, func(t *testing.T) {
			t.Parallel()
			proxy := testredis.NewProxy(t)
			cfg := testConfig(fw)
			cfg.redisURL = "redis://" + proxy.Addr()
			cfg.ttl = 100 * time.Millisecond // lapses while the frozen write waits
			a, srv := startApp(t, cfg)
			var sku string
			// A deduction of another SKU loads the scripts: a script Redis
			// does not have yet would fail the held-back write on arrival.
			// On a loaded machine it can outlast the 100ms lease (409), so
			// it is tried on fresh SKUs until one goes through.
			for i, deadline := 0, time.Now().Add(10*time.Second); ; i++ {
				got := deductRoutes[0].send(t, srv.URL, redisSKU(t, "V"+strconv.Itoa(i)))
				if got.status == http.StatusOK {
					break
				}
				if got.status != http.StatusConflict || time.Now().After(deadline) {
					t.Fatalf("first deduction: %v", got)
				}
			}
			// The case is a write on its way when the lease lapses: on a
			// loaded machine a renewal can come too late before that, the
			// request then answers 409 (nothing written, rightly), and it
			// is tried again on a fresh SKU.
			var got answer
			for i, deadline := 0, time.Now().Add(10*time.Second); ; i++ {
				sku = redisSKU(t, "W"+strconv.Itoa(i))
				var liveAtFreeze atomic.Bool
				a.shop.testHookAfterRead = func(ctx context.Context) {
					proxy.Freeze()
					liveAtFreeze.Store(ctx.Err() == nil)
				}
				got = deductRoutes[0].send(t, srv.URL, sku)
				proxy.Thaw()
				a.shop.testHookAfterRead = nil
				if liveAtFreeze.Load() || time.Now().After(deadline) {
					break
				}
			}
			if got.status != http.StatusServiceUnavailable || got.retryAfter == "" || !strings.Contains(got.Error, "unknown") {
				t.Errorf("deduction whose write was on its way when its lease lapsed: %v, want 503 with Retry-After, outcome unknown", got)
			}
			// The write lands once Redis has the bytes the freeze held back.
			poll := time.NewTicker(10 * time.Millisecond)
			defer poll.Stop()
			for deadline := time.Now().Add(5 * time.Second); ; <-poll.C {
				stock := stockOf(t, srv.URL, sku)
				if stock == 99 {
					break
				}
				if stock != 100 || time.Now().After(deadline) {
					t.Fatalf("stock %d, want 99: the held-back write did not land once", stock)
				}
			}
			// Its lease may lapse on a loaded machine too: 409, nothing
			// written, and it is sent again.
			for deadline := time.Now().Add(10 * time.Second); ; {
				got := deductRoutes[1].send(t, srv.URL, sku)
				if got.status == http.StatusConflict && time.Now().Before(deadline) {
					continue
				}
				if got.status != http.StatusOK || *got.Stock != 98 {
					t.Errorf("next deduction: %v, want 200 with stock 98", got)
				}
				break
			}
		})
	}
}
