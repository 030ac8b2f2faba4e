package middleware

import (
	"errors"
	"slices"

	"github.com/reqlock/reqlock/routetable"
)

// ParseSpec parses a lock annotation spec into a Config; the grammar and
// every field's values are routetable.ParseSpec's. Fields the spec leaves
// out stay zero, so DefaultConfig supplies them when the Config is used
// (NewWithConfig). Each field, the Config field it sets and its default:
//
//	field            Config field   default
//	key              Key, Keys      required (the first is Key)
//	ttl              TTL            10s
//	wait             Wait           2s (0 or none: NoWait)
//	on-timeout       TimeoutStatus  423; 429 with a limit
//	retry-after      RetryAfter     1s
//	on-store-error   OnStoreError   fail-closed (fail-open or run: FailOpen)
//	hold-at-least    HoldAtLeast    0 (release at once)
//	max-keys         MaxKeys        64
//	max-body         MaxBodyBytes   1MiB
//	max-value-len    MaxValueLen    64
//	watchdog         Watchdog       false
//	name             Name           the key templates
//	mode             Shared         exclusive (false)
//	limit            Limit          0 (no limit)
//	idempotency            Idempotency.Mode          off (required or optional)
//	idempotency-header     Idempotency.Header        Idempotency-Key
//	idempotency-retention  Idempotency.Retention     24h
//	idempotency-scope      Idempotency.Scope         none
//	idempotency-max-body   Idempotency.MaxBodyBytes  64KiB
//
// Every error wraps ErrInvalidConfig and routetable.ErrInvalid and names the
// 1-based column (in characters) of the offending field, the field and the
// problem:
//
//	reqlock/middleware: invalid configuration: spec column 20: wait: "2x" is not a duration (such as 2s or 500ms)
func ParseSpec(spec string) (Config, error) {
	s, err := routetable.ParseSpec(spec)
	if err != nil {
		return Config{}, tableError(err)
	}
	cfg := specConfig(s)
	if err := cfg.withDefaults().validate(); err != nil {
		// A backstop: routetable checks the range of every value (its
		// fuzz test checks that), and the number of keys.
		return Config{}, err
	}
	return cfg, nil
}

// MustParseSpec is like ParseSpec but panics when ParseSpec returns an
// error. Use it at start-up only.
func MustParseSpec(spec string) Config {
	cfg, err := ParseSpec(spec)
	if err != nil {
		panic(err)
	}
	return cfg
}

// specConfig is the Config of a parsed spec: the fields the spec sets, the
// others zero.
func specConfig(s routetable.Spec) Config {
	c := Config{
		TTL:           s.TTL,
		Wait:          s.Wait,
		TimeoutStatus: s.TimeoutStatus,
		RetryAfter:    s.RetryAfter,
		HoldAtLeast:   s.HoldAtLeast,
		MaxKeys:       s.MaxKeys,
		MaxBodyBytes:  s.MaxBodyBytes,
		MaxValueLen:   s.MaxValueLen,
		Watchdog:      s.Watchdog,
		Name:          s.Name,
		Shared:        s.Shared,
		Limit:         s.Limit,
	}
	if len(s.Keys) > 0 {
		c.Key = s.Keys[0]
	}
	if len(s.Keys) > 1 {
		c.Keys = slices.Clone(s.Keys[1:])
	}
	if s.Has("wait") && s.Wait == 0 {
		c.Wait = NoWait
	}
	if s.FailOpen {
		c.OnStoreError = FailOpen
	}
	switch s.Idempotency {
	case "required":
		c.Idempotency.Mode = IdempotencyRequired
	case "optional":
		c.Idempotency.Mode = IdempotencyOptional
	}
	if c.Idempotency.Mode != IdempotencyOff {
		c.Idempotency.Header = s.IdempotencyHeader
		c.Idempotency.Retention = s.IdempotencyRetention
		c.Idempotency.Scope = s.IdempotencyScope
		c.Idempotency.MaxBodyBytes = s.IdempotencyMaxBody
	}
	return c
}

// specError is a problem routetable found, reported under this package's
// prefix: it wraps ErrInvalidConfig and the *routetable.Error.
type specError struct{ err *routetable.Error }

func (e *specError) Error() string   { return ErrInvalidConfig.Error() + ": " + e.err.Detail() }
func (e *specError) Unwrap() []error { return []error{ErrInvalidConfig, e.err} }

// tableError returns err, an error of package routetable, with each
// *routetable.Error in it (err itself, or one of those errors.Join joined)
// reported as this package reports it; any other error stays as it is.
func tableError(err error) error {
	if e, ok := err.(*routetable.Error); ok {
		return &specError{e}
	}
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		errs := slices.Clone(joined.Unwrap())
		for i, err := range errs {
			errs[i] = tableError(err)
		}
		return errors.Join(errs...)
	}
	return err
}
