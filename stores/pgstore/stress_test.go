package pgstore_test

import (
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/holders/stress"
)

// TestSharedStress: holders under a limit of 3 and plain writers, on two
// Stores (two pools, as two processes) and a few keys: never more than 3
// holders of a key at once, no holder beside a writer, no call failing
// (issue 22).
func TestSharedStress(t *testing.T) {
	ss := []stress.Store{open(t, ""), open(t, "")}
	for _, cfg := range []stress.Config{
		{Keys: 3, Limit: 3, Readers: 24, Writers: 6, For: 3 * time.Second},
		{Keys: 4, Limit: 3, Readers: 40, Writers: 0, For: 3 * time.Second},
		{Keys: 2, Limit: 3, Readers: 20, Writers: 4, For: 3 * time.Second, Hold: 5 * time.Millisecond},
	} {
		stress.Run(t, ss, cfg)
	}
}
