package middleware_test

import (
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores/memstore"
)

const knownFields = "(known: key, ttl, wait, on-timeout, retry-after, on-store-error, hold-at-least, max-keys, max-body, max-value-len, watchdog, name)"

// TestParseSpecFields checks every field against the Config its Option
// builds, and that NewWithConfig accepts the result.
func TestParseSpecFields(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	for _, tc := range []struct {
		spec string
		want middleware.Config
	}{
		{"key=sku:<id>", middleware.Config{Key: "sku:<id>"}},
		{"@lock key=sku:<id>", middleware.Config{Key: "sku:<id>"}},
		{"  @lock\tkey=sku:<id>  ", middleware.Config{Key: "sku:<id>"}},
		{"@lock key=a key=b:<json:b> key=c", cfg("a", middleware.WithKeys("b:<json:b>", "c"))},
		{`@lock key="sku:<id>"`, middleware.Config{Key: "sku:<id>"}},
		{`@lock key="q:\"x\\{y"`, middleware.Config{Key: `q:"x\{y`}}, // \{ is keyfunc's escape of a brace
		{"@lock key=a ttl=10s", cfg("a", middleware.WithTTL(10*time.Second))},
		{"@lock key=a ttl=1ms", cfg("a", middleware.WithTTL(time.Millisecond))},
		{"@lock key=a ttl=1m30s", cfg("a", middleware.WithTTL(90*time.Second))},
		{"@lock key=a wait=2s", cfg("a", middleware.WithWait(2*time.Second))},
		{"@lock key=a wait=500ms", cfg("a", middleware.WithWait(500*time.Millisecond))},
		{"@lock key=a wait=0", cfg("a", middleware.WithWait(0))},
		{"@lock key=a wait=0s", middleware.Config{Key: "a", Wait: middleware.NoWait}},
		{"@lock key=a wait=none", middleware.Config{Key: "a", Wait: middleware.NoWait}},
		{"@lock key=a on-timeout=423", cfg("a", middleware.WithTimeoutStatus(http.StatusLocked))},
		{"@lock key=a on-timeout=409", cfg("a", middleware.WithTimeoutStatus(http.StatusConflict))},
		{"@lock key=a on-timeout=429", cfg("a", middleware.WithTimeoutStatus(http.StatusTooManyRequests))},
		{"@lock key=a on-timeout=503", cfg("a", middleware.WithTimeoutStatus(http.StatusServiceUnavailable))},
		{"@lock key=a retry-after=3s", cfg("a", middleware.WithRetryAfter(3*time.Second))},
		{"@lock key=a on-store-error=503", middleware.Config{Key: "a", OnStoreError: middleware.FailClosed}},
		{"@lock key=a on-store-error=fail-closed", middleware.Config{Key: "a", OnStoreError: middleware.FailClosed}},
		{"@lock key=a on-store-error=fail-open", cfg("a", middleware.WithFailOpen())},
		{"@lock key=a on-store-error=run", cfg("a", middleware.WithFailOpen())},
		{"@lock key=a hold-at-least=5s", cfg("a", middleware.WithHoldAtLeast(5*time.Second))},
		{"@lock key=a hold-at-least=0", middleware.Config{Key: "a"}},
		{"@lock key=a max-keys=8", cfg("a", middleware.WithMaxKeys(8))},
		{"@lock key=a max-body=4096", cfg("a", middleware.WithMaxBodyBytes(4096))},
		{"@lock key=a max-body=64KiB", cfg("a", middleware.WithMaxBodyBytes(64<<10))},
		{"@lock key=a max-body=2MiB", cfg("a", middleware.WithMaxBodyBytes(2<<20))},
		{"@lock key=a max-value-len=16", cfg("a", middleware.WithMaxValueLen(16))},
		{"@lock key=a max-value-len=200", cfg("a", middleware.WithMaxValueLen(200))},
		{"@lock key=a watchdog", cfg("a", middleware.WithWatchdog())},
		{"@lock key=a watchdog=true", cfg("a", middleware.WithWatchdog())},
		{"@lock key=a watchdog=false", middleware.Config{Key: "a"}},
		{"@lock key=a ttl=30ms watchdog", cfg("a", middleware.WithTTL(30*time.Millisecond), middleware.WithWatchdog())},
		{"@lock key=a name=deduct", cfg("a", middleware.WithName("deduct"))},
		{`@lock key=a name="POST /skus/{id}/deduct"`, cfg("a", middleware.WithName("POST /skus/{id}/deduct"))},
		{`@lock name="é" key=a`, cfg("a", middleware.WithName("é"))},
		{
			"@lock key=sku:<id> wait=2s ttl=10s on-timeout=423 on-store-error=503",
			cfg("sku:<id>", middleware.WithWait(2*time.Second), middleware.WithTTL(10*time.Second),
				middleware.WithTimeoutStatus(423)),
		},
		{
			"@lock name=all key=<json:a> key=b watchdog ttl=1m wait=none on-timeout=409 retry-after=2s " +
				"on-store-error=fail-open hold-at-least=1s max-keys=4 max-body=1MiB max-value-len=32",
			cfg("<json:a>", middleware.WithName("all"), middleware.WithKeys("b"), middleware.WithWatchdog(),
				middleware.WithTTL(time.Minute), middleware.WithWait(0), middleware.WithTimeoutStatus(409),
				middleware.WithRetryAfter(2*time.Second), middleware.WithFailOpen(),
				middleware.WithHoldAtLeast(time.Second), middleware.WithMaxKeys(4),
				middleware.WithMaxBodyBytes(1<<20), middleware.WithMaxValueLen(32)),
		},
	} {
		got, err := middleware.ParseSpec(tc.spec)
		if err != nil {
			t.Errorf("ParseSpec(%q): %v", tc.spec, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseSpec(%q) =\n%+v, want\n%+v", tc.spec, got, tc.want)
		}
		if got := middleware.MustParseSpec(tc.spec); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("MustParseSpec(%q) = %+v", tc.spec, got)
		}
		if _, err := middleware.NewWithConfig(locker, got); err != nil {
			t.Errorf("NewWithConfig(ParseSpec(%q)): %v", tc.spec, err)
		}
	}
}

