package routetable

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// Entry is one entry of a route table: a route and its lock spec.
type Entry struct {
	// Method is the route's method, upper-case, such as "POST".
	Method string
	// Path is the route's path template in canonical form: parameters are
	// written {name}, or {name...} for the rest of the path (ServeMux's
	// {$} stays).
	Path string
	// Spec is the route's lock spec, parsed.
	Spec Spec
	// Source says where the entry comes from: "file:line" for a table file,
	// else the label the caller gave ParseEntry, such as "code".
	Source string
	// Line is the entry's line in its table file, or 0.
	Line int
}

// methods are the methods a route may have.
var methods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace,
}

// ParseEntry parses one route table entry: route is "METHOD /path", such as
// "POST /skus/{id}/deduct", and spec a lock spec (see ParseSpec). Use it for
// tables written in code; source labels the entry in errors and in
// Entry.Source.
//
// The method is one of GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, CONNECT
// and TRACE, in upper case. The path starts with "/"; a parameter is a
// whole segment written {name}, :name (gin, echo), {name...} or *name (the
// rest of the path, last segment only), and names are Go identifiers.
// :name and *name become {name} and {name...} in Entry.Path.
//
// It returns every problem of the route and of the spec, joined, each an
// *Error wrapping ErrInvalid and prefixed with source when it is not empty:
//
//	reqlock/routetable: invalid configuration: code: POST /skus/{id}: spec column 14: unknown field "wiat" (known: ...)
func ParseEntry(route, spec, source string) (Entry, error) {
	e, problems := parseEntry(route, spec)
	if len(problems) > 0 {
		errs := make([]error, len(problems))
		for i, p := range problems {
			errs[i] = p.at(source, 0)
		}
		return Entry{}, errors.Join(errs...)
	}
	e.Source = source
	return e, nil
}

// routeProblem is a problem of one entry, before its source is known.
type routeProblem struct {
	msg   string
	cause error
}

func (p routeProblem) at(source string, line int) *Error {
	return &Error{Where: source, Line: line, Problem: p.msg, Err: p.cause}
}

// parseEntry parses route and spec, and returns the entry (its Method and
// Path empty when the route does not parse) and every problem.
func parseEntry(route, spec string) (Entry, []routeProblem) {
	var problems []routeProblem
	var e Entry
	method, path, problem := parseRoute(route)
	if problem != "" {
		problems = append(problems, routeProblem{msg: fmt.Sprintf("route %q: %s", route, problem)})
	}
	e.Method, e.Path = method, path
	s, err := parseSpec(spec)
	if err != nil {
		problems = append(problems, routeProblem{msg: routeLabel(route) + ": " + err.Detail(), cause: err.Err})
	}
	e.Spec = s
	return e, problems
}

// routeLabel is route as written, with runs of whitespace made one space.
func routeLabel(route string) string { return strings.Join(strings.Fields(route), " ") }

// parseRoute parses "METHOD /path" and returns the method and the canonical
// path, or the first problem.
func parseRoute(route string) (method, path, problem string) {
	want := `want "METHOD /path", such as "POST /skus/{id}/deduct"`
	words := strings.Fields(route)
	switch {
	case len(words) == 0:
		return "", "", "empty route (" + want + ")"
	case len(words) == 1 && strings.HasPrefix(words[0], "/"):
		return "", "", "no method (" + want + ")"
	case len(words) == 1:
		return "", "", "no path (" + want + ")"
	case len(words) > 2:
		return "", "", fmt.Sprintf("%d words (%s)", len(words), want)
	}
	method = words[0]
	if !slices.Contains(methods, method) {
		if up := strings.ToUpper(method); slices.Contains(methods, up) {
			return "", "", fmt.Sprintf("method %q is not upper-case (write %s)", method, up)
		}
		return "", "", fmt.Sprintf("unknown method %q (want %s)", method, strings.Join(methods, ", "))
	}
	path, problem = checkPath(words[1])
	if problem != "" {
		return "", "", problem
	}
	return method, path, ""
}

