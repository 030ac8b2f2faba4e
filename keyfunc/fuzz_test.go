package keyfunc

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
)

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"sku:<id>", "global", "\\{stock}:<query:w>:<form:sku>", "o:<header:X-Tenant>:<json:order.id>",
		"u:<ctx:user.id>", "<a>:<b>", "<a><b>", "sku:<id", "sku:id>", "<>", "<:x>", "<body:x>",
		"<json:a..b>", "<json:items[*].sku>", "<1id>", "a b", "ключ:<id>", "<query:é>", "\x00",
		"<header:a:b>", "<<>>", "<a<b>", strings.Repeat("a", 512), strings.Repeat("<a>:", 128),
		"<id>:<json:b[*].a>", "<json:b[*]>", "<json:a[*].b[*]>", "<json:[*]>", "<json:b[0]>", "<json:b[*]a>",
		"<query:b[*]>", "<json:b[*]>:<json:b[*]>", "<json:b[*]>:<json:a>",
		"acct:{id}", "acct::id", "/:id", "{p...}", "\\{a}:<id>", "a:\\::id", "a\\\\b", "a\\b", "{<id>}",
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
		// At most one [*], after a field name, in a json path.
		eaches := 0
		for _, p := range tmpl.parts {
			if p.ph == nil {
				continue
			}
			for i, step := range p.ph.path {
				if step.kind == stepEach {
					eaches++
					if p.ph.src != srcJSON || i == 0 || p.ph.path[i-1].kind != stepField || !p.ph.multi {
						t.Fatalf("%q: misplaced [*] in %s", s, p.ph.text)
					}
				}
			}
		}
		if eaches > 1 || tmpl.Multi() != (eaches == 1) {
			t.Fatalf("%q: %d [*], Multi() = %v", s, eaches, tmpl.Multi())
		}
		for _, name := range tmpl.PathNames() {
			if !strings.Contains(s, "<"+name+">") && !strings.Contains(s, "<path:"+name+">") {
				t.Fatalf("%q: PathNames() has %q", s, name)
			}
		}
		// Rendering any valid template must not panic.
		newReq := func() Request {
			r := httptest.NewRequest(http.MethodPost, "/?a=1", strings.NewReader(`{"a":"1","b":[{"a":"1"},"2"]}`))
			return fakeRequest{hr: r, path: map[string]string{"a": "1"}}
		}
		k, err := tmpl.Key(newReq())
		if tmpl.Multi() {
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("Key on a Multi template: error %v, want ErrSyntax", err)
			}
		} else if err != nil && !errors.Is(err, ErrMissing) && !errors.Is(err, ErrBadValue) {
			t.Fatalf("Key: unexpected error %v", err)
		}
		keys, kerr := tmpl.Keys(newReq())
		switch {
		case kerr != nil && !errors.Is(kerr, ErrMissing) && !errors.Is(kerr, ErrBadValue):
			t.Fatalf("Keys: unexpected error %v", kerr)
		case !tmpl.Multi() && (fmt.Sprint(err) != fmt.Sprint(kerr) || kerr == nil && (len(keys) != 1 || keys[0] != k)):
			t.Fatalf("Keys = %q, %v; Key = %q, %v", keys, kerr, k, err)
		}
	})
}

