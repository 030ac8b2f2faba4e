package middleware

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/reqlock/reqlock/keyfunc"
)

// FuzzParseSpec checks that ParseSpec never panics, that its errors wrap
// ErrInvalidConfig and name a column within the spec, and that a Config it
// returns validates and has key templates that parse.
func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{
		"@lock key=sku:<id> wait=2s ttl=10s on-timeout=423 on-store-error=503",
		"@lock name=all key=<json:a> key=b watchdog ttl=1m wait=none on-timeout=409 retry-after=2s " +
			"on-store-error=fail-open hold-at-least=1s max-keys=4 max-body=1MiB max-value-len=32",
		`@lock key="q:\"x\\y" name="a b"`,
		"key=a ttl=20ms watchdog",
		"key=a max-body=64KiB max-value-len=16",
		`key=a name="x\n"`,
		"@locks key=a",
		"key=a wait=-1s",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		cfg, err := ParseSpec(spec)
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("ParseSpec(%q) error %v does not wrap ErrInvalidConfig", spec, err)
			}
			var ce *configError
			if !errors.As(err, &ce) || !strings.HasPrefix(ce.where, "spec column ") {
				t.Fatalf("ParseSpec(%q) error %v names no column", spec, err)
			}
			return
		}
		if cfg.Key == "" {
			t.Fatalf("ParseSpec(%q) gave no Key", spec)
		}
		d := cfg.withDefaults()
		if err := d.validate(); err != nil {
			t.Fatalf("ParseSpec(%q) gave a Config that does not validate: %v", spec, err)
		}
		for _, tmpl := range d.templates() {
			if _, err := keyfunc.Parse(tmpl, keyfunc.WithMaxBodyBytes(d.MaxBodyBytes), keyfunc.WithMaxValueLen(d.MaxValueLen)); err != nil {
				t.Fatalf("ParseSpec(%q) gave key %q that does not parse: %v", spec, tmpl, err)
			}
		}
		if !utf8.ValidString(cfg.Name) {
			t.Fatalf("ParseSpec(%q) gave a name that is not UTF-8", spec)
		}
	})
}

// TestSpecMinMaxValueLen checks that minSpecMaxValueLen is the least
// max value length keyfunc accepts.
func TestSpecMinMaxValueLen(t *testing.T) {
	if _, err := keyfunc.Parse("k", keyfunc.WithMaxValueLen(minSpecMaxValueLen)); err != nil {
		t.Errorf("keyfunc rejects max value length %d: %v", minSpecMaxValueLen, err)
	}
	if _, err := keyfunc.Parse("k", keyfunc.WithMaxValueLen(minSpecMaxValueLen-1)); err == nil {
		t.Errorf("keyfunc accepts max value length %d; lower minSpecMaxValueLen", minSpecMaxValueLen-1)
	}
}
