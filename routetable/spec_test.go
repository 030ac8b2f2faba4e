package routetable_test

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/routetable"
)

const (
	allFields   = "key ttl wait on-timeout retry-after on-store-error hold-at-least max-keys max-body max-value-len watchdog name mode limit idempotency idempotency-header idempotency-retention idempotency-scope idempotency-max-body"
	knownFields = "(known: key, ttl, wait, on-timeout, retry-after, on-store-error, hold-at-least, max-keys, max-body, max-value-len, watchdog, name, mode, limit, idempotency, idempotency-header, idempotency-retention, idempotency-scope, idempotency-max-body)"
)

// exported is s without what Has reads, to compare with a Spec literal.
func exported(s routetable.Spec) routetable.Spec {
	return routetable.Spec{Text: s.Text, Keys: s.Keys, TTL: s.TTL, Wait: s.Wait, TimeoutStatus: s.TimeoutStatus,
		RetryAfter: s.RetryAfter, FailOpen: s.FailOpen, HoldAtLeast: s.HoldAtLeast, MaxKeys: s.MaxKeys,
		MaxBodyBytes: s.MaxBodyBytes, MaxValueLen: s.MaxValueLen, Watchdog: s.Watchdog, Name: s.Name,
		Shared: s.Shared, Limit: s.Limit, Idempotency: s.Idempotency, IdempotencyHeader: s.IdempotencyHeader,
		IdempotencyRetention: s.IdempotencyRetention, IdempotencyScope: s.IdempotencyScope, IdempotencyMaxBody: s.IdempotencyMaxBody}
}