// FuzzKey renders pairs of values with templates that share the prefix "k:"
// but not their skeletons: a template's key determines its values, and no
// values make two of these templates render the same key.
func FuzzKey(f *testing.F) {
	f.Add("1", "2", "1", "2", false)
	f.Add("1:2", "3", "1", "2:3", false)
	f.Add("1%3A2", "3", "1:2", "3", false)
	f.Add("x-y", "z", "x", "y-z", false)
	f.Add("a.lines", "b", "a", "lines.b", false)
	f.Add("1b2", "3", "1", "2b3", false)
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
		templates := []*Template{
			MustParse("k:<x>:<y>", opts...),
			MustParse("k:<x>-<y>", opts...),
			MustParse("k:<x>", opts...),
			MustParse("k:<x>.lines", opts...),
		}
		type rendered struct {
			tmpl   int
			x, y   string
			holes  int
			key    string
			values map[string]string
		}
		var keys []rendered
		for i, tmpl := range templates {
			for _, xy := range [][2]string{{x1, y1}, {x2, y2}} {
				vals := map[string]string{"path:x": xy[0], "path:y": xy[1]}
				k, err := tmpl.Key(fakeRequest{path: map[string]string{"x": xy[0], "y": xy[1]}})
				if xy[0] == "" || tmpl.holes == 2 && xy[1] == "" {
					if !errors.Is(err, ErrMissing) || k != "" {
						t.Fatalf("%s: Key(%q, %q) = %q, %v; want ErrMissing", tmpl, xy[0], xy[1], k, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: Key(%q, %q): %v", tmpl, xy[0], xy[1], err)
				}
				checkKey(t, tmpl, vals, k)
				keys = append(keys, rendered{i, xy[0], xy[1], tmpl.holes, k, vals})
			}
		}
		// A Multi template with its own skeleton renders x1 and x2 as two
		// elements: equal keys iff equal elements, and no key of the others.
		multi := MustParse("k:<json:xs[*]>/<json:y>", opts...)
		xs := []string{strings.ToValidUTF8(x1, "\uFFFD"), strings.ToValidUTF8(x2, "\uFFFD")}
		y := strings.ToValidUTF8(y1, "\uFFFD")
		body, _ := json.Marshal(map[string]any{"xs": xs, "y": y})
		mk, err := multi.Keys(HTTPRequest(httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))))
		if xs[0] == "" || xs[1] == "" || y == "" {
			if !errors.Is(err, ErrMissing) || mk != nil {
				t.Fatalf("%s: Keys(%s) = %q, %v; want ErrMissing", multi, body, mk, err)
			}
		} else {
			if err != nil || len(mk) != 2 {
				t.Fatalf("%s: Keys(%s) = %q, %v", multi, body, mk, err)
			}
			for i, k := range mk {
				checkKey(t, multi, map[string]string{"json:xs[*]": xs[i], "json:y": y}, k)
				for _, other := range keys {
					if k == other.key {
						t.Fatalf("%s with %s and %s with (%q, %q) both render %q",
							multi, body, templates[other.tmpl], other.x, other.y, k)
					}
				}
			}
			if (xs[0] == xs[1]) != (mk[0] == mk[1]) {
				t.Fatalf("%s: elements %q render %q", multi, xs, mk)
			}
		}
		for i, a := range keys {
			for _, b := range keys[i+1:] {
				if a.tmpl != b.tmpl {
					if a.key == b.key {
						t.Fatalf("%s with (%q, %q) and %s with (%q, %q) both render %q",
							templates[a.tmpl], a.x, a.y, templates[b.tmpl], b.x, b.y, a.key)
					}
					continue
				}
				same := a.x == b.x && (a.holes == 1 || a.y == b.y)
				if same != (a.key == b.key) {
					t.Fatalf("%s: (%q, %q) -> %q and (%q, %q) -> %q",
						templates[a.tmpl], a.x, a.y, a.key, b.x, b.y, b.key)
				}
			}
		}
	})
}

