package keyfunc

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseValid(t *testing.T) {
	tests := []struct {
		template  string
		needsBody bool
		want      []part // literal parts, or placeholders by source, name and path
	}{
		{"sku:<id>", false, []part{lit("sku:"), ph(srcPath, "id", "<id>")}},
		{"sku:<path:id>", false, []part{lit("sku:"), ph(srcPath, "id", "<path:id>")}},
		{"<_Id9>", false, []part{ph(srcPath, "_Id9", "<_Id9>")}},
		{"global", false, []part{lit("global")}},
		{"\\{cart}:<query:cart_id>", false, []part{lit("{cart}:"), ph(srcQuery, "cart_id", "<query:cart_id>")}},
		{"q:<query:a:b[0]!>", false, []part{lit("q:"), ph(srcQuery, "a:b[0]!", "<query:a:b[0]!>")}},
		{"t:<header:x-tenant-id>", false, []part{lit("t:"), ph(srcHeader, "X-Tenant-Id", "<header:x-tenant-id>")}},
		{"t:<header:X_Odd!#$%&'*+-.^_`|~1>", false, []part{lit("t:"), ph(srcHeader, "X_odd!#$%&'*+-.^_`|~1", "<header:X_Odd!#$%&'*+-.^_`|~1>")}},
		{"f:<form:sku>", true, []part{lit("f:"), ph(srcForm, "sku", "<form:sku>")}},
		{"j:<json:sku>", true, []part{lit("j:"), jph("<json:sku>", "sku")}},
		{"j:<json:order.item.sku>:x", true, []part{lit("j:"), jph("<json:order.item.sku>", "order", "item", "sku"), lit(":x")}},
		{"j:<json:a-b~c:d>", true, []part{lit("j:"), jph("<json:a-b~c:d>", "a-b~c:d")}},
		{"j:<json:a*b>", true, []part{lit("j:"), jph("<json:a*b>", "a*b")}},
		{"sku:<json:items[*].sku>", true, []part{lit("sku:"), jph("<json:items[*].sku>", "items", "[*]", "sku")}},
		{"tag:<json:tags[*]>", true, []part{lit("tag:"), jph("<json:tags[*]>", "tags", "[*]")}},
		{"j:<json:a.b[*].c>", true, []part{lit("j:"), jph("<json:a.b[*].c>", "a", "b", "[*]", "c")}},
		{"<id>:<json:a[*].b.c>:<json:d.e>", true, []part{ph(srcPath, "id", "<id>"), lit(":"), jph("<json:a[*].b.c>", "a", "[*]", "b", "c"), lit(":"), jph("<json:d.e>", "d", "e")}},
		{"q:<query:a[]>:<ctx:b[0]>", false, []part{lit("q:"), ph(srcQuery, "a[]", "<query:a[]>"), lit(":"), ph(srcCtx, "b[0]", "<ctx:b[0]>")}},
		{"[*]:<id>", false, []part{lit("[*]:"), ph(srcPath, "id", "<id>")}},
		{"u:<ctx:user.id>", false, []part{lit("u:"), ph(srcCtx, "user.id", "<ctx:user.id>")}},
		{"<a>:<b>", false, []part{ph(srcPath, "a", "<a>"), lit(":"), ph(srcPath, "b", "<b>")}},
		{"order.<id>.lines", false, []part{lit("order."), ph(srcPath, "id", "<id>"), lit(".lines")}},
		{"<a>-<b>_<c>~", false, []part{ph(srcPath, "a", "<a>"), lit("-"), ph(srcPath, "b", "<b>"), lit("_"), ph(srcPath, "c", "<c>"), lit("~")}},
		{"%41:#:<a>/x%", false, []part{lit("%41:#:"), ph(srcPath, "a", "<a>"), lit("/x%")}},
		{"!#$%&'()*+,-./09:;=?@AZ[\\\\]^_`az{|}~", false, []part{lit("!#$%&'()*+,-./09:;=?@AZ[\\]^_`az{|}~")}},
		{strings.Repeat("a", 512), false, []part{lit(strings.Repeat("a", 512))}},
	}
	for _, tt := range tests {
		t.Run(tt.template, func(t *testing.T) {
			tmpl, err := Parse(tt.template)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got := tmpl.String(); got != tt.template {
				t.Errorf("String() = %q, want %q", got, tt.template)
			}
			if got := tmpl.NeedsBody(); got != tt.needsBody {
				t.Errorf("NeedsBody() = %v, want %v", got, tt.needsBody)
			}
			if !reflect.DeepEqual(tmpl.parts, tt.want) {
				t.Errorf("parts = %s, want %s", dumpParts(tmpl.parts), dumpParts(tt.want))
			}
		})
	}
}

