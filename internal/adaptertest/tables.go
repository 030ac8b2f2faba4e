package adaptertest

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/routetable"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// TableWith is Table with the table-wide options opts.
func TableWith(t testing.TB, locker *reqlock.Locker, opts []middleware.Option, pairs ...string) *middleware.Routes {
	t.Helper()
	if len(pairs)%2 != 0 {
		t.Fatalf("Table: odd number of route and spec strings")
	}
	var entries []routetable.Entry
	for i := 0; i < len(pairs); i += 2 {
		e, err := routetable.ParseEntry(pairs[i], pairs[i+1], fmt.Sprintf("code:%d", i/2+1))
		if err != nil {
			t.Fatalf("ParseEntry(%q, %q): %v", pairs[i], pairs[i+1], err)
		}
		entries = append(entries, e)
	}
	rt, err := middleware.NewRoutes(locker, entries, opts...)
	if err != nil {
		t.Fatalf("NewRoutes: %v", err)
	}
	return rt
}

// brokenInstall is what the log says once when an install is broken.
const brokenInstall = "install is broken"

// expectBroken fails unless req is answered 500 (reason internal) without
// running a handler: a broken install.
func (s *suite) expectBroken(t *testing.T, h http.Handler, req *http.Request, ran *atomic.Int32) {
	t.Helper()
	before := ran.Load()
	rec := do(h, req)
	s.expectRejection(t, rec, http.StatusInternalServerError, middleware.ReasonInternal, false)
	if ran.Load() != before {
		t.Fatalf("%s %s: a handler ran through a broken install", req.Method, req.URL)
	}
}

// countingReport is reportLock that also counts its runs.
func countingReport(locker *reqlock.Locker, ran *atomic.Int32) http.HandlerFunc {
	report := reportLock(locker)
	return func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		report(w, r)
	}
}

// A table installed after its routes either fails at start-up (gin, which
// gives a route only the middleware installed before it) or locks them
// (echo, which applies middleware after routing; net/http, whose table
// wraps the whole mux): never an unlocked run ("Use after routes", issue 10
// item 1).
func (s *suite) testRoutesInstalledLate(t *testing.T) {
	locker, _ := newMemLocker(t)
	rt := Table(t, locker, "POST /items/{id}", "key=item:<id> wait=none")
	report := reportLock(locker)
	h, err := s.a.InstallRoutes(rt, []Endpoint{
		{Method: http.MethodPost, Path: "/items/{id}", Handler: report},
		{Method: http.MethodGet, Path: "/items/{id}", Handler: report},
	}, true)
	if err != nil {
		if !errors.Is(err, middleware.ErrInvalidConfig) {
			t.Fatalf("%s: installing after the routes: err = %v, want ErrInvalidConfig", s.a.Name, err)
		}
		return
	}
	expectBody(t, h, request(http.MethodPost, "/items/1", ""), "item:1")
	expectBody(t, h, request(http.MethodGet, "/items/1", ""), unlocked)
}

// A table entry that matches no route, installed without the explicit
// check call, fails at start-up (net/http) or breaks the install at the
// first request: logged once, and every request answered 500 without
// running a handler, so that the route the typo meant never runs unlocked
// ("typo, no CheckRoutes call", issue 10 item 1).
func (s *suite) testRoutesTypoUnchecked(t *testing.T) {
	locker, _ := newMemLocker(t)
	var logs syncBuffer
	rt := TableWith(t, locker, []middleware.Option{middleware.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))},
		"POST /items/{id}", "key=item:<id>",
		"PUT /itmes/{id}", "key=item:<id>") // meant PUT /items/{id}
	var ran atomic.Int32
	report := countingReport(locker, &ran)
	h, err := s.a.InstallRoutes(rt, []Endpoint{
		{Method: http.MethodPost, Path: "/items/{id}", Handler: report},
		{Method: http.MethodPut, Path: "/items/{id}", Handler: report},
		{Method: http.MethodGet, Path: "/items/{id}", Handler: report},
	}, false)
	if err != nil {
		if !errors.Is(err, middleware.ErrInvalidConfig) || !strings.Contains(err.Error(), "code:2: PUT /itmes/{id}") {
			t.Fatalf("%s: err = %v, want ErrInvalidConfig naming code:2 PUT /itmes/{id}", s.a.Name, err)
		}
		return
	}
	for range 2 {
		for _, method := range []string{http.MethodPut, http.MethodPost, http.MethodGet} {
			s.expectBroken(t, h, request(method, "/items/1", ""), &ran)
		}
	}
	l := logs.String()
	if strings.Count(l, brokenInstall) != 1 || !strings.Contains(l, "code:2: PUT /itmes/{id} matches no registered route") ||
		!strings.Contains(l, "level=ERROR") {
		t.Fatalf("the broken install was not logged once, at error level, naming the entry: %s", l)
	}
}

