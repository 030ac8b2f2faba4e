package middleware

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/routetable"
)

// ErrInvalidConfig is wrapped by every error that rejects a route's
// configuration at start-up.
var ErrInvalidConfig = errors.New("reqlock/middleware: invalid configuration")

// NoWait as Config.Wait makes a route try the lock once and answer the
// timeout status at once when the key is held.
const NoWait time.Duration = -1

// FailurePolicy says what a route does when the lock store fails.
type FailurePolicy int

const (
	// FailClosed answers 503 with Retry-After and never runs the handler.
	// It is the default.
	FailClosed FailurePolicy = iota
	// FailOpen runs the handler without the lock and logs a warning: once
	// per outage of the store (as reqlock.WithBreaker counts them), and
	// once a minute while it lasts. While the Locker counts the store
	// down, such routes run unlocked at once. Only for routes where running
	// unlocked is harmless.
	FailOpen
)

// String returns the policy as the spec language writes it: "fail-closed"
// or "fail-open".
func (p FailurePolicy) String() string {
	switch p {
	case FailClosed:
		return "fail-closed"
	case FailOpen:
		return "fail-open"
	}
	return fmt.Sprintf("FailurePolicy(%d)", int(p))
}

// Config is one route's lock configuration. A zero field takes its value
// from DefaultConfig; only Key is required.
type Config struct {
	// Key is the key template, such as "sku:<id>"; see package keyfunc for
	// the grammar. Router syntax ({id}, :id) is refused, not read as a
	// literal. Required unless Keys is set.
	Key string

	// Keys are further key templates. The route locks every key that Key
	// and Keys yield (a template with a [*] JSON path yields one per array
	// element) as one lock, all or none: see reqlock.Locker.ObtainAll.
	Keys []string

	// MaxKeys caps the keys one request's templates may yield, repeats
	// included (a cart naming one SKU twice counts it twice), so that a
	// hostile body costs bounded work. A request over it is answered 413
	// with reason too_many_keys. Default 64.
	MaxKeys int

	// HoldAtLeast keeps the lock for at least this long after it was
	// granted, even when the handler finishes sooner: the lock is then left
	// to expire instead of deleted (reqlock.Lock.HoldAtLeast). With NoWait
	// it rejects a double submit within the window. Default 0: released at
	// once.
	HoldAtLeast time.Duration

	// Name labels the route in metrics and logs, such as
	// "POST /skus/{id}/deduct". Default: the key templates. Never a raw key.
	Name string

	// TTL is the lease of each lock; it must outlast the handler.
	// Default 10s.
	TTL time.Duration

	// Wait bounds how long a request waits for a held key; the request's own
	// deadline bounds it too. Default 2s; NoWait tries once.
	Wait time.Duration

	// Shared makes the route's requests hold the key shared
	// (reqlock.Locker.ObtainShared): they run alongside each other, and
	// never alongside a request that holds the key exclusively (a route
	// without Shared and Limit). A waiting exclusive request goes before
	// new shared ones. A shared route locks one key: one template that
	// yields one key. Default false: exclusive.
	Shared bool

	// Limit, above 0, lets at most Limit requests hold the key at once,
	// across every instance (reqlock.Locker.ObtainLimited), and never
	// alongside an exclusive holder. A request that finds every place
	// taken waits like one that finds the key locked; when the wait runs
	// out it is answered TimeoutStatus (429 by default on such a route)
	// with reason "limit". A request gets in while fewer than its own
	// Limit hold the key, whatever the other holders got in under, so a
	// rolling change of the limit never locks the new instances out. A
	// limited route locks one key, and goes without Shared. Default 0: no
	// limit.
	Limit int

	// TimeoutStatus is the status answered when the wait runs out:
	// 423 Locked (default), 409 Conflict, 429 Too Many Requests (default
	// on a route with a Limit) or 503 Service Unavailable.
	TimeoutStatus int

	// RetryAfter is the Retry-After delay sent with timeout and store-failure
	// answers, rounded up to whole seconds. A request refused while the
	// Locker counts the store down (reqlock.ErrStoreDown) is told when the
	// next probe of the store is due instead, at least 1s. Default 1s.
	RetryAfter time.Duration

	// OnStoreError is the failure policy when the store fails or times out.
	// Default FailClosed.
	OnStoreError FailurePolicy

	// MaxBodyBytes bounds the request body read to derive a key (json and
	// form placeholders) and buffered before a wait. Default 1 MiB.
	MaxBodyBytes int64

	// MaxValueLen is the escaped length above which a key value is hashed.
	// Default 64.
	MaxValueLen int

	// Skipper, when it returns true, lets a request through without a lock.
	// Default nil: every request is locked.
	Skipper func(*http.Request) bool

	// Responder writes every rejection. Default nil: WriteProblem, a JSON
	// problem details body (the echo adapter returns an *echo.HTTPError
	// instead, which echo's error handler renders).
	Responder Responder

	// RequestSkipper is Skipper for adapters' framework-native skippers: req
	// is the keyfunc.Request the adapter passes to Guard.Serve, from which
	// ginlock.WithSkipper and echolock.WithSkipper read their framework's
	// context. A request that either skipper lets through goes unlocked.
	// Default nil.
	RequestSkipper func(req keyfunc.Request) bool

	// RequestResponder is Responder for adapters' framework-native
	// responders (ginlock.WithResponder, echolock.WithResponder); a Config
	// may have one of Responder and RequestResponder. Default nil.
	RequestResponder RequestResponder

	// Logger receives warnings (a lock gone when the handler finished,
	// fail-open runs) and, at Debug, each store failure and failed release
	// (the Locker logs an outage once). Default the Locker's logger. A lock lost under the watchdog is
	// logged on the Locker's logger.
	Logger *slog.Logger

	// Watchdog renews the lock every third of the TTL while the handler
	// runs (reqlock.Lock.KeepAlive), so a handler may outlast the TTL. The
	// handler's request context is then the keep-alive context: when the
	// lock is lost (a renewal finds the key gone or taken over, or renewals
	// fail until the lock's validity runs out) it is cancelled with a cause
	// wrapping reqlock.ErrLockLost, and the loss is logged. The watchdog stops
	// when the request ends or the lock is released; the release after the
	// handler also ends that context. Needs a TTL of at least MinWatchdogTTL.
	// Default false.
	Watchdog bool

	// Idempotency records the route's responses by idempotency key and
	// replays them to retries (see Idempotency). Default off.
	Idempotency Idempotency

	// optionProblems are the problems of the options that built this
	// Config (an explicit option given a meaningless value), such as
	// "WithTTL(0s): ..."; NewWithConfig reports them. Only options write
	// it.
	optionProblems []string
}

