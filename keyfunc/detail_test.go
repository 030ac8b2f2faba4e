package keyfunc_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/reqlock/reqlock/keyfunc"
)

// TestRequestDetail: every error a request causes says, for the client,
// where the value was looked for and what was wrong, in words: no Go
// package prefix, no placeholder syntax, no value from the request; and
// errors.Is still finds the sentinel.
func TestRequestDetail(t *testing.T) {
	form := func(body string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		return r
	}
	json := func(body string) *http.Request {
		return httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
	}
	for _, tc := range []struct {
		template string
		req      *http.Request
		sentinel error
		want     string
	}{
		{"sku:<id>", json(""), keyfunc.ErrMissing, `the path parameter "id" is missing or empty`},
		{"sku:<query:batch>", httptest.NewRequest(http.MethodPost, "/?other=secret", nil), keyfunc.ErrMissing,
			`the query parameter "batch" is missing or empty`},
		{"t:<header:X-Tenant>", json(""), keyfunc.ErrMissing, `the header "X-Tenant" is missing or empty`},
		{"sku:<form:sku>", form("other=secret"), keyfunc.ErrMissing, `the form field "sku" is missing or empty`},
		{"sku:<json:sku>", json(`{"qty":"secret"}`), keyfunc.ErrMissing, `the JSON body field "sku" is missing or empty`},
		{"sku:<json:order.sku>", json(`{"order":{}}`), keyfunc.ErrMissing, `the JSON body field "order.sku" is missing or empty`},
		{"user:<ctx:user>", json(""), keyfunc.ErrMissing, `the request has no "user" value (one the server derives from the request, such as its signed-in user)`},
		{"sku:<json:sku>", json(`{"sku":`), keyfunc.ErrBadValue, `the request body is not valid JSON`},
		{"sku:<json:sku>", json(`["secret"]`), keyfunc.ErrBadValue, `the request body is an array, not a JSON object`},
		{"sku:<json:sku>", json(`{"sku":{"a":"secret"}}`), keyfunc.ErrBadValue,
			`the JSON body field "sku" is an object, not a string, number or boolean`},
		{"sku:<json:order.sku>", json(`{"order":"secret"}`), keyfunc.ErrBadValue,
			`the JSON body field "order.sku": a parent of the field is a string, not an object`},
		{"sku:<form:sku>", form("sku=%zz"), keyfunc.ErrBadValue, `the request body is not a valid urlencoded form`},
		{"sku:<form:sku>", httptest.NewRequest(http.MethodPost, "/", strings.NewReader("sku=b")), keyfunc.ErrBadValue,
			`the request body is not a form: missing or invalid Content-Type`},
		{"sku:<form:sku>", func() *http.Request { r := form("sku=b"); r.URL.RawQuery = "sku=a"; return r }(), keyfunc.ErrBadValue,
			`the form field "sku" is also in the URL query, with another value`},
	} {
		t.Run(tc.want, func(t *testing.T) {
			tmpl := keyfunc.MustParse(tc.template)
			_, err := tmpl.Key(keyfunc.HTTPRequest(tc.req))
			if !errors.Is(err, tc.sentinel) {
				t.Fatalf("Key err = %v, want %v", err, tc.sentinel)
			}
			if got := keyfunc.RequestDetail(err); got != tc.want {
				t.Fatalf("RequestDetail = %q, want %q (Error: %q)", got, tc.want, err)
			}
		})
	}
}

// TestRequestDetailOfKeys: the errors of a [*] template name the array and
// the element in the client's words.
func TestRequestDetailOfKeys(t *testing.T) {
	tmpl := keyfunc.MustParse("sku:<json:items[*].sku>", keyfunc.WithMaxKeys(2))
	for _, tc := range []struct {
		body     string
		sentinel error
		want     string
	}{
		{`{}`, keyfunc.ErrMissing, `the JSON body has no array "items"`},
		{`{"items":[]}`, keyfunc.ErrMissing, `the JSON body array "items" is empty`},
		{`{"items":[{"sku":"a"},{"qty":1}]}`, keyfunc.ErrMissing, `the JSON body field "items[1].sku" is missing or empty`},
		{`{"items":[{"sku":[1]}]}`, keyfunc.ErrBadValue, `the JSON body field "items[0].sku" is an array, not a string, number or boolean`},
		{`{"items":{"sku":"a"}}`, keyfunc.ErrBadValue, `the JSON body field "items" is an object, not an array`},
		{`{"items":[{"sku":"a"},{"sku":"b"},{"sku":"c"}]}`, keyfunc.ErrTooManyKeys, `the JSON body array "items" has more than 2 elements`},
	} {
		t.Run(tc.want, func(t *testing.T) {
			_, err := tmpl.Keys(keyfunc.HTTPRequest(httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tc.body))))
			if !errors.Is(err, tc.sentinel) {
				t.Fatalf("Keys err = %v, want %v", err, tc.sentinel)
			}
			if got := keyfunc.RequestDetail(err); got != tc.want {
				t.Fatalf("RequestDetail = %q, want %q (Error: %q)", got, tc.want, err)
			}
		})
	}
	if got := keyfunc.RequestDetail(errors.New("other")); got != "" {
		t.Fatalf("RequestDetail of another error = %q, want empty", got)
	}
}
