package middleware

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/keyfunc"
)

// Routes is the lock configuration of a whole service: one Guard per route,
// found by the route's method and template. Build it once at start-up with
// NewRoutes, from a route table file's entries (LoadRouteTable) or from
// code (ParseRoute), and install it once in the router: Routes.Handler
// wraps a net/http ServeMux; ginlock.Routes and echolock.Routes are the gin
// and echo middleware. A request to a route without an entry passes
// through unlocked, at the cost of one map lookup (on net/http, also a
// second ServeMux lookup: see Handler).
//
// Routes is immutable and safe for concurrent use.
type Routes struct {
	entries []routeEntry
	byRoute map[routeKey]*Guard // by canonical ({id}) and colon (:id) path
}

type routeEntry struct {
	spec  RouteSpec
	guard *Guard
}

type routeKey struct{ method, path string }

// RouteID names a route a router has registered: its method and path
// template, in the router's syntax ({id}, :id or *path).
type RouteID struct {
	Method, Path string
}

// NewRoutes builds a Guard for every entry. A Config without a Name is
// named after its route, "METHOD /path/{param}", which is the label of its
// metrics. It checks every entry and returns every problem at once, joined,
// each prefixed with the entry's Source and wrapping ErrInvalidConfig:
// an invalid configuration, a route listed twice, or a key template that
// reads a path parameter the route does not have.
func NewRoutes(locker *reqlock.Locker, specs []RouteSpec) (*Routes, error) {
	rt := &Routes{byRoute: make(map[routeKey]*Guard, 2*len(specs))}
	var errs []error
	first := make(map[routeKey]string, len(specs))
	for _, spec := range specs {
		fail := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%w: %s: %s %s: %s", ErrInvalidConfig, spec.Source,
				spec.Method, spec.Path, fmt.Sprintf(format, args...)))
		}
		path := canonicalPath(spec.Path)
		shape := routeKey{spec.Method, routeShape(path)}
		if src, dup := first[shape]; dup {
			fail("listed twice (first at %s)", src)
			continue
		}
		first[shape] = spec.Source
		cfg := spec.Config
		if cfg.Name == "" {
			cfg.Name = spec.Method + " " + path
		}
		g, err := NewWithConfig(locker, cfg)
		if err != nil {
			errs = append(errs, sourced(spec, cfg.Name, err))
			continue
		}
		params := pathParams(path)
		for _, t := range g.templates {
			for _, name := range t.PathNames() {
				if !slices.Contains(params, name) {
					fail("key template %q reads path parameter %q, which the route does not have (it has: %s)",
						t.String(), name, listOrNone(params))
				}
			}
		}
		spec.Path = path
		rt.entries = append(rt.entries, routeEntry{spec: spec, guard: g})
		rt.byRoute[routeKey{spec.Method, path}] = g
		rt.byRoute[routeKey{spec.Method, colonPath(path)}] = g
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return rt, nil
}

// sourced puts an entry's source and route in front of err's message, after
// the package's prefix, as the table file's errors read; it still wraps err.
func sourced(spec RouteSpec, name string, err error) error {
	msg := strings.TrimPrefix(err.Error(), ErrInvalidConfig.Error()+": ")
	msg = strings.TrimPrefix(msg, fmt.Sprintf("route %q: ", name))
	return &sourcedError{
		msg: fmt.Sprintf("%v: %s: %s %s: %s", ErrInvalidConfig, spec.Source, spec.Method, spec.Path, msg),
		err: err,
	}
}

type sourcedError struct {
	msg string
	err error
}

func (e *sourcedError) Error() string { return e.msg }
func (e *sourcedError) Unwrap() error { return e.err }

// LoadRoutes reads the route table file at path (see LoadRouteTable) and
// builds its Routes. Errors name the file and line of each problem.
func LoadRoutes(locker *reqlock.Locker, path string) (*Routes, error) {
	specs, err := LoadRouteTable(path)
	if err != nil {
		return nil, err
	}
	return NewRoutes(locker, specs)
}

