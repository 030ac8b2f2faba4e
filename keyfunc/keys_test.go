package keyfunc

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

func TestKeys(t *testing.T) {
	long := strings.Repeat("x", 65)
	sum := sha256.Sum256([]byte(long))
	hashed := "#" + hex.EncodeToString(sum[:16])
	tests := []struct {
		name     string
		template string
		target   string
		body     string
		want     []string
	}{
		{"cart", "sku:<json:items[*].sku>", "/", `{"items":[{"sku":"A","qty":1},{"sku":"B","qty":2}]}`, []string{"sku:A", "sku:B"}},
		{"one element", "sku:<json:items[*].sku>", "/", `{"items":[{"sku":"A"}]}`, []string{"sku:A"}},
		{"array order kept", "sku:<json:items[*].sku>", "/", `{"items":[{"sku":"C"},{"sku":"A"},{"sku":"B"}]}`, []string{"sku:C", "sku:A", "sku:B"}},
		{"duplicates kept", "sku:<json:items[*].sku>", "/", `{"items":[{"sku":"A"},{"sku":"A"}]}`, []string{"sku:A", "sku:A"}},
		{"scalars", "tag:<json:tags[*]>", "/", `{"tags":["x","y-z"]}`, []string{"tag:x", "tag:y%2Dz"}},
		{"numbers", "n:<json:ids[*]>", "/", `{"ids":[1,2.50,-3,12345678901234567890]}`, []string{"n:1", "n:2%2E50", "n:%2D3", "n:12345678901234567890"}},
		{"bools", "b:<json:f[*]>", "/", `{"f":[true,false]}`, []string{"b:true", "b:false"}},
		{"string and number alike", "v:<json:v[*]>", "/", `{"v":["1",1]}`, []string{"v:1", "v:1"}},
		{"number fields", "sku:<json:items[*].id>", "/", `{"items":[{"id":7},{"id":8}]}`, []string{"sku:7", "sku:8"}},
		{"nested objects", "l:<json:order.lines[*].item.sku>", "/", `{"order":{"lines":[{"item":{"sku":"A"}},{"item":{"sku":"B","n":{"x":1}}}]}}`, []string{"l:A", "l:B"}},
		{"escaped like one value", "sku:<json:items[*].sku>", "/", `{"items":[{"sku":"a:b"},{"sku":"a%3Ab"},{"sku":"\u00e9"}]}`, []string{"sku:a%3Ab", "sku:a%253Ab", "sku:%C3%A9"}},
		{"hashed like one value", "sku:<json:items[*].sku>:end", "/", `{"items":[{"sku":"` + long + `"},{"sku":"A"}]}`, []string{"sku:" + hashed + ":end", "sku:A:end"}},
		{"values around", "<query:shop>:sku:<json:items[*].sku>:<json:wh>", "/?shop=s-1", `{"wh":"eu","items":[{"sku":"A"},{"sku":"B"}]}`, []string{"s%2D1:sku:A:eu", "s%2D1:sku:B:eu"}},
		{"hashed value around", "<query:shop>:<json:items[*]>", "/?shop=" + long, `{"items":["A","B"]}`, []string{hashed + ":A", hashed + ":B"}},
		{"hash tag", "\\{stock}:<json:items[*].sku>", "/", `{"items":[{"sku":"A"},{"sku":"B"}]}`, []string{"{stock}:A", "{stock}:B"}},
		{"single json", "sku:<json:sku>", "/", `{"sku":"A"}`, []string{"sku:A"}},
		{"single query", "sku:<query:sku>", "/?sku=A", "", []string{"sku:A"}},
		{"literal only", "global", "/", "", []string{"global"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRequest(tt.target, http.Header{"Content-Type": {"application/json"}}, tt.body)
			got, err := MustParse(tt.template).Keys(HTTPRequest(r))
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Keys = %q, %v; want %q", got, err, tt.want)
			}
			assertBody(t, r, tt.body)
		})
	}
}