// FuzzNoForgery checks the guarantee of the package documentation ("No
// forged keys") on two fuzzer-chosen templates rendered with fuzzer-chosen,
// non-empty values. Each key must cut back into its template's separators
// and slots, with every value slot decoding to its value; and two equal keys
// must come from templates with the same skeleton (the same separators, in
// order, around the same number of slots) whose slots agree one by one: two
// literal words are equal, two values are equal, or a literal word is the
// other template's rendered value (a key space the two templates share by
// design, such as "k:ab" and "k:<x>" with x "ab"). A Multi template renders
// three elements: each of its keys is checked with its element's value, and
// two of its keys are equal only for equal elements.
func FuzzNoForgery(f *testing.F) {
	for _, seed := range [][4]string{
		{"order.<id>", "order.<id>.lines", "\x07a.lines", "\x01a"},
		{"<query:a>-<query:b>", "<query:a>-<query:b>", "\x03x-y\x01z", "\x01x\x03y-z"},
		{"k:ab", "k:<x>", "", "\x02ab"},
		{"k:ab:<y>", "k:<x>:<y>", "\x01c", "\x02ab\x01c"},
		{"k:%3A", "k:<x>", "", "\x01:"},
		{"k:%41:<y>", "k:<x>", "\x01y", "\x01A"},
		{"sku:<id>", "sku:<json:sku>", "\x02A1", "\x02A1"},
		{"\\{stock}:<query:warehouse>:<form:sku>", "\\{stock}:<header:W>:<ctx:sku>", "\x02eu\x01s", "\x02eu\x01s"},
		{"t:<header:X-Tenant>:<json:order.id>", "t:<ctx:t>:<json:order.id>", "\x01a\x019", "\x01a\x019"},
		{"k:<x>:#", "k:<x>:<y>", "\x01a", "\x01a\x01#"},
		{"a<x>b<y>", "k:<x>%20b", "", ""},
		{"sku:<json:items[*].sku>", "sku:<id>", "\x01A\x01B\x01C", "\x01B"},
		{"sku:<json:items[*].sku>", "sku:<json:items[*].sku>", "\x01A\x03A:B\x01A", "\x03A:B"},
		{"k:<json:t[*]>:<query:q>", "k:<x>:<y>", "\x01q\x01a\x01b", "\x01a\x01q"},
		{"o.<json:l[*].id>", "o.<json:l[*].id>.x", "\x03a.x\x01b", "\x01a"},
		{"<json:a.b[*].c>-<json:a.d>", "<json:a.d>-<json:a.b[*].c>", "\x02xy\x01-", "\x01-\x02xy"},
	} {
		f.Add(seed[0], seed[1], []byte(seed[2]), []byte(seed[3]))
	}
	f.Fuzz(func(t *testing.T, t1, t2 string, data1, data2 []byte) {
		a, err := Parse(t1)
		if err != nil {
			return
		}
		b, err := Parse(t2)
		if err != nil {
			return
		}
		ka, ok := renderValues(t, a, assignValues(a, data1))
		if !ok {
			return
		}
		kb, ok := renderValues(t, b, assignValues(b, data2))
		if !ok {
			return
		}
		for _, keys := range [][]renderedKey{ka, kb} {
			for i, x := range keys {
				checkKey(t, x.tmpl, x.vals, x.key)
				for _, y := range keys[i+1:] { // elements of one Multi template
					if (x.elem == y.elem) != (x.key == y.key) {
						t.Fatalf("%q: elements %q and %q render %q and %q", x.tmpl, x.elem, y.elem, x.key, y.key)
					}
				}
			}
		}
		for _, x := range ka {
			for _, y := range kb {
				if x.key == y.key {
					checkSameKey(t, x, y)
				}
			}
		}
	})
}

// renderedKey is a key and the values it was rendered with, by valueID; elem
// is the value of a Multi template's [*] placeholder.
type renderedKey struct {
	tmpl *Template
	key  string
	vals map[string]string
	elem string
}

