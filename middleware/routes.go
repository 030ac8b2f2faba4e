package middleware

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/routetable"
)

// Routes is the lock configuration of a whole service: one Guard per route,
// found by the route's method and template. Build it once at start-up with
// LoadRoutes from a route table file, or with NewRoutes from a table's
// entries (routetable.Parse, or routetable.ParseEntry in code), and install
// it once in the router:
// Routes.Handler wraps a net/http ServeMux; ginlock.Install and
// echolock.Install put it in front of gin's and echo's routes. Every
// install checks the table against the router's routes, so that no entry
// is left matching nothing: Handler at once, the gin and echo installs at
// their first request, or at start-up through CheckRoutes. A request to a
// route without an entry passes through unlocked, at the cost of one map
// lookup (on net/http, also a second ServeMux lookup: see Handler).
//
// Routes is immutable and safe for concurrent use.
type Routes struct {
	entries []routeEntry
	byRoute map[routeKey]*Guard // by canonical ({id}) and colon (:id) path

	// table is the table-wide options: Skipper, RequestSkipper, Responder,
	// RequestResponder, Logger and Name; its responder answers the
	// requests of a broken install.
	table  Config
	logger *slog.Logger

	// problems are the problems of entries that LoadRoutesDeferred kept
	// instead of failing; every check reports them. unbuilt are those
	// entries whose route is known, which the checks match against the
	// router as well.
	problems []entryProblem
	unbuilt  []routeEntry
}

type routeEntry struct {
	route Route
	guard *Guard // nil for an unbuilt entry
	order int    // the entry's line in its file, else its index
}

// entryProblem is a problem of the table, in the order of its entry.
type entryProblem struct {
	order int
	err   error
}

type routeKey struct{ method, path string }

// RouteID names a route a router has registered: its method and path
// template, in the router's syntax ({id}, :id or *path).
type RouteID struct {
	Method, Path string
}

// Route is one route of a Routes: its method and path template, and the
// Config of its lock. RouteOf makes the Route of a route table's entry;
// build one in code for a route with settings no spec writes, such as a
// Skipper or Responder of its own, and pass it to NewRoutesWithConfig.
type Route struct {
	// Method is the route's method, upper-case, such as "POST".
	Method string
	// Path is the route's path template: {id} and {path...}, or gin and
	// echo's :id and *path. Routes keeps it canonical ({id}).
	Path string
	// Config is the route's lock configuration; fields left zero take
	// their defaults, and the table-wide options' (see NewRoutes).
	Config Config
	// Spec is the lock spec Config was parsed from, as written, or "".
	Spec string
	// Source says where the route comes from in errors: "file:line" for a
	// table file, else a label such as "code".
	Source string
}

// RouteOf returns the Route of a route table's entry: its Config is the
// entry's spec as ParseSpec turns it into one.
func RouteOf(e routetable.Entry) Route {
	return Route{Method: e.Method, Path: e.Path, Config: specConfig(e.Spec), Spec: e.Spec.Text, Source: e.Source}
}

// NewRoutes builds a Guard for every entry of a route table, such as
// routetable.Parse returns or routetable.ParseEntry makes in code: it is
// NewRoutesWithConfig with the Route of each entry (RouteOf), and takes the
// same table-wide options opts and returns the same errors.
func NewRoutes(locker *reqlock.Locker, entries []routetable.Entry, opts ...Option) (*Routes, error) {
	routes := make([]Route, len(entries))
	for i, e := range entries {
		routes[i] = RouteOf(e)
	}
	return NewRoutesWithConfig(locker, routes, opts...)
}

