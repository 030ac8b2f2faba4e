package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/testredis"
)

// cartItem is one item of a checkout's body.
type cartItem struct {
	SKU string `json:"sku"`
	Qty int64  `json:"qty"`
}

// cartBody returns the body of a checkout of items.
func cartBody(items ...cartItem) string {
	b, err := json.Marshal(map[string][]cartItem{"items": items})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// demand returns the quantity a cart asks of each SKU.
func demand(items []cartItem) map[string]int64 {
	d := map[string]int64{}
	for _, it := range items {
		d[it.SKU] += it.Qty
	}
	return d
}

// checkoutRoute checks out 1 of the SKU and 1 of another; it locks the SKU
// as the deduction routes do.
var checkoutRoute = deductRoute{"checkout", func(base, sku string) (string, string, string) {
	return http.MethodPost, base + "/carts/checkout", cartBody(cartItem{sku, 1}, cartItem{sku + "-2", 1})
}}

// lockedRoutes are every route that deducts: both deductions and the
// checkout.
var lockedRoutes = []deductRoute{deductRoutes[0], deductRoutes[1], checkoutRoute}

// storeNames are the stock and lock stores the HTTP tests run on.
var storeNames = []string{"memory", "redis"}

// onStore points cfg at store ("memory" or "redis") and returns a function
// that names SKUs: unique to the test on Redis.
func onStore(t *testing.T, cfg *config, store string) func(string) string {
	t.Helper()
	if store == "redis" {
		cfg.redisURL = "redis://" + testredis.Addr(t)
		prefix := redisSKU(t, "")
		return func(name string) string { return prefix + name }
	}
	return func(name string) string { return name }
}

// TestCheckoutRequests checks the answers to single checkouts on each
// framework and store, locked and with -nolock: bad bodies, empty carts and
// quantities below 1 are 400; a cart deducts all its SKUs, adding up the
// quantities of a SKU listed twice, and answers a line per SKU, sorted,
// with the stock left and the SKU's fence; a cart with a short SKU is 409
// naming every short SKU, its stock and the quantity asked, and changes no
// SKU. After every step the stocks must be exactly as expected.
func TestCheckoutRequests(t *testing.T) {
	type step struct {
		body   string
		status int
		lines  []cartLine  // a 200's, fences ignored
		short  []shortItem // a 409's
		stocks [3]int64    // P, Q, R after the step
	}
	const start = 10
	steps := func(sku func(string) string) []step {
		P, Q, R := sku("P"), sku("Q"), sku("R")
		all := [3]int64{start, start, start}
		return []step{
			{body: `not json`, status: 400, stocks: all},
			{body: `{}`, status: 400, stocks: all},
			{body: `{"items":[]}`, status: 400, stocks: all},
			{body: `{"items":null}`, status: 400, stocks: all},
			{body: fmt.Sprintf(`{"items":[{"sku":%q}]}`, P), status: 400, stocks: all},
			{body: fmt.Sprintf(`{"items":[{"sku":%q,"qty":0}]}`, P), status: 400, stocks: all},
			{body: fmt.Sprintf(`{"items":[{"sku":%q,"qty":1},{"sku":%q,"qty":-1}]}`, P, Q), status: 400, stocks: all},
			{body: fmt.Sprintf(`{"items":[{"sku":%q,"qty":1.5}]}`, P), status: 400, stocks: all},
			{body: fmt.Sprintf(`{"items":[{"sku":%q,"qty":1},{"qty":1}]}`, P), status: 400, stocks: all},
			{body: fmt.Sprintf(`{"items":[{"sku":%q,"qty":9223372036854775807},{"sku":%q,"qty":1}]}`, P, P), status: 400, stocks: all},
			{
				body:   cartBody(cartItem{Q, 2}, cartItem{P, 3}, cartItem{Q, 1}),
				status: 200, lines: []cartLine{{SKU: P, Qty: 3, Stock: 7}, {SKU: Q, Qty: 3, Stock: 7}},
				stocks: [3]int64{7, 7, 10},
			},
			{
				body:   cartBody(cartItem{P, 1}, cartItem{R, 11}),
				status: 409, short: []shortItem{{R, 11, 10}},
				stocks: [3]int64{7, 7, 10},
			},
			{
				body:   cartBody(cartItem{P, 4}, cartItem{P, 4}),
				status: 409, short: []shortItem{{P, 8, 7}},
				stocks: [3]int64{7, 7, 10},
			},
			{
				body:   cartBody(cartItem{R, 11}, cartItem{Q, 1}, cartItem{P, 8}),
				status: 409, short: []shortItem{{P, 8, 7}, {R, 11, 10}},
				stocks: [3]int64{7, 7, 10},
			},
			{
				body:   cartBody(cartItem{R, 10}, cartItem{P, 7}),
				status: 200, lines: []cartLine{{SKU: P, Qty: 7, Stock: 0}, {SKU: R, Qty: 10, Stock: 0}},
				stocks: [3]int64{0, 7, 0},
			},
			{
				body:   cartBody(cartItem{Q, 1}),
				status: 200, lines: []cartLine{{SKU: Q, Qty: 1, Stock: 6}},
				stocks: [3]int64{0, 6, 0},
			},
		}
	}
	for _, fw := range frameworks {
		for _, store := range storeNames {
			for _, locked := range []bool{true, false} {
				name := fw + "/" + store
				if !locked {
					name += "/nolock"
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					cfg := testConfig(fw)
					cfg.defaultStock = start
					cfg.noLock = !locked
					sku := onStore(t, &cfg, store)
					_, srv := startApp(t, cfg)
					fences := map[string]int64{}
					for i, s := range steps(sku) {
						got := mustDo(t, http.MethodPost, srv.URL+"/carts/checkout", s.body)
						if got.status != s.status {
							t.Fatalf("step %d, %s: %v, want status %d", i, s.body, got, s.status)
						}
						switch s.status {
						case http.StatusOK:
							lines := slices.Clone(got.Items)
							for j, l := range lines {
								switch {
								case !locked && l.Fence != 0:
									t.Errorf("step %d: unlocked, %s has fence %d", i, l.SKU, l.Fence)
								case locked && l.Fence <= fences[l.SKU]:
									t.Errorf("step %d: %s has fence %d, want above its last %d", i, l.SKU, l.Fence, fences[l.SKU])
								}
								fences[l.SKU] = l.Fence
								lines[j].Fence = 0
							}
							if !reflect.DeepEqual(lines, s.lines) {
								t.Fatalf("step %d, %s: lines %+v, want %+v", i, s.body, got.Items, s.lines)
							}
						case http.StatusConflict:
							if got.Error != "insufficient stock" || !reflect.DeepEqual(got.Short, s.short) {
								t.Fatalf("step %d, %s: %v, want the short SKUs %+v", i, s.body, got, s.short)
							}
						}
						for j, name := range []string{"P", "Q", "R"} {
							if stock := stockOf(t, srv.URL, sku(name)); stock != s.stocks[j] {
								t.Fatalf("after step %d, %s: stock of %s %d, want %d", i, s.body, name, stock, s.stocks[j])
							}
						}
					}
					if locked {
						// More items than the lock's max-keys (64).
						items := make([]cartItem, 65)
						for i := range items {
							items[i] = cartItem{sku(fmt.Sprint("many", i)), 1}
						}
						if got := mustDo(t, http.MethodPost, srv.URL+"/carts/checkout", cartBody(items...)); got.status != http.StatusRequestEntityTooLarge {
							t.Errorf("a cart of 65 items: %v, want 413", got)
						}
					}
				})
			}
		}
	}
}