// Guard returns the Guard of the route with method and path template, in
// the canonical ({id}, {path...}) or the gin and echo (:id, *path) syntax,
// or nil when the route has no entry.
func (rt *Routes) Guard(method, path string) *Guard {
	return rt.byRoute[routeKey{method, path}]
}

// Specs returns the entries, in the order given, with canonical paths.
func (rt *Routes) Specs() []RouteSpec {
	specs := make([]RouteSpec, len(rt.entries))
	for i, e := range rt.entries {
		specs[i] = e.spec
	}
	return specs
}

// Check reports, joined, every entry that matches none of the registered
// routes, each prefixed with its Source, so that a typo in a table never
// leaves a route silently unlocked. Adapters call it with their router's
// routes, through CheckRoutes; see ginlock.CheckRoutes and
// echolock.CheckRoutes.
func (rt *Routes) Check(registered []RouteID) error {
	have := make(map[routeKey]bool, len(registered))
	for _, r := range registered {
		have[routeKey{r.Method, canonicalPath(r.Path)}] = true
	}
	var errs []error
	for _, e := range rt.entries {
		if !have[routeKey{e.spec.Method, e.spec.Path}] {
			errs = append(errs, fmt.Errorf("%w: %s: %s %s matches no registered route",
				ErrInvalidConfig, e.spec.Source, e.spec.Method, e.spec.Path))
		}
	}
	return errors.Join(errs...)
}

// CheckRoutes is rt.Check for a router's own list of routes, such as gin's
// engine.Routes() or echo's e.Routes(): route gives each one's method and
// path template. A nil rt is an error wrapping ErrInvalidConfig.
func CheckRoutes[R any](rt *Routes, routes []R, route func(R) (method, path string)) error {
	if rt == nil {
		return fmt.Errorf("%w: the route table is nil", ErrInvalidConfig)
	}
	ids := make([]RouteID, len(routes))
	for i, r := range routes {
		ids[i].Method, ids[i].Path = route(r)
	}
	return rt.Check(ids)
}

// Handler returns mux behind the routes' locks: the net/http adapter of
// Routes, installed once around the whole ServeMux. Register every route on
// mux first: Handler checks each entry against mux and returns an error,
// wrapping ErrInvalidConfig and naming the entry's Source, for an entry that
// no registered pattern serves.
//
// Each request is routed by mux.Handler to find its pattern; a request whose
// pattern has an entry (by the request's method) is locked as Guard.Handler
// locks it, path placeholders reading the pattern's wildcards. HEAD
// requests use a GET entry when they have none of their own.
func (rt *Routes) Handler(mux *http.ServeMux) (http.Handler, error) {
	byPattern := make(map[routeKey]*patternGuard, len(rt.entries))
	var errs []error
	for _, e := range rt.entries {
		probe := &http.Request{Method: e.spec.Method, URL: &url.URL{Path: probePath(e.spec.Path)}, Host: "localhost"}
		_, pattern := mux.Handler(probe)
		method, path := splitPattern(pattern)
		if pattern == "" || canonicalPath(path) != e.spec.Path ||
			(method != "" && method != e.spec.Method && !(method == http.MethodGet && e.spec.Method == http.MethodHead)) {
			errs = append(errs, fmt.Errorf("%w: %s: %s %s matches no pattern registered on the ServeMux",
				ErrInvalidConfig, e.spec.Source, e.spec.Method, e.spec.Path))
			continue
		}
		byPattern[routeKey{e.spec.Method, pattern}] = newPatternGuard(e.guard, path)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pg := lookupPattern(byPattern, mux, r)
		if pg == nil {
			mux.ServeHTTP(w, r)
			return
		}
		_ = pg.guard.Serve(patternRequest{r: r, pg: pg}, func(r *http.Request) error {
			mux.ServeHTTP(w, r)
			return nil
		}, func(rej *Rejection) error {
			pg.guard.Reject(w, r, rej)
			return nil
		})
	}), nil
}