// cfg is the Config that middleware.New would start from.
func cfg(key string, opts ...middleware.Option) middleware.Config {
	c := middleware.Config{Key: key}
	for _, opt := range opts {
		opt(&c)
	}
	return c
}

// TestParseSpecDefaults checks that a spec with only a key takes every other
// field from DefaultConfig.
func TestParseSpecDefaults(t *testing.T) {
	c, err := middleware.ParseSpec("@lock key=sku:<id>")
	if err != nil {
		t.Fatal(err)
	}
	g, err := middleware.NewWithConfig(reqlock.MustNew(memstore.New()), c)
	if err != nil {
		t.Fatal(err)
	}
	want := middleware.DefaultConfig
	want.Key, want.Name = "sku:<id>", "sku:<id>"
	if got := g.Config(); !reflect.DeepEqual(got, want) {
		t.Errorf("Config() = %+v, want %+v", got, want)
	}
}

func TestParseSpecErrors(t *testing.T) {
	for _, tc := range []struct{ spec, want string }{
		{"@lock key=sku:1 wiat=2s", `spec column 17: unknown field "wiat" ` + knownFields},
		{`kéy=a`, `spec column 1: unknown field "kéy" ` + knownFields},
		{`name="é" wiat=1`, `spec column 10: unknown field "wiat" ` + knownFields},
		{`key=a watch`, `spec column 7: unknown field "watch" ` + knownFields},
		{`key=a "key"=b`, `spec column 7: unknown field "\"key\"" ` + knownFields},
		{`key=a =b`, `spec column 7: "=" without a field name`},
		{`key=a @lock`, `spec column 7: "@lock" can only start the spec`},
		{`@locks key=a`, `spec column 1: starts with "@locks", not "@lock"`},
		{`  @Lock key=a`, `spec column 3: starts with "@Lock", not "@lock"`},
		{`@lockkey=a`, `spec column 1: starts with "@lockkey=a", not "@lock"`},
		{``, `spec column 1: no key (such as key=sku:<id>)`},
		{`@lock`, `spec column 1: no key (such as key=sku:<id>)`},
		{`@lock wait=2s`, `spec column 1: no key (such as key=sku:<id>)`},
		{`key=a wait`, `spec column 7: wait: no value (write wait=VALUE)`},
		{`key=a wait=`, `spec column 7: wait: empty value`},
		{`key=a wait= ttl=1s`, `spec column 7: wait: empty value`},
		{`key=a wait=""`, `spec column 7: wait: empty value`},
		{`key= wait=1s`, `spec column 1: key: empty value`},
		{`key=a wait=1s wait=2s`, `spec column 15: wait given twice (first at column 7)`},
		{`key=a watchdog watchdog=false`, `spec column 16: watchdog given twice (first at column 7)`},
		{`key=a name=x name=y`, `spec column 14: name given twice (first at column 7)`},
		{`key=a key=b key=a`, `spec column 13: key: "a" given twice (first at column 1)`},
		{`key="sku:<id>`, `spec column 1: key: unterminated quoted value`},
		{`key=a name="x`, `spec column 7: name: unterminated quoted value`},
		{`key=a name="x\`, `spec column 7: name: unterminated quoted value`},
		{`key=a name="x\n"`, `spec column 7: name: backslash before 'n' in quoted value (only \" and \\ are escapes)`},
		{`key="a"b`, `spec column 1: key: no space after the closing quote`},
		{`key=a"b"`, `spec column 1: key: stray '"' in an unquoted value (quote the whole value)`},
		{"key=a name=\"x\ty\"", `spec column 7: name: control character U+0009 in value`},
		{"key=a name=x\x00y", `spec column 7: name: control character U+0000 in value`},
		{"key=a name=\xff", `spec column 12: invalid UTF-8`},
		{`key=abcd wait="2x"`, `spec column 10: wait: "2x" is not a duration (such as 2s or 500ms)`},
		{`key=a wait=2`, `spec column 7: wait: "2" is not a duration (such as 2s or 500ms)`},
		{`key=a wait=-1s`, `spec column 7: wait: "-1s" is negative (write wait=none to try once)`},
		{`key=a ttl=ten`, `spec column 7: ttl: "ten" is not a duration (such as 2s or 500ms)`},
		{`key=a ttl=-1s`, `spec column 7: ttl: "-1s" is negative`},
		{`key=a ttl=0`, `spec column 7: ttl: "0" is below 1ms`},
		{`key=a ttl=999us`, `spec column 7: ttl: "999us" is below 1ms`},
		{`key=a retry-after=x`, `spec column 7: retry-after: "x" is not a duration (such as 2s or 500ms)`},
		{`key=a retry-after=-2s`, `spec column 7: retry-after: "-2s" is negative`},
		{`key=a retry-after=0`, `spec column 7: retry-after: "0" is zero (Retry-After is whole seconds, at least 1)`},
		{`key=a hold-at-least=1`, `spec column 7: hold-at-least: "1" is not a duration (such as 2s or 500ms)`},
		{`key=a hold-at-least=-1s`, `spec column 7: hold-at-least: "-1s" is negative`},
		{`key=a on-timeout=500`, `spec column 7: on-timeout: "500" is not one of 423, 409, 429, 503`},
		{`key=a on-timeout=locked`, `spec column 7: on-timeout: "locked" is not one of 423, 409, 429, 503`},
		{`key=a on-store-error=500`, `spec column 7: on-store-error: "500" is not one of 503, fail-closed, fail-open, run`},
		{`key=a max-keys=x`, `spec column 7: max-keys: "x" is not a whole number`},
		{`key=a max-keys=-1`, `spec column 7: max-keys: "-1" is not a whole number`},
		{`key=a max-keys=0`, `spec column 7: max-keys: "0" is below 1`},
		{`key=a max-keys=99999999999999999999`, `spec column 7: max-keys: "99999999999999999999" is too large`},
		{`key=a max-body=0`, `spec column 7: max-body: "0" is below 1 byte`},
		{`key=a max-body=0KiB`, `spec column 7: max-body: "0KiB" is below 1 byte`},
		{`key=a max-body=64KB`, `spec column 7: max-body: "64KB" is not a size in bytes (such as 65536, 64KiB or 1MiB)`},
		{`key=a max-body=MiB`, `spec column 7: max-body: "MiB" is not a size in bytes (such as 65536, 64KiB or 1MiB)`},
		{`key=a max-body=-1`, `spec column 7: max-body: "-1" is not a size in bytes (such as 65536, 64KiB or 1MiB)`},
		{`key=a max-body=9223372036854775808`, `spec column 7: max-body: "9223372036854775808" is too large`},
		{`key=a max-body=8796093022208MiB`, `spec column 7: max-body: "8796093022208MiB" is too large`},
		{`key=a max-value-len=8`, `spec column 7: max-value-len: "8" is below 16`},
		{`key=a max-value-len=16B`, `spec column 7: max-value-len: "16B" is not a whole number`},
		{`key=a watchdog=yes`, `spec column 7: watchdog: "yes" is not true or false`},
		{`key=a ttl=20ms watchdog`, `spec column 16: watchdog: needs a ttl of at least 30ms, not 20ms`},
		{`key=sku:<id`, `spec column 1: key: keyfunc: invalid template: "sku:<id": unclosed placeholder at offset 4`},
		{`@lock name=x key=a key=sku<id>`, `spec column 20: key: keyfunc: invalid template: "sku<id>": placeholder <id> preceded by 'u' at offset 2 (a value may contain letters, digits, '%' and '#': separate them with another character, such as ':')`},
	} {
		_, err := middleware.ParseSpec(tc.spec)
		want := "reqlock/middleware: invalid configuration: " + tc.want
		if err == nil || err.Error() != want {
			t.Errorf("ParseSpec(%q) error:\n got %v\nwant %s", tc.spec, err, want)
			continue
		}
		if !errors.Is(err, middleware.ErrInvalidConfig) {
			t.Errorf("ParseSpec(%q) error does not wrap ErrInvalidConfig", tc.spec)
		}
		if strings.Contains(tc.want, "keyfunc: ") != errors.Is(err, keyfunc.ErrSyntax) {
			t.Errorf("ParseSpec(%q) error: errors.Is(err, keyfunc.ErrSyntax) = %v", tc.spec, errors.Is(err, keyfunc.ErrSyntax))
		}
	}
}

func TestMustParseSpecPanics(t *testing.T) {
	defer func() {
		err, _ := recover().(error)
		if !errors.Is(err, middleware.ErrInvalidConfig) {
			t.Errorf("recovered %v, want an error wrapping ErrInvalidConfig", err)
		}
	}()
	middleware.MustParseSpec("@lock wait=2s")
}