func TestKeysErrors(t *testing.T) {
	tests := []struct {
		name     string
		template string
		body     string
		want     string
		wantErr  error
	}{
		{"missing array", "sku:<json:items[*].sku>", `{"other":[]}`, "keyfunc: key value missing: <json:items[*].sku>", ErrMissing},
		{"missing parent", "l:<json:order.lines[*].sku>", `{"x":1}`, "keyfunc: key value missing: <json:order.lines[*].sku>", ErrMissing},
		{"no body", "sku:<json:items[*].sku>", "", "keyfunc: key value missing: <json:items[*].sku>", ErrMissing},
		{"empty array", "sku:<json:items[*].sku>", `{"items":[]}`, "keyfunc: key value missing: <json:items[*].sku>: the array is empty", ErrMissing},
		{"element lacks field", "sku:<json:items[*].sku>", `{"items":[{"sku":"A"},{"qty":2}]}`, "keyfunc: key value missing: <json:items[*].sku>: at items[1]", ErrMissing},
		{"element empty value", "sku:<json:items[*].sku>", `{"items":[{"sku":"A"},{"sku":""}]}`, "keyfunc: key value missing: <json:items[*].sku>: at items[1]", ErrMissing},
		{"empty scalar", "t:<json:tags[*]>", `{"tags":["a",""]}`, "keyfunc: key value missing: <json:tags[*]>: at tags[1]", ErrMissing},
		{"nested element lacks field", "l:<json:order.lines[*].item.sku>", `{"order":{"lines":[{"item":{"sku":"A"}},{"item":{}}]}}`, "keyfunc: key value missing: <json:order.lines[*].item.sku>: at order.lines[1]", ErrMissing},
		{"array null", "sku:<json:items[*].sku>", `{"items":null}`, "keyfunc: key value unusable: <json:items[*].sku>: the value at [*] is null, not an array", ErrBadValue},
		{"array is object", "sku:<json:items[*].sku>", `{"items":{"sku":"A"}}`, "keyfunc: key value unusable: <json:items[*].sku>: the value at [*] is an object, not an array", ErrBadValue},
		{"array is string", "sku:<json:items[*].sku>", `{"items":"secret"}`, "keyfunc: key value unusable: <json:items[*].sku>: the value at [*] is a string, not an array", ErrBadValue},
		{"parent not object", "l:<json:order.lines[*].sku>", `{"order":"secret"}`, "keyfunc: key value unusable: <json:order.lines[*].sku>: a parent of the field is a string, not an object", ErrBadValue},
		{"element not object", "sku:<json:items[*].sku>", `{"items":[{"sku":"A"},"secret"]}`, "keyfunc: key value unusable: <json:items[*].sku>: at items[1]: a parent of the field is a string, not an object", ErrBadValue},
		{"element value null", "sku:<json:items[*].sku>", `{"items":[{"sku":null}]}`, "keyfunc: key value unusable: <json:items[*].sku>: at items[0]: value is null", ErrBadValue},
		{"element value object", "sku:<json:items[*].sku>", `{"items":[{"sku":{"a":"secret"}}]}`, "keyfunc: key value unusable: <json:items[*].sku>: at items[0]: value is an object", ErrBadValue},
		{"scalar is object", "t:<json:tags[*]>", `{"tags":["a",{"b":"secret"}]}`, "keyfunc: key value unusable: <json:tags[*]>: at tags[1]: value is an object", ErrBadValue},
		{"nested array", "t:<json:tags[*]>", `{"tags":[["secret"]]}`, "keyfunc: key value unusable: <json:tags[*]>: at tags[0]: value is an array", ErrBadValue},
		{"case variant of array", "sku:<json:items[*].sku>", `{"items":[{"sku":"A"}],"Items":[{"sku":"B"}]}`, "keyfunc: key value unusable: <json:items[*].sku>: a field name in the body differs from it only in case", ErrBadValue},
		{"case variant in element", "sku:<json:items[*].sku>", `{"items":[{"sku":"A","SKU":"B"}]}`, "keyfunc: key value unusable: <json:items[*].sku>: at items[0]: a field name in the body differs from it only in case", ErrBadValue},
		{"invalid JSON", "sku:<json:items[*].sku>", `{"items":[secret]}`, "keyfunc: key value unusable: <json:items[*].sku>: body is not valid JSON", ErrBadValue},
		{"array body", "sku:<json:items[*].sku>", `[{"sku":"secret"}]`, "keyfunc: key value unusable: <json:items[*].sku>: body is an array, not a JSON object", ErrBadValue},
		{"other placeholder first", "<json:shop>:<json:items[*].sku>", `{"items":[{"sku":"A"}]}`, "keyfunc: key value missing: <json:shop>", ErrMissing},
		{"other placeholder after", "<json:items[*].sku>:<json:shop>", `{"items":[{"sku":"A"}],"shop":null}`, "keyfunc: key value unusable: <json:shop>: value is null", ErrBadValue},
		{"array error first", "<json:items[*].sku>:<json:shop>", `{"items":[]}`, "keyfunc: key value missing: <json:items[*].sku>: the array is empty", ErrMissing},
		{"body too large", "sku:<json:items[*].sku>", `{"items":[{"sku":"A"}],"pad":"` + strings.Repeat("x", 300) + `"}`, "keyfunc: request body too large: <json:items[*].sku>: over 256 bytes", ErrBodyTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRequest("/", http.Header{"Content-Type": {"application/json"}}, tt.body)
			got, err := MustParse(tt.template, WithMaxBodyBytes(256)).Keys(HTTPRequest(r))
			if !errors.Is(err, tt.wantErr) || err.Error() != tt.want {
				t.Fatalf("Keys = %q, %v; want error %q", got, err, tt.want)
			}
			if got != nil {
				t.Errorf("Keys returned %q with an error", got)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error %q quotes the request", err)
			}
			assertBody(t, r, tt.body)
		})
	}
}

