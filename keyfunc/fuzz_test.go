package keyfunc

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"sku:<id>", "global", "{stock}:<query:w>:<form:sku>", "o:<header:X-Tenant>:<json:order.id>",
		"u:<ctx:user.id>", "<a>:<b>", "<a><b>", "sku:<id", "sku:id>", "<>", "<:x>", "<body:x>",
		"<json:a..b>", "<json:items[*].sku>", "<1id>", "a b", "ключ:<id>", "<query:é>", "\x00",
		"<header:a:b>", "<<>>", "<a<b>", strings.Repeat("a", 512), strings.Repeat("<a>:", 128),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tmpl, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("Parse(%q) error %v does not wrap ErrSyntax", s, err)
			}
			return
		}
		if tmpl.String() != s {
			t.Fatalf("String() = %q, want %q", tmpl.String(), s)
		}
		if _, err := Parse(tmpl.String()); err != nil {
			t.Fatalf("Parse(String()) of %q: %v", s, err)
		}
		// Rendering any valid template must not panic.
		r := httptest.NewRequest(http.MethodPost, "/?a=1", strings.NewReader(`{"a":"1"}`))
		if _, err := tmpl.Key(fakeRequest{hr: r, path: map[string]string{"a": "1"}}); err != nil &&
			!errors.Is(err, ErrMissing) && !errors.Is(err, ErrBadValue) {
			t.Fatalf("Key: unexpected error %v", err)
		}
	})
}

func FuzzKey(f *testing.F) {
	f.Add("1", "2", "1", "2", false)
	f.Add("1:2", "3", "1", "2:3", false)
	f.Add("1%3A2", "3", "1:2", "3", false)
	f.Add("{tag}", "x", "%7Btag%7D", "x", false)
	f.Add("a b", "é", "a+b", "%C3%A9", false)
	f.Add("日本語", "\x00\xff", "#", "~", false)
	f.Add(strings.Repeat("a", 64), strings.Repeat("a", 65), strings.Repeat("a", 65), strings.Repeat("a", 64), false)
	f.Add(strings.Repeat(":", 40), "y", strings.Repeat("%3A", 40), "y", true)
	f.Add("", "y", "x", "", false)
	f.Fuzz(func(t *testing.T, x1, y1, x2, y2 string, small bool) {
		var opts []Option
		if small {
			opts = append(opts, WithMaxValueLen(16))
		}
		tmpl := MustParse("k:<x>:<y>", opts...)
		key := func(x, y string) string {
			k, err := tmpl.Key(fakeRequest{path: map[string]string{"x": x, "y": y}})
			if x == "" || y == "" {
				if !errors.Is(err, ErrMissing) || k != "" {
					t.Fatalf("Key(%q, %q) = %q, %v; want ErrMissing", x, y, k, err)
				}
				return ""
			}
			if err != nil {
				t.Fatalf("Key(%q, %q): %v", x, y, err)
			}
			parts := strings.Split(k, ":")
			if len(parts) != 3 || parts[0] != "k" {
				t.Fatalf("Key(%q, %q) = %q: not three parts", x, y, k)
			}
			for _, p := range parts[1:] {
				if p == "" {
					t.Fatalf("Key(%q, %q) = %q has an empty part", x, y, k)
				}
				for i := 0; i < len(p); i++ {
					if c := p[i]; !unreserved[c] && c != '%' && c != '#' {
						t.Fatalf("Key(%q, %q) = %q: byte %q in a value", x, y, k, c)
					}
				}
			}
			return k
		}
		k1, k2 := key(x1, y1), key(x2, y2)
		if k1 == "" || k2 == "" {
			return
		}
		if same := x1 == x2 && y1 == y2; same != (k1 == k2) {
			t.Fatalf("(%q, %q) -> %q and (%q, %q) -> %q", x1, y1, k1, x2, y2, k2)
		}
	})
}

// FuzzKeyBody feeds arbitrary bodies to json and form templates: Key must
// not panic, must fail only with a keyfunc sentinel, and must leave the body
// whole for the handler.
func FuzzKeyBody(f *testing.F) {
	f.Add(uint8(0), "application/json", []byte(`{"a":{"b":"1"},"c":2}`))
	f.Add(uint8(0), "application/json", []byte(`{"a":[1,{"b":null}],"c":true}`))
	f.Add(uint8(0), "", []byte(`{"a":{"b":"\u00e9\ud800"}}`))
	f.Add(uint8(0), "", []byte(`{"a":`))
	f.Add(uint8(1), "application/x-www-form-urlencoded", []byte("c=1&a=%zz;x"))
	f.Add(uint8(1), "multipart/form-data; boundary=X", []byte("--X\r\nContent-Disposition: form-data; name=\"c\"\r\n\r\nv\r\n--X--\r\n"))
	f.Add(uint8(1), "multipart/form-data; boundary=X", []byte("--X\r\nContent-Disposition: form-data; name=\"c\"; filename=\"f\"\r\n\r\nv\r\n--X--\r\n"))
	f.Add(uint8(2), "text/plain; charset=\"", bytes.Repeat([]byte("x"), 300))
	templates := []*Template{
		MustParse("j:<json:a.b>:<json:c>", WithMaxBodyBytes(256)),
		MustParse("f:<form:c>:<form:a>", WithMaxBodyBytes(256)),
		MustParse("b:<json:c>:<form:c>", WithMaxBodyBytes(256)),
	}
	f.Fuzz(func(t *testing.T, which uint8, contentType string, body []byte) {
		tmpl := templates[int(which)%len(templates)]
		r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		r.Header.Set("Content-Type", contentType)
		k, err := tmpl.Key(HTTPRequest(r))
		switch {
		case err == nil:
			if k == "" {
				t.Fatal("empty key without an error")
			}
		case errors.Is(err, ErrMissing), errors.Is(err, ErrBadValue), errors.Is(err, ErrBodyTooLarge):
		default:
			t.Fatalf("unexpected error %v", err)
		}
		got, rerr := io.ReadAll(r.Body)
		if rerr != nil || !bytes.Equal(got, body) {
			t.Fatalf("body after Key = %q, %v; want %q", got, rerr, body)
		}
	})
}
