package keyfunc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// fakeRequest is a Request with path and context values from maps.
type fakeRequest struct {
	hr   *http.Request
	path map[string]string
	ctx  map[string]any
}

func (f fakeRequest) HTTPRequest() *http.Request   { return f.hr }
func (f fakeRequest) PathValue(name string) string { return f.path[name] }
func (f fakeRequest) ContextValue(name string) (any, bool) {
	v, ok := f.ctx[name]
	return v, ok
}

func newRequest(target string, header http.Header, body string) *http.Request {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r := httptest.NewRequest(http.MethodPost, target, rd)
	for k, vs := range header {
		r.Header[k] = vs
	}
	return r
}

func TestKeySources(t *testing.T) {
	jsonHeader := http.Header{"Content-Type": {"application/json"}}
	formHeader := http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}
	tests := []struct {
		name     string
		template string
		req      fakeRequest
		want     string
	}{
		{"literal only", "global", fakeRequest{}, "global"},
		{"path", "sku:<id>", fakeRequest{path: map[string]string{"id": "42"}}, "sku:42"},
		{"path explicit", "sku:<path:id>", fakeRequest{path: map[string]string{"id": "42"}}, "sku:42"},
		{"query first value", "c:<query:cart>", fakeRequest{hr: newRequest("/?cart=a1&cart=b2", nil, "")}, "c:a1"},
		{"query decoded then escaped", "c:<query:cart>", fakeRequest{hr: newRequest("/?cart=a+b%2Fc", nil, "")}, "c:a%20b%2Fc"},
		{"two queries", "c:<query:a>:<query:b>", fakeRequest{hr: newRequest("/?a=1&b=2", nil, "")}, "c:1:2"},
		{"header", "t:<header:x-tenant>", fakeRequest{hr: newRequest("/", http.Header{"X-Tenant": {"acme", "other"}}, "")}, "t:acme"},
		{"json", "j:<json:sku>", fakeRequest{hr: newRequest("/", jsonHeader, `{"sku":"A-1"}`)}, "j:A%2D1"},
		{"form", "f:<form:sku>", fakeRequest{hr: newRequest("/", formHeader, `sku=A-1&sku=B`)}, "f:A%2D1"},
		{"ctx", "u:<ctx:user>", fakeRequest{ctx: map[string]any{"user": "u7"}}, "u:u7"},
		{"hash tag literal", "\\{stock}:<id>", fakeRequest{path: map[string]string{"id": "9"}}, "{stock}:9"},
		{"all sources", "<id>:<query:q>:<header:h>:<json:a.b>:<ctx:c>", fakeRequest{
			hr:   newRequest("/?q=2", http.Header{"H": {"3"}, "Content-Type": {"application/json"}}, `{"a":{"b":4}}`),
			path: map[string]string{"id": "1"},
			ctx:  map[string]any{"c": 5},
		}, "1:2:3:4:5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := MustParse(tt.template).Key(tt.req)
			if err != nil {
				t.Fatalf("Key: %v", err)
			}
			if got != tt.want {
				t.Errorf("Key = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestKeyMissing(t *testing.T) {
	tests := []struct {
		template string
		req      Request
		want     string
	}{
		{"sku:<id>", fakeRequest{}, "keyfunc: key value missing: <id>"},
		{"sku:<path:id>", fakeRequest{path: map[string]string{"id": ""}}, "keyfunc: key value missing: <path:id>"},
		{"sku:<id>", nil, "keyfunc: key value missing: <id>"},
		{"c:<query:cart>", fakeRequest{hr: newRequest("/?other=1", nil, "")}, "keyfunc: key value missing: <query:cart>"},
		{"c:<query:cart>", fakeRequest{hr: newRequest("/?cart=", nil, "")}, "keyfunc: key value missing: <query:cart>"},
		{"c:<query:cart>", fakeRequest{}, "keyfunc: key value missing: <query:cart>"},
		{"c:<query:cart>", fakeRequest{hr: &http.Request{}}, "keyfunc: key value missing: <query:cart>"},
		{"t:<header:X-Tenant>", fakeRequest{hr: newRequest("/", nil, "")}, "keyfunc: key value missing: <header:X-Tenant>"},
		{"t:<header:X-Tenant>", fakeRequest{hr: newRequest("/", http.Header{"X-Tenant": {""}}, "")}, "keyfunc: key value missing: <header:X-Tenant>"},
		{"t:<header:X-Tenant>", fakeRequest{hr: &http.Request{}}, "keyfunc: key value missing: <header:X-Tenant>"},
		{"j:<json:sku>", fakeRequest{hr: newRequest("/", nil, `{"other":1}`)}, "keyfunc: key value missing: <json:sku>"},
		{"j:<json:sku>", fakeRequest{hr: newRequest("/", nil, `{"sku":""}`)}, "keyfunc: key value missing: <json:sku>"},
		{"j:<json:a.sku>", fakeRequest{hr: newRequest("/", nil, `{"a":{}}`)}, "keyfunc: key value missing: <json:a.sku>"},
		{"j:<json:a.sku>", fakeRequest{hr: newRequest("/", nil, `{"b":{"sku":1}}`)}, "keyfunc: key value missing: <json:a.sku>"},
		{"j:<json:sku>", fakeRequest{hr: newRequest("/", nil, "")}, "keyfunc: key value missing: <json:sku>"},
		{"j:<json:sku>", fakeRequest{hr: &http.Request{Body: http.NoBody}}, "keyfunc: key value missing: <json:sku>"},
		{"j:<json:sku>", fakeRequest{}, "keyfunc: key value missing: <json:sku>"},
		{"f:<form:sku>", fakeRequest{hr: newRequest("/", http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, "a=1")}, "keyfunc: key value missing: <form:sku>"},
		{"f:<form:sku>", fakeRequest{hr: newRequest("/", http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, "sku=")}, "keyfunc: key value missing: <form:sku>"},
		{"f:<form:sku>", fakeRequest{hr: newRequest("/?sku=1", nil, "")}, "keyfunc: key value missing: <form:sku>"},
		{"u:<ctx:user>", fakeRequest{}, "keyfunc: key value missing: <ctx:user>"},
		{"u:<ctx:user>", fakeRequest{ctx: map[string]any{"user": ""}}, "keyfunc: key value missing: <ctx:user>"},
		{"u:<ctx:user>", fakeRequest{ctx: map[string]any{"user": nil}}, "keyfunc: key value missing: <ctx:user>"},
		{"u:<ctx:user>", fakeRequest{ctx: map[string]any{"user": (*stringer)(nil)}}, "keyfunc: key value missing: <ctx:user>"},
		{"u:<ctx:user>", fakeRequest{ctx: map[string]any{"user": []byte{}}}, "keyfunc: key value missing: <ctx:user>"},
		{"<id>:<query:q>", fakeRequest{path: map[string]string{"id": "1"}}, "keyfunc: key value missing: <query:q>"},
	}
	for _, tt := range tests {
		t.Run(tt.template, func(t *testing.T) {
			got, err := MustParse(tt.template).Key(tt.req)
			if !errors.Is(err, ErrMissing) {
				t.Fatalf("Key = %q, %v; want ErrMissing", got, err)
			}
			if got != "" {
				t.Errorf("Key returned %q with an error", got)
			}
			if err.Error() != tt.want {
				t.Errorf("error = %q, want %q", err, tt.want)
			}
		})
	}
}

func TestKeyEscaping(t *testing.T) {
	tests := []struct{ value, want string }{
		{"AZaz09", "AZaz09"},
		{"A-1", "A%2D1"},
		{"-._~", "%2D%2E%5F%7E"},
		{"a:b", "a%3Ab"},
		{"a/b", "a%2Fb"},
		{"{tag}", "%7Btag%7D"},
		{"a b", "a%20b"},
		{"100%", "100%25"},
		{"#1", "%231"},
		{"é", "%C3%A9"},
		{"\x00\xff", "%00%FF"},
		{"a\r\nb", "a%0D%0Ab"},
		{"<>\"'*", "%3C%3E%22%27%2A"},
	}
	tmpl := MustParse("k:<x>")
	for _, tt := range tests {
		got, err := tmpl.Key(fakeRequest{path: map[string]string{"x": tt.value}})
		if err != nil {
			t.Fatalf("Key(%q): %v", tt.value, err)
		}
		if got != "k:"+tt.want {
			t.Errorf("Key(%q) = %q, want %q", tt.value, got, "k:"+tt.want)
		}
	}
}

func TestKeyHashing(t *testing.T) {
	hash := func(v string) string {
		sum := sha256.Sum256([]byte(v))
		return "#" + hex.EncodeToString(sum[:16])
	}
	tests := []struct {
		name   string
		value  string
		maxLen int
		want   string
	}{
		{"64 bytes kept", strings.Repeat("a", 64), DefaultMaxValueLen, strings.Repeat("a", 64)},
		{"65 bytes hashed", strings.Repeat("a", 65), DefaultMaxValueLen, hash(strings.Repeat("a", 65))},
		{"escaped to 64 kept", strings.Repeat("a", 61) + ":", DefaultMaxValueLen, strings.Repeat("a", 61) + "%3A"},
		{"escaped to 65 hashed", strings.Repeat("a", 62) + ":", DefaultMaxValueLen, hash(strings.Repeat("a", 62) + ":")},
		{"22 escaped bytes hashed", strings.Repeat("é", 11), DefaultMaxValueLen, hash(strings.Repeat("é", 11))},
		{"custom limit kept", strings.Repeat("b", 16), 16, strings.Repeat("b", 16)},
		{"custom limit hashed", strings.Repeat("b", 17), 16, hash(strings.Repeat("b", 17))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl := MustParse("k:<x>:end", WithMaxValueLen(tt.maxLen))
			got, err := tmpl.Key(fakeRequest{path: map[string]string{"x": tt.value}})
			if err != nil {
				t.Fatal(err)
			}
			if want := "k:" + tt.want + ":end"; got != want {
				t.Errorf("Key = %q, want %q", got, want)
			}
		})
	}
}

func TestKeyCannotBeForged(t *testing.T) {
	tmpl := MustParse("a:<x>:<y>")
	key := func(x, y string) string {
		k, err := tmpl.Key(fakeRequest{path: map[string]string{"x": x, "y": y}})
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	pairs := [][2]string{{"1:2", "3"}, {"1", "2:3"}, {"1%3A2", "3"}, {"1", "2%3A3"}}
	seen := map[string][2]string{}
	for _, p := range pairs {
		k := key(p[0], p[1])
		if prev, ok := seen[k]; ok {
			t.Errorf("pairs %q and %q both give key %q", prev, p, k)
		}
		seen[k] = p
		if strings.Count(k, ":") != 2 {
			t.Errorf("key %q for %q has extra separators", k, p)
		}
	}
	if k := key("{x}", "y"); strings.ContainsAny(k, "{}") {
		t.Errorf("request value introduced a hash tag: %q", k)
	}
}

// TestForgeryRegressions holds the collisions a review found when '-', '.',
// '_' and '~' stayed unescaped and a placeholder could touch a letter, a
// digit, '%' or '#': each pair now renders two keys, or its template is
// rejected.
func TestForgeryRegressions(t *testing.T) {
	key := func(template string, path map[string]string) string {
		t.Helper()
		k, err := MustParse(template).Key(fakeRequest{path: path})
		if err != nil {
			t.Fatalf("%s: Key: %v", template, err)
		}
		return k
	}
	hashed := key("k:<x>", map[string]string{"x": strings.Repeat("x", 65)})
	tests := []struct {
		name         string
		template1    string
		path1        map[string]string
		template2    string
		path2        map[string]string
		want1, want2 string
	}{
		{"separator in one value", "<a>-<b>", map[string]string{"a": "x-y", "b": "z"},
			"<a>-<b>", map[string]string{"a": "x", "b": "y-z"}, "x%2Dy-z", "x-y%2Dz"},
		{"separator across templates", "order.<id>", map[string]string{"id": "a.lines"},
			"order.<id>.lines", map[string]string{"id": "a"}, "order.a%2Elines", "order.a.lines"},
		{"underscore and tilde", "k:<a>_<b>~", map[string]string{"a": "x_y", "b": "z~"},
			"k:<a>_<b>~", map[string]string{"a": "x", "b": "y_z~"}, "k:x%5Fy_z%7E~", "k:x_y%5Fz%7E~"},
		{"percent", "k:<x>", map[string]string{"x": "a b"},
			"k:<x>:%20b", map[string]string{"x": "a"}, "k:a%20b", "k:a:%20b"},
		{"hash", "k:<x>", map[string]string{"x": strings.Repeat("x", 65)},
			"k:<x>", map[string]string{"x": hashed[2:]}, hashed, "k:%23" + hashed[3:]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k1, k2 := key(tt.template1, tt.path1), key(tt.template2, tt.path2)
			if k1 != tt.want1 || k2 != tt.want2 {
				t.Errorf("keys %q and %q, want %q and %q", k1, k2, tt.want1, tt.want2)
			}
			if k1 == k2 {
				t.Errorf("%s with %q and %s with %q both render %q", tt.template1, tt.path1, tt.template2, tt.path2, k1)
			}
		})
	}
	// Templates whose placeholder touches a byte a value can contain are
	// rejected: the reviewer's a<x>b<y> (x=1b2 y=3 vs x=1 y=2b3), k:<x>%20b
	// (x=a vs k:<x> with x="a b"), and k:#<x>, whose x could spell the hex of
	// k:<x>'s hashed value.
	for _, template := range []string{"a<x>b<y>", "<query:a>x<query:b>", "k:<x>%20b", "k:#<x>", "k:<x>#1", "sku<id>", "<id>9"} {
		if _, err := Parse(template); !errors.Is(err, ErrSyntax) {
			t.Errorf("Parse(%q) error = %v, want ErrSyntax", template, err)
		}
	}
}

func TestKeyJSON(t *testing.T) {
	tests := []struct {
		name     string
		template string
		body     string
		want     string // key, or error text when wantErr is set
		wantErr  error
	}{
		{"string", "j:<json:sku>", `{"sku":"A 1"}`, "j:A%201", nil},
		{"nested", "j:<json:order.item.sku>", `{"order":{"item":{"sku":"X"}}}`, "j:X", nil},
		{"integer", "j:<json:n>", `{"n":42}`, "j:42", nil},
		{"number literal text", "j:<json:n>", `{"n":1.50e3}`, "j:1%2E50e3", nil},
		{"negative", "j:<json:n>", `{"n":-7}`, "j:%2D7", nil},
		{"big number kept exact", "j:<json:n>", `{"n":12345678901234567890}`, "j:12345678901234567890", nil},
		{"true", "j:<json:b>", `{"b":true}`, "j:true", nil},
		{"false", "j:<json:b>", `{"b":false}`, "j:false", nil},
		{"two fields one decode", "j:<json:a>:<json:b.c>", `{"a":"1","b":{"c":2}}`, "j:1:2", nil},
		{"whitespace around", "j:<json:a>", " \n{\"a\":\"1\"}\n ", "j:1", nil},
		{"unicode escape", "j:<json:a>", `{"a":"\u00e9"}`, "j:%C3%A9", nil},
		{"null", "j:<json:sku>", `{"sku":null}`, "keyfunc: key value unusable: <json:sku>: value is null", ErrBadValue},
		{"object", "j:<json:sku>", `{"sku":{"a":1}}`, "keyfunc: key value unusable: <json:sku>: value is an object", ErrBadValue},
		{"array", "j:<json:sku>", `{"sku":[1]}`, "keyfunc: key value unusable: <json:sku>: value is an array", ErrBadValue},
		{"parent not object", "j:<json:a.b>", `{"a":"secret"}`, "keyfunc: key value unusable: <json:a.b>: a parent of the field is a string, not an object", ErrBadValue},
		{"case variant", "j:<json:sku>", `{"sku":"a","SKU":"b"}`, "keyfunc: key value unusable: <json:sku>: a field name in the body differs from it only in case", ErrBadValue},
		{"case variant parent", "j:<json:o.sku>", `{"O":{"sku":"b"},"o":{"sku":"a"}}`, "keyfunc: key value unusable: <json:o.sku>: a field name in the body differs from it only in case", ErrBadValue},
		{"unicode case variant", "j:<json:key>", `{"key":"a","\u212aey":"b"}`, "keyfunc: key value unusable: <json:key>: a field name in the body differs from it only in case", ErrBadValue},
		{"only other case", "j:<json:sku>", `{"Sku":"b"}`, "keyfunc: key value unusable: <json:sku>: a field name in the body differs from it only in case", ErrBadValue},
		{"exact duplicate last wins", "j:<json:sku>", `{"sku":"a","sku":"b"}`, "j:b", nil},
		{"parent number", "j:<json:a.b>", `{"a":1}`, "keyfunc: key value unusable: <json:a.b>: a parent of the field is a number, not an object", ErrBadValue},
		{"parent bool", "j:<json:a.b>", `{"a":true}`, "keyfunc: key value unusable: <json:a.b>: a parent of the field is a boolean, not an object", ErrBadValue},
		{"parent null", "j:<json:a.b>", `{"a":null}`, "keyfunc: key value unusable: <json:a.b>: a parent of the field is null, not an object", ErrBadValue},
		{"array body", "j:<json:sku>", `[{"sku":"1"}]`, "keyfunc: key value unusable: <json:sku>: body is an array, not a JSON object", ErrBadValue},
		{"string body", "j:<json:sku>", `"secret"`, "keyfunc: key value unusable: <json:sku>: body is a string, not a JSON object", ErrBadValue},
		{"null body", "j:<json:sku>", `null`, "keyfunc: key value unusable: <json:sku>: body is null, not a JSON object", ErrBadValue},
		{"invalid JSON", "j:<json:sku>", `{"sku":secret}`, "keyfunc: key value unusable: <json:sku>: body is not valid JSON", ErrBadValue},
		{"truncated", "j:<json:sku>", `{"sku":"1"`, "keyfunc: key value unusable: <json:sku>: body is not valid JSON", ErrBadValue},
		{"trailing data", "j:<json:sku>", `{"sku":"1"} {"sku":"2"}`, "keyfunc: key value unusable: <json:sku>: body is not valid JSON: data after the top-level value", ErrBadValue},
		{"whitespace body", "j:<json:sku>", "  ", "keyfunc: key value unusable: <json:sku>: body is not valid JSON", ErrBadValue},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRequest("/", http.Header{"Content-Type": {"application/json"}}, tt.body)
			got, err := MustParse(tt.template).Key(HTTPRequest(r))
			if tt.wantErr == nil {
				if err != nil || got != tt.want {
					t.Fatalf("Key = %q, %v; want %q", got, err, tt.want)
				}
			} else {
				if !errors.Is(err, tt.wantErr) || err.Error() != tt.want {
					t.Fatalf("Key = %q, %v; want error %q", got, err, tt.want)
				}
				if strings.Contains(err.Error(), "secret") {
					t.Errorf("error %q quotes the request", err)
				}
			}
			assertBody(t, r, tt.body)
		})
	}
}

