package middleware

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
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

// RouteSpec is one entry of a route table: a route and its lock spec.
type RouteSpec struct {
	// Method is the route's method, upper-case, such as "POST".
	Method string
	// Path is the route's path template in canonical form: parameters are
	// written {name}, or {name...} for the rest of the path (ServeMux's
	// {$} stays).
	Path string
	// Spec is the lock spec as written.
	Spec string
	// Config is the spec parsed by ParseSpec; fields the spec leaves out
	// are zero.
	Config Config
	// Source says where the entry comes from: "file:line" for a table file,
	// else the label the caller gave ParseRoute, such as "code".
	Source string
}

// specMethods are the methods a route may have.
var specMethods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace,
}

// ParseRoute parses one route table entry: route is "METHOD /path", such as
// "POST /skus/{id}/deduct", and spec a lock spec (see ParseSpec). Use it for
// tables written in code; source labels the entry in errors and in
// RouteSpec.Source.
//
// The method is one of GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, CONNECT
// and TRACE, in upper case. The path starts with "/"; a parameter is a
// whole segment written {name}, :name (gin, echo), {name...} or *name (the
// rest of the path, last segment only), and names are Go identifiers.
// :name and *name become {name} and {name...} in RouteSpec.Path.
//
// It returns every problem of the route and of the spec, joined, each
// wrapping ErrInvalidConfig and prefixed with source when it is not empty:
//
//	reqlock/middleware: invalid configuration: code: POST /skus/{id}: spec column 14: unknown field "wiat" (known: ...)
func ParseRoute(route, spec, source string) (RouteSpec, error) {
	rs, _, problems := parseRouteEntry(route, spec)
	if len(problems) > 0 {
		errs := make([]error, len(problems))
		for i, p := range problems {
			errs[i] = p.at(source)
		}
		return RouteSpec{}, errors.Join(errs...)
	}
	rs.Source = source
	return rs, nil
}

// routeProblem is a problem of one entry, before its source is known.
type routeProblem struct {
	msg   string
	cause error
}

func (p routeProblem) at(source string) error {
	return &configError{where: source, msg: p.msg, cause: p.cause}
}

// parseRouteEntry parses route and spec, and returns the route's shape (its
// method and path with parameter names blanked, "" when the route does not
// parse) and every problem.
func parseRouteEntry(route, spec string) (RouteSpec, string, []routeProblem) {
	var problems []routeProblem
	rs := RouteSpec{Spec: spec}
	method, path, shape, problem := parseRouteText(route)
	if problem != "" {
		problems = append(problems, routeProblem{msg: fmt.Sprintf("route %q: %s", route, problem)})
	}
	rs.Method, rs.Path = method, path
	cfg, err := parseSpec(spec)
	if err != nil {
		problems = append(problems, routeProblem{msg: routeLabel(route) + ": " + err.detail(), cause: err.cause})
	}
	rs.Config = cfg
	return rs, shape, problems
}

// routeLabel is route as written, with runs of whitespace made one space.
func routeLabel(route string) string { return strings.Join(strings.Fields(route), " ") }

// parseRouteText parses "METHOD /path" and returns the method, the canonical
// path and the route's shape, or the first problem.
func parseRouteText(route string) (method, path, shape, problem string) {
	want := `want "METHOD /path", such as "POST /skus/{id}/deduct"`
	words := strings.Fields(route)
	switch {
	case len(words) == 0:
		return "", "", "", "empty route (" + want + ")"
	case len(words) == 1 && strings.HasPrefix(words[0], "/"):
		return "", "", "", "no method (" + want + ")"
	case len(words) == 1:
		return "", "", "", "no path (" + want + ")"
	case len(words) > 2:
		return "", "", "", fmt.Sprintf("%d words (%s)", len(words), want)
	}
	method = words[0]
	if !slices.Contains(specMethods, method) {
		if up := strings.ToUpper(method); slices.Contains(specMethods, up) {
			return "", "", "", fmt.Sprintf("method %q is not upper-case (write %s)", method, up)
		}
		return "", "", "", fmt.Sprintf("unknown method %q (want %s)", method, strings.Join(specMethods, ", "))
	}
	path, shape, problem = canonicalRoutePath(words[1])
	if problem != "" {
		return "", "", "", problem
	}
	return method, path, method + " " + shape, ""
}

