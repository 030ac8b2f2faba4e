package metricdefs

import (
	"fmt"
	"math"
)

// The defaults of the options of both implementations.
const (
	// DefaultNamespace prefixes every metric name: reqlock_lock_success_total.
	DefaultNamespace = "reqlock"
	// DefaultMaxRoutes caps the distinct route labels (option WithMaxRoutes).
	DefaultMaxRoutes = 1000
	// OverflowRoute is the route label of events whose route came after
	// the cap of distinct routes was reached.
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

// CheckBuckets returns an error unless the bucket bounds b increase
// strictly (a NaN does not), as the option WithBuckets requires. A last
// bound of +Inf is allowed: it is the bucket every histogram has.
func CheckBuckets(b []float64) error {
	for i, v := range b {
		if math.IsNaN(v) || i > 0 && !(v > b[i-1]) {
			return fmt.Errorf("the buckets %v do not increase strictly", b)
		}
	}
	return nil
}
