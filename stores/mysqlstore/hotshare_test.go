package mysqlstore

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/hotshare"
)

// TestHotKeySharedAcrossProcesses: two Lockers, each on a Store and a
// connection pool of its own, as two processes have, contend for one hot
// key with 4 workers each; each must get a fair share of the grants, and
// one at least every second, although MySQL signals no release and waiters
// poll (issue 18, defect 21).
func TestHotKeySharedAcrossProcesses(t *testing.T) {
	var id [6]byte
	_, _ = rand.Read(id[:])
	prefix := "reqlock:hotshare:" + hex.EncodeToString(id[:]) + ":"
	counters := hotshare.NewCounters(2)
	var lockers []*reqlock.Locker
	for i := range 2 {
		opts := append([]reqlock.Option{reqlock.WithKeyPrefix(prefix)}, hotshare.Options(counters, i)...)
		lockers = append(lockers, reqlock.MustNew(newStore(t, openDB(t)), opts...))
	}
	r := hotshare.Run(t, lockers, counters, hotshare.Config{
		Key:      "hot",
		Workers:  4,
		Hold:     time.Millisecond,
		TTL:      10 * time.Second,
		Wait:     2 * time.Second,
		Duration: 3 * time.Second,
	})
	t.Log(r)
	if os.Getenv("HOTSHARE_REPORT") != "" {
		return
	}
	// The bounds of the root package's test of the same name, which says
	// why.
	if share := r.MinShare(); share < 0.25 || r.MaxGap() > time.Second {
		t.Fatalf("want each process to get at least 25%% of the grants, and one at least every 1s: %v", r)
	}
}