func TestKeyBodyLimit(t *testing.T) {
	const limit = 64
	tmpl := MustParse("j:<json:a>", WithMaxBodyBytes(limit))
	exact := `{"a":"` + strings.Repeat("x", limit-8) + `"}`
	if len(exact) != limit {
		t.Fatalf("test body is %d bytes", len(exact))
	}
	t.Run("exactly MaxBodyBytes", func(t *testing.T) {
		r := newRequest("/", nil, exact)
		if _, err := tmpl.Key(HTTPRequest(r)); err != nil {
			t.Fatalf("Key: %v", err)
		}
		assertBody(t, r, exact)
	})
	t.Run("unknown length", func(t *testing.T) {
		r := newRequest("/", nil, exact)
		r.ContentLength = -1
		if _, err := tmpl.Key(HTTPRequest(r)); err != nil {
			t.Fatalf("Key: %v", err)
		}
		assertBody(t, r, exact)
	})
	for _, tt := range []struct {
		name string
		body string
		cl   int64
	}{
		{"one byte over", exact + " ", limit + 1},
		{"far over", exact + strings.Repeat(" ", 10*limit), -1},
		{"content length lies", exact + " ", 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRequest("/", nil, tt.body)
			r.ContentLength = tt.cl
			_, err := tmpl.Key(HTTPRequest(r))
			want := fmt.Sprintf("keyfunc: request body too large: <json:a>: over %d bytes", limit)
			if !errors.Is(err, ErrBodyTooLarge) || err.Error() != want {
				t.Fatalf("Key error = %v, want %q", err, want)
			}
			assertBody(t, r, tt.body) // the stream stays whole
		})
	}
	t.Run("MaxBytesReader", func(t *testing.T) {
		r := newRequest("/", nil, exact)
		r.Body = http.MaxBytesReader(httptest.NewRecorder(), r.Body, 10)
		if _, err := tmpl.Key(HTTPRequest(r)); !errors.Is(err, ErrBodyTooLarge) {
			t.Fatalf("Key error = %v, want ErrBodyTooLarge", err)
		}
	})
	t.Run("read error", func(t *testing.T) {
		r := newRequest("/", nil, "")
		r.Body = io.NopCloser(io.MultiReader(strings.NewReader(`{"a"`), errReader{io.ErrUnexpectedEOF}))
		_, err := tmpl.Key(HTTPRequest(r))
		if !errors.Is(err, ErrBadValue) || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("Key error = %v, want ErrBadValue wrapping io.ErrUnexpectedEOF", err)
		}
	})
	t.Run("max int64", func(t *testing.T) {
		r := newRequest("/", nil, `{"a":"1"}`)
		got, err := MustParse("j:<json:a>", WithMaxBodyBytes(math.MaxInt64)).Key(HTTPRequest(r))
		if err != nil || got != "j:1" {
			t.Fatalf("Key = %q, %v", got, err)
		}
	})
}

