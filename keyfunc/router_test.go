package keyfunc

import (
	"errors"
	"strings"
	"testing"
)

// Router syntax, {id} or :id, is the likeliest typo of a gin, echo or
// net/http user: it would parse as a literal and give every request the same
// key. Parse refuses it and shows the reqlock spelling.
func TestParseRouterSyntax(t *testing.T) {
	tests := []struct {
		template, syntax, want string
	}{
		{"acct:{id}", "{id}", "<id>"},
		{"{id}", "{id}", "<id>"},
		{"files:{path...}", "{path...}", "<path>"},
		{"acct:{id}:<query:x>", "{id}", "<id>"},
		{"{stock}:<id>", "{stock}", "<stock>"},
		{"acct::id", ":id", "<id>"},
		{":id", ":id", "<id>"},
		{"acct/:id", ":id", "<id>"},
		{"<tenant>::acct_2", ":acct_2", "<acct_2>"},
		{"a:\\\\::id", ":id", "<id>"}, // an escaped backslash, then a plain ':'
	}
	for _, tt := range tests {
		t.Run(tt.template, func(t *testing.T) {
			_, err := Parse(tt.template)
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("Parse(%q) = %v, want ErrSyntax", tt.template, err)
			}
			msg := err.Error()
			for _, part := range []string{"router syntax " + tt.syntax, "write " + tt.want + " for a path parameter", `\` + tt.syntax + " for literal text"} {
				if !strings.Contains(msg, part) {
					t.Errorf("error %q lacks %q", msg, part)
				}
			}
		})
	}
}

// Literal words after a colon, braces around a placeholder and escaped router
// syntax stay valid, and an escape renders as the byte it escapes.
func TestParseNotRouterSyntax(t *testing.T) {
	tests := []struct {
		template string
		values   []string
		want     string
	}{
		{"sku:<id>", []string{"9"}, "sku:9"},
		{"tenant:acme:<id>", []string{"9"}, "tenant:acme:9"},
		{"acct:id", nil, "acct:id"},
		{"a:b:c", nil, "a:b:c"},
		{"::<id>", []string{"9"}, "::9"},
		{"{<id>}", []string{"9"}, "{9}"},
		{"{sku:<id>}:x", []string{"9"}, "{sku:9}:x"},
		{"cart:{<json:cart>}:sku:<json:sku>", []string{"c", "9"}, "cart:{c}:sku:9"}, // redisstore's advice
		{"{}:{1a}:{a-b}:{$}", nil, "{}:{1a}:{a-b}:{$}"},
		{"\\{stock}:<id>", []string{"9"}, "{stock}:9"},
		{"acct:\\{id}", nil, "acct:{id}"},
		{"acct:{id\\}", nil, "acct:{id}"},
		{"acct:\\:id", nil, "acct::id"},
		{"acct:\\::id", nil, "acct:::id"}, // ':id' after an escaped ':' is a word
		{"\\:id:<id>", []string{"9"}, ":id:9"},
		{"a\\\\b:<id>", []string{"9"}, "a\\b:9"},
		{"\\\\<id>", []string{"9"}, "\\9"},
	}
	for _, tt := range tests {
		t.Run(tt.template, func(t *testing.T) {
			tmpl, err := Parse(tt.template)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got := tmpl.String(); got != tt.template {
				t.Errorf("String() = %q, want %q", got, tt.template)
			}
			got, err := tmpl.Render(tt.values...)
			if err != nil || got != tt.want {
				t.Errorf("Render = %q, %v; want %q", got, err, tt.want)
			}
			if want := len(tt.want) - len(strings.Join(tt.values, "")) + tmpl.holes*max(tmpl.maxValueLen, hashedLen); tmpl.MaxLen() != want {
				t.Errorf("MaxLen() = %d, want %d", tmpl.MaxLen(), want)
			}
			if len(tt.values) == 0 {
				if key, err := tmpl.Key(fakeRequest{}); err != nil || key != tt.want {
					t.Errorf("Key = %q, %v; want %q", key, err, tt.want)
				}
			}
		})
	}
}

// TestRouterSyntaxMessage keeps the message the package documentation shows.
func TestRouterSyntaxMessage(t *testing.T) {
	_, err := Parse("acct:{id}")
	want := `keyfunc: invalid template: "acct:{id}": router syntax {id} at offset 5 (write <id> for a path parameter, or \{id} for literal text)`
	if err == nil || err.Error() != want {
		t.Fatalf("Parse = %v, want %s", err, want)
	}
}

func TestParseBadEscape(t *testing.T) {
	for _, tt := range []struct{ template, want string }{
		{`a\b`, `keyfunc: invalid template: "a\\b": backslash before 'b' at offset 1 (a backslash escapes only '{', '}', ':' and '\': write \\ for a backslash)`},
		{`a:\`, `keyfunc: invalid template: "a:\\": backslash before the end at offset 2 (a backslash escapes only '{', '}', ':' and '\': write \\ for a backslash)`},
		{`a:\<id>`, `keyfunc: invalid template: "a:\\<id>": backslash before '<' at offset 2 (a backslash escapes only '{', '}', ':' and '\': write \\ for a backslash)`},
	} {
		_, err := Parse(tt.template)
		if !errors.Is(err, ErrSyntax) || err.Error() != tt.want {
			t.Errorf("Parse(%q) = %v, want %s", tt.template, err, tt.want)
		}
	}
}
