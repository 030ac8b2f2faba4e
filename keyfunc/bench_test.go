package keyfunc

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
)

// benchKeys benchmarks rendering template for r: Key when want is a single
// key, Keys otherwise. body, when not nil, is put back as r's body before
// each rendering, as a fresh request would bring it. The keys are checked
// against want once before the timed loop, and their error (and count) in
// it, so a benchmark cannot time a rendering that went wrong.
func benchKeys(b *testing.B, template string, r *http.Request, body []byte, want ...string) {
	b.Helper()
	tmpl := MustParse(template)
	req := HTTPRequest(r)
	rd := bytes.NewReader(body)
	rc := io.NopCloser(rd)
	rewind := func() {
		if body != nil {
			rd.Reset(body)
			r.Body, r.ContentLength = rc, int64(len(body))
		}
	}
	render := func() ([]string, error) {
		rewind()
		if len(want) == 1 {
			key, err := tmpl.Key(req)
			return []string{key}, err
		}
		return tmpl.Keys(req)
	}
	if got, err := render(); err != nil || !slices.Equal(got, want) {
		b.Fatalf("%s renders %q, %v; want %q", template, got, err, want)
	}
	b.ReportAllocs()
	if len(want) == 1 {
		for b.Loop() {
			rewind()
			if _, err := tmpl.Key(req); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	for b.Loop() {
		rewind()
		if keys, err := tmpl.Keys(req); err != nil || len(keys) != len(want) {
			b.Fatal(keys, err)
		}
	}
}

func BenchmarkKeyPath(b *testing.B) {
	r := httptest.NewRequest(http.MethodPost, "/skus/A-1042", nil)
	r.SetPathValue("id", "A-1042")
	benchKeys(b, "\\{stock}:sku:<id>", r, nil, "{stock}:sku:A%2D1042")
}

func BenchmarkKeyHeader(b *testing.B) {
	r := httptest.NewRequest(http.MethodPost, "/skus/A-1042", nil)
	r.SetPathValue("id", "A-1042")
	r.Header.Set("X-Tenant", "acme")
	benchKeys(b, "tenant:<header:X-Tenant>:sku:<id>", r, nil, "tenant:acme:sku:A%2D1042")
}

func BenchmarkKeyQueryHeader(b *testing.B) {
	r := httptest.NewRequest(http.MethodPost, "/carts?cart=c-77&page=2", nil)
	r.Header.Set("X-Tenant", "acme")
	benchKeys(b, "tenant:<header:X-Tenant>:cart:<query:cart>", r, nil, "tenant:acme:cart:c%2D77")
}

func BenchmarkKeyJSON(b *testing.B) {
	body := []byte(`{"order":{"sku":"A-1042","qty":2,"note":"gift wrap"}}`)
	r := httptest.NewRequest(http.MethodPost, "/orders", nil)
	benchKeys(b, "order:<json:order.sku>", r, body, "order:A%2D1042")
}

func BenchmarkKeyHashed(b *testing.B) {
	long := string(bytes.Repeat([]byte("x"), 200))
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.SetPathValue("id", long)
	sum := sha256.Sum256([]byte(long))
	benchKeys(b, "sku:<id>", r, nil, "sku:#"+hex.EncodeToString(sum[:16]))
}

func BenchmarkKeysCart10(b *testing.B) {
	body := []byte(`{"cart":"c-77","items":[` +
		`{"sku":"A-1001","qty":1},{"sku":"A-1002","qty":2},{"sku":"A-1003","qty":1},{"sku":"A-1004","qty":3},` +
		`{"sku":"A-1005","qty":1},{"sku":"A-1006","qty":2},{"sku":"A-1007","qty":1},{"sku":"A-1008","qty":5},` +
		`{"sku":"A-1009","qty":1},{"sku":"A-1010","qty":2}]}`)
	r := httptest.NewRequest(http.MethodPost, "/carts/c-77/checkout", nil)
	want := make([]string, 10) // '-' is escaped in a key
	for i := range want {
		want[i] = fmt.Sprintf("{stock}:sku:A%%2D%d", 1001+i)
	}
	benchKeys(b, "\\{stock}:sku:<json:items[*].sku>", r, body, want...)
}