// TestCheckoutUnderContention sends 50 concurrent carts of 2 to 4 items,
// drawn from 6 SKUs (a SKU may come twice), so that they overlap and many
// run short; in memory on each framework, on Redis, and on two instances
// sharing Redis. Every cart must answer within a deadline (no deadlock),
// 200 or 409. Per SKU, the successful carts ordered by their fence must
// leave exactly the stocks they report, one after another, and the final
// stock must be the initial one minus their quantities: the carts ran one
// at a time on each SKU, and no 409 cart changed anything. On Redis no lock
// key is left behind.
func TestCheckoutUnderContention(t *testing.T) {
	cases := []struct {
		name, store string
		fws         []string // one instance per framework
	}{
		{"memory/gin", "memory", []string{frameworkGin}},
		{"memory/echo", "memory", []string{frameworkEcho}},
		{"memory/nethttp", "memory", []string{frameworkNetHTTP}},
		{"redis/nethttp", "redis", []string{frameworkNetHTTP}},
		{"redis/two instances", "redis", []string{frameworkGin, frameworkEcho}},
	}
	const initial = 20
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var (
				bases []string
				sku   func(string) string
				first *app
			)
			for _, fw := range tc.fws {
				cfg := testConfig(fw)
				cfg.defaultStock = initial
				cfg.work = time.Millisecond
				cfg.wait = 30 * time.Second // a deadlock shows as a missing answer, not a 423
				sku = onStore(t, &cfg, tc.store)
				a, srv := startApp(t, cfg)
				bases = append(bases, srv.URL)
				if first == nil {
					first = a
				}
			}
			skus := make([]string, 6)
			for i := range skus {
				skus[i] = sku(string(rune('A' + i)))
			}
			rng := rand.New(rand.NewPCG(7, uint64(len(tc.fws))))
			carts := make([][]cartItem, 50)
			for i := range carts {
				for range 2 + rng.IntN(3) {
					carts[i] = append(carts[i], cartItem{skus[rng.IntN(len(skus))], 1 + rng.Int64N(3)})
				}
			}

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			answers := make([]answer, len(carts))
			errs := make([]error, len(carts))
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i, items := range carts {
				wg.Go(func() {
					<-start
					answers[i], errs[i] = doCtx(ctx, http.MethodPost, bases[i%len(bases)]+"/carts/checkout", cartBody(items...))
				})
			}
			close(start)
			wg.Wait()

			type sale struct{ fence, qty, left int64 }
			sales := map[string][]sale{}
			var ok, short int
			for i, a := range answers {
				if errs[i] != nil {
					t.Fatalf("cart %d: %v (a deadlock?)", i, errs[i])
				}
				want := demand(carts[i])
				switch {
				case a.status == http.StatusOK:
					ok++
					got := map[string]int64{}
					for _, l := range a.Items {
						got[l.SKU] = l.Qty
						sales[l.SKU] = append(sales[l.SKU], sale{l.Fence, l.Qty, l.Stock})
					}
					if !maps.Equal(got, want) {
						t.Errorf("cart %d: lines %+v, want the quantities %v", i, a.Items, want)
					}
				case a.status == http.StatusConflict && a.Error == "insufficient stock" && len(a.Short) > 0:
					short++
					for _, s := range a.Short {
						if s.Qty != want[s.SKU] || s.Stock >= s.Qty {
							t.Errorf("cart %d asks %v: short item %+v", i, want, s)
						}
					}
				default:
					t.Errorf("cart %d: unexpected answer %v", i, a)
				}
			}
			t.Logf("%d carts checked out, %d were short", ok, short)
			if ok == 0 || short == 0 {
				t.Errorf("%d carts checked out and %d were short: the load does not test both", ok, short)
			}

			for _, s := range skus {
				stock := int64(initial)
				ss := sales[s]
				slices.SortFunc(ss, func(a, b sale) int { return cmp.Compare(a.fence, b.fence) })
				for i, sl := range ss {
					if i > 0 && sl.fence == ss[i-1].fence {
						t.Errorf("SKU %s: two carts had fence %d", s, sl.fence)
					}
					stock -= sl.qty
					if sl.left != stock {
						t.Errorf("SKU %s: the cart with fence %d took %d and left %d, want %d: the carts did not run one at a time",
							s, sl.fence, sl.qty, sl.left, stock)
					}
				}
				for _, base := range bases {
					if got := stockOf(t, base, s); got != stock {
						t.Errorf("SKU %s: stock %d, want %d (%d minus what the successful carts took)", s, got, stock, initial)
					}
				}
			}

			if tc.store == "redis" {
				client := testredis.Client(t)
				keys := skuKeysOf(first.routes, routeCheckout)
				lockKey := func(sku string) string {
					k, err := keys.key(sku)
					if err != nil {
						t.Fatal(err)
					}
					return "reqlock:" + k
				}
				// The key names are right: a held lock shows.
				held, err := first.locker.Obtain(context.Background(), strings.TrimPrefix(lockKey(skus[0]), "reqlock:"), time.Minute, 0)
				if err != nil {
					t.Fatal(err)
				}
				if n, err := client.Exists(context.Background(), lockKey(skus[0])).Result(); err != nil || n != 1 {
					t.Fatalf("EXISTS %s while held: %d, %v", lockKey(skus[0]), n, err)
				}
				if err := held.Release(context.Background()); err != nil {
					t.Fatal(err)
				}
				for _, s := range skus {
					if n, err := client.Exists(context.Background(), lockKey(s)).Result(); err != nil || n != 0 {
						t.Errorf("lock key %s left in Redis (EXISTS %d, %v)", lockKey(s), n, err)
					}
				}
			}
		})
	}
}

