package routetable_test

import (
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/routetable"
)

const invalid = "reqlock/routetable: invalid configuration: "

// checkErrors checks that err wraps ErrInvalid and that its lines are
// exactly want, each after the ErrInvalid prefix.
func checkErrors(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want:\n%s", what, strings.Join(want, "\n"))
		return
	}
	if !errors.Is(err, routetable.ErrInvalid) {
		t.Errorf("%s: error %q does not wrap ErrInvalid", what, err)
	}
	var got []string
	for _, line := range strings.Split(err.Error(), "\n") {
		if !strings.HasPrefix(line, invalid) {
			t.Errorf("%s: error line %q does not start with %q", what, line, invalid)
		}
		got = append(got, strings.TrimPrefix(line, invalid))
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s: errors:\n%s\nwant:\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// wantTable is the content of testdata/routes.json and testdata/routes.yaml.
func wantTable(file string) []routetable.Entry {
	return []routetable.Entry{
		{
			Method: "POST", Path: "/skus/{id}/deduct",
			Spec: routetable.Spec{Text: "@lock key=sku:<id> wait=2s ttl=10s on-timeout=423 on-store-error=503",
				Keys: []string{"sku:<id>"}, Wait: 2 * time.Second, TTL: 10 * time.Second, TimeoutStatus: 423},
			Source: file + ":3", Line: 3,
		},
		{
			Method: "POST", Path: "/orders",
			Spec: routetable.Spec{Text: "@lock key=order:<json:order_id> wait=none hold-at-least=5s name=create-order",
				Keys: []string{"order:<json:order_id>"}, HoldAtLeast: 5 * time.Second, Name: "create-order"},
			Source: file + ":4", Line: 4,
		},
		{
			Method: "PUT", Path: "/users/{user}/balance",
			Spec: routetable.Spec{Text: "key=user_balance:<user> on-store-error=fail-open",
				Keys: []string{"user_balance:<user>"}, FailOpen: true},
			Source: file + ":5", Line: 5,
		},
		{
			Method: "GET", Path: "/files/{path...}",
			Spec: routetable.Spec{Text: "@lock key=file:<path> max-body=64KiB",
				Keys: []string{"file:<path>"}, MaxBodyBytes: 64 << 10},
			Source: file + ":6", Line: 6,
		},
		{
			Method: "DELETE", Path: "/carts/{cart}/items/{item}",
			Spec: routetable.Spec{Text: "@lock key=cart:<cart> key=item:<item> watchdog ttl=30s",
				Keys: []string{"cart:<cart>", "item:<item>"}, Watchdog: true, TTL: 30 * time.Second},
			Source: file + ":7", Line: 7,
		},
	}
}

// entries is es with their Specs as exported, to compare with literals.
func entries(es []routetable.Entry) []routetable.Entry {
	var out []routetable.Entry
	for _, e := range es {
		e.Spec = exported(e.Spec)
		out = append(out, e)
	}
	return out
}

func TestLoad(t *testing.T) {
	for _, file := range []string{"testdata/routes.json", "testdata/routes.yaml"} {
		got, err := routetable.Load(file)
		if err != nil {
			t.Errorf("Load(%s): %v", file, err)
			continue
		}
		if want := wantTable(file); !reflect.DeepEqual(entries(got), want) {
			t.Errorf("Load(%s) =\n%+v\nwant\n%+v", file, got, want)
		}
	}
}

// TestLoadRouteTableInvalid checks that every problem of a table is
// reported, in line order.
func TestLoadInvalid(t *testing.T) {
	for _, tc := range []struct {
		file   string
		kind   string
		first  int // line of the first route
		rotues int // line of the unknown field
	}{
		{"testdata/routes_invalid.json", "JSON", 3, 12},
		{"testdata/routes_invalid.yaml", "YAML", 2, 10},
	} {
		got, err := routetable.Load(tc.file)
		if got != nil {
			t.Errorf("Load(%s) returned entries with an error", tc.file)
		}
		at := func(offset int, msg string) string {
			return tc.file + ":" + itoa(tc.first+offset) + ": " + msg
		}
		checkErrors(t, tc.file, err,
			at(1, `POST /skus/:sku/deduct: spec column 21: unknown field "wiat" `+knownFields),
			at(1, `POST /skus/:sku/deduct is listed twice (first at line `+itoa(tc.first)+` as POST /skus/{id}/deduct)`),
			at(2, `route "post /orders": method "post" is not upper-case (write POST)`),
			at(3, `route "GET /files/*": segment "*": a wildcard needs a name, such as *path`),
			at(4, `route "PUT /a/{id": segment "{id": a parameter must be a whole segment, such as {id}`),
			at(5, `GET /b: spec is a `+tc.kind+` number, not a string`),
			at(6, `GET /c: spec is a `+tc.kind+` null, not a string`),
			at(7, `POST /skus/{id}/deduct: spec column 20: ttl: "-1s" is negative`),
			at(7, `POST /skus/{id}/deduct is listed twice (first at line `+itoa(tc.first)+`)`),
			tc.file+":"+itoa(tc.rotues)+`: unknown field "rotues" (known: routes)`,
		)
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

func TestLoadFileErrors(t *testing.T) {
	_, err := routetable.Load("testdata/missing.yaml")
	if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, routetable.ErrInvalid) ||
		err.Error() != "reqlock/routetable: read route table: open testdata/missing.yaml: no such file or directory" {
		t.Errorf("Load(missing file) error = %v", err)
	}
	_, err = routetable.Load("testdata/missing.toml")
	checkErrors(t, "Load(.toml)", err,
		`testdata/missing.toml: unsupported route table extension ".toml" (want .json, .yaml or .yml)`)
}

func TestParseFormats(t *testing.T) {
	want := []routetable.Entry{{Method: "GET", Path: "/a", Spec: routetable.Spec{Text: "key=a", Keys: []string{"a"}}}}
	for _, tc := range []struct {
		name, data string
		line       int
	}{
		{"t.json", `{"routes": {"GET /a": "key=a"}}`, 1},
		{"T.JSON", "{\"routes\": {\n\n\"GET /a\": \"key=a\"}}", 3},
		{"t.yaml", "routes:\n  GET /a: key=a\n", 2},
		{"dir.d/t.yml", "routes: {GET /a: key=a}\n", 1},
		{"t.YML", "---\nroutes:\n  \"GET /a\": |-\n    key=a\n", 3},
	} {
		got, err := routetable.Parse(tc.name, []byte(tc.data))
		want[0].Source, want[0].Line = tc.name+":"+itoa(tc.line), tc.line
		if err != nil || !reflect.DeepEqual(entries(got), want) {
			t.Errorf("Parse(%s) = %+v, %v; want %+v", tc.name, got, err, want)
		}
	}
	for _, tc := range []struct{ name, data string }{
		{"t.json", `{"routes": {}}`},
		{"t.yaml", "routes: {}\n"},
		{"t.yaml", "# no routes yet\nroutes: {}\n"},
	} {
		got, err := routetable.Parse(tc.name, []byte(tc.data))
		if err != nil || len(got) != 0 {
			t.Errorf("Parse(%s, %q) = %+v, %v; want no entries", tc.name, tc.data, got, err)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       []string
	}{
		// File names.
		{"routes.toml", "", []string{`routes.toml: unsupported route table extension ".toml" (want .json, .yaml or .yml)`}},
		{"routes", "", []string{`routes: unsupported route table extension "" (want .json, .yaml or .yml)`}},

		// JSON.
		{"r.json", "", []string{`r.json:1: invalid JSON: empty file`}},
		{"r.json", "\n \n", []string{`r.json:1: invalid JSON: empty file`}},
		{"r.json", "{\"routes\": {\"GET /a\": [1,\n2,}}}", []string{`r.json:2: invalid JSON: invalid character '}' looking for beginning of value`}},
		{"r.json", "{\"routes\": {\n\"GET /a\": \"key=a\"\n", []string{`r.json:2: invalid JSON: unexpected end of JSON input`}},
		{"r.json", "{\"routes\": {}}\n{}", []string{`r.json:2: invalid JSON: invalid character '{' after top-level value`}},
		{"r.json", "{\"routes\": {\n\"GET /a\": \"\xff\"}}", []string{`r.json:2: invalid UTF-8`}},
		{"r.json", `[]`, []string{`r.json:1: the table is a JSON array, not an object with a "routes" field`}},
		{"r.json", `"routes"`, []string{`r.json:1: the table is a JSON string, not an object with a "routes" field`}},
		{"r.json", "\n\n5", []string{`r.json:3: the table is a JSON number, not an object with a "routes" field`}},
		{"r.json", `null`, []string{`r.json:1: the table is a JSON null, not an object with a "routes" field`}},
		{"r.json", `{}`, []string{`r.json:1: no "routes" field`}},
		{"r.json", "{\n\"Routes\": {}}", []string{`r.json:1: no "routes" field`, `r.json:2: unknown field "Routes" (known: routes)`}},
		{"r.json", "{\"routes\": 1e999}", []string{`r.json:1: field "routes" is a JSON number, not an object`}},
		{"r.json", "{\"routes\": [{}]}", []string{`r.json:1: field "routes" is a JSON array, not an object`}},
		{"r.json", "{\"routes\": {},\n\"routes\": {\"GET /a\": 1}}", []string{`r.json:2: field "routes" is listed twice (first at line 1)`}},
		{"r.json", "{\"routes\": {\n" +
			"\"GET /a\": 1e999,\n\"GET /b\": true,\n\"GET /c\": null,\n\"GET /d\": {\"x\": [1]},\n\"GET /e\": [\"key=a\"],\n" +
			"\"GET /f\": \"key=f\"}}", []string{
			`r.json:2: GET /a: spec is a JSON number, not a string`,
			`r.json:3: GET /b: spec is a JSON boolean, not a string`,
			`r.json:4: GET /c: spec is a JSON null, not a string`,
			`r.json:5: GET /d: spec is a JSON object, not a string`,
			`r.json:6: GET /e: spec is a JSON array, not a string`,
		}},
		{"r.json", "{\"routes\": {\"\": \"key=a\", \"GET\": \"key=a\", \"/a\": \"key=a\"}}", []string{
			`r.json:1: route "": empty route (want "METHOD /path", such as "POST /skus/{id}/deduct")`,
			`r.json:1: route "GET": no path (want "METHOD /path", such as "POST /skus/{id}/deduct")`,
			`r.json:1: route "/a": no method (want "METHOD /path", such as "POST /skus/{id}/deduct")`,
		}},
		{"r.json", "{\"routes\": {\"GET /a\": \"\"}}", []string{`r.json:1: GET /a: spec column 1: no key (such as key=sku:<id>)`}},
		{"r.json", "{\"routes\": {\"FETCH  /a\": \"wait=1s\"}}", []string{
			`r.json:1: route "FETCH  /a": unknown method "FETCH" (want GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, CONNECT, TRACE)`,
			`r.json:1: FETCH /a: spec column 1: no key (such as key=sku:<id>)`,
		}},

		// YAML.
		{"r.yaml", "", []string{`r.yaml:1: no "routes" field`}},
		{"r.yaml", "# nothing\n", []string{`r.yaml:1: no "routes" field`}},
		{"r.yaml", "routes:\n  GET /a: \"key=a\n", []string{`r.yaml:2: invalid YAML: could not find end character of double-quoted text`}},
		{"r.yaml", "routes:\n\tGET /a: key=a\n", []string{"r.yaml:2: invalid YAML: found character '\t' that cannot start any token"}},
		{"r.yaml", "routes:\n  POST /a: @lock key=a\n", []string{`r.yaml:2: invalid YAML: '@' is a reserved character (quote a spec that starts with @lock: "@lock key=...")`}},
		{"r.yaml", "routes:\n  GET /a: \"\xff\"\n", []string{`r.yaml:2: invalid UTF-8`}},
		{"r.yaml", "routes: {}\n---\nroutes: {}\n", []string{`r.yaml:3: more than one YAML document`}},
		{"r.yaml", "- routes\n", []string{`r.yaml:1: the table is a YAML sequence, not a mapping with a "routes" field`}},
		{"r.yaml", "routes\n", []string{`r.yaml:1: the table is a YAML string, not a mapping with a "routes" field`}},
		{"r.yaml", "routes:\n", []string{`r.yaml:1: field "routes" is a YAML null, not a mapping`}},
		{"r.yaml", "routes: [a]\n", []string{`r.yaml:1: field "routes" is a YAML sequence, not a mapping`}},
		{"r.yaml", "routes: {}\nroutes:\n  GET /a: 1\n", []string{`r.yaml:2: field "routes" is listed twice (first at line 1)`}},
		{"r.yaml", "route: {}\n1: {}\n", []string{
			`r.yaml:1: unknown field "route" (known: routes)`,
			`r.yaml:1: no "routes" field`,
			`r.yaml:2: unknown field "1" (known: routes)`,
		}},
		{"r.yaml", "routes:\n" +
			"  GET /a: 1\n  GET /b: true\n  GET /c:\n  GET /d: {x: 1}\n  GET /e: [key=a]\n" +
			"  GET /f: &x key=a\n  GET /g: *x\n  GET /h: !!str key=a\n  GET /i: key=a\n", []string{
			`r.yaml:2: GET /a: spec is a YAML number, not a string`,
			`r.yaml:3: GET /b: spec is a YAML boolean, not a string`,
			`r.yaml:4: GET /c: spec is a YAML null, not a string`,
			`r.yaml:5: GET /d: spec is a YAML mapping, not a string`,
			`r.yaml:6: GET /e: spec is a YAML sequence, not a string`,
			`r.yaml:7: GET /f: spec is a YAML anchor, not a string`,
			`r.yaml:8: GET /g: spec is a YAML alias, not a string`,
			`r.yaml:9: GET /h: spec is a YAML tagged value, not a string`,
		}},
		{"r.yaml", "routes:\n  12: key=a\n  true: key=b\n  ? GET /a\n  : key=c\n", []string{
			`r.yaml:2: route is a YAML number, not a string such as "POST /skus/{id}/deduct"`,
			`r.yaml:3: route is a YAML boolean, not a string such as "POST /skus/{id}/deduct"`,
			`r.yaml:4: route is a YAML complex key, not a string such as "POST /skus/{id}/deduct"`,
		}},
		{"r.yaml", "routes:\n  GET /a: \"@lock key=a wait=2x\"\n  GET /b: key=<b\n", []string{
			`r.yaml:2: GET /a: spec column 13: wait: "2x" is not a duration (such as 2s or 500ms)`,
			`r.yaml:3: GET /b: spec column 1: key: keyfunc: invalid template: "<b": unclosed placeholder at offset 0`,
		}},

		// Router syntax in a key.
		{"r.yaml", "routes:\n  GET /a: key=a\n  POST /acct/{id}: key=acct:{id}\n", []string{
			`r.yaml:3: POST /acct/{id}: spec column 1: key: keyfunc: invalid template: "acct:{id}": router syntax {id} at offset 5 (write <id> for a path parameter, or \{id} for literal text)`,
		}},
		{"r.yml", "routes:\n  POST /acct/:id: '@lock key=acct::id'\n", []string{
			`r.yml:2: POST /acct/:id: spec column 7: key: keyfunc: invalid template: "acct::id": router syntax :id at offset 5 (write <id> for a path parameter, or \:id for literal text)`,
		}},
		{"r.json", "{\"routes\": {\n\"POST /acct/{id}\": \"key=acct:{id}\"}}", []string{
			`r.json:2: POST /acct/{id}: spec column 1: key: keyfunc: invalid template: "acct:{id}": router syntax {id} at offset 5 (write <id> for a path parameter, or \{id} for literal text)`,
		}},
	} {
		specs, err := routetable.Parse(tc.name, []byte(tc.data))
		if specs != nil {
			t.Errorf("Parse(%s, %q) returned entries with an error", tc.name, tc.data)
		}
		checkErrors(t, tc.name+" "+strings.ReplaceAll(tc.data, "\n", `\n`), err, tc.want...)
	}
}

func TestParseKeepsCauses(t *testing.T) {
	for _, spec := range []string{"key=<b", "key=acct:{id}"} {
		_, err := routetable.Parse("r.yaml", []byte("routes:\n  GET /a/{id}: "+spec+"\n"))
		if !errors.Is(err, keyfunc.ErrSyntax) {
			t.Errorf("%s: error %v does not wrap keyfunc.ErrSyntax", spec, err)
		}
		_, err = routetable.ParseEntry("GET /a/{id}", spec, "main.go:12")
		if !errors.Is(err, keyfunc.ErrSyntax) || !strings.HasPrefix(err.Error(), invalid+"main.go:12: GET /a/{id}: spec column 1: key: ") {
			t.Errorf("ParseEntry(%s): error %v does not wrap keyfunc.ErrSyntax or name the entry", spec, err)
		}
	}
}

// TestParseRouteTableDuplicates checks that routes differing only in
// parameter names or their spelling are one route, and that others are not.
func TestParseDuplicates(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want string // "" when a and b are different routes
	}{
		{"POST /skus/{id}/deduct", "POST /skus/{id}/deduct", "POST /skus/{id}/deduct is listed twice (first at line 2)"},
		{"POST /skus/{id}/deduct", "POST  /skus/{id}/deduct", "POST /skus/{id}/deduct is listed twice (first at line 2)"},
		{"POST /skus/{id}/deduct", "POST /skus/{sku}/deduct", "POST /skus/{sku}/deduct is listed twice (first at line 2 as POST /skus/{id}/deduct)"},
		{"POST /skus/{id}/deduct", "POST /skus/:id/deduct", "POST /skus/:id/deduct is listed twice (first at line 2 as POST /skus/{id}/deduct)"},
		{"POST /skus/:sku/deduct", "POST /skus/{id}/deduct", "POST /skus/{id}/deduct is listed twice (first at line 2 as POST /skus/:sku/deduct)"},
		{"GET /files/*path", "GET /files/{rest...}", "GET /files/{rest...} is listed twice (first at line 2 as GET /files/*path)"},
		{"GET /a/{x}/b/{y}", "GET /a/:y/b/:x", "GET /a/:y/b/:x is listed twice (first at line 2 as GET /a/{x}/b/{y})"},
		{"GET /a/{$}", "GET /a/{$}", "GET /a/{$} is listed twice (first at line 2)"},
		{"GET /a/{id}", "HEAD /a/{id}", ""},
		{"GET /a/{id}", "GET /a/{id...}", ""},
		{"GET /a/{id}", "GET /a/id", ""},
		{"GET /a/", "GET /a", ""},
		{"GET /a/", "GET /a/{$}", ""},
		{"GET /a/:id", "GET /a/*id", ""},
	} {
		for _, format := range []string{"json", "yaml"} {
			var data string
			if format == "json" {
				data = "{\"routes\": {\n\"" + tc.a + "\": \"key=a\",\n\"" + tc.b + "\": \"key=b\"}}\n"
			} else {
				data = "routes:\n  " + tc.a + ": key=a\n  " + tc.b + ": key=b\n"
			}
			name := "r." + format
			specs, err := routetable.Parse(name, []byte(data))
			if tc.want == "" {
				if err != nil || len(specs) != 2 {
					t.Errorf("%s: %q and %q: %d entries, error %v; want two entries", format, tc.a, tc.b, len(specs), err)
				}
				continue
			}
			checkErrors(t, format+": "+tc.a+" and "+tc.b, err, name+":3: "+tc.want)
		}
	}
}

// TestCheck: Check returns the entries without problems, the entries with
// problems whose route parsed (not the second of a duplicate), and every
// problem with its line; CheckFile reads a file, and does not read one with
// an unsupported extension.
func TestCheck(t *testing.T) {
	data := "routes:\n" +
		"  POST /a/{id}: key=a:<id>\n" +
		"  PUT /b/{id}: key=b:<id> ttl=0\n" +
		"  post /c: key=c\n" +
		"  POST /a/:x: key=a:<x>\n" +
		"  GET /d: key=d\n"
	tb := routetable.Check("r.yaml", []byte(data))
	var got []string
	for _, e := range tb.Entries {
		got = append(got, e.Source+" "+e.Method+" "+e.Path)
	}
	for _, e := range tb.Broken {
		got = append(got, "broken "+e.Source+" "+e.Method+" "+e.Path+" "+e.Spec.Text)
	}
	for _, p := range tb.Problems {
		got = append(got, "problem "+itoa(p.Line)+" "+p.Where)
	}
	want := []string{
		"r.yaml:2 POST /a/{id}", "r.yaml:6 GET /d",
		"broken r.yaml:3 PUT /b/{id} key=b:<id> ttl=0",
		"problem 3 r.yaml:3", "problem 4 r.yaml:4", "problem 5 r.yaml:5",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Check:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if err := tb.Err(); !errors.Is(err, routetable.ErrInvalid) || len(strings.Split(err.Error(), "\n")) != 3 {
		t.Errorf("Err() = %v, want the three problems", err)
	}
	if err := routetable.Check("r.yaml", []byte("routes: {}\n")).Err(); err != nil {
		t.Errorf("Err() of an empty table = %v", err)
	}

	tb, err := routetable.CheckFile("testdata/routes.yaml")
	if err != nil || len(tb.Entries) != len(wantTable("")) || len(tb.Problems) != 0 {
		t.Errorf("CheckFile(routes.yaml) = %+v, %v", tb, err)
	}
	tb, err = routetable.CheckFile("testdata/missing.toml")
	if err != nil || len(tb.Problems) != 1 || tb.Problems[0].Line != 0 {
		t.Errorf("CheckFile(missing.toml) = %+v, %v; want only the extension's problem", tb, err)
	}
	if _, err := routetable.CheckFile("testdata/missing.yaml"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("CheckFile(missing.yaml) error = %v", err)
	}
}

// TestParseSharedAndLimited: a table takes the mode and limit fields in
// every route shape (net/http's {id}, gin and echo's :id), and a shared or
// limited entry that locks several keys is refused naming its line and
// route.
func TestParseSharedAndLimited(t *testing.T) {
	data := []byte(`routes:
  GET /reports/:id: "@lock key=report:<id> mode=shared"
  POST /reports/{id}/rebuild: "@lock key=report:<id> mode=exclusive watchdog"
  POST /exports: "@lock key=tenant:<header:X-Tenant> limit=3"
`)
	entries, err := routetable.Parse("routes.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]string, len(entries))
	for i, e := range entries {
		got[i] = fmt.Sprintf("%s %s shared=%t limit=%d", e.Method, e.Path, e.Spec.Shared, e.Spec.Limit)
	}
	want := []string{"GET /reports/{id} shared=true limit=0", "POST /reports/{id}/rebuild shared=false limit=0", "POST /exports shared=false limit=3"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("entries %q, want %q", got, want)
	}
	_, err = routetable.Parse("routes.json", []byte(`{"routes": {
  "GET /a/:id": "@lock key=a:<id> key=b mode=shared",
  "POST /b": "@lock key=b limit=0"
}}`))
	checkErrors(t, "Parse", err,
		`routes.json:2: GET /a/:id: spec column 24: mode: a shared or limited lock takes one key; this spec has 2 key templates`,
		`routes.json:3: POST /b: spec column 13: limit: "0" is below 1`)
}
