package routetable

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"
)

// Load reads the route table file at path; see Parse. The format follows
// the extension: .json, .yaml or .yml. A file it cannot read is an error
// that wraps the read error but not ErrInvalid.
func Load(path string) ([]Entry, error) {
	t, err := CheckFile(path)
	if err != nil {
		return nil, fmt.Errorf("reqlock/routetable: read route table: %w", err)
	}
	if err := t.Err(); err != nil {
		return nil, err
	}
	return t.Entries, nil
}

// Parse parses a route table: data is JSON when name ends in .json, YAML
// when it ends in .yaml or .yml. The table maps routes, as ParseEntry takes
// them, to lock specs:
//
//	{"routes": {"POST /skus/{id}/deduct": "@lock key=sku:<id> wait=2s"}}
//
//	routes:
//	  POST /skus/{id}/deduct: "@lock key=sku:<id> wait=2s"
//
// The entries come back in file order, each with Source "name:line". A key
// template's backslash escape (keyfunc's \{ for a literal brace) is written
// as is in a YAML plain or single-quoted scalar and doubled in a JSON or YAML
// double-quoted string: "key=\\{stock}:<id>".
//
// It checks the whole table and returns every problem, joined, each an
// *Error wrapping ErrInvalid and prefixed with "name:line": a syntax error
// or invalid UTF-8 (which stops the check), a field other than routes, a
// spec that is not a string, an invalid route or spec, and a route listed
// twice, where routes that differ only in parameter names, such as
// /skus/{id} and /skus/:sku, are the same. YAML anchors, aliases and tags
// are not supported.
func Parse(name string, data []byte) ([]Entry, error) {
	t := Check(name, data)
	if err := t.Err(); err != nil {
		return nil, err
	}
	return t.Entries, nil
}

// Table is what Check found in a route table: its entries with and without
// problems, and every problem.
type Table struct {
	// Entries are the entries without problems, in file order.
	Entries []Entry
	// Broken are the entries with a problem whose route parsed, other than
	// the second of a route listed twice, in file order: a router's routes
	// can still be checked against them. Their Spec holds only its Text.
	Broken []Entry
	// Problems are the problems of the table, in line order; a problem of
	// the whole file (its extension) has Line 0.
	Problems []*Error
}

// Err returns the table's problems joined, or nil.
func (t Table) Err() error {
	if len(t.Problems) == 0 {
		return nil
	}
	errs := make([]error, len(t.Problems))
	for i, p := range t.Problems {
		errs[i] = p
	}
	return errors.Join(errs...)
}

// Check parses a route table as Parse does, but never fails: it returns
// what it found, problems included, so that a caller can report them
// together with problems of its own (middleware.LoadRoutesDeferred).
func Check(name string, data []byte) Table {
	format, err := tableFormat(name)
	if err != nil {
		return Table{Problems: []*Error{err}}
	}
	t := &tableParser{name: name, data: data}
	if off := invalidUTF8(data); off >= 0 {
		t.fail(t.lineAt(off), "invalid UTF-8")
	} else if format == "json" {
		t.parseJSON()
	} else {
		t.parseYAML()
	}
	t.check()
	slices.SortStableFunc(t.table.Problems, func(a, b *Error) int { return a.Line - b.Line })
	return t.table
}

// CheckFile is Check for the table file at path. Its error is os.ReadFile's;
// a file with an unsupported extension is not read.
func CheckFile(path string) (Table, error) {
	if _, err := tableFormat(path); err != nil {
		return Table{Problems: []*Error{err}}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return Table{}, err
	}
	return Check(path, data), nil
}

// tableFormat returns "json" or "yaml" by name's extension.
func tableFormat(name string) (string, *Error) {
	switch ext := filepath.Ext(name); strings.ToLower(ext) {
	case ".json":
		return "json", nil
	case ".yaml", ".yml":
		return "yaml", nil
	default:
		return "", &Error{Where: name, Problem: fmt.Sprintf("unsupported route table extension %q (want .json, .yaml or .yml)", ext)}
	}
}

// invalidUTF8 returns the offset of the first byte of data that is not
// valid UTF-8, or -1.
func invalidUTF8(data []byte) int {
	for off := 0; off < len(data); {
		r, size := utf8.DecodeRune(data[off:])
		if r == utf8.RuneError && size == 1 {
			return off
		}
		off += size
	}
	return -1
}

// tableParser holds the state of one Check.
type tableParser struct {
	name    string
	data    []byte
	entries []tableEntry
	table   Table
}

// tableEntry is one route of the table, as read from the file.
type tableEntry struct {
	line      int
	route     string
	routeKind string // "" when the route is a string, else its kind
	spec      string
	specKind  string // "" when the spec is a string, else its kind
}

func (t *tableParser) source(line int) string { return t.name + ":" + strconv.Itoa(line) }

func (t *tableParser) fail(line int, format string, args ...any) {
	t.table.Problems = append(t.table.Problems, &Error{Where: t.source(line), Line: line, Problem: fmt.Sprintf(format, args...)})
}