// NewRoutesWithConfig builds a Guard for every route. A Config without a
// Name is named after its route, "METHOD /path/{param}", which is the label
// of its metrics. It checks every route and returns every problem at once,
// joined, each prefixed with the route's Source and wrapping
// ErrInvalidConfig: an invalid configuration, a route listed twice, or a
// key template that reads a path parameter the route does not have.
//
// opts are table-wide options, applied to every route without editing the
// routes: WithSkipper and WithRequestSkipper (a request that either lets
// through goes unlocked), WithResponder, WithRequestResponder, WithLogger
// and WithName (the metrics and log label of every route whose Config names
// none), and the adapters' native forms (ginlock.WithSkipper,
// echolock.WithResponder...). A route's own value of a field wins over the
// table's, the two skippers counting as one field and the two responders as
// another: a route with a Skipper or RequestSkipper of its own (one built
// in code; a spec sets neither) skips by its own alone, never by the
// table's. Any other option is an error: the fields a spec sets belong to
// each route.
func NewRoutesWithConfig(locker *reqlock.Locker, routes []Route, opts ...Option) (*Routes, error) {
	table, err := tableConfig(opts)
	if err != nil {
		return nil, err
	}
	rt, problems := buildRoutes(locker, routes, nil, table)
	if len(problems) > 0 {
		return nil, joinProblems(problems)
	}
	return rt, nil
}

// tableConfig applies the table-wide options opts to an empty Config and
// checks that they set only the fields that apply to a whole table.
func tableConfig(opts []Option) (Config, error) {
	var c Config
	for _, opt := range opts {
		opt(&c)
	}
	var errs []error
	for _, p := range c.optionProblems {
		errs = append(errs, fmt.Errorf("%w: route table option %s", ErrInvalidConfig, p))
	}
	var set []string
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"Key", c.Key != ""}, {"Keys", len(c.Keys) > 0}, {"MaxKeys", c.MaxKeys != 0},
		{"HoldAtLeast", c.HoldAtLeast != 0}, {"TTL", c.TTL != 0}, {"Wait", c.Wait != 0},
		{"TimeoutStatus", c.TimeoutStatus != 0}, {"RetryAfter", c.RetryAfter != 0},
		{"OnStoreError", c.OnStoreError != FailClosed}, {"MaxBodyBytes", c.MaxBodyBytes != 0},
		{"MaxValueLen", c.MaxValueLen != 0}, {"Watchdog", c.Watchdog},
		{"Shared", c.Shared}, {"Limit", c.Limit != 0}, {"Idempotency", c.Idempotency != (Idempotency{})},
	} {
		if f.set {
			set = append(set, f.name)
		}
	}
	if len(set) > 0 {
		errs = append(errs, fmt.Errorf("%w: route table options set %s, which belong to each entry's spec; "+
			"only Skipper, RequestSkipper, Responder, RequestResponder, Logger and Name apply to a whole table",
			ErrInvalidConfig, strings.Join(set, ", ")))
	}
	if c.Responder != nil && c.RequestResponder != nil {
		errs = append(errs, fmt.Errorf("%w: route table options set both a Responder and a RequestResponder", ErrInvalidConfig))
	}
	return c, errors.Join(errs...)
}

// withTable gives cfg the table-wide fields it does not set itself; the
// skippers go as a pair, and so do the responders.
func (c Config) withTable(table Config) Config {
	if c.Skipper == nil && c.RequestSkipper == nil {
		c.Skipper, c.RequestSkipper = table.Skipper, table.RequestSkipper
	}
	if c.Responder == nil && c.RequestResponder == nil {
		c.Responder, c.RequestResponder = table.Responder, table.RequestResponder
	}
	if c.Logger == nil {
		c.Logger = table.Logger
	}
	if c.Name == "" {
		c.Name = table.Name
	}
	return c
}