func TestKeyBodyRestored(t *testing.T) {
	body := `{"sku":"A1","qty":2}`
	r := newRequest("/", nil, body)
	orig := &closeRecorder{ReadCloser: r.Body}
	r.Body = orig
	tmpl := MustParse("j:<json:sku>")
	for i := range 2 { // a second Key call reads the restored body
		got, err := tmpl.Key(HTTPRequest(r))
		if err != nil || got != "j:A1" {
			t.Fatalf("call %d: Key = %q, %v", i, got, err)
		}
	}
	if !orig.closed {
		t.Error("the original body was not closed")
	}
	assertBody(t, r, body)
	if r.GetBody == nil {
		t.Fatal("GetBody not set")
	}
	for range 2 {
		rc, err := r.GetBody()
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := io.ReadAll(rc); string(b) != body {
			t.Errorf("GetBody read %q, want %q", b, body)
		}
	}
}

func TestKeyForm(t *testing.T) {
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	_ = mw.WriteField("sku", "A 1")
	_ = mw.WriteField("sku", "B")
	fw, _ := mw.CreateFormFile("file", "f.txt")
	_, _ = fw.Write([]byte("file content"))
	_ = mw.Close()
	multipartType := mw.FormDataContentType()

	tests := []struct {
		name        string
		template    string
		contentType string
		body        string
		want        string
		wantErr     error
	}{
		{"urlencoded", "f:<form:sku>", "application/x-www-form-urlencoded", "sku=A+1&sku=B&x=2", "f:A%201", nil},
		{"same value in query", "f:<form:sku>", "application/x-www-form-urlencoded", "sku=A", "f:A", nil},
		{"other value in query", "f:<form:sku>", "application/x-www-form-urlencoded", "sku=B", "keyfunc: key value unusable: <form:sku>: the field is also in the URL query, with another value", ErrBadValue},
		{"multipart other value in query", "f:<form:sku>", multipartType, mp.String(), "keyfunc: key value unusable: <form:sku>: the field is also in the URL query, with another value", ErrBadValue},
		{"urlencoded with charset", "f:<form:sku>:<form:x>", "application/x-www-form-urlencoded; charset=utf-8", "sku=A&x=2", "f:A:2", nil},
		{"multipart", "f:<form:sku>", multipartType, mp.String(), "f:A%201", nil},
		{"multipart file is no value", "f:<form:file>", multipartType, mp.String(), "keyfunc: key value missing: <form:file>", ErrMissing},
		{"invalid urlencoded", "f:<form:sku>", "application/x-www-form-urlencoded", "sku=%zz", "keyfunc: key value unusable: <form:sku>: body is not a valid urlencoded form", ErrBadValue},
		{"semicolon", "f:<form:sku>", "application/x-www-form-urlencoded", "sku=1;x=2", "keyfunc: key value unusable: <form:sku>: body is not a valid urlencoded form", ErrBadValue},
		{"invalid multipart", "f:<form:sku>", multipartType, "not multipart", "keyfunc: key value unusable: <form:sku>: body is not a valid multipart form", ErrBadValue},
		{"no boundary", "f:<form:sku>", "multipart/form-data", mp.String(), "keyfunc: key value unusable: <form:sku>: body is not a form: multipart Content-Type without boundary", ErrBadValue},
		{"json content type", "f:<form:sku>", "application/json", `{"sku":"1"}`, "keyfunc: key value unusable: <form:sku>: body is not a form: Content-Type is neither urlencoded nor multipart", ErrBadValue},
		{"no content type", "f:<form:sku>", "", "sku=1", "keyfunc: key value unusable: <form:sku>: body is not a form: missing or invalid Content-Type", ErrBadValue},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRequest("/?sku=A", http.Header{"Content-Type": {tt.contentType}}, tt.body)
			if !strings.Contains(tt.name, "query") {
				r.URL.RawQuery = "other=1"
			}
			got, err := MustParse(tt.template).Key(HTTPRequest(r))
			if tt.wantErr == nil {
				if err != nil || got != tt.want {
					t.Fatalf("Key = %q, %v; want %q", got, err, tt.want)
				}
			} else if !errors.Is(err, tt.wantErr) || err.Error() != tt.want {
				t.Fatalf("Key = %q, %v; want error %q", got, err, tt.want)
			}
			assertBody(t, r, tt.body)
		})
	}
	t.Run("handler parses the form after Key", func(t *testing.T) {
		r := newRequest("/", http.Header{"Content-Type": {multipartType}}, mp.String())
		if _, err := MustParse("f:<form:sku>").Key(HTTPRequest(r)); err != nil {
			t.Fatal(err)
		}
		if err := r.ParseMultipartForm(1 << 20); err != nil {
			t.Fatal(err)
		}
		if got := r.FormValue("sku"); got != "A 1" {
			t.Errorf("handler FormValue = %q, want %q", got, "A 1")
		}
	})
}