// lineAt is the 1-based line of data[off].
func (t *tableParser) lineAt(off int) int {
	off = min(max(off, 0), len(t.data))
	return 1 + bytes.Count(t.data[:off], []byte("\n"))
}

// check parses every entry and reports its problems and duplicates.
func (t *tableParser) check() {
	type first struct {
		line  int
		label string
	}
	seen := map[string]first{}
	for _, te := range t.entries {
		src := t.source(te.line)
		if te.routeKind != "" {
			t.fail(te.line, "route is a %s, not a string such as \"POST /skus/{id}/deduct\"", te.routeKind)
			continue
		}
		label := routeLabel(te.route)
		var e Entry
		var problems []routeProblem
		if te.specKind != "" {
			var problem string
			if e.Method, e.Path, problem = parseRoute(te.route); problem != "" {
				problems = append(problems, routeProblem{msg: fmt.Sprintf("route %q: %s", te.route, problem)})
			}
			problems = append(problems, routeProblem{msg: fmt.Sprintf("%s: spec is a %s, not a string", label, te.specKind)})
		} else {
			e, problems = parseEntry(te.route, te.spec)
		}
		dup := false
		if e.Method != "" {
			shape := e.Method + " " + PathShape(e.Path)
			if f, ok := seen[shape]; ok {
				as := ""
				if f.label != label {
					as = " as " + f.label
				}
				problems = append(problems, routeProblem{msg: fmt.Sprintf("%s is listed twice (first at line %d%s)", label, f.line, as)})
				dup = true
			} else {
				seen[shape] = first{te.line, label}
			}
		}
		for _, p := range problems {
			t.table.Problems = append(t.table.Problems, p.at(src, te.line))
		}
		e.Source, e.Line = src, te.line
		switch {
		case len(problems) == 0:
			t.table.Entries = append(t.table.Entries, e)
		case e.Method != "" && !dup:
			e.Spec = Spec{Text: te.spec}
			t.table.Broken = append(t.table.Broken, e)
		}
	}
}

// parseJSON reads {"routes": {ROUTE: SPEC, ...}} into t.entries.
func (t *tableParser) parseJSON() {
	// Unmarshal checks the syntax of the whole file, with the offset of an
	// error; the Decoder's offsets are unreliable after an error.
	if err := json.Unmarshal(t.data, new(json.RawMessage)); err != nil {
		var se *json.SyntaxError
		line := 1
		if errors.As(err, &se) {
			line = t.lineAt(int(se.Offset) - 1)
		}
		msg := strings.TrimPrefix(err.Error(), "json: ")
		if len(bytes.TrimSpace(t.data)) == 0 {
			line, msg = 1, "empty file"
		}
		t.fail(line, "invalid JSON: %s", msg)
		return
	}
	dec := json.NewDecoder(bytes.NewReader(t.data))
	dec.UseNumber() // so that no number fails to decode
	// Every token of a valid JSON text ends on the line it starts on.
	line := func() int { return t.lineAt(int(dec.InputOffset()) - 1) }
	tok, _ := dec.Token()
	if tok != json.Delim('{') {
		t.fail(line(), "the table is a JSON %s, not an object with a \"routes\" field", jsonKind(tok))
		return
	}
	routesLine := 0
	for dec.More() {
		key, _ := dec.Token()
		field, _ := key.(string)
		keyLine := line()
		tok, _ := dec.Token()
		switch {
		case field != "routes":
			t.fail(keyLine, "unknown field %q (known: routes)", field)
		case routesLine != 0:
			t.fail(keyLine, "field \"routes\" is listed twice (first at line %d)", routesLine)
		case tok != json.Delim('{'):
			routesLine = keyLine
			t.fail(keyLine, "field \"routes\" is a JSON %s, not an object", jsonKind(tok))
		default:
			routesLine = keyLine
			t.parseJSONRoutes(dec, line)
			continue
		}
		skipJSON(dec, tok)
	}
	if routesLine == 0 {
		t.fail(1, "no \"routes\" field")
	}
}

// parseJSONRoutes reads the entries of the routes object, whose '{' dec has
// just read, up to its '}'.
func (t *tableParser) parseJSONRoutes(dec *json.Decoder, line func() int) {
	for dec.More() {
		key, _ := dec.Token()
		route, _ := key.(string)
		e := tableEntry{line: line(), route: route}
		tok, _ := dec.Token()
		if s, ok := tok.(string); ok {
			e.spec = s
		} else {
			e.specKind = "JSON " + jsonKind(tok)
			skipJSON(dec, tok)
		}
		t.entries = append(t.entries, e)
	}
	dec.Token() // '}'
}

// skipJSON reads the rest of the value that starts with tok.
func skipJSON(dec *json.Decoder, tok json.Token) {
	for depth := 0; ; tok, _ = dec.Token() {
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if depth <= 0 {
			return
		}
	}
}

