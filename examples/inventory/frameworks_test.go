package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testredis"
)

// rawAnswer is an answer whose body need not be JSON: the routers answer a
// wrong method or path themselves, each with its own body.
type rawAnswer struct {
	status int
	allow  string
}

// doRaw sends one request and returns its status and Allow header.
func doRaw(t *testing.T, method, url string) rawAnswer {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	return rawAnswer{resp.StatusCode, resp.Header.Get("Allow")}
}

// allowSet returns the methods of an Allow header, sorted, without OPTIONS:
// echo answers OPTIONS itself (204 with Allow) and so lists it, while
// net/http and gin answer it like any other method they do not serve.
func allowSet(allow string) []string {
	var methods []string
	for m := range strings.SplitSeq(allow, ",") {
		if m = strings.TrimSpace(m); m != "" && m != http.MethodOptions {
			methods = append(methods, m)
		}
	}
	slices.Sort(methods)
	return methods
}

// TestWrongMethodAnswersAlike sends each route a method it does not serve,
// on each framework: every one answers 405 with an Allow header naming the
// methods the path serves, the same on all three (gin answers 404 unless
// told otherwise), and HEAD is served beside every GET, as net/http's
// ServeMux does. A path with a trailing slash the route lacks is 404
// everywhere (gin would redirect it). Nothing is deducted.
func TestWrongMethodAnswersAlike(t *testing.T) {
	cases := []struct {
		method, path string
		status       int
		allow        []string // sorted; checked on a 405
	}{
		{http.MethodDelete, "/skus/X", 405, []string{"GET", "HEAD", "PUT"}},
		{http.MethodPost, "/skus/X", 405, []string{"GET", "HEAD", "PUT"}},
		{http.MethodGet, "/skus/X/deduct", 405, []string{"POST"}},
		{http.MethodPut, "/skus/a%2Fb/deduct", 405, []string{"POST"}},
		{http.MethodGet, "/orders", 405, []string{"POST"}},
		{http.MethodPatch, "/carts/checkout", 405, []string{"POST"}},
		{http.MethodPost, "/metrics", 405, []string{"GET", "HEAD"}},
		{http.MethodHead, "/skus/X", 200, nil},
		{http.MethodHead, "/metrics", 200, nil},
		{http.MethodPost, "/skus/X/deduct/", 404, nil},
		{http.MethodGet, "/skus/X/", 404, nil},
	}
	for _, fw := range frameworks {
		t.Run(fw, func(t *testing.T) {
			t.Parallel()
			_, srv := startApp(t, testConfig(fw))
			for _, c := range cases {
				got := doRaw(t, c.method, srv.URL+c.path)
				if got.status != c.status {
					t.Errorf("%s %s: %d, want %d", c.method, c.path, got.status, c.status)
					continue
				}
				if c.status == http.StatusMethodNotAllowed && !slices.Equal(allowSet(got.allow), c.allow) {
					t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, got.allow, strings.Join(c.allow, ", "))
				}
			}
			if got := stockOf(t, srv.URL, "X"); got != 100 {
				t.Errorf("stock of X %d, want 100", got)
			}
		})
	}
}

// escapedSKUs are SKUs whose path segment is escaped, with the segment.
var escapedSKUs = []struct{ sku, segment string }{
	{"a/b", "a%2Fb"},
	{"a b", "a%20b"},
	{"a%2Fb", "a%252Fb"},
	{"a:b", "a%3Ab"},
	{"été", "%C3%A9t%C3%A9"},
}

// TestEscapedPathSegmentIsOneSKU sends /skus/a%2Fb/deduct and the like to
// each framework: the SKU is the unescaped segment, "a/b", on all three
// (gin, by default, sees /skus/a/b/deduct and answers 404), and the lock
// key is the one a JSON "a/b" gives: while another holder has that key, the
// deduction waits and answers 423; once it is free, the path and /orders
// with the JSON SKU deduct the same stock, and GET and PUT find it too.
func TestEscapedPathSegmentIsOneSKU(t *testing.T) {
	for _, fw := range frameworks {
		t.Run(fw, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(fw)
			cfg.wait = 50 * time.Millisecond
			a, srv := startApp(t, cfg)
			keys := skuKeysOf(a.routes, routeDeduct)
			for _, e := range escapedSKUs {
				if u, err := url.PathUnescape(e.segment); err != nil || u != e.sku {
					t.Fatalf("segment %q unescapes to %q (%v), not %q", e.segment, u, err, e.sku)
				}
				key, err := keys.key(e.sku)
				if err != nil {
					t.Fatal(err)
				}
				deduct := srv.URL + "/skus/" + e.segment + "/deduct"
				checkHeldKeyLocks(t, a.locker, key, deduct)
				got := mustDo(t, http.MethodPost, deduct, `{"qty":1}`)
				if got.status != http.StatusOK || got.SKU != e.sku || *got.Stock != 99 {
					t.Errorf("POST /skus/%s/deduct: %v, want 200 for SKU %q with stock 99", e.segment, got, e.sku)
					continue
				}
				order := mustDo(t, http.MethodPost, srv.URL+"/orders", fmt.Sprintf(`{"sku":%q,"qty":1}`, e.sku))
				if order.status != http.StatusOK || order.SKU != e.sku || *order.Stock != 98 || order.Fence <= got.Fence {
					t.Errorf("POST /orders for %q after the path's deduction: %v, want 200 with stock 98 and a fence above %d", e.sku, order, got.Fence)
				}
				if got := mustDo(t, http.MethodGet, srv.URL+"/skus/"+e.segment, ""); got.SKU != e.sku || *got.Stock != 98 {
					t.Errorf("GET /skus/%s: %v, want SKU %q with stock 98", e.segment, got, e.sku)
				}
				if got := mustDo(t, http.MethodPut, srv.URL+"/skus/"+e.segment, `{"stock":5}`); got.status != http.StatusOK || got.SKU != e.sku {
					t.Errorf("PUT /skus/%s: %v, want 200 for SKU %q", e.segment, got, e.sku)
				}
				if got := mustDo(t, http.MethodPost, srv.URL+"/orders", fmt.Sprintf(`{"sku":%q,"qty":1}`, e.sku)); *got.Stock != 4 {
					t.Errorf("POST /orders for %q after PUT 5: %v, want stock 4", e.sku, got)
				}
			}
		})
	}
}