// buildRoutes builds the Routes of routes, the i-th ordered by orders[i] (a
// line) or else by i, with the table-wide options of table, and returns the
// problems of the routes it could not build, which it keeps unbuilt.
func buildRoutes(locker *reqlock.Locker, routes []Route, orders []int, table Config) (*Routes, []entryProblem) {
	rt := &Routes{byRoute: make(map[routeKey]*Guard, 2*len(routes)), table: table, logger: table.Logger}
	if rt.logger == nil && locker != nil {
		rt.logger = locker.Logger()
	}
	if rt.logger == nil {
		rt.logger = slog.Default()
	}
	var problems []entryProblem
	first := make(map[routeKey]string, len(routes))
	for i, route := range routes {
		order := i
		if orders != nil {
			order = orders[i]
		}
		failed := false
		add := func(err error) {
			problems = append(problems, entryProblem{order, err})
			failed = true
		}
		fail := func(format string, args ...any) {
			add(fmt.Errorf("%w: %s: %s %s: %s", ErrInvalidConfig, route.Source,
				route.Method, route.Path, fmt.Sprintf(format, args...)))
		}
		path := routetable.CanonicalPath(route.Path)
		shape := routeKey{route.Method, routetable.PathShape(path)}
		if src, dup := first[shape]; dup {
			fail("listed twice (first at %s)", src)
			continue
		}
		first[shape] = route.Source
		cfg := route.Config.withTable(table)
		if cfg.Name == "" {
			cfg.Name = route.Method + " " + path
		}
		g, err := NewWithConfig(locker, cfg)
		if err != nil {
			add(sourced(route, cfg.Name, err))
		} else {
			var params []string
			for _, p := range routetable.PathParams(path) {
				params = append(params, p.Name)
			}
			for _, t := range g.templates {
				for _, name := range t.PathNames() {
					if !slices.Contains(params, name) {
						fail("key template %q reads path parameter %q, which the route does not have (it has: %s)",
							t.String(), name, listOrNone(params))
					}
				}
			}
		}
		route.Path = path
		if failed {
			rt.unbuilt = append(rt.unbuilt, routeEntry{route: route, order: order})
			continue
		}
		rt.entries = append(rt.entries, routeEntry{route: route, guard: g, order: order})
		rt.byRoute[routeKey{route.Method, path}] = g
		rt.byRoute[routeKey{route.Method, routetable.ColonPath(path)}] = g
	}
	return rt, problems
}

// joinProblems joins problems in the order of their entries.
func joinProblems(problems []entryProblem) error {
	slices.SortStableFunc(problems, func(a, b entryProblem) int { return a.order - b.order })
	errs := make([]error, len(problems))
	for i, p := range problems {
		errs[i] = p.err
	}
	return errors.Join(errs...)
}

// sourced puts a route's source and route in front of err's message, after
// the package's prefix, as the table file's errors read; it still wraps err.
func sourced(route Route, name string, err error) error {
	msg := strings.TrimPrefix(err.Error(), ErrInvalidConfig.Error()+": ")
	msg = strings.TrimPrefix(msg, fmt.Sprintf("route %q: ", name))
	return &sourcedError{
		msg: fmt.Sprintf("%v: %s: %s %s: %s", ErrInvalidConfig, route.Source, route.Method, route.Path, msg),
		err: err,
	}
}

type sourcedError struct {
	msg string
	err error
}

func (e *sourcedError) Error() string { return e.msg }
func (e *sourcedError) Unwrap() error { return e.err }

// LoadRoutes reads the route table file at path (see routetable.Parse for
// its format) and builds its Routes, with the table-wide options opts (see
// NewRoutes). Errors name the file and line of each problem, and wrap
// ErrInvalidConfig and routetable.ErrInvalid; a file it cannot read is an
// error that wraps the read error, not ErrInvalidConfig.
func LoadRoutes(locker *reqlock.Locker, path string, opts ...Option) (*Routes, error) {
	t, err := routetable.CheckFile(path)
	if err != nil {
		return nil, fmt.Errorf("reqlock/middleware: read route table: %w", err)
	}
	if err := t.Err(); err != nil {
		return nil, tableError(err)
	}
	return NewRoutes(locker, t.Entries, opts...)
}