func TestParseInvalid(t *testing.T) {
	long := strings.Repeat("a", 513)
	tests := []struct {
		template string
		want     string
	}{
		{"", `keyfunc: invalid template: "": empty template at offset 0`},
		{long, `keyfunc: invalid template: template is 513 bytes, longer than the 512-byte limit at offset 512`},
		{"sku:<id", `keyfunc: invalid template: "sku:<id": unclosed placeholder at offset 4`},
		{"sku:<", `keyfunc: invalid template: "sku:<": unclosed placeholder at offset 4`},
		{"<a<b>", `keyfunc: invalid template: "<a<b>": unclosed placeholder at offset 0`},
		{"sku:id>", `keyfunc: invalid template: "sku:id>": stray '>' at offset 6`},
		{"<a>>", `keyfunc: invalid template: "<a>>": stray '>' at offset 3`},
		{"sku:<>", `keyfunc: invalid template: "sku:<>": empty placeholder at offset 4`},
		{"x:<body:id>", `keyfunc: invalid template: "x:<body:id>": unknown source "body" at offset 3 (want path, query, header, form, json or ctx)`},
		{"x:<Query:id>", `keyfunc: invalid template: "x:<Query:id>": unknown source "Query" at offset 3 (want path, query, header, form, json or ctx)`},
		{"x:<:id>", `keyfunc: invalid template: "x:<:id>": empty source at offset 3 (want path, query, header, form, json or ctx)`},
		{"x:<query:>", `keyfunc: invalid template: "x:<query:>": empty query name at offset 9`},
		{"x:<path:>", `keyfunc: invalid template: "x:<path:>": empty path name at offset 8`},
		{"x:<json:>", `keyfunc: invalid template: "x:<json:>": empty json name at offset 8`},
		{"x:<1id>", `keyfunc: invalid template: "x:<1id>": path name starts with a digit at offset 3`},
		{"x:<sku-id>", `keyfunc: invalid template: "x:<sku-id>": invalid character '-' in path name at offset 6`},
		{"x:<path:é>", `keyfunc: invalid template: "x:<path:é>": invalid character byte 0xC3 in path name at offset 8`},
		{"x:<query:a b>", `keyfunc: invalid template: "x:<query:a b>": invalid character ' ' in query name at offset 10`},
		{"x:<form:a\tb>", `keyfunc: invalid template: "x:<form:a\tb>": invalid character byte 0x09 in form name at offset 9`},
		{"x:<ctx:a\x7fb>", `keyfunc: invalid template: "x:<ctx:a\x7fb>": invalid character byte 0x7F in ctx name at offset 8`},
		{"x:<header:X:Y>", `keyfunc: invalid template: "x:<header:X:Y>": invalid character ':' in header name at offset 11`},
		{"x:<header:X(Y)>", `keyfunc: invalid template: "x:<header:X(Y)>": invalid character '(' in header name at offset 11`},
		{"x:<json:a..b>", `keyfunc: invalid template: "x:<json:a..b>": empty segment in json path at offset 10`},
		{"x:<json:.a>", `keyfunc: invalid template: "x:<json:.a>": empty segment in json path at offset 8`},
		{"x:<json:a.>", `keyfunc: invalid template: "x:<json:a.>": empty segment in json path at offset 10`},
		{"x:<json:a]>", `keyfunc: invalid template: "x:<json:a]>": stray ']' in json path at offset 9`},
		{"x:<json:a]b[*]>", `keyfunc: invalid template: "x:<json:a]b[*]>": stray ']' in json path at offset 9`},
		{"x:<json:items[0].sku>", `keyfunc: invalid template: "x:<json:items[0].sku>": invalid array step [0] in json path at offset 13 (only [*] is supported)`},
		{"x:<json:items[]>", `keyfunc: invalid template: "x:<json:items[]>": invalid array step [] in json path at offset 13 (only [*] is supported)`},
		{"x:<json:items[x]>", `keyfunc: invalid template: "x:<json:items[x]>": invalid array step [x] in json path at offset 13 (only [*] is supported)`},
		{"x:<json:items[**]>", `keyfunc: invalid template: "x:<json:items[**]>": invalid array step [**] in json path at offset 13 (only [*] is supported)`},
		{"x:<json:items[*>", `keyfunc: invalid template: "x:<json:items[*>": unclosed '[' in json path at offset 13`},
		{"x:<json:items[>", `keyfunc: invalid template: "x:<json:items[>": unclosed '[' in json path at offset 13`},
		{"x:<json:[*].sku>", `keyfunc: invalid template: "x:<json:[*].sku>": [*] without a field name in json path at offset 8 (write field[*])`},
		{"x:<json:a.[*]>", `keyfunc: invalid template: "x:<json:a.[*]>": [*] without a field name in json path at offset 10 (write field[*])`},
		{"x:<json:items[*]sku>", `keyfunc: invalid template: "x:<json:items[*]sku>": invalid character 's' after [*] in json path at offset 16 (want '.' or the end of the path)`},
		{"x:<json:a[*]]>", `keyfunc: invalid template: "x:<json:a[*]]>": invalid character ']' after [*] in json path at offset 12 (want '.' or the end of the path)`},
		{"x:<json:a[*].>", `keyfunc: invalid template: "x:<json:a[*].>": empty segment in json path at offset 13`},
		{"x:<json:a[*][0]>", `keyfunc: invalid template: "x:<json:a[*][0]>": invalid array step [0] in json path at offset 12 (only [*] is supported)`},
		{"x:<json:a[*][*]>", `keyfunc: invalid template: "x:<json:a[*][*]>": a template may have at most one [*] at offset 12`},
		{"x:<json:a[*].b[*].c>", `keyfunc: invalid template: "x:<json:a[*].b[*].c>": a template may have at most one [*] at offset 14`},
		{"x:<json:a[*]>:<json:b[*]>", `keyfunc: invalid template: "x:<json:a[*]>:<json:b[*]>": a template may have at most one [*] at offset 21`},
		{"x:<json:a[*]>:<json:a[*]>", `keyfunc: invalid template: "x:<json:a[*]>:<json:a[*]>": a template may have at most one [*] at offset 21`},
		{"x:<query:items[*]>", `keyfunc: invalid template: "x:<query:items[*]>": [*] in query name at offset 14 (only json paths have array steps)`},
		{"x:<form:a[*]>", `keyfunc: invalid template: "x:<form:a[*]>": [*] in form name at offset 9 (only json paths have array steps)`},
		{"x:<ctx:a.b[*]>", `keyfunc: invalid template: "x:<ctx:a.b[*]>": [*] in ctx name at offset 10 (only json paths have array steps)`},
		{"x:<items[*]>", `keyfunc: invalid template: "x:<items[*]>": invalid character '[' in path name at offset 8`},
		{"x:<header:a[*]>", `keyfunc: invalid template: "x:<header:a[*]>": invalid character '[' in header name at offset 11`},
		{"x:<json:a b>", `keyfunc: invalid template: "x:<json:a b>": invalid character ' ' in json path at offset 9`},
		{"<a><b>", `keyfunc: invalid template: "<a><b>": adjacent placeholders at offset 3 (separate them with a literal)`},
		{"x:<a><query:b>", `keyfunc: invalid template: "x:<a><query:b>": adjacent placeholders at offset 5 (separate them with a literal)`},
		{"sku<id>", `keyfunc: invalid template: "sku<id>": placeholder <id> preceded by 'u' at offset 2 (a value may contain letters, digits, '%' and '#': separate them with another character, such as ':')`},
		{"sku:9<id>", `keyfunc: invalid template: "sku:9<id>": placeholder <id> preceded by '9' at offset 4 (a value may contain letters, digits, '%' and '#': separate them with another character, such as ':')`},
		{"k%<id>", `keyfunc: invalid template: "k%<id>": placeholder <id> preceded by '%' at offset 1 (a value may contain letters, digits, '%' and '#': separate them with another character, such as ':')`},
		{"k#<id>", `keyfunc: invalid template: "k#<id>": placeholder <id> preceded by '#' at offset 1 (a value may contain letters, digits, '%' and '#': separate them with another character, such as ':')`},
		{"<id>v2", `keyfunc: invalid template: "<id>v2": placeholder <id> followed by 'v' at offset 4 (a value may contain letters, digits, '%' and '#': separate them with another character, such as ':')`},
		{"k:<query:a>0", `keyfunc: invalid template: "k:<query:a>0": placeholder <query:a> followed by '0' at offset 11 (a value may contain letters, digits, '%' and '#': separate them with another character, such as ':')`},
		{"k:<x>%20b", `keyfunc: invalid template: "k:<x>%20b": placeholder <x> followed by '%' at offset 5 (a value may contain letters, digits, '%' and '#': separate them with another character, such as ':')`},
		{"k:<x>#", `keyfunc: invalid template: "k:<x>#": placeholder <x> followed by '#' at offset 5 (a value may contain letters, digits, '%' and '#': separate them with another character, such as ':')`},
		{"<a>:x<b>", `keyfunc: invalid template: "<a>:x<b>": placeholder <b> preceded by 'x' at offset 4 (a value may contain letters, digits, '%' and '#': separate them with another character, such as ':')`},
		{"a<x>b<y>", `keyfunc: invalid template: "a<x>b<y>": placeholder <x> preceded by 'a' at offset 0 (a value may contain letters, digits, '%' and '#': separate them with another character, such as ':')`},
		{"a<1id>", `keyfunc: invalid template: "a<1id>": placeholder <1id> preceded by 'a' at offset 0 (a value may contain letters, digits, '%' and '#': separate them with another character, such as ':')`},
		{"<a>b<c", `keyfunc: invalid template: "<a>b<c": placeholder <a> followed by 'b' at offset 3 (a value may contain letters, digits, '%' and '#': separate them with another character, such as ':')`},
		{"sku <id>", `keyfunc: invalid template: "sku <id>": invalid character ' ' in literal at offset 3`},
		{"sku:\n<id>", `keyfunc: invalid template: "sku:\n<id>": invalid character byte 0x0A in literal at offset 4`},
		{"<id>:\x00", `keyfunc: invalid template: "<id>:\x00": invalid character byte 0x00 in literal at offset 5`},
		{"ключ:<id>", `keyfunc: invalid template: "ключ:<id>": invalid character byte 0xD0 in literal at offset 0`},
	}
	for _, tt := range tests {
		name := tt.template
		if len(name) > 40 {
			name = name[:40]
		}
		t.Run(name, func(t *testing.T) {
			tmpl, err := Parse(tt.template)
			if err == nil {
				t.Fatalf("Parse(%q) = %v, want error", tt.template, tmpl)
			}
			if !errors.Is(err, ErrSyntax) {
				t.Errorf("error %v does not wrap ErrSyntax", err)
			}
			if err.Error() != tt.want {
				t.Errorf("error\n got: %s\nwant: %s", err, tt.want)
			}
		})
	}
}

