package metrics

import (
	"fmt"
	"math"
	"slices"
)

// Defaults of New, which the Prometheus adapter
// github.com/reqlock/reqlock/metrics/prometheus shares.
const (
	// DefaultNamespace prefixes every metric name: reqlock_lock_success_total.
	DefaultNamespace = "reqlock"
	// DefaultMaxRoutes caps the distinct route labels; see WithMaxRoutes.
	DefaultMaxRoutes = 1000
	// OverflowRoute is the route label of events whose route came after
	// the cap of WithMaxRoutes was reached.
	OverflowRoute = "other"
)

// DefaultWaitBuckets returns the default buckets, in seconds, of
// lock_wait_seconds: from half a millisecond (an uncontended lock, a local
// handoff) to 10 seconds (a long wait limit).
func DefaultWaitBuckets() []float64 {
	return []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
}

// DefaultHoldBuckets returns the default buckets, in seconds, of
// lock_hold_seconds: from a millisecond to a minute, the span of a
// request's handler.
func DefaultHoldBuckets() []float64 {
	return []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
}

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

// CheckBuckets returns an error unless the bucket bounds b increase
// strictly (a NaN does not), as WithBuckets requires. A last bound of +Inf
// is allowed: it is the bucket every histogram has.
func CheckBuckets(b []float64) error {
	for i, v := range b {
		if math.IsNaN(v) || i > 0 && !(v > b[i-1]) {
			return fmt.Errorf("the buckets %v do not increase strictly", b)
		}
	}
	return nil
}

// finiteBuckets panics unless b increases strictly, and returns b without
// a last bound of +Inf, which the +Inf bucket of every histogram covers.
func finiteBuckets(which string, b []float64) []float64 {
	if err := CheckBuckets(b); err != nil {
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