// MinWatchdogTTL is the shortest TTL a route with the watchdog accepts: a
// renewal every third of it, 10ms, is as often as is sensible. It is the
// spec language's limit too (routetable.MinWatchdogTTL).
const MinWatchdogTTL = routetable.MinWatchdogTTL

// DefaultConfig holds the default of every Config field.
var DefaultConfig = Config{
	TTL:           10 * time.Second,
	Wait:          2 * time.Second,
	TimeoutStatus: http.StatusLocked,
	RetryAfter:    time.Second,
	OnStoreError:  FailClosed,
	MaxBodyBytes:  keyfunc.DefaultMaxBodyBytes,
	MaxValueLen:   keyfunc.DefaultMaxValueLen,
	MaxKeys:       DefaultMaxKeys,
}

// DefaultMaxKeys is the default of Config.MaxKeys.
const DefaultMaxKeys = 64

// Option changes one field of a route's Config. An option given a value
// that means nothing for its field, such as WithTTL(0), makes the Guard's
// constructor fail with an error wrapping ErrInvalidConfig that names the
// option and the value: leave the option out to get the field's default.
// (A zero field of a Config built by hand takes its default.)
type Option func(*Config)

// nonZero returns the option that sets the field of c that field points to
// to v, refusing a zero v, which would silently mean the default, with why
// in the words of the option. def is the default the message names.
func nonZero[T comparable](option string, v T, field func(c *Config) *T, why string, def T) Option {
	return func(c *Config) {
		var zero T
		if v == zero {
			c.optionError(option, v, "%s (leave the option out for the default %v)", why, def)
			return
		}
		*field(c) = v
	}
}

// optionError records a problem of an option in c.
func (c *Config) optionError(option string, value any, format string, args ...any) {
	c.optionProblems = append(c.optionProblems, fmt.Sprintf("%s(%v): %s", option, value, fmt.Sprintf(format, args...)))
}

// WithTTL sets Config.TTL, at least 1ms. Default 10s.
func WithTTL(ttl time.Duration) Option {
	return nonZero("WithTTL", ttl, func(c *Config) *time.Duration { return &c.TTL },
		"a lock's TTL must be at least 1ms", DefaultConfig.TTL)
}