func TestParseOptions(t *testing.T) {
	tests := []struct {
		name string
		opts []Option
		want string // error; "" for success
	}{
		{"defaults", nil, ""},
		{"nil option", []Option{nil}, ""},
		{"body 1", []Option{WithMaxBodyBytes(1)}, ""},
		{"value 16", []Option{WithMaxValueLen(16)}, ""},
		{"keys 1", []Option{WithMaxKeys(1)}, ""},
		{"body 0", []Option{WithMaxBodyBytes(0)}, "keyfunc: invalid template: option WithMaxBodyBytes(0): must be greater than 0"},
		{"body negative", []Option{WithMaxBodyBytes(-5)}, "keyfunc: invalid template: option WithMaxBodyBytes(-5): must be greater than 0"},
		{"value 15", []Option{WithMaxValueLen(15)}, "keyfunc: invalid template: option WithMaxValueLen(15): must be at least 16"},
		{"keys 0", []Option{WithMaxKeys(0)}, "keyfunc: invalid template: option WithMaxKeys(0): must be at least 1"},
		{"keys negative", []Option{WithMaxKeys(-3)}, "keyfunc: invalid template: option WithMaxKeys(-3): must be at least 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl, err := Parse("sku:<id>", tt.opts...)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse = %v, want error %q", tmpl, tt.want)
			}
			if !errors.Is(err, ErrSyntax) || err.Error() != tt.want {
				t.Errorf("error = %v, want %q wrapping ErrSyntax", err, tt.want)
			}
		})
	}
	tmpl := MustParse("sku:<id>", WithMaxBodyBytes(10), WithMaxValueLen(20), WithMaxKeys(5))
	if tmpl.maxBodyBytes != 10 || tmpl.maxValueLen != 20 || tmpl.maxKeys != 5 {
		t.Errorf("options not applied: body %d, value %d, keys %d", tmpl.maxBodyBytes, tmpl.maxValueLen, tmpl.maxKeys)
	}
	tmpl = MustParse("sku:<id>")
	if tmpl.maxBodyBytes != DefaultMaxBodyBytes || tmpl.maxValueLen != DefaultMaxValueLen || tmpl.maxKeys != DefaultMaxKeys {
		t.Errorf("defaults: body %d, value %d, keys %d", tmpl.maxBodyBytes, tmpl.maxValueLen, tmpl.maxKeys)
	}
}