// TestParseSpecFields checks every field's values and the fields Has
// reports.
func TestParseSpecFields(t *testing.T) {
	keys := func(k ...string) []string { return k }
	for _, tc := range []struct {
		spec string
		want routetable.Spec
		has  string // the fields Has reports, space-separated
	}{
		{"key=sku:<id>", routetable.Spec{Keys: keys("sku:<id>")}, "key"},
		{"  @lock\tkey=sku:<id>  ", routetable.Spec{Keys: keys("sku:<id>")}, "key"},
		{"@lock key=a key=b:<json:b> key=c", routetable.Spec{Keys: keys("a", "b:<json:b>", "c")}, "key"},
		{`@lock key="q:\"x\\{y"`, routetable.Spec{Keys: keys(`q:"x\{y`)}, "key"}, // \{ is keyfunc's escape of a brace
		{"key=a ttl=1ms", routetable.Spec{Keys: keys("a"), TTL: time.Millisecond}, "key ttl"},
		{"key=a ttl=1m30s", routetable.Spec{Keys: keys("a"), TTL: 90 * time.Second}, "key ttl"},
		{"key=a wait=500ms", routetable.Spec{Keys: keys("a"), Wait: 500 * time.Millisecond}, "key wait"},
		{"key=a wait=0", routetable.Spec{Keys: keys("a")}, "key wait"},
		{"key=a wait=none", routetable.Spec{Keys: keys("a")}, "key wait"},
		{"key=a on-timeout=409", routetable.Spec{Keys: keys("a"), TimeoutStatus: 409}, "key on-timeout"},
		{"key=a retry-after=3s", routetable.Spec{Keys: keys("a"), RetryAfter: 3 * time.Second}, "key retry-after"},
		{"key=a on-store-error=503", routetable.Spec{Keys: keys("a")}, "key on-store-error"},
		{"key=a on-store-error=fail-closed", routetable.Spec{Keys: keys("a")}, "key on-store-error"},
		{"key=a on-store-error=fail-open", routetable.Spec{Keys: keys("a"), FailOpen: true}, "key on-store-error"},
		{"key=a on-store-error=run", routetable.Spec{Keys: keys("a"), FailOpen: true}, "key on-store-error"},
		{"key=a hold-at-least=0", routetable.Spec{Keys: keys("a")}, "key hold-at-least"},
		{"key=a hold-at-least=5s", routetable.Spec{Keys: keys("a"), HoldAtLeast: 5 * time.Second}, "key hold-at-least"},
		{"key=a max-keys=8", routetable.Spec{Keys: keys("a"), MaxKeys: 8}, "key max-keys"},
		{"key=a max-body=4096", routetable.Spec{Keys: keys("a"), MaxBodyBytes: 4096}, "key max-body"},
		{"key=a max-body=64KiB", routetable.Spec{Keys: keys("a"), MaxBodyBytes: 64 << 10}, "key max-body"},
		{"key=a max-body=2MiB", routetable.Spec{Keys: keys("a"), MaxBodyBytes: 2 << 20}, "key max-body"},
		{"key=a max-value-len=16", routetable.Spec{Keys: keys("a"), MaxValueLen: 16}, "key max-value-len"},
		{"key=a watchdog", routetable.Spec{Keys: keys("a"), Watchdog: true}, "key watchdog"},
		{"key=a watchdog=false", routetable.Spec{Keys: keys("a")}, "key watchdog"},
		{"key=a ttl=30ms watchdog=true", routetable.Spec{Keys: keys("a"), TTL: 30 * time.Millisecond, Watchdog: true}, "key ttl watchdog"},
		{`key=a name="POST /skus/{id}/deduct"`, routetable.Spec{Keys: keys("a"), Name: "POST /skus/{id}/deduct"}, "key name"},
		{`@lock name="é" key=a`, routetable.Spec{Keys: keys("a"), Name: "é"}, "key name"},
		{"key=report:<id> mode=shared", routetable.Spec{Keys: keys("report:<id>"), Shared: true}, "key mode"},
		{"key=a key=b mode=exclusive", routetable.Spec{Keys: keys("a", "b")}, "key mode"},
		{"key=tenant:<header:X-Tenant> limit=3 on-timeout=423", routetable.Spec{Keys: keys("tenant:<header:X-Tenant>"),
			Limit: 3, TimeoutStatus: 423}, "key limit on-timeout"},
		{"key=a idempotency=optional", routetable.Spec{Keys: keys("a"), Idempotency: "optional"}, "key idempotency"},
		{
			"key=sku:<id> idempotency=required idempotency-header=X-Request-Key idempotency-retention=1h " +
				"idempotency-scope=<header:Authorization> idempotency-max-body=1KiB",
			routetable.Spec{Keys: keys("sku:<id>"), Idempotency: "required", IdempotencyHeader: "X-Request-Key",
				IdempotencyRetention: time.Hour, IdempotencyScope: "<header:Authorization>", IdempotencyMaxBody: 1 << 10},
			"key idempotency idempotency-header idempotency-retention idempotency-scope idempotency-max-body",
		},
		{
			"@lock name=all key=<json:a> key=b watchdog ttl=1m wait=2s on-timeout=429 retry-after=2s " +
				"on-store-error=fail-open hold-at-least=1s max-keys=4 max-body=1MiB max-value-len=32",
			routetable.Spec{Keys: keys("<json:a>", "b"), Name: "all", Watchdog: true, TTL: time.Minute,
				Wait: 2 * time.Second, TimeoutStatus: 429, RetryAfter: 2 * time.Second, FailOpen: true,
				HoldAtLeast: time.Second, MaxKeys: 4, MaxBodyBytes: 1 << 20, MaxValueLen: 32},
			"key ttl wait on-timeout retry-after on-store-error hold-at-least max-keys max-body max-value-len watchdog name",
		},
	} {
		got, err := routetable.ParseSpec(tc.spec)
		if err != nil {
			t.Errorf("ParseSpec(%q): %v", tc.spec, err)
			continue
		}
		tc.want.Text = tc.spec
		if !reflect.DeepEqual(exported(got), tc.want) {
			t.Errorf("ParseSpec(%q) =\n%+v, want\n%+v", tc.spec, got, tc.want)
		}
		for _, f := range strings.Fields(allFields) {
			if want := slices.Contains(strings.Fields(tc.has), f); got.Has(f) != want {
				t.Errorf("ParseSpec(%q).Has(%q) = %v, want %v", tc.spec, f, got.Has(f), want)
			}
		}
	}
	if s, _ := routetable.ParseSpec("key=a"); s.Has("wiat") {
		t.Error(`Has("wiat") = true for an unknown field`)
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
		{`key=a mode=read`, `spec column 7: mode: "read" is not exclusive or shared`},
		{`key=a limit=0`, `spec column 7: limit: "0" is below 1`},
		{`key=a limit=-2`, `spec column 7: limit: "-2" is not a whole number`},
		{`key=a limit=3 mode=shared`, `spec column 15: mode: a limit is a mode of its own (at most 3 holders at once, never with an exclusive one); leave mode out`},
		{`key=a mode=exclusive limit=3`, `spec column 7: mode: a limit is a mode of its own (at most 3 holders at once, never with an exclusive one); leave mode out`},
		{`key=a key=b mode=shared`, `spec column 13: mode: a shared or limited lock takes one key; this spec has 2 key templates`},
		{`limit=2 key=a key=b`, `spec column 1: limit: a shared or limited lock takes one key; this spec has 2 key templates`},
		{`mode=shared key=<json:items[*].sku>`, `spec column 13: key: "<json:items[*].sku>" may yield several keys, and a shared or limited lock takes one`},
		{`key=a on-timeout=500`, `spec column 7: on-timeout: "500" is not one of 423, 409, 429, 503`},
		{`key=a on-timeout=locked`, `spec column 7: on-timeout: "locked" is not one of 423, 409, 429, 503`},
		{`key=a on-store-error=500`, `spec column 7: on-store-error: "500" is not one of 503, fail-closed, fail-open, run`},
		{`key=a max-keys=x`, `spec column 7: max-keys: "x" is not a whole number`},
		{`key=a max-keys=-1`, `spec column 7: max-keys: "-1" is not a whole number`},
		{`key=a max-keys=0`, `spec column 7: max-keys: "0" is below 1`},
		{`key=a max-keys=99999999999999999999`, `spec column 7: max-keys: "99999999999999999999" is too large`},
		{`key=a key=b max-keys=1`, `spec column 13: max-keys: 1 is below the 2 key templates, each of which yields at least one key`},
		{`key=a max-body=0`, `spec column 7: max-body: "0" is below 1 byte`},
		{`key=a max-body=0KiB`, `spec column 7: max-body: "0KiB" is below 1 byte`},
		{`key=a max-body=64KB`, `spec column 7: max-body: "64KB" is not a size in bytes (such as 65536, 64KiB or 1MiB)`},
		{`key=a max-body=MiB`, `spec column 7: max-body: "MiB" is not a size in bytes (such as 65536, 64KiB or 1MiB)`},
		{`key=a max-body=-1`, `spec column 7: max-body: "-1" is not a size in bytes (such as 65536, 64KiB or 1MiB)`},
		{`key=a max-body=9223372036854775808`, `spec column 7: max-body: "9223372036854775808" is too large`},
		{`key=a max-body=8796093022208MiB`, `spec column 7: max-body: "8796093022208MiB" is too large`},
		{`key=a max-value-len=15`, `spec column 7: max-value-len: "15" is below 16`},
		{`key=a max-value-len=16B`, `spec column 7: max-value-len: "16B" is not a whole number`},
		{`key=a watchdog=yes`, `spec column 7: watchdog: "yes" is not true or false`},
		{`key=a ttl=20ms watchdog`, `spec column 16: watchdog: needs a ttl of at least 30ms, not 20ms`},
		{`key=sku:<id`, `spec column 1: key: keyfunc: invalid template: "sku:<id": unclosed placeholder at offset 4`},
		{`key=a idempotency=yes`, `spec column 7: idempotency: "yes" is not required or optional`},
		{`key=a idempotency-header=X-Key`, `spec column 7: idempotency-header: needs idempotency=required or idempotency=optional`},
		{`key=a idempotency-max-body=1KiB`, `spec column 7: idempotency-max-body: needs idempotency=required or idempotency=optional`},
		{`key=a idempotency=required idempotency-header=X:Key`, `spec column 28: idempotency-header: "X:Key" is not a header name`},
		{`key=a idempotency=required idempotency-retention=0`, `spec column 28: idempotency-retention: "0" is zero`},
		{`key=a idempotency=required idempotency-retention=1d`, `spec column 28: idempotency-retention: "1d" is not a duration (such as 2s or 500ms)`},
		{`key=a idempotency=required idempotency-max-body=0`, `spec column 28: idempotency-max-body: "0" is below 1 byte`},
		{`key=a idempotency=optional on-store-error=fail-open`, `spec column 7: idempotency: does not go with on-store-error=fail-open, which would run a retry again while the store is down`},
		{`key=a idempotency=required idempotency-scope=<json:a[*]>`, `spec column 28: idempotency-scope: "<json:a[*]>" may yield several values; a scope is one value`},
		{`key=a idempotency=required idempotency-scope=<header:A`, `spec column 28: idempotency-scope: keyfunc: invalid template: "<header:A": unclosed placeholder at offset 0`},
		// Router syntax, quoted or not, shows the reqlock spelling.
		{"@lock key=acct:{id} wait=1s", `spec column 7: key: keyfunc: invalid template: "acct:{id}": router syntax {id} at offset 5 (write <id> for a path parameter, or \{id} for literal text)`},
		{`@lock key="acct::id"`, `spec column 7: key: keyfunc: invalid template: "acct::id": router syntax :id at offset 5 (write <id> for a path parameter, or \:id for literal text)`},
		{"@lock key=sku:<sku> key=:id", `spec column 21: key: keyfunc: invalid template: ":id": router syntax :id at offset 0 (write <id> for a path parameter, or \:id for literal text)`},
		{`@lock name=x key=a key=sku<id>`, `spec column 20: key: keyfunc: invalid template: "sku<id>": placeholder <id> preceded by 'u' at offset 2 (a value may contain letters, digits, '%' and '#': separate them with another character, such as ':')`},
	} {
		_, err := routetable.ParseSpec(tc.spec)
		want := "reqlock/routetable: invalid configuration: " + tc.want
		if err == nil || err.Error() != want {
			t.Errorf("ParseSpec(%q) error:\n got %v\nwant %s", tc.spec, err, want)
			continue
		}
		var e *routetable.Error
		if !errors.Is(err, routetable.ErrInvalid) || !errors.As(err, &e) || e.Detail() != tc.want {
			t.Errorf("ParseSpec(%q) error is not an *Error wrapping ErrInvalid with the detail", tc.spec)
		}
		if strings.Contains(tc.want, "keyfunc: ") != errors.Is(err, keyfunc.ErrSyntax) {
			t.Errorf("ParseSpec(%q) error: errors.Is(err, keyfunc.ErrSyntax) = %v", tc.spec, errors.Is(err, keyfunc.ErrSyntax))
		}
	}
}