// WithWait sets Config.Wait; zero means NoWait (try once). Default 2s.
func WithWait(wait time.Duration) Option {
	return func(c *Config) {
		if wait == 0 {
			wait = NoWait
		}
		c.Wait = wait
	}
}

// WithTimeoutStatus sets Config.TimeoutStatus: 423, 409, 429 or 503.
// Default 423.
func WithTimeoutStatus(status int) Option {
	return nonZero("WithTimeoutStatus", status, func(c *Config) *int { return &c.TimeoutStatus },
		"want 423, 409, 429 or 503", DefaultConfig.TimeoutStatus)
}

// WithRetryAfter sets Config.RetryAfter, above 0. Default 1s.
func WithRetryAfter(d time.Duration) Option {
	return nonZero("WithRetryAfter", d, func(c *Config) *time.Duration { return &c.RetryAfter },
		"Retry-After is whole seconds, at least 1", DefaultConfig.RetryAfter)
}

// WithFailOpen sets Config.OnStoreError to FailOpen: when the store fails,
// the handler runs without the lock and a warning is logged (see FailOpen).
func WithFailOpen() Option { return func(c *Config) { c.OnStoreError = FailOpen } }

// WithMaxBodyBytes sets Config.MaxBodyBytes, at least 1. Default 1 MiB.
func WithMaxBodyBytes(n int64) Option {
	return nonZero("WithMaxBodyBytes", n, func(c *Config) *int64 { return &c.MaxBodyBytes },
		"the limit must be at least 1 byte", DefaultConfig.MaxBodyBytes)
}

// WithMaxValueLen sets Config.MaxValueLen, at least 16. Default 64.
func WithMaxValueLen(n int) Option {
	return nonZero("WithMaxValueLen", n, func(c *Config) *int { return &c.MaxValueLen },
		fmt.Sprintf("the length must be at least %d", keyfunc.MinMaxValueLen), DefaultConfig.MaxValueLen)
}

// WithSkipper sets Config.Skipper. Default nil: every request is locked.
func WithSkipper(skip func(*http.Request) bool) Option {
	return func(c *Config) { c.Skipper = skip }
}

// WithResponder sets Config.Responder. Default nil: WriteProblem.
func WithResponder(r Responder) Option { return func(c *Config) { c.Responder = r } }

// WithRequestSkipper sets Config.RequestSkipper. Default nil.
func WithRequestSkipper(skip func(req keyfunc.Request) bool) Option {
	return func(c *Config) { c.RequestSkipper = skip }
}

// WithRequestResponder sets Config.RequestResponder. Default nil.
func WithRequestResponder(r RequestResponder) Option {
	return func(c *Config) { c.RequestResponder = r }
}

// WithLogger sets Config.Logger. Default nil: the Locker's logger.
func WithLogger(l *slog.Logger) Option { return func(c *Config) { c.Logger = l } }

// WithKeys adds key templates to Config.Keys: the route then locks every
// key its templates yield, all or none.
func WithKeys(templates ...string) Option {
	return func(c *Config) { c.Keys = append(c.Keys[:len(c.Keys):len(c.Keys)], templates...) }
}

// WithMaxKeys sets Config.MaxKeys, at least 1. Default 64.
func WithMaxKeys(n int) Option {
	return nonZero("WithMaxKeys", n, func(c *Config) *int { return &c.MaxKeys },
		"a route locks at least 1 key", DefaultConfig.MaxKeys)
}

// WithHoldAtLeast sets Config.HoldAtLeast. Default 0: released at once.
func WithHoldAtLeast(d time.Duration) Option { return func(c *Config) { c.HoldAtLeast = d } }

// WithName sets Config.Name. Default: the key templates.
func WithName(name string) Option { return func(c *Config) { c.Name = name } }

// WithShared sets Config.Shared: the route's requests hold the key shared.
func WithShared() Option { return func(c *Config) { c.Shared = true } }

// WithLimit sets Config.Limit, at least 1: at most n requests hold the key
// at once. Default 0: no limit.
func WithLimit(n int) Option {
	return func(c *Config) {
		if n < 1 {
			c.optionError("WithLimit", n, "a limit lets at least 1 request in (leave the option out for no limit)")
			return
		}
		c.Limit = n
	}
}

// WithWatchdog sets Config.Watchdog: the lock is renewed while the handler
// runs, and a lost lock cancels the handler's request context with a cause
// wrapping reqlock.ErrLockLost.
func WithWatchdog() Option { return func(c *Config) { c.Watchdog = true } }