// LoadRoutesDeferred is LoadRoutes for reporting every problem of a table
// in one start-up error: it never fails, and keeps the problems it finds
// (an unreadable file, a syntax error, a bad route or spec, a route listed
// twice, a bad table option) in the Routes, whose install reports them
// together with the entries that match no route the router serves, each
// with its file and line, in the order of the file: Routes.Handler and
// CheckRoutes (ginlock.CheckRoutes, echolock.CheckRoutes) at start-up, the
// gin and echo installs at their first request. A Routes with problems
// never locks or runs a request: its installs answer 500. Err returns the
// problems kept.
//
//	rt := middleware.LoadRoutesDeferred(locker, "routes.yaml")
//	handler, err := rt.Handler(mux) // every problem, at once
func LoadRoutesDeferred(locker *reqlock.Locker, path string, opts ...Option) *Routes {
	table, tableErr := tableConfig(opts)
	var problems []entryProblem
	if tableErr != nil {
		problems = append(problems, entryProblem{0, tableErr})
	}
	t, err := routetable.CheckFile(path)
	if err != nil {
		problems = append(problems, entryProblem{0, fmt.Errorf("%w: %s: read route table: %w", ErrInvalidConfig, path, err)})
	}
	for _, p := range t.Problems {
		problems = append(problems, entryProblem{p.Line, tableError(p)})
	}
	var unbuilt []routeEntry
	for _, e := range t.Broken {
		unbuilt = append(unbuilt, routeEntry{route: RouteOf(e), order: e.Line})
	}
	routes := make([]Route, len(t.Entries))
	lines := make([]int, len(t.Entries))
	for i, e := range t.Entries {
		routes[i], lines[i] = RouteOf(e), e.Line
	}
	rt, built := buildRoutes(locker, routes, lines, table)
	rt.problems = append(problems, built...)
	rt.unbuilt = append(unbuilt, rt.unbuilt...)
	return rt
}

// Err returns the problems of the table that LoadRoutesDeferred kept,
// joined in the order of the file, or nil. Every install reports them.
func (rt *Routes) Err() error {
	if len(rt.problems) == 0 {
		return nil
	}
	return joinProblems(slices.Clone(rt.problems))
}

// HasResponder reports whether the table has a Responder or
// RequestResponder of its own, given by a table-wide option.
func (rt *Routes) HasResponder() bool {
	return rt.table.Responder != nil || rt.table.RequestResponder != nil
}

// Respond writes rej, the answer of a request the table cannot serve (see
// Installation), with the table's RequestResponder, Responder or, by
// default, WriteProblem; req is the adapter's view of the request. It
// returns the RequestResponder's error.
func (rt *Routes) Respond(w http.ResponseWriter, req keyfunc.Request, rej *Rejection) error {
	return respond(&rt.table, w, req, rej)
}

// Guard returns the Guard of the route with method and path template, in
// the canonical ({id}, {path...}) or the gin and echo (:id, *path) syntax,
// or nil when the route has no entry.
func (rt *Routes) Guard(method, path string) *Guard {
	return rt.byRoute[routeKey{method, path}]
}

// Routes returns the routes, in the order given, with canonical paths and
// their own Configs, without the table-wide options.
func (rt *Routes) Routes() []Route {
	routes := make([]Route, len(rt.entries))
	for i, e := range rt.entries {
		routes[i] = e.route
	}
	return routes
}

// Check reports, joined, every entry that matches none of the registered
// routes, each prefixed with its Source, so that a typo in a table never
// leaves a route silently unlocked, together with the problems a
// LoadRoutesDeferred table kept, in the order of the file. Adapters call it
// with their router's routes, through CheckRoutes; see ginlock.CheckRoutes
// and echolock.CheckRoutes.
func (rt *Routes) Check(registered []RouteID) error {
	have := make(map[routeKey]bool, len(registered))
	for _, r := range registered {
		have[routeKey{r.Method, routetable.CanonicalPath(r.Path)}] = true
	}
	return rt.check(func(e routeEntry) bool { return have[routeKey{e.route.Method, e.route.Path}] }, "matches no registered route")
}