// threeProblems is a table with a problem of each kind, each on its own
// line: a bad duration (2), a route that matches no route of the router (3)
// and an unknown field (4).
const threeProblems = `routes:
  POST /items/{id}: key=item:<id> wait=2x
  PUT /itmes/{id}: key=item:<id>
  DELETE /items/{id}: key=item:<id> wiat=1s
`

// WriteTable writes data to a route table file named name, in a directory
// of its own that the test removes, and returns its path.
func WriteTable(t testing.TB, name, data string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A table with problems of several kinds reports them all in one start-up
// error, in the order of the file, when loaded with LoadRoutesDeferred:
// the problems of its lines and the entry that matches no route alike
// (issue 10 item 7). Installed without the check call, its first request
// breaks the install with the same list, and nothing runs.
func (s *suite) testRoutesEveryProblem(t *testing.T) {
	locker, _ := newMemLocker(t)
	path := WriteTable(t, "routes.yaml", threeProblems)
	want := []string{
		"routes.yaml:2: POST /items/{id}: spec column 15: wait: \"2x\" is not a duration",
		"routes.yaml:3: PUT /itmes/{id} matches no",
		"routes.yaml:4: DELETE /items/{id}: spec column 15: unknown field \"wiat\"",
	}
	inOrder := func(msg string) bool {
		at := 0
		for _, w := range want {
			i := strings.Index(msg[at:], w)
			if i < 0 {
				return false
			}
			at += i + len(w)
		}
		return strings.Count(msg, "routes.yaml:") == len(want)
	}

	// LoadRoutes stops at the lines' problems, before any router is known.
	if _, err := middleware.LoadRoutes(locker, path); err == nil || strings.Contains(err.Error(), "routes.yaml:3") {
		t.Fatalf("LoadRoutes err = %v, want the problems of lines 2 and 4 only", err)
	}

	var ran atomic.Int32
	report := countingReport(locker, &ran)
	endpoints := []Endpoint{
		{Method: http.MethodPost, Path: "/items/{id}", Handler: report},
		{Method: http.MethodPut, Path: "/items/{id}", Handler: report},
		{Method: http.MethodDelete, Path: "/items/{id}", Handler: report},
	}
	rt := middleware.LoadRoutesDeferred(locker, path)
	if err := rt.Err(); err == nil || strings.Contains(err.Error(), "routes.yaml:3") {
		t.Fatalf("Err() = %v, want the problems of lines 2 and 4", err)
	}
	_, err := s.a.ServeRoutes(rt, endpoints)
	if !errors.Is(err, middleware.ErrInvalidConfig) || !inOrder(err.Error()) {
		t.Fatalf("%s: start-up error:\n%v\nwant, in this order and nothing else:\n%s", s.a.Name, err, strings.Join(want, "\n"))
	}

	var logs syncBuffer
	rt = middleware.LoadRoutesDeferred(locker, path, middleware.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	h, err := s.a.InstallRoutes(rt, endpoints, false)
	if err != nil {
		if !inOrder(err.Error()) {
			t.Fatalf("%s: install error %v", s.a.Name, err)
		}
		return
	}
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		s.expectBroken(t, h, request(method, "/items/1", ""), &ran)
	}
	if l := logs.String(); strings.Count(l, brokenInstall) != 1 || !inOrder(strings.ReplaceAll(l, `\"`, `"`)) {
		t.Fatalf("the log does not hold every problem once: %s", l)
	}
}

// Table-wide options apply to every route of the table without editing its
// entries: the skipper, the responder, the logger, and the name as the
// metrics label of every entry without its own (issue 10 item 6).
func (s *suite) testRoutesTableOptions(t *testing.T) {
	m := newRecordingMetrics()
	locker, quiet := metricsLockers(m)
	specs := []string{
		"POST /items/{id}", "key=item:<id> wait=none",
		"PUT /items/{id}", "key=item:<id> wait=none name=put-item",
	}
	rt := TableWith(t, locker, []middleware.Option{
		middleware.WithSkipper(func(r *http.Request) bool { return r.Header.Get("X-Skip") != "" }),
		middleware.WithResponder(func(w http.ResponseWriter, r *http.Request, rej *middleware.Rejection) {
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, "table:"+string(rej.Reason))
		}),
		middleware.WithName("shop"),
	}, specs...)
	for _, sp := range rt.Routes() {
		if sp.Config.Skipper != nil || sp.Config.Responder != nil || (sp.Config.Name != "" && sp.Config.Name != "put-item") {
			t.Fatalf("the table's options edited the entry %s %s: %+v", sp.Method, sp.Path, sp.Config)
		}
	}
	report := reportLock(quiet)
	srv := s.serveRoutes(t, rt,
		Endpoint{Method: http.MethodPost, Path: "/items/{id}", Handler: report},
		Endpoint{Method: http.MethodPut, Path: "/items/{id}", Handler: report})
	expectBody(t, srv, request(http.MethodPost, "/items/1", ""), "item:1")
	hold(t, quiet, "item:1")
	for _, method := range []string{http.MethodPost, http.MethodPut} {
		if rec := do(srv, request(method, "/items/1", "")); rec.Code != http.StatusTooManyRequests || rec.Body.String() != "table:timeout" {
			t.Errorf("%s: held key: got %d %q, want the table's responder", method, rec.Code, rec.Body)
		}
		req := request(method, "/items/1", "")
		req.Header.Set("X-Skip", "1")
		expectBody(t, srv, req, unlocked)
	}
	expectMetrics(t, m, map[string]map[reqlock.Outcome]int{
		"shop":     {reqlock.OutcomeAcquired: 1, reqlock.OutcomeTimeout: 1},
		"put-item": {reqlock.OutcomeTimeout: 1},
	}, map[string]int{"shop": 1}, "item:1")

	// The table's logger gets every route's warnings.
	store, err := redisstore.New(testredis.DownClient(t))
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	down := reqlock.MustNew(store, reqlock.WithLogger(discardLogger()))
	rt = TableWith(t, down, []middleware.Option{middleware.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))},
		"POST /items/{id}", "key=item:<id> on-store-error=fail-open")
	srv = s.serveRoutes(t, rt, Endpoint{Method: http.MethodPost, Path: "/items/{id}", Handler: reportLock(down)})
	expectBody(t, srv, request(http.MethodPost, "/items/1", ""), unlocked)
	if !strings.Contains(logs.String(), "WITHOUT the lock") {
		t.Fatalf("the fail-open run was not logged on the table's logger: %q", logs.String())
	}
}

