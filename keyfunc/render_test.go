package keyfunc

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// renderBothWays renders tmpl both ways for one value v: from a request
// whose path parameter id and JSON body field "acct" and array "items"
// carry v, and from v itself.
func renderBothWays(t *testing.T, tmpl *Template, v string) (fromRequest, fromValue string, errReq, errVal error) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"acct": v, "items": []map[string]string{{"sku": v}}})
	if err != nil {
		t.Fatal(err)
	}
	r := fakeRequest{hr: newRequest("/", http.Header{"Content-Type": {"application/json"}}, string(body)),
		path: map[string]string{"id": v}}
	if tmpl.Multi() {
		var keys []string
		keys, errReq = tmpl.Keys(r)
		if errReq == nil {
			fromRequest = keys[0]
		}
	} else {
		fromRequest, errReq = tmpl.Key(r)
	}
	fromValue, errVal = tmpl.Render(v)
	return fromRequest, fromValue, errReq, errVal
}

// Render gives the key Key renders for a request carrying the same value,
// whatever the value needs: escaping, hashing, or nothing.
func TestRenderMatchesKey(t *testing.T) {
	templates := []string{"acct:<id>", "acct:<json:acct>", "cart:<json:items[*].sku>"}
	values := []string{"A-1", "a/b", "plain", "100%", "ü", " x ", strings.Repeat("long", 100)}
	for _, src := range templates {
		tmpl := MustParse(src)
		for _, v := range values {
			fromRequest, fromValue, errReq, errVal := renderBothWays(t, tmpl, v)
			if errReq != nil || errVal != nil {
				t.Fatalf("%s with %q: Key %v, Render %v", src, v, errReq, errVal)
			}
			if fromRequest != fromValue {
				t.Errorf("%s with %q: Render %q, want Key's %q", src, v, fromValue, fromRequest)
			}
		}
	}
	// The case of the report: the stored key is escaped, so "acct:"+v is
	// not it, and Render is how a handler finds it.
	if got, _ := MustParse("acct:<json:acct>").Render("A-1"); got != "acct:A%2D1" {
		t.Fatalf("Render(A-1) = %q, want acct:A%%2D1", got)
	}
}

func TestRenderErrors(t *testing.T) {
	two := MustParse("move:<json:from>:<json:to>")
	if k, err := two.Render("A-1", "B-2"); err != nil || k != "move:A%2D1:B%2D2" {
		t.Fatalf("Render of two values: %q, %v", k, err)
	}
	cases := []struct {
		name   string
		tmpl   *Template
		values []string
		want   error
		msg    string
	}{
		{"too few", two, []string{"A"}, ErrBadValue, "has 2 placeholders, Render got 1 values"},
		{"too many", two, []string{"A", "B", "C"}, ErrBadValue, "got 3 values"},
		{"empty", two, []string{"A", ""}, ErrMissing, "<json:to>"},
		{"not parsed", &Template{}, nil, ErrSyntax, "use Parse"},
		{"nil", nil, nil, ErrSyntax, "use Parse"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k, err := c.tmpl.Render(c.values...)
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) || k != "" {
				t.Fatalf("Render(%q) = %q, %v; want an error wrapping %v containing %q", c.values, k, err, c.want, c.msg)
			}
		})
	}
	if _, err := Render("acct:<json", []string{"A"}); !errors.Is(err, ErrSyntax) {
		t.Fatalf("Render of a bad template: %v, want ErrSyntax", err)
	}
	if k, err := Render("acct:<id>", []string{strings.Repeat("A-1", 10)}, WithMaxValueLen(16)); err != nil || !strings.HasPrefix(k, "acct:#") {
		t.Fatalf("Render with a short max value length: %q, %v; want the value hashed", k, err)
	}
}

// FuzzRenderMatchesKey: for any value a request can carry, Render renders
// the key Key does, so a handler always finds its lock's key by value.
func FuzzRenderMatchesKey(f *testing.F) {
	for _, v := range []string{"A-1", "a/b", "%", "\x00", strings.Repeat("x", 200)} {
		f.Add(v)
	}
	tmpl := MustParse("acct:<id>:<json:acct>")
	f.Fuzz(func(t *testing.T, v string) {
		body, err := json.Marshal(map[string]string{"acct": v})
		if err != nil {
			t.Skip() // not a value a JSON body can carry
		}
		var back map[string]string
		if json.Unmarshal(body, &back) != nil || back["acct"] != v {
			t.Skip() // invalid UTF-8: JSON carries another value
		}
		r := fakeRequest{hr: newRequest("/", http.Header{"Content-Type": {"application/json"}}, string(body)),
			path: map[string]string{"id": v}}
		fromRequest, errReq := tmpl.Key(r)
		fromValue, errVal := tmpl.Render(v, v)
		if (errReq == nil) != (errVal == nil) {
			t.Fatalf("value %q: Key error %v, Render error %v", v, errReq, errVal)
		}
		if fromRequest != fromValue {
			t.Fatalf("value %q: Render %q, Key %q", v, fromValue, fromRequest)
		}
	})
}

// TestMaxLenBoundsEveryKey: no value makes a key longer than MaxLen, and
// the longest value that is not hashed reaches it.
func TestMaxLenBoundsEveryKey(t *testing.T) {
	cases := []struct {
		template string
		maxValue int
	}{
		{"sku", 64},
		{"sku:<id>", 64},
		{"acct:<json:from>/<json:to>", 64},
		{"u:<header:X-User>", 16},  // a hash (33 bytes) is longer than the limit
		{"u:<header:X-User>", 200}, // the limit is longer than a hash
	}
	for _, c := range cases {
		tmpl := MustParse(c.template, WithMaxValueLen(c.maxValue))
		holes := strings.Count(c.template, "<")
		longest := 0
		for _, v := range []string{"a", strings.Repeat("x", c.maxValue), strings.Repeat("/", c.maxValue), strings.Repeat("y", 10_000)} {
			values := slices.Repeat([]string{v}, holes)
			key, err := tmpl.Render(values...)
			if err != nil {
				t.Fatalf("%q.Render: %v", c.template, err)
			}
			if len(key) > tmpl.MaxLen() {
				t.Errorf("%q with a %d-byte value renders %d bytes, above MaxLen %d", c.template, len(v), len(key), tmpl.MaxLen())
			}
			longest = max(longest, len(key))
		}
		if longest != tmpl.MaxLen() {
			t.Errorf("%q: the longest key rendered is %d bytes, MaxLen says %d", c.template, longest, tmpl.MaxLen())
		}
	}
}