// withDefaults fills zero fields from DefaultConfig.
func (c Config) withDefaults() Config {
	d := DefaultConfig
	if c.TTL == 0 {
		c.TTL = d.TTL
	}
	if c.Wait == 0 {
		c.Wait = d.Wait
	}
	if c.TimeoutStatus == 0 {
		c.TimeoutStatus = d.TimeoutStatus
		if c.Limit > 0 {
			c.TimeoutStatus = http.StatusTooManyRequests
		}
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = d.RetryAfter
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = d.MaxBodyBytes
	}
	if c.MaxValueLen == 0 {
		c.MaxValueLen = d.MaxValueLen
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = d.MaxKeys
	}
	if c.Name == "" {
		c.Name = strings.Join(c.templates(), " ")
	}
	c.Idempotency = c.Idempotency.withDefaults()
	return c
}

// validate reports the problems of the options that built c, joined, or
// else the first problem of the defaulted Config.
func (c Config) validate() error {
	if len(c.optionProblems) > 0 {
		errs := make([]error, len(c.optionProblems))
		for i, p := range c.optionProblems {
			errs[i] = fmt.Errorf("%w: route %q: %s", ErrInvalidConfig, c.Name, p)
		}
		return errors.Join(errs...)
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: route %q: %s", ErrInvalidConfig, c.Name, fmt.Sprintf(format, args...))
	}
	switch {
	case len(c.templates()) == 0:
		return fmt.Errorf("%w: no key template (set Key or Keys)", ErrInvalidConfig)
	case len(c.templates()) != len(c.Keys)+min(len(c.Key), 1):
		return bad("an entry of Keys is empty")
	case c.MaxKeys < 1:
		return bad("max keys %d is below 1", c.MaxKeys)
	case c.MaxKeys < len(c.templates()):
		return bad("max keys %d is below the %d key templates, each of which yields at least one key",
			c.MaxKeys, len(c.templates()))
	case c.HoldAtLeast < 0:
		return bad("hold-at-least %v is negative", c.HoldAtLeast)
	case c.TTL < time.Millisecond:
		return bad("ttl %v is below 1ms", c.TTL)
	case c.Watchdog && c.TTL < MinWatchdogTTL:
		return bad("ttl %v is below %v, the shortest the watchdog renews", c.TTL, MinWatchdogTTL)
	case c.Wait < 0 && c.Wait != NoWait:
		return bad("wait %v is negative (use NoWait to try once)", c.Wait)
	case c.RetryAfter < 0:
		return bad("retry-after %v is negative", c.RetryAfter)
	case c.MaxBodyBytes < 0:
		return bad("max body bytes %d is negative", c.MaxBodyBytes)
	case c.OnStoreError != FailClosed && c.OnStoreError != FailOpen:
		return bad("unknown store failure policy %v", c.OnStoreError)
	case c.Responder != nil && c.RequestResponder != nil:
		return bad("both a Responder and a RequestResponder are set; a route answers with one")
	case c.Limit < 0:
		return bad("limit %d is below 0", c.Limit)
	case c.Shared && c.Limit > 0:
		return bad("both Shared and a Limit are set; a limit is a mode of its own (at most %d holders, never with an exclusive one)", c.Limit)
	case (c.Shared || c.Limit > 0) && len(c.templates()) > 1:
		return bad("a %s lock takes one key; this route has %d key templates", c.modeName(), len(c.templates()))
	case c.Idempotency.problem() != "":
		return bad("%s", c.Idempotency.problem())
	}
	switch c.TimeoutStatus {
	case http.StatusLocked, http.StatusConflict, http.StatusTooManyRequests, http.StatusServiceUnavailable:
	default:
		return bad("timeout status %d is not one of 423, 409, 429, 503", c.TimeoutStatus)
	}
	return nil
}

// modeName names the route's mode in messages: "shared", "limited" or
// "exclusive".
func (c Config) modeName() string {
	switch {
	case c.Limit > 0:
		return "limited"
	case c.Shared:
		return "shared"
	}
	return "exclusive"
}

// templates returns Key and Keys, without empty ones.
func (c Config) templates() []string {
	var ts []string
	if c.Key != "" {
		ts = append(ts, c.Key)
	}
	for _, k := range c.Keys {
		if k != "" {
			ts = append(ts, k)
		}
	}
	return ts
}