type stringer struct{ s string }

func (s *stringer) String() string { return s.s }

type (
	userID   int64
	shard    uint8
	name     string
	flag     bool
	rawBytes []byte
)

func TestKeyContext(t *testing.T) {
	tests := []struct {
		name  string
		value any
		want  string
	}{
		{"string", "acme", "acme"},
		{"bytes", []byte("a:b"), "a%3Ab"},
		{"stringer", &stringer{"s1"}, "s1"},
		{"duration stringer", 1500 * time.Millisecond, "1%2E5s"},
		{"int", -3, "%2D3"},
		{"int8", int8(-8), "%2D8"},
		{"int16", int16(16), "16"},
		{"int32", int32(32), "32"},
		{"int64", int64(math.MaxInt64), "9223372036854775807"},
		{"uint", uint(1), "1"},
		{"uint8", uint8(255), "255"},
		{"uint16", uint16(16), "16"},
		{"uint32", uint32(32), "32"},
		{"uint64", uint64(math.MaxUint64), "18446744073709551615"},
		{"uintptr", uintptr(7), "7"},
		{"true", true, "true"},
		{"false", false, "false"},
		{"named int", userID(99), "99"},
		{"named uint", shard(3), "3"},
		{"named string", name("n"), "n"},
		{"named bool", flag(true), "true"},
		{"named bytes", rawBytes("rb"), "rb"},
		{"zero int", 0, "0"},
	}
	tmpl := MustParse("u:<ctx:v>")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tmpl.Key(fakeRequest{ctx: map[string]any{"v": tt.value}})
			if err != nil || got != "u:"+tt.want {
				t.Fatalf("Key = %q, %v; want %q", got, err, "u:"+tt.want)
			}
		})
	}
	for _, v := range []any{1.5, float32(1), struct{}{}, []string{"a"}, map[string]int{}, &struct{}{}, complex(1, 1), make(chan int)} {
		t.Run(fmt.Sprintf("unsupported %T", v), func(t *testing.T) {
			_, err := tmpl.Key(fakeRequest{ctx: map[string]any{"v": v}})
			want := fmt.Sprintf("keyfunc: key value unusable: <ctx:v>: context value of unsupported type %T", v)
			if !errors.Is(err, ErrBadValue) || err.Error() != want {
				t.Fatalf("Key error = %v, want %q", err, want)
			}
		})
	}
}

