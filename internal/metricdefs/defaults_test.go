package metricdefs

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func TestCheckBuckets(t *testing.T) {
	for _, b := range [][]float64{nil, {}, {1}, {-1, 0, 1e-9, 1}, {1, math.Inf(1)}, DefaultWaitBuckets(), DefaultHoldBuckets()} {
		if err := CheckBuckets(b); err != nil {
			t.Errorf("CheckBuckets(%v): %v", b, err)
		}
	}
	for _, b := range [][]float64{{1, 1}, {2, 1}, {math.NaN()}, {1, math.NaN()}, {math.Inf(1), math.Inf(1)}} {
		if err := CheckBuckets(b); err == nil || !strings.Contains(err.Error(), "increase strictly") {
			t.Errorf("CheckBuckets(%v): %v, want an error", b, err)
		}
	}
}

// TestDefaultBuckets pins the default buckets both implementations use.
func TestDefaultBuckets(t *testing.T) {
	if got := DefaultWaitBuckets(); !slices.Equal(got, []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}) {
		t.Errorf("DefaultWaitBuckets() = %v", got)
	}
	if got := DefaultHoldBuckets(); !slices.Equal(got, []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}) {
		t.Errorf("DefaultHoldBuckets() = %v", got)
	}
	// Each call returns a slice of its own.
	DefaultWaitBuckets()[0] = 42
	if DefaultWaitBuckets()[0] != .0005 {
		t.Error("DefaultWaitBuckets shares its slice")
	}
}