func TestMultiAndPathNames(t *testing.T) {
	tests := []struct {
		template  string
		multi     bool
		pathNames []string
	}{
		{"global", false, nil},
		{"sku:<id>", false, []string{"id"}},
		{"<a>:<path:b>:<path:a>:<query:c>:<b>", false, []string{"a", "b"}},
		{"sku:<json:sku>:<query:id>:<header:Id>:<ctx:id>:<form:id>", false, nil},
		{"sku:<json:items[*].sku>", true, nil},
		{"<shop>:<json:items[*]>:<id>", true, []string{"shop", "id"}},
		{"<id>:<json:a.b[*].c>:<json:d>", true, []string{"id"}},
	}
	for _, tt := range tests {
		t.Run(tt.template, func(t *testing.T) {
			tmpl := MustParse(tt.template)
			if got := tmpl.Multi(); got != tt.multi {
				t.Errorf("Multi() = %v, want %v", got, tt.multi)
			}
			if got := tmpl.PathNames(); !reflect.DeepEqual(got, tt.pathNames) {
				t.Errorf("PathNames() = %q, want %q", got, tt.pathNames)
			}
		})
	}
	// PathNames returns a fresh slice.
	tmpl := MustParse("<a>:<b>")
	tmpl.PathNames()[0] = "x"
	if got := tmpl.PathNames(); got[0] != "a" {
		t.Errorf("PathNames() after a caller's write = %q", got)
	}
}