func TestHTTPRequestAdapter(t *testing.T) {
	tmpl := MustParse("sku:<id>:<ctx:tenant>:<json:qty>:<query:w>:<header:X-Shop>")
	var gotKey, gotBody string
	var gotErr error
	mux := http.NewServeMux()
	mux.HandleFunc("POST /skus/{id}", func(w http.ResponseWriter, r *http.Request) {
		gotKey, gotErr = tmpl.Key(HTTPRequest(r))
		b, _ := io.ReadAll(r.Body)
		gotBody = string(b)
	})
	tenant := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx := context.WithValue(r.Context(), ContextKey("tenant"), "acme")
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
	srv := httptest.NewServer(tenant(mux))
	defer srv.Close()

	body := `{"qty":3}`
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/skus/A%2F1?w=eu", strings.NewReader(body))
	req.Header.Set("X-Shop", "s1")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if gotErr != nil {
		t.Fatalf("Key: %v", gotErr)
	}
	if want := "sku:A%2F1:acme:3:eu:s1"; gotKey != want {
		t.Errorf("Key = %q, want %q", gotKey, want)
	}
	if gotBody != body {
		t.Errorf("handler read %q, want %q", gotBody, body)
	}

	a := HTTPRequest(nil)
	if a.HTTPRequest() != nil || a.PathValue("id") != "" {
		t.Error("nil adapter returns values")
	}
	if v, ok := a.ContextValue("tenant"); ok || v != nil {
		t.Error("nil adapter returns a context value")
	}
	if _, err := tmpl.Key(a); !errors.Is(err, ErrMissing) {
		t.Errorf("Key(HTTPRequest(nil)) error = %v, want ErrMissing", err)
	}
}

func TestKeyConcurrent(t *testing.T) {
	tmpl := MustParse("j:<id>:<json:a>")
	done := make(chan error)
	for i := range 8 {
		go func() {
			for j := range 50 {
				r := newRequest("/", nil, fmt.Sprintf(`{"a":%d}`, j))
				got, err := tmpl.Key(fakeRequest{hr: r, path: map[string]string{"id": fmt.Sprint(i)}})
				if want := fmt.Sprintf("j:%d:%d", i, j); err != nil || got != want {
					done <- fmt.Errorf("Key = %q, %v; want %q", got, err, want)
					return
				}
			}
			done <- nil
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// assertBody checks that r.Body still yields want.
func assertBody(t *testing.T, r *http.Request, want string) {
	t.Helper()
	if r.Body == nil {
		if want != "" {
			t.Errorf("body is nil, want %q", want)
		}
		return
	}
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatalf("reading restored body: %v", err)
	}
	if string(b) != want {
		t.Errorf("restored body = %q, want %q", b, want)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

type closeRecorder struct {
	io.ReadCloser
	closed bool
}

func (c *closeRecorder) Close() error {
	c.closed = true
	return c.ReadCloser.Close()
}