// canonicalRoutePath checks a route's path, writes its parameters {name}
// and {name...}, and returns it with its shape, where parameter names are
// blanked: {} and {...}.
func canonicalRoutePath(path string) (canonical, shape, problem string) {
	if !strings.HasPrefix(path, "/") {
		return "", "", fmt.Sprintf("path %q does not start with \"/\"", path)
	}
	segs := strings.Split(path[1:], "/")
	out := make([]string, len(segs))
	shapes := make([]string, len(segs))
	seen := map[string]bool{}
	for i, seg := range segs {
		last := i == len(segs)-1
		name, rest := "", false
		switch {
		case strings.HasPrefix(seg, ":"):
			name = seg[1:]
		case strings.HasPrefix(seg, "*"):
			name, rest = seg[1:], true
			if name == "" {
				return "", "", fmt.Sprintf("segment %q: a wildcard needs a name, such as *path", seg)
			}
		case seg == "{$}":
			if !last {
				return "", "", "{$} must be the last segment"
			}
			out[i], shapes[i] = seg, seg
			continue
		case strings.HasPrefix(seg, "{"):
			if !strings.HasSuffix(seg, "}") {
				return "", "", fmt.Sprintf("segment %q: a parameter must be a whole segment, such as {id}", seg)
			}
			name = seg[1 : len(seg)-1]
			name, rest = strings.CutSuffix(name, "...")
		default:
			for _, r := range seg {
				switch {
				case r == '{' || r == '}':
					return "", "", fmt.Sprintf("segment %q: a parameter must be a whole segment, such as {id}", seg)
				case r < ' ' || r == 0x7f:
					return "", "", fmt.Sprintf("segment %q: control character %U", seg, r)
				}
			}
			out[i], shapes[i] = seg, seg
			continue
		}
		switch {
		case name == "":
			return "", "", fmt.Sprintf("segment %q: empty parameter name", seg)
		case !isIdentifier(name):
			return "", "", fmt.Sprintf("segment %q: parameter name %q is not a Go identifier", seg, name)
		case rest && !last:
			return "", "", fmt.Sprintf("segment %q: a rest-of-path parameter must be the last segment", seg)
		case seen[name]:
			return "", "", fmt.Sprintf("parameter %q appears twice", name)
		}
		seen[name] = true
		if rest {
			out[i], shapes[i] = "{"+name+"...}", "{...}"
		} else {
			out[i], shapes[i] = "{"+name+"}", "{}"
		}
	}
	return "/" + strings.Join(out, "/"), "/" + strings.Join(shapes, "/"), ""
}

// isIdentifier reports whether s is an ASCII Go identifier.
func isIdentifier(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		letter := c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
		if !letter && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return s != ""
}

// LoadRouteTable reads the route table file at path; see ParseRouteTable.
// The format follows the extension: .json, .yaml or .yml.
func LoadRouteTable(path string) ([]RouteSpec, error) {
	if _, err := tableFormat(path); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reqlock/middleware: read route table: %w", err)
	}
	return ParseRouteTable(path, data)
}

// ParseRouteTable parses a route table: data is JSON when name ends in
// .json, YAML when it ends in .yaml or .yml. The table maps routes, as
// ParseRoute takes them, to lock specs:
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
// It checks the whole table and returns every problem, joined, each
// wrapping ErrInvalidConfig and prefixed with "name:line": a syntax error
// or invalid UTF-8 (which stops the check), a field other than routes, a
// spec that is not a string, an invalid route or spec, and a route listed
// twice, where routes that differ only in parameter names, such as
// /skus/{id} and /skus/:sku, are the same. YAML anchors, aliases and tags
// are not supported.
func ParseRouteTable(name string, data []byte) ([]RouteSpec, error) {
	if _, err := tableFormat(name); err != nil {
		return nil, err
	}
	t := parseTable(name, data)
	if len(t.problems) > 0 {
		errs := make([]error, len(t.problems))
		for i, p := range t.problems {
			errs[i] = p.err
		}
		return nil, errors.Join(errs...)
	}
	return t.specs, nil
}

