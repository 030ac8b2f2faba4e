package mysqlstore

import (
	"math"
	"testing"
)

// TestContendedKeyOfLongestTTL: a key refused with the longest Wait counts
// as contended; the deadline of its mark used to overflow into the past.
func TestContendedKeyOfLongestTTL(t *testing.T) {
	var c contendedKeys
	c.mark("k", math.MaxInt64)
	if !c.contended("k") {
		t.Fatal("a key refused with a Wait of math.MaxInt64 does not count as contended")
	}
}
