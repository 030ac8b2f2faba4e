package routetable_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/routetable"
)

// wantRouterSyntaxError checks that err rejects a key template in router
// syntax: it wraps ErrInvalid and keyfunc.ErrSyntax and shows the reqlock
// spelling of the parameter.
func wantRouterSyntaxError(t *testing.T, what string, err error, syntax, spelling string) {
	t.Helper()
	if !errors.Is(err, routetable.ErrInvalid) || !errors.Is(err, keyfunc.ErrSyntax) {
		t.Fatalf("%s: err = %v, want ErrInvalid and keyfunc.ErrSyntax", what, err)
	}
	for _, part := range []string{"router syntax " + syntax, "write " + spelling + " for a path parameter"} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("%s: error %q lacks %q", what, err, part)
		}
	}
}

// TestRouterSyntaxInSpec: a spec's key in router syntax fails ParseSpec and
// ParseEntry, quoted or not, and the error keeps the spec column.
func TestRouterSyntaxInSpec(t *testing.T) {
	for _, tc := range []struct{ spec, syntax string }{
		{"@lock key=acct:{id} wait=1s", "{id}"},
		{`@lock key="acct::id"`, ":id"},
		{"@lock key=sku:<sku> key=:id", ":id"},
	} {
		_, err := routetable.ParseSpec(tc.spec)
		wantRouterSyntaxError(t, "ParseSpec("+tc.spec+")", err, tc.syntax, "<id>")
		if !strings.Contains(err.Error(), "spec column ") {
			t.Errorf("ParseSpec(%s): error %q has no column", tc.spec, err)
		}
		_, err = routetable.ParseEntry("POST /acct/{id}", tc.spec, "main.go:12")
		wantRouterSyntaxError(t, "ParseEntry("+tc.spec+")", err, tc.syntax, "<id>")
	}
}

// TestRouterSyntaxInTable: a YAML or JSON route table with a key in router
// syntax fails to load, with the entry's line.
func TestRouterSyntaxInTable(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, data, where, syntax string }{
		{"routes.yaml", "routes:\n  GET /a: key=a\n  POST /acct/{id}: key=acct:{id}\n", "routes.yaml:3", "{id}"},
		{"routes.yml", "routes:\n  POST /acct/:id: '@lock key=acct::id'\n", "routes.yml:2", ":id"},
		{"routes.json", "{\"routes\": {\n\"POST /acct/{id}\": \"key=acct:{id}\"}}", "routes.json:2", "{id}"},
	} {
		path := filepath.Join(dir, tc.name)
		if err := os.WriteFile(path, []byte(tc.data), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := routetable.Load(path)
		wantRouterSyntaxError(t, tc.name, err, tc.syntax, "<id>")
		if !strings.Contains(err.Error(), tc.where) {
			t.Errorf("%s: error %q does not name %s", tc.name, err, tc.where)
		}
	}
}