// checkHeldKeyLocks holds key with locker, as another request or instance
// would, and checks that a deduction at each of urls, sent at once, which
// waits out its route's wait, answers 423: it locks that very key. It
// releases the key before it returns.
func checkHeldKeyLocks(t *testing.T, locker *reqlock.Locker, key string, urls ...string) {
	t.Helper()
	held, err := locker.Obtain(context.Background(), key, 10*time.Second, 0)
	if err != nil {
		t.Fatalf("Obtain(%q): %v", key, err)
	}
	got := make([]answer, len(urls))
	errs := make([]error, len(urls))
	var wg sync.WaitGroup
	for i, url := range urls {
		wg.Go(func() { got[i], errs[i] = do(http.MethodPost, url, `{"qty":1}`) })
	}
	wg.Wait()
	if err := held.Release(context.Background()); err != nil {
		t.Fatalf("Release(%q): %v", key, err)
	}
	for i, url := range urls {
		switch {
		case errs[i] != nil:
			t.Fatalf("POST %s: %v", url, errs[i])
		case got[i].status != http.StatusLocked:
			t.Errorf("POST %s while %q is held: %v, want 423: the route locks another key", url, key, got[i])
		}
	}
}

// TestEscapedPathSegmentAcrossFrameworks runs one instance on each framework
// over one Redis, as instances of a service on different routers would
// share it: an escaped SKU's lock key is the same on all three (each waits
// for a holder of the key and answers 423), and they deduct the same stock.
func TestEscapedPathSegmentAcrossFrameworks(t *testing.T) {
	redisURL := "redis://" + testredis.Addr(t)
	var (
		apps  []*app
		bases []string
	)
	for _, fw := range frameworks {
		cfg := testConfig(fw)
		cfg.redisURL = redisURL
		// The wait bounds each store call of a deduction: at 50ms, a
		// loaded machine's Redis round trip now and then outlasted it
		// (503, and its lock, released in the background, was still held
		// for the next check). The held-key checks of the three
		// frameworks wait it out at once.
		cfg.wait = time.Second
		a, srv := startApp(t, cfg)
		apps, bases = append(apps, a), append(bases, srv.URL)
	}
	for _, e := range escapedSKUs {
		prefix := redisSKU(t, "")
		sku, segment := prefix+e.sku, url.PathEscape(prefix)+e.segment
		key, err := skuKeysOf(apps[0].routes, routeDeduct).key(sku)
		if err != nil {
			t.Fatal(err)
		}
		deducts := make([]string, len(frameworks))
		for i := range frameworks {
			deducts[i] = bases[i] + "/skus/" + segment + "/deduct"
		}
		checkHeldKeyLocks(t, apps[0].locker, key, deducts...)
		var fence int64
		for i, fw := range frameworks {
			deduct := deducts[i]
			got := mustDo(t, http.MethodPost, deduct, `{"qty":1}`)
			if want := int64(99 - i); got.status != http.StatusOK || got.SKU != sku || *got.Stock != want || got.Fence <= fence {
				t.Errorf("%s: POST /skus/%s/deduct: %v, want 200 for SKU %q with stock %d and a fence above %d", fw, segment, got, sku, want, fence)
			}
			fence = got.Fence
		}
		for i, fw := range frameworks {
			if got := mustDo(t, http.MethodGet, bases[i]+"/skus/"+segment, ""); got.SKU != sku || *got.Stock != 97 {
				t.Errorf("%s: GET /skus/%s: %v, want SKU %q with stock 97", fw, segment, got, sku)
			}
		}
	}
}
