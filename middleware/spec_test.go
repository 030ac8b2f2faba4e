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
	"github.com/reqlock/reqlock/routetable"
	"github.com/reqlock/reqlock/stores/memstore"
)

// TestParseSpecConfig checks that every field reaches its Config field as
// its Option sets it, and that NewWithConfig accepts the result. The
// grammar's own tests are routetable's.
func TestParseSpecConfig(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	for _, tc := range []struct {
		spec string
		want middleware.Config
	}{
		{"@lock key=sku:<id>", middleware.Config{Key: "sku:<id>"}},
		{"key=a wait=0s", middleware.Config{Key: "a", Wait: middleware.NoWait}},
		{"key=a wait=none", middleware.Config{Key: "a", Wait: middleware.NoWait}},
		{"key=a on-store-error=fail-closed", middleware.Config{Key: "a", OnStoreError: middleware.FailClosed}},
		{"key=a hold-at-least=0 watchdog=false", middleware.Config{Key: "a"}},
		{
			"@lock key=sku:<id> wait=2s ttl=10s on-timeout=423 on-store-error=503",
			cfg("sku:<id>", middleware.WithWait(2*time.Second), middleware.WithTTL(10*time.Second),
				middleware.WithTimeoutStatus(http.StatusLocked)),
		},
		{
			"@lock name=all key=<json:a> key=b watchdog ttl=1m wait=none on-timeout=409 retry-after=2s " +
				"on-store-error=run hold-at-least=1s max-keys=4 max-body=1MiB max-value-len=32",
			cfg("<json:a>", middleware.WithName("all"), middleware.WithKeys("b"), middleware.WithWatchdog(),
				middleware.WithTTL(time.Minute), middleware.WithWait(0), middleware.WithTimeoutStatus(http.StatusConflict),
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

// TestParseSpecLimits: the least and greatest values the spec language
// accepts make Configs that NewWithConfig accepts, so that its limits are
// Config's.
func TestParseSpecLimits(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	for _, spec := range []string{
		"key=a ttl=1ms",
		"key=a ttl=" + middleware.MinWatchdogTTL.String() + " watchdog",
		"key=a retry-after=1ns",
		"key=a max-keys=1",
		"key=a key=b key=c max-keys=3",
		"key=a max-body=1",
		"key=a max-body=8796093022207MiB",
		"key=a max-value-len=16",
		"key=a hold-at-least=0",
	} {
		c, err := middleware.ParseSpec(spec)
		if err != nil {
			t.Errorf("ParseSpec(%q): %v", spec, err)
			continue
		}
		if _, err := middleware.NewWithConfig(locker, c); err != nil {
			t.Errorf("NewWithConfig(ParseSpec(%q)): %v", spec, err)
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

// TestParseSpecErrors: ParseSpec reports routetable's problems under this
// package's prefix, wrapping ErrInvalidConfig, routetable.ErrInvalid and
// the cause.
func TestParseSpecErrors(t *testing.T) {
	for _, tc := range []struct{ spec, want string }{
		{"@lock key=sku:1 wiat=2s", `spec column 17: unknown field "wiat" (known: key, ttl, wait, on-timeout, retry-after, on-store-error, hold-at-least, max-keys, max-body, max-value-len, watchdog, name, mode, limit, idempotency, idempotency-header, idempotency-retention, idempotency-scope, idempotency-max-body)`},
		{`key=abcd wait="2x"`, `spec column 10: wait: "2x" is not a duration (such as 2s or 500ms)`},
		{`key=a ttl=20ms watchdog`, `spec column 16: watchdog: needs a ttl of at least 30ms, not 20ms`},
		{`key=sku:<id`, `spec column 1: key: keyfunc: invalid template: "sku:<id": unclosed placeholder at offset 4`},
	} {
		_, err := middleware.ParseSpec(tc.spec)
		want := "reqlock/middleware: invalid configuration: " + tc.want
		if err == nil || err.Error() != want {
			t.Errorf("ParseSpec(%q) error:\n got %v\nwant %s", tc.spec, err, want)
			continue
		}
		var e *routetable.Error
		if !errors.Is(err, middleware.ErrInvalidConfig) || !errors.Is(err, routetable.ErrInvalid) || !errors.As(err, &e) {
			t.Errorf("ParseSpec(%q) error does not wrap ErrInvalidConfig and a *routetable.Error", tc.spec)
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