// gate holds the first caller of its hook until it is opened; later
// callers pass.
type gate struct {
	calls   atomic.Int32
	inside  chan struct{} // closed when the first caller arrives
	release chan struct{}
}

func newGate() *gate { return &gate{inside: make(chan struct{}), release: make(chan struct{})} }

// await waits until the request whose answer comes on done, named what,
// is held in the gate; it fails the test when that request answers first.
func (g *gate) await(t *testing.T, done <-chan sent, what string) {
	t.Helper()
	select {
	case <-g.inside:
	case got := <-done:
		t.Fatalf("%s answered %v (error %v) before it reached the gate", what, got.a, got.err)
	}
}

func (g *gate) hook(ctx context.Context) {
	if g.calls.Add(1) != 1 {
		return
	}
	close(g.inside)
	select {
	case <-g.release:
	case <-ctx.Done():
	}
}

// TestCheckoutAndDeductExcludeEachOther holds a checkout of P and Q inside
// its lock: deductions, orders and stock updates of P or Q wait and answer
// 423 (the wait is 300ms), while a deduction of R goes through. Then it
// holds a deduction of P: a checkout of P and R answers 423 and changes
// neither. The checkout's keys are the same sku: keys as the other routes'.
func TestCheckoutAndDeductExcludeEachOther(t *testing.T) {
	for _, fw := range frameworks {
		for _, store := range storeNames {
			t.Run(fw+"/"+store, func(t *testing.T) {
				t.Parallel()
				cfg := testConfig(fw)
				cfg.wait = 300 * time.Millisecond // a first Redis round trip on a loaded machine fits
				sku := onStore(t, &cfg, store)
				P, Q, R := sku("P"), sku("Q"), sku("R")
				a, srv := startApp(t, cfg)
				var current atomic.Pointer[gate]
				a.shop.testHookAfterRead = func(ctx context.Context) { current.Load().hook(ctx) }

				// A checkout holds P and Q.
				g := newGate()
				current.Store(g)
				done := doAsync(http.MethodPost, srv.URL+"/carts/checkout", cartBody(cartItem{P, 1}, cartItem{Q, 2}))
				g.await(t, done, "the checkout of P and Q")
				for _, req := range [][3]string{
					{http.MethodPost, "/skus/" + P + "/deduct", `{"qty":1}`},
					{http.MethodPost, "/orders", fmt.Sprintf(`{"sku":%q,"qty":1}`, Q)},
					{http.MethodPut, "/skus/" + Q, `{"stock":5}`},
					{http.MethodPost, "/carts/checkout", cartBody(cartItem{R, 1}, cartItem{Q, 1})},
				} {
					if got := mustDo(t, req[0], srv.URL+req[1], req[2]); got.status != http.StatusLocked {
						t.Errorf("%s %s %s during the checkout: %v, want 423", req[0], req[1], req[2], got)
					}
				}
				if got := mustDo(t, http.MethodPost, srv.URL+"/skus/"+R+"/deduct", `{"qty":1}`); got.status != http.StatusOK {
					t.Errorf("deduct R during a checkout of P and Q: %v, want 200", got)
				}
				close(g.release)
				r := <-done
				if r.err != nil {
					t.Fatalf("checkout of P and Q: %v", r.err)
				}
				got := r.a
				if got.status != http.StatusOK || len(got.Items) != 2 || *stockAfter(got, P) != 99 || *stockAfter(got, Q) != 98 {
					t.Fatalf("checkout of P and Q: %v, want 200 leaving 99 and 98", got)
				}

				// A deduction holds P.
				g = newGate()
				current.Store(g)
				done = doAsync(http.MethodPost, srv.URL+"/skus/"+P+"/deduct", `{"qty":1}`)
				g.await(t, done, "the deduction of P")
				if got := mustDo(t, http.MethodPost, srv.URL+"/carts/checkout", cartBody(cartItem{R, 1}, cartItem{P, 1})); got.status != http.StatusLocked {
					t.Errorf("checkout of R and P during a deduction of P: %v, want 423", got)
				}
				close(g.release)
				if r := <-done; r.err != nil || r.a.status != http.StatusOK || *r.a.Stock != 98 {
					t.Fatalf("deduct P: %v (error %v), want 200 leaving 98", r.a, r.err)
				}
				for s, want := range map[string]int64{P: 98, Q: 98, R: 99} {
					if got := stockOf(t, srv.URL, s); got != want {
						t.Errorf("stock of %s: %d, want %d", s, got, want)
					}
				}
			})
		}
	}
}

