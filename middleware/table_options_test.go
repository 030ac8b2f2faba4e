package middleware_test

import (
	"errors"
	"io/fs"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/adaptertest"
	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/routetable"
	"github.com/reqlock/reqlock/stores/memstore"
)

// TestTableOptionsOnlyTableWideFields: a table-wide option must be one that
// applies to a whole table; the fields a spec sets belong to each entry, so
// a table option setting one is a start-up error naming it, as is a
// meaningless value and two responders.
func TestTableOptionsOnlyTableWideFields(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	e, err := routetable.ParseEntry("POST /items/{id}", "key=item:<id>", "code:1")
	if err != nil {
		t.Fatal(err)
	}
	respond := func(http.ResponseWriter, *http.Request, *middleware.Rejection) {}
	respondReq := func(http.ResponseWriter, keyfunc.Request, *middleware.Rejection) error { return nil }
	for _, tc := range []struct {
		opts []middleware.Option
		want string
	}{
		{[]middleware.Option{middleware.WithWait(time.Second)}, "set Wait, which belong to each entry's spec"},
		{[]middleware.Option{middleware.WithFailOpen(), middleware.WithWatchdog()}, "set OnStoreError, Watchdog,"},
		{[]middleware.Option{middleware.WithKeys("tenant:<header:X-Tenant>")}, "set Keys,"},
		{[]middleware.Option{middleware.WithTTL(0)}, "route table option WithTTL(0s)"},
		{[]middleware.Option{middleware.WithResponder(respond), middleware.WithRequestResponder(respondReq)}, "both a Responder and a RequestResponder"},
	} {
		rt, err := middleware.NewRoutes(locker, []routetable.Entry{e}, tc.opts...)
		if !errors.Is(err, middleware.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewRoutes = %v, %v; want ErrInvalidConfig saying %q", rt, err, tc.want)
		}
	}
	if _, err := middleware.NewRoutes(locker, []routetable.Entry{e},
		middleware.WithResponder(respond), middleware.WithSkipper(func(*http.Request) bool { return false }),
		middleware.WithName("shop"), middleware.WithLogger(nil)); err != nil {
		t.Fatalf("table-wide fields: %v", err)
	}
}

// TestTableOptionsEntryWins: an entry's own name (and a hand-built entry's
// own responder) wins over the table's.
func TestTableOptionsEntryWins(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	named := entry(t, "POST /items/{id}", "key=item:<id> name=deduct", "code:1")
	plain := entry(t, "PUT /items/{id}", "key=item:<id>", "code:2")
	own := func(w http.ResponseWriter, _ *http.Request, _ *middleware.Rejection) {
		w.WriteHeader(http.StatusTeapot)
	}
	plain.Config.Responder = own
	table := func(w http.ResponseWriter, _ *http.Request, _ *middleware.Rejection) {
		w.WriteHeader(http.StatusConflict)
	}
	rt, err := middleware.NewRoutesWithConfig(locker, []middleware.Route{named, plain},
		middleware.WithName("shop"), middleware.WithResponder(table))
	if err != nil {
		t.Fatal(err)
	}
	if got := rt.Guard(http.MethodPost, "/items/{id}").Config().Name; got != "deduct" {
		t.Errorf("named entry: name %q, want its own", got)
	}
	if got := rt.Guard(http.MethodPut, "/items/{id}").Config().Name; got != "shop" {
		t.Errorf("unnamed entry: name %q, want the table's", got)
	}
	for method, want := range map[string]int{http.MethodPost: http.StatusConflict, http.MethodPut: http.StatusTeapot} {
		rec := &statusRecorder{header: http.Header{}}
		rt.Guard(method, "/items/{id}").Reject(rec, nil, &middleware.Rejection{Status: http.StatusLocked})
		if rec.status != want {
			t.Errorf("%s: the rejection got %d, want %d", method, rec.status, want)
		}
	}
}

type statusRecorder struct {
	header http.Header
	status int
}

func (r *statusRecorder) Header() http.Header         { return r.header }
func (r *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *statusRecorder) WriteHeader(status int)      { r.status = status }

