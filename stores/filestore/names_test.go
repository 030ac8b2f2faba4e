package filestore

import (
	"strings"
	"testing"
)

// TestFileName: names are safe (no path separator, NUL, "." or "..", at
// most 255 bytes), distinct for distinct keys, case-differing ones
// included, and long keys are hashed.
func TestFileName(t *testing.T) {
	keys := []string{
		"a", "A", "_41", "_", "..", ".", "../../etc/passwd", "/abs", "a/b", "a_2fb",
		"sku:42", "sku:42 ", "k\x00", "k", "é", "\xff",
		strings.Repeat("x", maxEscaped), strings.Repeat("x", maxEscaped+1),
		strings.Repeat("/", 100), strings.Repeat("/", 67), strings.Repeat("y", 10000),
	}
	seen := make(map[string]string)
	for _, k := range keys {
		name := fileName(k)
		if strings.ContainsAny(name, "/\x00") || name == "." || name == ".." || strings.HasPrefix(name, ".") {
			t.Errorf("fileName(%q) = %q: not a safe name", k, name)
		}
		if len(name) > 255 {
			t.Errorf("fileName(%q) has %d bytes, over NAME_MAX", k, len(name))
		}
		if lower := strings.ToLower(name); seen[lower] != "" && seen[lower] != k {
			t.Errorf("fileName(%q) = %q, as for %q (ignoring case)", k, name, seen[lower])
		} else {
			seen[lower] = k
		}
	}
	if got := fileName("sku:42"); got != "k-sku_3a42" {
		t.Errorf(`fileName("sku:42") = %q, want "k-sku_3a42"`, got)
	}
	if got := fileName(strings.Repeat("x", maxEscaped+1)); !strings.HasPrefix(got, hashedPrefix) || len(got) != len(hashedPrefix)+64 {
		t.Errorf("a key over %d escaped bytes is named %q, want its SHA-256", maxEscaped, got)
	}
}

// FuzzFileName: no two keys share a name, and every name is safe.
func FuzzFileName(f *testing.F) {
	f.Add("a", "A")
	f.Add("a_2f", "a/")
	f.Fuzz(func(t *testing.T, a, b string) {
		na, nb := fileName(a), fileName(b)
		if a != b && na == nb {
			t.Fatalf("keys %q and %q share the name %q", a, b, na)
		}
		if strings.ContainsAny(na, "/\x00") || len(na) > 255 || na[0] == '.' {
			t.Fatalf("fileName(%q) = %q: not a safe name", a, na)
		}
	})
}