func TestMustParsePanics(t *testing.T) {
	defer func() {
		err, _ := recover().(error)
		if !errors.Is(err, ErrSyntax) {
			t.Errorf("recovered %v, want an error wrapping ErrSyntax", err)
		}
	}()
	MustParse("sku:<id")
}

func TestNilAndZeroTemplate(t *testing.T) {
	var nilT *Template
	if nilT.String() != "" || nilT.NeedsBody() || nilT.Multi() || nilT.PathNames() != nil {
		t.Error("nil Template: want empty String, no body, not Multi and no path names")
	}
	for _, tmpl := range []*Template{nilT, {}} {
		if _, err := tmpl.Key(HTTPRequest(nil)); !errors.Is(err, ErrSyntax) {
			t.Errorf("Key on unparsed template: err = %v, want ErrSyntax", err)
		}
		if keys, err := tmpl.Keys(HTTPRequest(nil)); !errors.Is(err, ErrSyntax) || keys != nil {
			t.Errorf("Keys on unparsed template = %q, %v; want ErrSyntax", keys, err)
		}
	}
}

func lit(s string) part { return part{literal: s} }

func ph(src source, name, text string) part {
	return part{ph: &placeholder{src: src, name: name, text: text}}
}

// jph builds a json placeholder; a field "[*]" stands for an array step.
func jph(text string, fields ...string) part {
	p := &placeholder{src: srcJSON, name: text[len("<json:") : len(text)-1], text: text}
	for _, f := range fields {
		if f == "[*]" {
			p.path = append(p.path, jsonStep{kind: stepEach})
			p.multi = true
			continue
		}
		p.path = append(p.path, jsonStep{kind: stepField, field: f})
	}
	return part{ph: p}
}

func dumpParts(ps []part) string {
	var b strings.Builder
	for _, p := range ps {
		if p.ph == nil {
			b.WriteString("lit(" + p.literal + ") ")
			continue
		}
		b.WriteString(p.ph.src.String() + "(" + p.ph.name + ") ")
	}
	return b.String()
}
