package memstore_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
)

// TestOpen: Open takes memory:// with a label and connect, and refuses
// anything else, an unknown parameter with stores.ErrUnknownOption (issue
// 20 item 4: memory://x?foo=1 was accepted).
func TestOpen(t *testing.T) {
	for _, u := range []string{"memory://", "memory://orders", "memory:///a/b", "memory://x?connect=lazy", "memory://?connect=check"} {
		if s, err := memstore.Open(t.Context(), u); err != nil || s == nil {
			t.Errorf("Open(%q): %v, %v", u, s, err)
		}
	}
	for u, want := range map[string]string{
		"redis://x":              `scheme "redis"`,
		"memory:x":               "want memory://",
		"memory://u:p@x":         "user information",
		"memory://x#f":           "fragment",
		"memory://x?connect=now": `connect="now"`,
		"memory://x?%zz":         "URL parameters",
		"memory://x?foo=1":       `memstore: unknown URL option "foo" (known: connect)`,
	} {
		s, err := memstore.Open(t.Context(), u)
		if s != nil || !errors.Is(err, stores.ErrInvalid) || !strings.Contains(errText(err), want) {
			t.Errorf("Open(%q): %v, %v; want stores.ErrInvalid saying %q", u, s, err, want)
		}
		if strings.Contains(u, "foo") != errors.Is(err, stores.ErrUnknownOption) {
			t.Errorf("Open(%q): %v; wraps stores.ErrUnknownOption: %v", u, err, errors.Is(err, stores.ErrUnknownOption))
		}
	}
}

// errText is err's message, or "" for nil.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
