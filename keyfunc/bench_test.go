package keyfunc

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

func BenchmarkKeyPath(b *testing.B) {
	tmpl := MustParse("{stock}:sku:<id>")
	r := httptest.NewRequest(http.MethodPost, "/skus/A-1042", nil)
	r.SetPathValue("id", "A-1042")
	req := HTTPRequest(r)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tmpl.Key(req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkKeyHeader(b *testing.B) {
	tmpl := MustParse("tenant:<header:X-Tenant>:sku:<id>")
	r := httptest.NewRequest(http.MethodPost, "/skus/A-1042", nil)
	r.SetPathValue("id", "A-1042")
	r.Header.Set("X-Tenant", "acme")
	req := HTTPRequest(r)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tmpl.Key(req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkKeyQueryHeader(b *testing.B) {
	tmpl := MustParse("tenant:<header:X-Tenant>:cart:<query:cart>")
	r := httptest.NewRequest(http.MethodPost, "/carts?cart=c-77&page=2", nil)
	r.Header.Set("X-Tenant", "acme")
	req := HTTPRequest(r)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tmpl.Key(req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkKeyJSON(b *testing.B) {
	tmpl := MustParse("order:<json:order.sku>")
	body := []byte(`{"order":{"sku":"A-1042","qty":2,"note":"gift wrap"}}`)
	r := httptest.NewRequest(http.MethodPost, "/orders", nil)
	rd := bytes.NewReader(body)
	rc := io.NopCloser(rd)
	req := HTTPRequest(r)
	b.ReportAllocs()
	for b.Loop() {
		rd.Reset(body)
		r.Body, r.ContentLength = rc, int64(len(body))
		if _, err := tmpl.Key(req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkKeyHashed(b *testing.B) {
	tmpl := MustParse("sku:<id>")
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.SetPathValue("id", string(bytes.Repeat([]byte("x"), 200)))
	req := HTTPRequest(r)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tmpl.Key(req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkKeysCart10(b *testing.B) {
	tmpl := MustParse("{stock}:sku:<json:items[*].sku>")
	body := []byte(`{"cart":"c-77","items":[` +
		`{"sku":"A-1001","qty":1},{"sku":"A-1002","qty":2},{"sku":"A-1003","qty":1},{"sku":"A-1004","qty":3},` +
		`{"sku":"A-1005","qty":1},{"sku":"A-1006","qty":2},{"sku":"A-1007","qty":1},{"sku":"A-1008","qty":5},` +
		`{"sku":"A-1009","qty":1},{"sku":"A-1010","qty":2}]}`)
	r := httptest.NewRequest(http.MethodPost, "/carts/c-77/checkout", nil)
	rd := bytes.NewReader(body)
	rc := io.NopCloser(rd)
	req := HTTPRequest(r)
	b.ReportAllocs()
	for b.Loop() {
		rd.Reset(body)
		r.Body, r.ContentLength = rc, int64(len(body))
		keys, err := tmpl.Keys(req)
		if err != nil || len(keys) != 10 {
			b.Fatal(keys, err)
		}
	}
}
