package routetable_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/routetable"
)

// FuzzParseSpec checks that ParseSpec never panics, that its errors are
// *Errors wrapping ErrInvalid that name a column within the spec, and that
// a Spec it returns keeps the promises of Spec's fields: at least one key,
// each of which parses with the spec's limits, and every value in its
// range, which is what middleware needs for a valid Config.
func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{
		"@lock key=sku:<id> wait=2s ttl=10s on-timeout=423 on-store-error=503",
		"@lock name=all key=<json:a> key=b watchdog ttl=1m wait=none on-timeout=409 retry-after=2s " +
			"on-store-error=fail-open hold-at-least=1s max-keys=4 max-body=1MiB max-value-len=32",
		`@lock key="q:\"x\\y" name="a b"`,
		"key=a ttl=20ms watchdog",
		"key=a max-body=64KiB max-value-len=16",
		"key=a key=b max-keys=1",
		`key=a name="x\n"`,
		"@locks key=a",
		"key=a wait=-1s",
		"key=report:<id> mode=shared watchdog",
		"key=t:<header:X-Tenant> limit=3 on-timeout=429",
		"key=a limit=2 mode=shared",
		"key=sku:<id> idempotency=required idempotency-header=X-Key idempotency-retention=1h idempotency-scope=<header:A> idempotency-max-body=1KiB",
		"key=a idempotency-scope=<json:b>",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		s, err := routetable.ParseSpec(text)
		if err != nil {
			var e *routetable.Error
			if !errors.Is(err, routetable.ErrInvalid) || !errors.As(err, &e) {
				t.Fatalf("ParseSpec(%q) error %v is not an *Error wrapping ErrInvalid", text, err)
			}
			var col int
			if _, scan := fmt.Sscanf(e.Where, "spec column %d", &col); scan != nil || col < 1 || col > utf8.RuneCountInString(text)+1 {
				t.Fatalf("ParseSpec(%q) error %v names no column within the spec", text, err)
			}
			return
		}
		if len(s.Keys) == 0 || s.Text != text {
			t.Fatalf("ParseSpec(%q) = %+v: no key, or not its text", text, s)
		}
		var opts []keyfunc.Option
		if s.MaxBodyBytes != 0 {
			opts = append(opts, keyfunc.WithMaxBodyBytes(s.MaxBodyBytes))
		}
		if s.MaxValueLen != 0 {
			opts = append(opts, keyfunc.WithMaxValueLen(s.MaxValueLen))
		}
		for _, k := range s.Keys {
			if _, err := keyfunc.Parse(k, opts...); err != nil {
				t.Fatalf("ParseSpec(%q) gave key %q that does not parse: %v", text, k, err)
			}
		}
		switch {
		case s.TTL != 0 && s.TTL < time.Millisecond, s.Wait < 0, s.RetryAfter < 0, s.Has("retry-after") && s.RetryAfter == 0,
			s.HoldAtLeast < 0, s.MaxKeys < 0, s.MaxKeys != 0 && s.MaxKeys < len(s.Keys), s.MaxBodyBytes < 0,
			s.MaxValueLen != 0 && s.MaxValueLen < keyfunc.MinMaxValueLen,
			s.Watchdog && s.TTL != 0 && s.TTL < routetable.MinWatchdogTTL,
			!slices.Contains([]int{0, 423, 409, 429, 503}, s.TimeoutStatus),
			!utf8.ValidString(s.Name),
			s.Limit < 0, s.Limit > 0 && s.Has("mode"), (s.Shared || s.Limit > 0) && len(s.Keys) != 1,
			!slices.Contains([]string{"", "required", "optional"}, s.Idempotency),
			s.Idempotency == "" && (s.IdempotencyHeader != "" || s.IdempotencyRetention != 0 || s.IdempotencyScope != "" || s.IdempotencyMaxBody != 0),
			s.Idempotency != "" && s.FailOpen, s.IdempotencyRetention < 0, s.IdempotencyMaxBody < 0,
			s.Has("idempotency-header") && s.IdempotencyHeader == "":
			t.Fatalf("ParseSpec(%q) gave a value out of its range: %+v", text, s)
		}
	})
}