func TestKeysTooMany(t *testing.T) {
	cart := func(n int, bad int) string {
		items := make([]map[string]any, n)
		for i := range items {
			items[i] = map[string]any{"sku": fmt.Sprint("s", i), "qty": 1}
			if i == bad {
				delete(items[i], "sku")
			}
		}
		b, _ := json.Marshal(map[string]any{"items": items})
		return string(b)
	}
	tests := []struct {
		name    string
		opts    []Option
		body    string
		wantLen int    // keys, when want is ""
		want    string // error
	}{
		{"max 3 with 3", []Option{WithMaxKeys(3)}, cart(3, -1), 3, ""},
		{"max 3 with 4", []Option{WithMaxKeys(3)}, cart(4, -1), 0, "keyfunc: too many keys: <json:items[*].sku>: the array has more elements than the limit of 3"},
		{"max 1 with 1", []Option{WithMaxKeys(1)}, cart(1, -1), 1, ""},
		{"max 1 with 2", []Option{WithMaxKeys(1)}, cart(2, -1), 0, "keyfunc: too many keys: <json:items[*].sku>: the array has more elements than the limit of 1"},
		{"default with 64", nil, cart(64, -1), 64, ""},
		{"default with 65", nil, cart(65, -1), 0, "keyfunc: too many keys: <json:items[*].sku>: the array has more elements than the limit of 64"},
		// The count is checked before any element is read.
		{"over the cap with a bad element", []Option{WithMaxKeys(3)}, cart(4, 0), 0, "keyfunc: too many keys: <json:items[*].sku>: the array has more elements than the limit of 3"},
		{"big array", nil, cart(10000, -1), 0, "keyfunc: too many keys: <json:items[*].sku>: the array has more elements than the limit of 64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRequest("/", nil, tt.body)
			got, err := MustParse("sku:<json:items[*].sku>", tt.opts...).Keys(HTTPRequest(r))
			if tt.want == "" {
				if err != nil || len(got) != tt.wantLen {
					t.Fatalf("Keys = %d keys, %v; want %d keys", len(got), err, tt.wantLen)
				}
				for i, k := range got {
					if want := fmt.Sprint("sku:s", i); k != want {
						t.Fatalf("key %d = %q, want %q", i, k, want)
					}
				}
			} else if !errors.Is(err, ErrTooManyKeys) || err.Error() != tt.want || got != nil {
				t.Fatalf("Keys = %d keys, %v; want error %q", len(got), err, tt.want)
			}
			assertBody(t, r, tt.body)
		})
	}
}