// TestLoadRoutesDeferred: a deferred table keeps the problems it finds,
// file-level ones too, and the install reports them with the entries that
// match no route, an entry with a bad spec included.
func TestLoadRoutesDeferred(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	write := func(name, data string) string { return adaptertest.WriteTable(t, name, data) }
	mux := http.NewServeMux()
	mux.HandleFunc("POST /items/{id}", func(http.ResponseWriter, *http.Request) {})

	for _, tc := range []struct {
		name, path string
		want       []string
	}{
		{"missing file", filepath.Join(t.TempDir(), "none.yaml"), []string{"none.yaml: read route table"}},
		{"bad extension", write("routes.txt", ""), []string{`unsupported route table extension ".txt"`}},
		{"syntax error", write("syntax.json", `{"routes": {`), []string{"syntax.json:1: invalid JSON"}},
		{"bad spec on an unserved route", write("both.yaml", "routes:\n  POST /items/{id}: key=item:<id>\n  PUT /nowhere/{id}: key=x:<id> ttl=0\n"),
			[]string{`both.yaml:3: PUT /nowhere/{id}: spec column 12: ttl: "0" is below 1ms`, "both.yaml:3: PUT /nowhere/{id} matches no pattern"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := middleware.LoadRoutesDeferred(locker, tc.path)
			if !errors.Is(rt.Err(), middleware.ErrInvalidConfig) {
				t.Fatalf("Err() = %v, want ErrInvalidConfig", rt.Err())
			}
			h, err := rt.Handler(mux)
			if h != nil || !errors.Is(err, middleware.ErrInvalidConfig) {
				t.Fatalf("Handler = %v, %v; want no handler and ErrInvalidConfig", h, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Handler's error does not say %q:\n%v", w, err)
				}
			}
		})
	}

	rt := middleware.LoadRoutesDeferred(locker, write("ok.yaml", "routes:\n  POST /items/{id}: key=item:<id>\n"))
	if err := rt.Err(); err != nil {
		t.Fatalf("a good table: Err() = %v", err)
	}
	if _, err := rt.Handler(mux); err != nil || rt.Guard(http.MethodPost, "/items/{id}") == nil {
		t.Fatalf("a good table: Handler err %v, guard %v", err, rt.Guard(http.MethodPost, "/items/{id}"))
	}
}

// TestLoadRoutesErrors: LoadRoutes reports every problem of a file under
// this package's prefix, each wrapping ErrInvalidConfig and
// routetable.ErrInvalid, in the order of the file; a file it cannot read is
// not a configuration error.
func TestLoadRoutesErrors(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	path := adaptertest.WriteTable(t, "r.yaml", "routes:\n  GET /a: key=a wiat=1s\n  post /b: key=b\n  GET /c: key=c\n")
	_, err := middleware.LoadRoutes(locker, path)
	want := []string{
		path + `:2: GET /a: spec column 7: unknown field "wiat"`,
		path + `:3: route "post /b": method "post" is not upper-case (write POST)`,
	}
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok || len(joined.Unwrap()) != len(want) {
		t.Fatalf("LoadRoutes = %v, want %d joined errors", err, len(want))
	}
	for i, e := range joined.Unwrap() {
		prefix := middleware.ErrInvalidConfig.Error() + ": " + want[i]
		if !strings.HasPrefix(e.Error(), prefix) || !errors.Is(e, middleware.ErrInvalidConfig) || !errors.Is(e, routetable.ErrInvalid) {
			t.Errorf("error %d = %q, want ErrInvalidConfig and routetable.ErrInvalid starting %q", i, e, prefix)
		}
	}

	missing := filepath.Join(t.TempDir(), "none.yaml")
	_, err = middleware.LoadRoutes(locker, missing)
	if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, middleware.ErrInvalidConfig) ||
		err.Error() != "reqlock/middleware: read route table: open "+missing+": no such file or directory" {
		t.Errorf("LoadRoutes(missing file) = %v", err)
	}

	rt, err := middleware.LoadRoutes(locker, adaptertest.WriteTable(t, "ok.json", "{\"routes\": {\n\"POST /a/:id\": \"key=a:<id> wait=none\"}}"))
	if err != nil {
		t.Fatal(err)
	}
	routes := rt.Routes()
	if len(routes) != 1 || routes[0].Path != "/a/{id}" || routes[0].Spec != "key=a:<id> wait=none" ||
		!strings.HasSuffix(routes[0].Source, "ok.json:2") || routes[0].Config.Wait != middleware.NoWait {
		t.Errorf("Routes() = %+v", routes)
	}
}