// parseTable parses the table data, whose name has a supported extension,
// and returns the parser: its entries without problems, their lines, every
// problem sorted by line, and the entries with problems whose route parsed.
func parseTable(name string, data []byte) *tableParser {
	format, _ := tableFormat(name)
	t := &tableParser{name: name, data: data}
	if off := invalidUTF8(data); off >= 0 {
		t.fail(t.lineAt(off), "invalid UTF-8")
	} else if format == "json" {
		t.parseJSON()
	} else {
		t.parseYAML()
	}
	t.check()
	slices.SortStableFunc(t.problems, func(a, b tableProblem) int { return a.line - b.line })
	return t
}

// tableFormat returns "json" or "yaml" by name's extension.
func tableFormat(name string) (string, error) {
	switch ext := filepath.Ext(name); strings.ToLower(ext) {
	case ".json":
		return "json", nil
	case ".yaml", ".yml":
		return "yaml", nil
	default:
		return "", &configError{where: name, msg: fmt.Sprintf("unsupported route table extension %q (want .json, .yaml or .yml)", ext)}
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

// tableParser holds the state of one ParseRouteTable.
type tableParser struct {
	name     string
	data     []byte
	entries  []tableEntry
	problems []tableProblem
	specs    []RouteSpec
	lines    []int         // of specs
	broken   []brokenEntry // entries with problems whose route parsed
}

// brokenEntry is an entry with a problem, not a duplicate, whose route
// parsed: its route can still be matched against a router's.
type brokenEntry struct {
	spec RouteSpec
	line int
}

// tableEntry is one route of the table, as read from the file.
type tableEntry struct {
	line      int
	route     string
	routeKind string // "" when the route is a string, else its kind
	spec      string
	specKind  string // "" when the spec is a string, else its kind
}

type tableProblem struct {
	line int
	err  error
}

func (t *tableParser) source(line int) string { return t.name + ":" + strconv.Itoa(line) }

func (t *tableParser) fail(line int, format string, args ...any) {
	t.problems = append(t.problems, tableProblem{line, &configError{where: t.source(line), msg: fmt.Sprintf(format, args...)}})
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
	for _, e := range t.entries {
		src := t.source(e.line)
		if e.routeKind != "" {
			t.fail(e.line, "route is a %s, not a string such as \"POST /skus/{id}/deduct\"", e.routeKind)
			continue
		}
		label := routeLabel(e.route)
		var rs RouteSpec
		var shape string
		var problems []routeProblem
		if e.specKind != "" {
			var problem string
			if _, _, shape, problem = parseRouteText(e.route); problem != "" {
				problems = append(problems, routeProblem{msg: fmt.Sprintf("route %q: %s", e.route, problem)})
			}
			problems = append(problems, routeProblem{msg: fmt.Sprintf("%s: spec is a %s, not a string", label, e.specKind)})
		} else {
			rs, shape, problems = parseRouteEntry(e.route, e.spec)
		}
		dup := false
		if shape != "" {
			if f, ok := seen[shape]; ok {
				as := ""
				if f.label != label {
					as = " as " + f.label
				}
				problems = append(problems, routeProblem{msg: fmt.Sprintf("%s is listed twice (first at line %d%s)", label, f.line, as)})
				dup = true
			} else {
				seen[shape] = first{e.line, label}
			}
		}
		for _, p := range problems {
			t.problems = append(t.problems, tableProblem{e.line, p.at(src)})
		}
		rs.Source = src
		switch {
		case len(problems) == 0:
			t.specs = append(t.specs, rs)
			t.lines = append(t.lines, e.line)
		case shape != "" && !dup:
			method, path, _, _ := parseRouteText(e.route)
			t.broken = append(t.broken, brokenEntry{RouteSpec{Method: method, Path: path, Spec: e.spec, Source: src}, e.line})
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