// TestKeysRenderLikeKey checks that each key of a Multi template is the key
// of the same template without [*] whose field holds that element alone.
func TestKeysRenderLikeKey(t *testing.T) {
	values := []any{"A", "a:b", "a b", "-._~", "%41", "#1", "{tag}", "é", "\u2028", strings.Repeat("x", 64),
		strings.Repeat("x", 65), strings.Repeat(":", 30), json.Number("1.5e3"), json.Number("-0"), true, false}
	multi := MustParse("k:<json:a[*].v>:end")
	single := MustParse("k:<json:v>:end")
	items := make([]map[string]any, len(values))
	for i, v := range values {
		items[i] = map[string]any{"v": v}
	}
	body, err := json.Marshal(map[string]any{"a": items})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := multi.Keys(HTTPRequest(newRequest("/", nil, string(body))))
	if err != nil || len(keys) != len(values) {
		t.Fatalf("Keys = %q, %v", keys, err)
	}
	for i, v := range values {
		b, _ := json.Marshal(map[string]any{"v": v})
		want, err := single.Key(HTTPRequest(newRequest("/", nil, string(b))))
		if err != nil {
			t.Fatal(err)
		}
		if keys[i] != want {
			t.Errorf("element %q: Keys gives %q, Key gives %q", v, keys[i], want)
		}
	}
}

func TestKeyOnMultiTemplate(t *testing.T) {
	body := `{"items":[{"sku":"A"}]}`
	r := newRequest("/", nil, body)
	tmpl := MustParse("sku:<json:items[*].sku>")
	got, err := tmpl.Key(HTTPRequest(r))
	want := `keyfunc: invalid template: "sku:<json:items[*].sku>": a template with [*] yields several keys (use Keys)`
	if !errors.Is(err, ErrSyntax) || err.Error() != want || got != "" {
		t.Fatalf("Key = %q, %v; want error %q", got, err, want)
	}
	assertBody(t, r, body)
}

func TestKeysBodyRestored(t *testing.T) {
	body := `{"shop":"s1","items":[{"sku":"A"},{"sku":"B"}]}`
	r := newRequest("/", nil, body)
	tmpl := MustParse("<json:shop>:<json:items[*].sku>")
	for i := range 2 { // a second call reads the restored body
		got, err := tmpl.Keys(HTTPRequest(r))
		if want := []string{"s1:A", "s1:B"}; err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("call %d: Keys = %q, %v; want %q", i, got, err, want)
		}
	}
	assertBody(t, r, body)
	rc, err := r.GetBody()
	if err != nil {
		t.Fatal(err)
	}
	assertBody(t, &http.Request{Body: rc}, body)
}

func TestKeysConcurrent(t *testing.T) {
	tmpl := MustParse("<id>:<json:items[*]>")
	done := make(chan error)
	for i := range 8 {
		go func() {
			for j := range 50 {
				r := newRequest("/", nil, fmt.Sprintf(`{"items":[%d,"x"]}`, j))
				got, err := tmpl.Keys(fakeRequest{hr: r, path: map[string]string{"id": fmt.Sprint(i)}})
				want := []string{fmt.Sprintf("%d:%d", i, j), fmt.Sprintf("%d:x", i)}
				if err != nil || !reflect.DeepEqual(got, want) {
					done <- fmt.Errorf("Keys = %q, %v; want %q", got, err, want)
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
