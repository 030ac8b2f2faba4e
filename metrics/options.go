package metrics

import (
	"fmt"
	"math"
	"slices"

	"github.com/reqlock/reqlock/internal/metricdefs"
)

// Defaults of New, the same as the Prometheus adapter's.
const (
	// DefaultNamespace prefixes every metric name: reqlock_lock_success_total.
	DefaultNamespace = metricdefs.DefaultNamespace
	// DefaultMaxRoutes caps the distinct route labels; see WithMaxRoutes.
	DefaultMaxRoutes = metricdefs.DefaultMaxRoutes
	// OverflowRoute is the route label of events whose route came after
	// the cap of WithMaxRoutes was reached.
	OverflowRoute = metricdefs.OverflowRoute
)

// DefaultWaitBuckets returns the default buckets, in seconds, of
// lock_wait_seconds: from half a millisecond (an uncontended lock, a local
// handoff) to 10 seconds (a long wait limit).
func DefaultWaitBuckets() []float64 { return metricdefs.DefaultWaitBuckets() }

// DefaultHoldBuckets returns the default buckets, in seconds, of
// lock_hold_seconds: from a millisecond to a minute, the span of a
// request's handler.
func DefaultHoldBuckets() []float64 { return metricdefs.DefaultHoldBuckets() }

type config struct {
	namespace   string
	waitBuckets []float64
	holdBuckets []float64
	maxRoutes   int
}

// Option configures New.
type Option func(*config)

// WithNamespace sets the prefix of every metric name. Default
// DefaultNamespace; empty leaves names without prefix (lock_success_total).
// The namespace must be a valid Prometheus metric name of the classic
// character set, [a-zA-Z_:][a-zA-Z0-9_:]*; New panics otherwise.
func WithNamespace(ns string) Option { return func(c *config) { c.namespace = ns } }

// WithBuckets sets the upper bounds of the histogram buckets, in seconds
// and strictly increasing, of lock_wait_seconds and lock_hold_seconds. An
// empty slice keeps that histogram's default (DefaultWaitBuckets,
// DefaultHoldBuckets). The +Inf bucket is always added; a last bound of
// +Inf is dropped as redundant. New panics when bounds do not increase
// strictly.
func WithBuckets(wait, hold []float64) Option {
	return func(c *config) {
		if len(wait) > 0 {
			c.waitBuckets = slices.Clone(wait)
		}
		if len(hold) > 0 {
			c.holdBuckets = slices.Clone(hold)
		}
	}
}

// WithMaxRoutes caps the distinct route labels at n: events of any further
// route are counted under route="other" (OverflowRoute). Zero counts every
// event under "other". Default DefaultMaxRoutes. New panics when n is
// negative.
//
// The cap counts the distinct labels passed to the Metrics methods; a route
// template actually named "other" shares the overflow's series.
func WithMaxRoutes(n int) Option { return func(c *config) { c.maxRoutes = n } }

func newConfig(opts []Option) config {
	c := config{
		namespace:   DefaultNamespace,
		waitBuckets: DefaultWaitBuckets(),
		holdBuckets: DefaultHoldBuckets(),
		maxRoutes:   DefaultMaxRoutes,
	}
	for _, opt := range opts {
		opt(&c)
	}
	if c.maxRoutes < 0 {
		panic(fmt.Sprintf("metrics: WithMaxRoutes(%d): the cap must not be negative", c.maxRoutes))
	}
	if c.namespace != "" && !validName(c.namespace) {
		panic(fmt.Sprintf("metrics: WithNamespace(%q): not a valid metric name", c.namespace))
	}
	c.waitBuckets = finiteBuckets("wait", c.waitBuckets)
	c.holdBuckets = finiteBuckets("hold", c.holdBuckets)
	return c
}

// finiteBuckets panics unless b increases strictly, and returns b without
// a last bound of +Inf, which the +Inf bucket of every histogram covers.
func finiteBuckets(which string, b []float64) []float64 {
	if err := metricdefs.CheckBuckets(b); err != nil {
		panic(fmt.Sprintf("metrics: WithBuckets: %s: %v", which, err))
	}
	if n := len(b); n > 0 && math.IsInf(b[n-1], +1) {
		b = b[:n-1]
	}
	return b
}

// validName reports whether s matches [a-zA-Z_:][a-zA-Z0-9_:]*, the
// classic metric name pattern of the text format.
func validName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', c == '_', c == ':':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return s != ""
}