// checkSameKey asserts that two equal keys come from templates with the same
// skeleton whose slots agree one by one.
func checkSameKey(t *testing.T, x, y renderedKey) {
	t.Helper()
	a, b, va, vb, key := x.tmpl, y.tmpl, x.vals, y.vals, x.key
	skelA, slotsA := templateSlots(a)
	skelB, slotsB := templateSlots(b)
	if skelA != skelB {
		t.Fatalf("%q with %q and %q with %q both render %q: skeletons %q and %q differ",
			a, va, b, vb, key, skelA, skelB)
	}
	_, words := keySlots(key)
	for i := range slotsA {
		pa, pb := slotsA[i].ph, slotsB[i].ph
		switch {
		case pa == nil && pb == nil:
			if slotsA[i].literal != slotsB[i].literal {
				t.Fatalf("%q and %q render %q: literal slot %d differs", a, b, key, i)
			}
		case pa != nil && pb != nil:
			if x, y := va[valueID(pa)], vb[valueID(pb)]; x != y {
				t.Fatalf("%q with %q and %q with %q render %q: slot %d has values %q and %q",
					a, va, b, vb, key, i, x, y)
			}
		case pa == nil:
			if slotsA[i].literal != words[i] {
				t.Fatalf("%q and %q render %q: slot %d is %q, not literal %q", a, b, key, i, words[i], slotsA[i].literal)
			}
		default:
			if slotsB[i].literal != words[i] {
				t.Fatalf("%q and %q render %q: slot %d is %q, not literal %q", a, b, key, i, words[i], slotsB[i].literal)
			}
		}
	}
}

// templateSlots cuts tmpl as the package documentation does: slots are its
// placeholders and its literal words (maximal runs of letters, digits, '%'
// and '#' in a literal); the skeleton is the template with each slot replaced
// by '<', which no literal contains.
func templateSlots(tmpl *Template) (skeleton string, slots []part) {
	var b strings.Builder
	for _, p := range tmpl.parts {
		if p.ph != nil {
			b.WriteByte('<')
			slots = append(slots, p)
			continue
		}
		_, words := cutWords(&b, p.literal)
		for _, w := range words {
			slots = append(slots, lit(w))
		}
	}
	return b.String(), slots
}

// keySlots cuts a rendered key the same way.
func keySlots(key string) (skeleton string, words []string) {
	var b strings.Builder
	_, words = cutWords(&b, key)
	return b.String(), words
}

// cutWords writes s to b with each maximal run of letters, digits, '%' and
// '#' replaced by '<', and returns the runs.
func cutWords(b *strings.Builder, s string) (*strings.Builder, []string) {
	var words []string
	for i := 0; i < len(s); {
		if !isWordByte(s[i]) {
			b.WriteByte(s[i])
			i++
			continue
		}
		j := i
		for j < len(s) && isWordByte(s[j]) {
			j++
		}
		b.WriteByte('<')
		words = append(words, s[i:j])
		i = j
	}
	return b, words
}

// isWordByte is isValueByte, written out again so the test does not trust
// the code under test.
func isWordByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '%' || c == '#'
}

// checkKey asserts that key, rendered by tmpl with vals (by valueID), cuts
// into tmpl's skeleton, that its literal words are tmpl's and that each
// value slot is vals' value escaped or hashed.
func checkKey(t *testing.T, tmpl *Template, vals map[string]string, key string) {
	t.Helper()
	skel, slots := templateSlots(tmpl)
	keySkel, words := keySlots(key)
	if keySkel != skel {
		t.Fatalf("%q renders %q with %q: skeleton %q, want %q", tmpl, key, vals, keySkel, skel)
	}
	for i, s := range slots {
		w := words[i]
		if s.ph == nil {
			if w != s.literal {
				t.Fatalf("%q renders %q: slot %d is %q, want literal %q", tmpl, key, i, w, s.literal)
			}
			continue
		}
		v := vals[valueID(s.ph)]
		if strings.HasPrefix(w, "#") {
			sum := sha256.Sum256([]byte(v))
			if want := "#" + hex.EncodeToString(sum[:16]); w != want || len(escapeRef(v)) <= tmpl.maxValueLen {
				t.Fatalf("%q renders %q: slot %d is %q for %q", tmpl, key, i, w, v)
			}
			continue
		}
		if got, ok := unescapeStrict(w); !ok || got != v || len(w) > tmpl.maxValueLen {
			t.Fatalf("%q renders %q: slot %d is %q for %q", tmpl, key, i, w, v)
		}
	}
}