func lookupPattern(byPattern map[routeKey]*patternGuard, mux *http.ServeMux, r *http.Request) *patternGuard {
	_, pattern := mux.Handler(r)
	if pattern == "" {
		return nil
	}
	if pg := byPattern[routeKey{r.Method, pattern}]; pg != nil || r.Method != http.MethodHead {
		return pg
	}
	return byPattern[routeKey{http.MethodGet, pattern}]
}

// patternGuard is a ServeMux pattern's Guard and where the pattern's
// wildcards stand in the path, to read their values.
type patternGuard struct {
	guard  *Guard
	params map[string]wildcard
}

// wildcard is the position of a pattern wildcard: its segment's index, and
// whether it takes the rest of the path ({name...}).
type wildcard struct {
	segment int
	rest    bool
}

func newPatternGuard(g *Guard, path string) *patternGuard {
	pg := &patternGuard{guard: g, params: map[string]wildcard{}}
	for i, seg := range strings.Split(path, "/") {
		if strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") && seg != "{$}" {
			name, rest := strings.CutSuffix(seg[1:len(seg)-1], "...")
			pg.params[name] = wildcard{segment: i, rest: rest}
		}
	}
	return pg
}

// patternRequest is keyfunc.Request for a request the ServeMux has not yet
// served: path values come from matching the pattern.
type patternRequest struct {
	r  *http.Request
	pg *patternGuard
}

func (p patternRequest) HTTPRequest() *http.Request { return p.r }

func (p patternRequest) PathValue(name string) string {
	w, ok := p.pg.params[name]
	if !ok {
		return ""
	}
	raw := p.r.URL.EscapedPath()
	for range w.segment {
		_, after, found := strings.Cut(raw, "/")
		if !found {
			return ""
		}
		raw = after
	}
	if !w.rest {
		raw, _, _ = strings.Cut(raw, "/")
	}
	v, err := url.PathUnescape(raw)
	if err != nil {
		return ""
	}
	return v
}

func (p patternRequest) ContextValue(name string) (any, bool) {
	return keyfunc.HTTPRequest(p.r).ContextValue(name)
}

// splitPattern splits a ServeMux pattern into its method (or "") and path,
// dropping a host.
func splitPattern(pattern string) (method, path string) {
	if m, rest, ok := strings.Cut(pattern, " "); ok {
		method, pattern = m, strings.TrimLeft(rest, " \t")
	}
	if i := strings.IndexByte(pattern, '/'); i > 0 {
		pattern = pattern[i:]
	}
	return method, pattern
}

// canonicalPath writes gin and echo parameters, :id and *path, as {id} and
// {path...}; ServeMux's {$} stays.
func canonicalPath(path string) string {
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

// colonPath writes {id} and {path...} as gin and echo write them.
func colonPath(path string) string {
	if !strings.Contains(path, "{") {
		return path
	}
	segs := strings.Split(path, "/")
	for i, s := range segs {
		if strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}") && s != "{$}" {
			name := s[1 : len(s)-1]
			if n, ok := strings.CutSuffix(name, "..."); ok {
				segs[i] = "*" + n
			} else {
				segs[i] = ":" + name
			}
		}
	}
	return strings.Join(segs, "/")
}

// routeShape blanks parameter names, so /a/{id} and /a/{sku} are one route.
func routeShape(path string) string {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		if strings.HasPrefix(s, "{") && s != "{$}" {
			if strings.HasSuffix(s, "...}") {
				segs[i] = "{...}"
			} else {
				segs[i] = "{}"
			}
		}
	}
	return strings.Join(segs, "/")
}

// pathParams lists a canonical path's parameter names.
func pathParams(path string) []string {
	var names []string
	for _, s := range strings.Split(path, "/") {
		if strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}") && s != "{$}" {
			names = append(names, strings.TrimSuffix(s[1:len(s)-1], "..."))
		}
	}
	return names
}

// probePath is a request path that the canonical path's pattern serves.
func probePath(path string) string {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		switch {
		case s == "{$}":
			segs[i] = ""
		case strings.HasPrefix(s, "{"):
			segs[i] = "reqlock-probe"
		}
	}
	return strings.Join(segs, "/")
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