// An entry's own skipper replaces the table's, both of them: the table's
// Skipper and RequestSkipper skip the other entries' requests, and the
// entry's requests skip by its own alone (NewRoutesWithConfig's doc).
func (s *suite) testRoutesEntrySkipperWins(t *testing.T) {
	locker, _ := newMemLocker(t)
	plain := middleware.Route{Method: http.MethodPost, Path: "/items/{id}", Config: middleware.Config{Key: "item:<id>"}, Source: "code:1"}
	own := middleware.Route{Method: http.MethodPut, Path: "/items/{id}", Config: middleware.Config{Key: "item:<id>"}, Source: "code:2"}
	own.Config.Skipper = func(r *http.Request) bool { return r.Header.Get("X-Own") != "" }
	rt, err := middleware.NewRoutesWithConfig(locker, []middleware.Route{plain, own},
		middleware.WithSkipper(func(r *http.Request) bool { return r.Header.Get("X-Table") != "" }),
		middleware.WithRequestSkipper(func(req keyfunc.Request) bool { return req.HTTPRequest().Header.Get("X-Skip") != "" }))
	if err != nil {
		t.Fatal(err)
	}
	report := reportLock(locker)
	srv := s.serveRoutes(t, rt,
		Endpoint{Method: http.MethodPost, Path: "/items/{id}", Handler: report},
		Endpoint{Method: http.MethodPut, Path: "/items/{id}", Handler: report})
	for _, tc := range []struct{ method, header, want string }{
		{http.MethodPost, "X-Table", unlocked},
		{http.MethodPost, "X-Skip", unlocked},
		{http.MethodPost, "X-Own", "item:1"},
		{http.MethodPut, "X-Own", unlocked},
		{http.MethodPut, "X-Table", "item:1"},
		{http.MethodPut, "X-Skip", "item:1"},
	} {
		req := request(tc.method, "/items/1", "")
		req.Header.Set(tc.header, "1")
		if rec := do(srv, req); rec.Code != http.StatusOK || rec.Body.String() != tc.want {
			t.Errorf("%s with %s: got %d %q, want 200 %q", tc.method, tc.header, rec.Code, rec.Body, tc.want)
		}
	}
}

// The adapter's native skipper and responder work on a route guard and on a
// whole table (issue 10 item 6).
func (s *suite) testNativeOptions(t *testing.T) {
	locker, _ := newMemLocker(t)
	report := reportLock(locker)
	native := []middleware.Option{s.a.Skipper(), s.a.Responder(http.StatusTooManyRequests, "native")}
	guarded := s.serve(t, locker, "item:<id>", report, append(native, middleware.WithWait(0))...)
	table := s.serveRoutes(t, TableWith(t, locker, native, "POST /items/{id}", "key=item:<id> wait=none"),
		Endpoint{Method: http.MethodPost, Path: "/items/{id}", Handler: report})
	for name, h := range map[string]http.Handler{"route guard": guarded, "table": table} {
		expectBody(t, h, post("/items/1", ""), "item:1")
		release := hold(t, locker, "item:1")
		rec := do(h, post("/items/1", ""))
		if rec.Code != http.StatusTooManyRequests || rec.Body.String() != "native:timeout" {
			t.Errorf("%s: held key: got %d %q, want the native responder's 429", name, rec.Code, rec.Body)
		}
		req := post("/items/1", "")
		req.Header.Set("X-Skip", "1")
		expectBody(t, h, req, unlocked)
		release()
	}
}