// jsonKind names the kind of the value that starts with tok.
func jsonKind(tok json.Token) string {
	switch tok.(type) {
	case json.Delim:
		if tok == json.Delim('[') {
			return "array"
		}
		return "object"
	case string:
		return "string"
	case json.Number, float64:
		return "number"
	case bool:
		return "boolean"
	}
	return "null"
}

// yamlError is the error interface of goccy/go-yaml's parser errors.
type yamlError interface {
	GetToken() *token.Token
	GetMessage() string
}

// parseYAML reads a document "routes: {ROUTE: SPEC, ...}" into t.entries.
func (t *tableParser) parseYAML() {
	// Duplicate keys are reported by check, naming both lines.
	file, err := parser.ParseBytes(t.data, 0, parser.AllowDuplicateMapKey())
	if err != nil {
		var ye yamlError
		if errors.As(err, &ye) && ye.GetToken() != nil && ye.GetToken().Position != nil {
			msg := ye.GetMessage()
			if strings.Contains(msg, "'@' is a reserved character") {
				msg += ` (quote a spec that starts with @lock: "@lock key=...")`
			}
			t.fail(ye.GetToken().Position.Line, "invalid YAML: %s", msg)
		} else {
			t.fail(1, "invalid YAML: %v", err)
		}
		return
	}
	var docs []*ast.DocumentNode
	for _, d := range file.Docs {
		if d != nil && d.Body != nil {
			docs = append(docs, d)
		}
	}
	if len(docs) == 0 {
		t.fail(1, "no \"routes\" field")
		return
	}
	if len(docs) > 1 {
		t.fail(yamlLine(docs[1].Body), "more than one YAML document")
		return
	}
	top := yamlMapping(docs[0].Body)
	if top == nil {
		t.fail(yamlLine(docs[0].Body), "the table is a %s, not a mapping with a \"routes\" field", yamlKind(docs[0].Body))
		return
	}
	routesLine := 0
	for _, mv := range top {
		keyLine := yamlLine(mv.Key)
		key, ok := mv.Key.(*ast.StringNode)
		switch {
		case !ok || key.Value != "routes":
			name := mv.Key.String()
			if ok {
				name = key.Value
			}
			t.fail(keyLine, "unknown field %q (known: routes)", name)
		case routesLine != 0:
			t.fail(keyLine, "field \"routes\" is listed twice (first at line %d)", routesLine)
		default:
			routesLine = keyLine
			routes := yamlMapping(mv.Value)
			if routes == nil {
				t.fail(keyLine, "field \"routes\" is a %s, not a mapping", yamlKind(mv.Value))
				continue
			}
			for _, r := range routes {
				e := tableEntry{line: yamlLine(r.Key)}
				if s, ok := r.Key.(*ast.StringNode); ok {
					e.route = s.Value
				} else {
					e.routeKind = yamlKind(r.Key)
				}
				e.spec, e.specKind = yamlString(r.Value)
				t.entries = append(t.entries, e)
			}
		}
	}
	if routesLine == 0 {
		t.fail(1, "no \"routes\" field")
	}
}

// yamlMapping returns the entries of a mapping node, or nil when n is not
// a mapping. A mapping without entries gives an empty, non-nil slice.
func yamlMapping(n ast.Node) []*ast.MappingValueNode {
	switch m := n.(type) {
	case *ast.MappingNode:
		if m.Values == nil {
			return []*ast.MappingValueNode{}
		}
		return m.Values
	case *ast.MappingValueNode:
		return []*ast.MappingValueNode{m}
	}
	return nil
}

// yamlString returns the value of a string node, or the kind of another.
func yamlString(n ast.Node) (value, kind string) {
	switch s := n.(type) {
	case *ast.StringNode:
		return s.Value, ""
	case *ast.LiteralNode:
		return s.Value.Value, ""
	}
	return "", yamlKind(n)
}

// yamlKind names the kind of node n, such as "YAML number".
func yamlKind(n ast.Node) string {
	if n == nil {
		return "YAML null"
	}
	switch n.Type() {
	case ast.StringType, ast.LiteralType:
		return "YAML string"
	case ast.NullType:
		return "YAML null"
	case ast.BoolType:
		return "YAML boolean"
	case ast.IntegerType, ast.FloatType, ast.InfinityType, ast.NanType:
		return "YAML number"
	case ast.MappingType, ast.MappingValueType:
		return "YAML mapping"
	case ast.SequenceType:
		return "YAML sequence"
	case ast.AnchorType:
		return "YAML anchor"
	case ast.AliasType:
		return "YAML alias"
	case ast.TagType:
		return "YAML tagged value"
	case ast.MappingKeyType:
		return "YAML complex key"
	}
	return "YAML " + strings.ToLower(n.Type().String())
}

// yamlLine is the line of node n's token, or 1.
func yamlLine(n ast.Node) int {
	if n != nil {
		if tk := n.GetToken(); tk != nil && tk.Position != nil && tk.Position.Line > 0 {
			return tk.Position.Line
		}
	}
	return 1
}