// stockAfter returns the stock a checkout's answer reports for sku, or a
// pointer to -1.
func stockAfter(a answer, sku string) *int64 {
	for _, l := range a.Items {
		if l.SKU == sku {
			return &l.Stock
		}
	}
	v := int64(-1)
	return &v
}

// TestCheckoutWithExpiredLeaseChangesNothing is TestExpiredLeaseEndsTheRequest
// for a cart: checkout A of X and Y reads both and stalls past its 50ms
// lease. Its context ends with the lease, so A answers 409 "lock lost" and
// changes neither SKU; B, a deduction of Y queued behind it, deducts.
// (TestLostLockIsFenced covers a checkout whose lock is lost unnoticed.)
func TestCheckoutWithExpiredLeaseChangesNothing(t *testing.T) {
	for _, fw := range frameworks {
		for _, store := range storeNames {
			t.Run(fw+"/"+store, func(t *testing.T) {
				t.Parallel()
				cfg := testConfig(fw)
				// A lease long enough for A to reach its read on a loaded
				// machine; A then works until it ends.
				cfg.ttl = 300 * time.Millisecond
				cfg.wait = 30 * time.Second
				sku := onStore(t, &cfg, store)
				X, Y := sku("X"), sku("Y")
				a, srv := startApp(t, cfg)

				var reads atomic.Int32
				aRead := make(chan struct{})
				a.shop.testHookAfterRead = func(ctx context.Context) {
					if reads.Add(1) == 1 {
						close(aRead)
						<-ctx.Done() // A: works until its lease ends
					}
				}
				first := doAsync(http.MethodPost, srv.URL+"/carts/checkout", cartBody(cartItem{X, 1}, cartItem{Y, 1}))
				awaitHook(t, aRead, first)
				second := doAsync(http.MethodPost, srv.URL+"/skus/"+Y+"/deduct", `{"qty":1}`)
				ra, rb := <-first, <-second
				if ra.err != nil || rb.err != nil {
					t.Fatal(ra.err, rb.err)
				}
				if ra.a.status != http.StatusConflict || !strings.HasPrefix(ra.a.Error, "lock lost") {
					t.Errorf("A, whose lease expired: %v, want 409 lock lost", ra.a)
				}
				if rb.a.status != http.StatusOK || *rb.a.Stock != 99 {
					t.Errorf("B: %v, want 200 with stock 99", rb.a)
				}
				if got := stockOf(t, srv.URL, X); got != 100 {
					t.Errorf("stock of X %d, want 100: the expired checkout changed it", got)
				}
				if got := stockOf(t, srv.URL, Y); got != 99 {
					t.Errorf("stock of Y %d, want 99: B's sale only", got)
				}
			})
		}
	}
}