// CheckUnguarded reports, joined in the order of the entries, every entry
// whose route is among unguarded: the routes a router serves without the
// table's install in front of them, which an adapter that can read its
// router's handler chains lists (ginlock.Verify). Routes without an entry
// are ignored: they run unlocked by design. Each problem names the entry's
// Source and wraps ErrInvalidConfig; why says why the route runs without
// the table.
func (rt *Routes) CheckUnguarded(unguarded []RouteID, why string) error {
	off := make(map[routeKey]bool, len(unguarded))
	for _, r := range unguarded {
		off[routeKey{r.Method, routetable.CanonicalPath(r.Path)}] = true
	}
	var problems []entryProblem
	for _, e := range rt.entries {
		if off[routeKey{e.route.Method, e.route.Path}] {
			problems = append(problems, entryProblem{e.order, fmt.Errorf("%w: %s: %s %s runs unlocked: %s",
				ErrInvalidConfig, e.route.Source, e.route.Method, e.route.Path, why)})
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return joinProblems(problems)
}

// check returns the table's problems and those of every entry, built or
// not, that served reports the router does not serve (saying so with
// unserved), joined in the order of the entries.
func (rt *Routes) check(served func(routeEntry) bool, unserved string) error {
	problems := slices.Clone(rt.problems)
	for _, list := range [][]routeEntry{rt.entries, rt.unbuilt} {
		for _, e := range list {
			if !served(e) {
				problems = append(problems, entryProblem{e.order, fmt.Errorf("%w: %s: %s %s %s",
					ErrInvalidConfig, e.route.Source, e.route.Method, e.route.Path, unserved)})
			}
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return joinProblems(problems)
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
// no registered pattern serves, joined with the problems a
// LoadRoutesDeferred table kept, in the order of the file.
//
// Each request is routed by mux.Handler to find its pattern; a request whose
// pattern has an entry (by the request's method) is locked as Guard.Handler
// locks it, path placeholders reading the pattern's wildcards. HEAD
// requests use a GET entry when they have none of their own.
func (rt *Routes) Handler(mux *http.ServeMux) (http.Handler, error) {
	byPattern := make(map[routeKey]*patternGuard, len(rt.entries))
	served := func(e routeEntry) bool {
		probe := &http.Request{Method: e.route.Method, URL: &url.URL{Path: probePath(e.route.Path)}, Host: "localhost"}
		_, pattern := mux.Handler(probe)
		method, path := splitPattern(pattern)
		if pattern == "" || routetable.CanonicalPath(path) != e.route.Path ||
			(method != "" && method != e.route.Method && !(method == http.MethodGet && e.route.Method == http.MethodHead)) {
			return false
		}
		if e.guard != nil {
			byPattern[routeKey{e.route.Method, pattern}] = newPatternGuard(e.guard, path)
		}
		return true
	}
	if err := rt.check(served, "matches no pattern registered on the ServeMux"); err != nil {
		return nil, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pg := lookupPattern(byPattern, mux, r)
		if pg == nil {
			mux.ServeHTTP(w, r)
			return
		}
		req := patternRequest{r: r, pg: pg}
		_ = pg.guard.ServeResponse(w, req, func(r *http.Request, rec *Recording) error {
			if rec != nil {
				mux.ServeHTTP(rec.Writer(w), r)
				return nil
			}
			mux.ServeHTTP(w, r)
			return nil
		}, func(rej *Rejection) error {
			_ = pg.guard.Respond(w, req, rej)
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
	params map[string]routetable.Param
}

func newPatternGuard(g *Guard, path string) *patternGuard {
	pg := &patternGuard{guard: g, params: map[string]routetable.Param{}}
	for _, p := range routetable.PathParams(path) {
		pg.params[p.Name] = p
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
	for range w.Segment {
		_, after, found := strings.Cut(raw, "/")
		if !found {
			return ""
		}
		raw = after
	}
	if !w.Rest {
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

// probePath is a request path that the canonical path's pattern serves.
func probePath(path string) string {
	segs := strings.Split(strings.TrimSuffix(path, "{$}"), "/")
	for _, p := range routetable.PathParams(path) {
		segs[p.Segment] = "reqlock-probe"
	}
	return strings.Join(segs, "/")
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