// checkPath checks a route's path and returns it with its parameters written
// {name} and {name...}.
func checkPath(path string) (canonical, problem string) {
	if !strings.HasPrefix(path, "/") {
		return "", fmt.Sprintf("path %q does not start with \"/\"", path)
	}
	segs := strings.Split(path[1:], "/")
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
				return "", fmt.Sprintf("segment %q: a wildcard needs a name, such as *path", seg)
			}
		case seg == "{$}":
			if !last {
				return "", "{$} must be the last segment"
			}
			continue
		case strings.HasPrefix(seg, "{"):
			if !strings.HasSuffix(seg, "}") {
				return "", fmt.Sprintf("segment %q: a parameter must be a whole segment, such as {id}", seg)
			}
			name = seg[1 : len(seg)-1]
			name, rest = strings.CutSuffix(name, "...")
		default:
			for _, r := range seg {
				switch {
				case r == '{' || r == '}':
					return "", fmt.Sprintf("segment %q: a parameter must be a whole segment, such as {id}", seg)
				case r < ' ' || r == 0x7f:
					return "", fmt.Sprintf("segment %q: control character %U", seg, r)
				}
			}
			continue
		}
		switch {
		case name == "":
			return "", fmt.Sprintf("segment %q: empty parameter name", seg)
		case !isIdentifier(name):
			return "", fmt.Sprintf("segment %q: parameter name %q is not a Go identifier", seg, name)
		case rest && !last:
			return "", fmt.Sprintf("segment %q: a rest-of-path parameter must be the last segment", seg)
		case seen[name]:
			return "", fmt.Sprintf("parameter %q appears twice", name)
		}
		seen[name] = true
	}
	return CanonicalPath(path), ""
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

// CanonicalPath writes the gin and echo parameters of a route's path
// template, :id and *path, as {id} and {path...}; ServeMux's {$} and the
// rest of the path stay. It checks nothing: ParseEntry does.
func CanonicalPath(path string) string {
	if !strings.ContainsAny(path, ":*") {
		return path
	}
	segs := strings.Split(path, "/")
	for i, s := range segs {
		switch {
		case strings.HasPrefix(s, ":") && len(s) > 1:
			segs[i] = "{" + s[1:] + "}"
		case strings.HasPrefix(s, "*") && len(s) > 1:
			segs[i] = "{" + s[1:] + "...}"
		}
	}
	return strings.Join(segs, "/")
}

// ColonPath writes the parameters of a canonical path, {id} and {path...},
// as gin and echo write them, :id and *path.
func ColonPath(path string) string {
	if !strings.Contains(path, "{") {
		return path
	}
	segs := strings.Split(path, "/")
	for i, s := range segs {
		if name, rest, ok := param(s); ok {
			if rest {
				segs[i] = "*" + name
			} else {
				segs[i] = ":" + name
			}
		}
	}
	return strings.Join(segs, "/")
}

// PathShape blanks the parameter names of a canonical path, {} and {...},
// so that /a/{id} and /a/{sku}, which a router takes for one route, have
// one shape.
func PathShape(path string) string {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		if _, rest, ok := param(s); ok {
			if rest {
				segs[i] = "{...}"
			} else {
				segs[i] = "{}"
			}
		}
	}
	return strings.Join(segs, "/")
}

// Param is a parameter of a canonical path.
type Param struct {
	// Name is the parameter's name: id for {id}.
	Name string
	// Segment is the index of the parameter's segment in the path split at
	// each "/": 1 for the first segment after the leading "/".
	Segment int
	// Rest says the parameter takes the rest of the path: {path...}.
	Rest bool
}

// PathParams lists the parameters of a canonical path, in order.
func PathParams(path string) []Param {
	var params []Param
	for i, s := range strings.Split(path, "/") {
		if name, rest, ok := param(s); ok {
			params = append(params, Param{Name: name, Segment: i, Rest: rest})
		}
	}
	return params
}

// param reports whether the segment seg of a canonical path is a
// parameter, {name} or {name...} (rest), and returns its name.
func param(seg string) (name string, rest, ok bool) {
	if !strings.HasPrefix(seg, "{") || !strings.HasSuffix(seg, "}") || seg == "{$}" {
		return "", false, false
	}
	name, rest = strings.CutSuffix(seg[1:len(seg)-1], "...")
	return name, rest, true
}
