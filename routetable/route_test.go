package routetable_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/reqlock/reqlock/routetable"
)

func TestParseEntry(t *testing.T) {
	for _, tc := range []struct{ route, method, path string }{
		{"POST /skus/{id}/deduct", "POST", "/skus/{id}/deduct"},
		{"  POST\t/skus/:id/deduct ", "POST", "/skus/{id}/deduct"},
		{"GET /", "GET", "/"},
		{"GET /{$}", "GET", "/{$}"},
		{"GET /a/", "GET", "/a/"},
		{"GET /a//b", "GET", "/a//b"},
		{"GET /files/*path", "GET", "/files/{path...}"},
		{"GET /files/{path...}", "GET", "/files/{path...}"},
		{"GET /a/{_x1}/b/:Y_2/*z", "GET", "/a/{_x1}/b/{Y_2}/{z...}"},
		{"GET /a:b/c*d/e%2Ff/é", "GET", "/a:b/c*d/e%2Ff/é"},
		{"HEAD /a", "HEAD", "/a"},
		{"PUT /a", "PUT", "/a"},
		{"PATCH /a", "PATCH", "/a"},
		{"DELETE /a", "DELETE", "/a"},
		{"OPTIONS /a", "OPTIONS", "/a"},
		{"CONNECT /a", "CONNECT", "/a"},
		{"TRACE /a", "TRACE", "/a"},
	} {
		got, err := routetable.ParseEntry(tc.route, "@lock key=k wait=1s", "code")
		want := routetable.Entry{Method: tc.method, Path: tc.path, Source: "code",
			Spec: routetable.Spec{Text: "@lock key=k wait=1s", Keys: []string{"k"}, Wait: time.Second}}
		if err != nil || !reflect.DeepEqual(entries([]routetable.Entry{got})[0], want) {
			t.Errorf("ParseEntry(%q) = %+v, %v; want %+v", tc.route, got, err, want)
		}
	}
}

func TestParseEntryErrors(t *testing.T) {
	const want = `want "METHOD /path", such as "POST /skus/{id}/deduct"`
	for _, tc := range []struct{ route, want string }{
		{"", `route "": empty route (` + want + `)`},
		{" \t", `route " \t": empty route (` + want + `)`},
		{"POST", `route "POST": no path (` + want + `)`},
		{"/skus", `route "/skus": no method (` + want + `)`},
		{"POST /a b", `route "POST /a b": 3 words (` + want + `)`},
		{"post /a", `route "post /a": method "post" is not upper-case (write POST)`},
		{"Get /a", `route "Get /a": method "Get" is not upper-case (write GET)`},
		{"FETCH /a", `route "FETCH /a": unknown method "FETCH" (want GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, CONNECT, TRACE)`},
		{"POST skus", `route "POST skus": path "skus" does not start with "/"`},
		{"POST example.com/skus", `route "POST example.com/skus": path "example.com/skus" does not start with "/"`},
		{"POST /a/:", `route "POST /a/:": segment ":": empty parameter name`},
		{"POST /a/{}", `route "POST /a/{}": segment "{}": empty parameter name`},
		{"POST /a/{...}", `route "POST /a/{...}": segment "{...}": empty parameter name`},
		{"POST /a/*", `route "POST /a/*": segment "*": a wildcard needs a name, such as *path`},
		{"POST /a/:1d", `route "POST /a/:1d": segment ":1d": parameter name "1d" is not a Go identifier`},
		{"POST /a/{id-x}", `route "POST /a/{id-x}": segment "{id-x}": parameter name "id-x" is not a Go identifier`},
		{"POST /a/:id.json", `route "POST /a/:id.json": segment ":id.json": parameter name "id.json" is not a Go identifier`},
		{"POST /a/{id", `route "POST /a/{id": segment "{id": a parameter must be a whole segment, such as {id}`},
		{"POST /a/x{id}", `route "POST /a/x{id}": segment "x{id}": a parameter must be a whole segment, such as {id}`},
		{"POST /a/id}", `route "POST /a/id}": segment "id}": a parameter must be a whole segment, such as {id}`},
		{"POST /a/{id}x", `route "POST /a/{id}x": segment "{id}x": a parameter must be a whole segment, such as {id}`},
		{"POST /a/\x01", `route "POST /a/\x01": segment "\x01": control character U+0001`},
		{"POST /a/*rest/b", `route "POST /a/*rest/b": segment "*rest": a rest-of-path parameter must be the last segment`},
		{"POST /a/{rest...}/", `route "POST /a/{rest...}/": segment "{rest...}": a rest-of-path parameter must be the last segment`},
		{"POST /{$}/a", `route "POST /{$}/a": {$} must be the last segment`},
		{"POST /a/{id}/b/:id", `route "POST /a/{id}/b/:id": parameter "id" appears twice`},
	} {
		_, err := routetable.ParseEntry(tc.route, "key=a", "routes.go:12")
		checkErrors(t, "ParseEntry("+tc.route+")", err, "routes.go:12: "+tc.want)
	}

	// Route and spec problems are both reported; an empty source adds no
	// prefix.
	_, err := routetable.ParseEntry("post /a", "@lock key=a wiat=1s", "")
	checkErrors(t, "ParseEntry(post /a)", err,
		`route "post /a": method "post" is not upper-case (write POST)`,
		`post /a: spec column 13: unknown field "wiat" `+knownFields)
}

// TestPaths checks the path helpers on every spelling of a parameter.
func TestPaths(t *testing.T) {
	for _, tc := range []struct {
		path, canonical, colon, shape string
		params                        []routetable.Param
	}{
		{"/a/b", "/a/b", "/a/b", "/a/b", nil},
		{"/skus/:id/deduct", "/skus/{id}/deduct", "/skus/:id/deduct", "/skus/{}/deduct", []routetable.Param{{"id", 2, false}}},
		{"/skus/{id}/deduct", "/skus/{id}/deduct", "/skus/:id/deduct", "/skus/{}/deduct", []routetable.Param{{"id", 2, false}}},
		{"/files/*path", "/files/{path...}", "/files/*path", "/files/{...}", []routetable.Param{{"path", 2, true}}},
		{"/a/{x}/b/:y/{z...}", "/a/{x}/b/{y}/{z...}", "/a/:x/b/:y/*z", "/a/{}/b/{}/{...}",
			[]routetable.Param{{"x", 2, false}, {"y", 4, false}, {"z", 5, true}}},
		{"/a/{$}", "/a/{$}", "/a/{$}", "/a/{$}", nil},
		{"/a:b/c*d", "/a:b/c*d", "/a:b/c*d", "/a:b/c*d", nil},
	} {
		c := routetable.CanonicalPath(tc.path)
		if c != tc.canonical {
			t.Errorf("CanonicalPath(%q) = %q, want %q", tc.path, c, tc.canonical)
		}
		if got := routetable.ColonPath(c); got != tc.colon {
			t.Errorf("ColonPath(%q) = %q, want %q", c, got, tc.colon)
		}
		if got := routetable.PathShape(c); got != tc.shape {
			t.Errorf("PathShape(%q) = %q, want %q", c, got, tc.shape)
		}
		if got := routetable.PathParams(c); !reflect.DeepEqual(got, tc.params) {
			t.Errorf("PathParams(%q) = %+v, want %+v", c, got, tc.params)
		}
	}
}