// escapeRef is a reference escaping: letters and digits stay, every other
// byte becomes %XX.
func escapeRef(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if c := v[i]; isWordByte(c) && c != '%' && c != '#' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// unescapeStrict decodes an escaped value, accepting only the form escapeRef
// writes: letters, digits and %XX (uppercase) of any other byte.
func unescapeStrict(w string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(w); i++ {
		c := w[i]
		if c != '%' {
			if !isWordByte(c) || c == '#' {
				return "", false
			}
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(w) || !isUpperHex(w[i+1]) || !isUpperHex(w[i+2]) {
			return "", false
		}
		d, _ := hex.DecodeString(w[i+1 : i+3])
		if isWordByte(d[0]) && d[0] != '%' && d[0] != '#' {
			return "", false // letters and digits are never escaped
		}
		b.WriteByte(d[0])
		i += 2
	}
	return b.String(), w != ""
}

func isUpperHex(c byte) bool { return '0' <= c && c <= '9' || 'A' <= c && c <= 'F' }

// valueID identifies the request value a placeholder reads: <id> and
// <path:id> read the same one.
func valueID(ph *placeholder) string { return ph.src.String() + ":" + ph.name }

// fuzzValues are the values of a request: one per valueID, and the elements
// of the array at a Multi template's [*].
type fuzzValues struct {
	one   map[string]string
	elems []string
}

// assignValues gives each value of tmpl a non-empty value cut from data: a
// length byte (modulo 32) then that many bytes, reused in turn when data runs
// out; the [*] placeholder gets three elements, so some may be equal. json
// values are valid UTF-8, as a JSON body carries them.
func assignValues(tmpl *Template, data []byte) fuzzValues {
	var pool []string
	for len(data) > 0 {
		n := min(int(data[0])%32, len(data)-1)
		if n > 0 {
			pool = append(pool, string(data[1:1+n]))
		}
		data = data[1+n:]
	}
	if len(pool) == 0 {
		pool = []string{"v"}
	}
	next := func(json bool) string {
		v := pool[0]
		pool = append(pool[1:], v)
		if json {
			v = strings.ToValidUTF8(v, "\uFFFD")
		}
		return v
	}
	fv := fuzzValues{one: map[string]string{}}
	for _, p := range tmpl.parts {
		if p.ph == nil {
			continue
		}
		if p.ph.multi {
			for range 3 {
				fv.elems = append(fv.elems, next(true))
			}
			continue
		}
		id := valueID(p.ph)
		if _, ok := fv.one[id]; !ok {
			fv.one[id] = next(p.ph.src == srcJSON)
		}
	}
	return fv
}

// renderValues renders tmpl for a request carrying fv, with Keys, and with
// Key when tmpl is not Multi. It reports false when the values cannot be
// carried together: a json path inside another, a form field the query
// contradicts, json and form in one body.
func renderValues(t *testing.T, tmpl *Template, fv fuzzValues) ([]renderedKey, bool) {
	t.Helper()
	vals := fv.one
	req := fakeRequest{path: map[string]string{}, ctx: map[string]any{}}
	query, form := url.Values{}, url.Values{}
	header := http.Header{}
	obj := map[string]any{}
	var hasJSON, hasForm, conflict bool
	for _, p := range tmpl.parts {
		ph := p.ph
		if ph == nil {
			continue
		}
		v := vals[valueID(ph)]
		switch ph.src {
		case srcPath:
			req.path[ph.name] = v
		case srcCtx:
			req.ctx[ph.name] = v
		case srcQuery:
			query.Set(ph.name, v)
		case srcHeader:
			if ph.name == "Content-Type" {
				return nil, false // the body needs its own
			}
			header[ph.name] = []string{v}
		case srcForm:
			hasForm = true
			form.Set(ph.name, v)
		case srcJSON:
			hasJSON = true
			path, leaf := ph.path, any(v)
			if ph.multi { // the fields before [*] lead to an array of elements
				each := slices.IndexFunc(path, func(s jsonStep) bool { return s.kind == stepEach })
				arr := make([]any, len(fv.elems))
				for i, e := range fv.elems {
					arr[i] = e
					for j := len(path) - 1; j > each; j-- {
						arr[i] = map[string]any{path[j].field: arr[i]}
					}
				}
				path, leaf = path[:each], arr
			}
			m := obj
			for _, step := range path[:len(path)-1] {
				next, ok := m[step.field].(map[string]any)
				if !ok {
					if _, taken := m[step.field]; taken {
						conflict = true
						break
					}
					next = map[string]any{}
					m[step.field] = next
				}
				m = next
			}
			last := path[len(path)-1].field
			if _, taken := m[last]; taken && (ph.multi || m[last] != leaf) {
				conflict = true
			}
			m[last] = leaf
		}
	}
	if conflict || hasJSON && hasForm {
		return nil, false
	}
	var body, contentType string
	switch {
	case hasJSON:
		b, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		body, contentType = string(b), "application/json"
	case hasForm:
		body, contentType = form.Encode(), "application/x-www-form-urlencoded"
	}
	req.hr = httptest.NewRequest(http.MethodPost, "/?"+query.Encode(), strings.NewReader(body))
	for k, v := range header {
		req.hr.Header[k] = v
	}
	if contentType != "" {
		req.hr.Header.Set("Content-Type", contentType)
	}
	keys, err := tmpl.Keys(req)
	if errors.Is(err, ErrBadValue) {
		return nil, false // a json field name differing only in case, a query/form clash
	}
	if err != nil {
		t.Fatalf("%q with %q: Keys: %v", tmpl, fv, err)
	}
	if !tmpl.Multi() {
		if key, err := tmpl.Key(req); err != nil || len(keys) != 1 || key != keys[0] {
			t.Fatalf("%q with %q: Keys = %q, Key = %q, %v", tmpl, fv, keys, key, err)
		}
		return []renderedKey{{tmpl: tmpl, key: keys[0], vals: vals}}, true
	}
	if len(keys) != len(fv.elems) {
		t.Fatalf("%q with %q: Keys = %q", tmpl, fv, keys)
	}
	var id string
	for _, p := range tmpl.parts {
		if p.ph != nil && p.ph.multi {
			id = valueID(p.ph)
		}
	}
	rks := make([]renderedKey, len(keys))
	for i, k := range keys {
		ev := maps.Clone(vals)
		ev[id] = fv.elems[i]
		rks[i] = renderedKey{tmpl: tmpl, key: k, vals: ev, elem: fv.elems[i]}
	}
	return rks, true
}

// FuzzKeyBody feeds arbitrary bodies to json and form templates: Key and
// Keys must not panic, must fail only with a keyfunc sentinel, must agree
// on single-valued templates, must render at most MaxKeys keys, and must
// leave the body whole for the handler.
func FuzzKeyBody(f *testing.F) {
	f.Add(uint8(0), "application/json", []byte(`{"a":{"b":"1"},"c":2}`))
	f.Add(uint8(0), "application/json", []byte(`{"a":[1,{"b":null}],"c":true}`))
	f.Add(uint8(0), "", []byte(`{"a":{"b":"\u00e9\ud800"}}`))
	f.Add(uint8(0), "", []byte(`{"a":`))
	f.Add(uint8(1), "application/x-www-form-urlencoded", []byte("c=1&a=%zz;x"))
	f.Add(uint8(1), "multipart/form-data; boundary=X", []byte("--X\r\nContent-Disposition: form-data; name=\"c\"\r\n\r\nv\r\n--X--\r\n"))
	f.Add(uint8(1), "multipart/form-data; boundary=X", []byte("--X\r\nContent-Disposition: form-data; name=\"c\"; filename=\"f\"\r\n\r\nv\r\n--X--\r\n"))
	f.Add(uint8(2), "text/plain; charset=\"", bytes.Repeat([]byte("x"), 300))
	f.Add(uint8(3), "application/json", []byte(`{"a":[{"b":"1"},{"b":2,"B":3},{"b":true}],"c":"x"}`))
	f.Add(uint8(3), "application/json", []byte(`{"a":[{"b":"1"},{},"s",null,[{"b":1}]],"c":"x"}`))
	f.Add(uint8(3), "application/json", []byte(`{"a":[{"b":1},{"b":2},{"b":3},{"b":4},{"b":5}],"c":"x"}`))
	f.Add(uint8(4), "application/json", []byte(`{"a":[],"c":{"a":["1","",null]}}`))
	f.Add(uint8(4), "application/json", []byte(`{"a":{"b":[1]},"c":{"a":[1,1.5e300,-0,"\u0000",false]}}`))
	templates := []*Template{
		MustParse("j:<json:a.b>:<json:c>", WithMaxBodyBytes(256)),
		MustParse("f:<form:c>:<form:a>", WithMaxBodyBytes(256)),
		MustParse("b:<json:c>:<form:c>", WithMaxBodyBytes(256)),
		MustParse("m:<json:a[*].b>:<json:c>", WithMaxBodyBytes(256), WithMaxKeys(4)),
		MustParse("n:<json:c.a[*]>", WithMaxBodyBytes(256), WithMaxKeys(4)),
	}
	f.Fuzz(func(t *testing.T, which uint8, contentType string, body []byte) {
		tmpl := templates[int(which)%len(templates)]
		r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		r.Header.Set("Content-Type", contentType)
		k, err := tmpl.Key(HTTPRequest(r))
		switch {
		case tmpl.Multi():
			if !errors.Is(err, ErrSyntax) || k != "" {
				t.Fatalf("Key on a Multi template = %q, %v; want ErrSyntax", k, err)
			}
		case err == nil:
			if k == "" {
				t.Fatal("empty key without an error")
			}
		case errors.Is(err, ErrMissing), errors.Is(err, ErrBadValue), errors.Is(err, ErrBodyTooLarge):
		default:
			t.Fatalf("unexpected error %v", err)
		}
		keys, kerr := tmpl.Keys(HTTPRequest(r))
		switch {
		case kerr == nil:
			if len(keys) == 0 || len(keys) > tmpl.maxKeys {
				t.Fatalf("Keys = %d keys, want 1 to %d", len(keys), tmpl.maxKeys)
			}
			for _, key := range keys {
				if !strings.HasPrefix(key, tmpl.raw[:2]) || len(key) <= 2 {
					t.Fatalf("Keys = %q", keys)
				}
			}
		case errors.Is(kerr, ErrMissing), errors.Is(kerr, ErrBadValue), errors.Is(kerr, ErrBodyTooLarge),
			errors.Is(kerr, ErrTooManyKeys) && tmpl.Multi():
			if keys != nil {
				t.Fatalf("Keys = %q with error %v", keys, kerr)
			}
		default:
			t.Fatalf("Keys: unexpected error %v", kerr)
		}
		if !tmpl.Multi() && (fmt.Sprint(err) != fmt.Sprint(kerr) || err == nil && (len(keys) != 1 || keys[0] != k)) {
			t.Fatalf("Keys = %q, %v; Key = %q, %v", keys, kerr, k, err)
		}
		got, rerr := io.ReadAll(r.Body)
		if rerr != nil || !bytes.Equal(got, body) {
			t.Fatalf("body after Key and Keys = %q, %v; want %q", got, rerr, body)
		}
	})
}
