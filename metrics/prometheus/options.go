package reqlockprom

import (
	"fmt"
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/reqlock/reqlock/internal/metricdefs"
)

// Defaults of New, the same as those of the core package
// github.com/reqlock/reqlock/metrics.
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
	constLabels prometheus.Labels
	maxRoutes   int
}

// Option configures New.
type Option func(*config)

// WithNamespace sets the prefix of every metric name. Default
// DefaultNamespace; empty leaves names without prefix (lock_success_total).
func WithNamespace(ns string) Option { return func(c *config) { c.namespace = ns } }

// WithBuckets sets the histogram buckets, in seconds and strictly
// increasing, of lock_wait_seconds and lock_hold_seconds. An empty slice
// keeps that histogram's default (DefaultWaitBuckets, DefaultHoldBuckets).
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

// WithConstLabels adds labels with fixed values to every metric, such as
// {"locker": "orders"} when a process has several Lockers, each with its
// own Metrics. They must not be route, reason or result.
func WithConstLabels(labels prometheus.Labels) Option {
	return func(c *config) { c.constLabels = maps.Clone(labels) }
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
		panic(fmt.Sprintf("reqlockprom: WithMaxRoutes(%d): the cap must not be negative", c.maxRoutes))
	}
	checkBuckets("wait", c.waitBuckets)
	checkBuckets("hold", c.holdBuckets)
	for name := range c.constLabels {
		if name == metricdefs.LabelRoute || name == metricdefs.LabelReason || name == metricdefs.LabelResult {
			panic(fmt.Sprintf("reqlockprom: WithConstLabels: %q is a label of the metrics themselves", name))
		}
	}
	return c
}

// checkBuckets panics unless b increases strictly, as New promises: the
// Prometheus library would panic only when the first child is created, on
// the request path.
func checkBuckets(which string, b []float64) {
	if err := metricdefs.CheckBuckets(b); err != nil {
		panic(fmt.Sprintf("reqlockprom: WithBuckets: %s: %v", which, err))
	}
}
