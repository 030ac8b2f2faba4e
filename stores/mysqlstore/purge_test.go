package mysqlstore

import (
	"errors"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// TestPurge: a purge deletes the rows of keys free for the retention whose
// fence the clock has passed by the retention, and no other row; the next
// grant of a purged key still has a fence a stride above its last one.
func TestPurge(t *testing.T) {
	db := openDB(t)
	s := newStore(t, db, WithPurge(0, MinRetention))
	if _, err := s.Purge(t.Context(), MinRetention-time.Second); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("Purge with a short retention: %v, want stores.ErrInvalid", err)
	}
	keys := testKeys(2)
	free, held := keys[:1], keys[1:]
	first := mustAcquire(t, s, free, "t1", time.Minute)
	if err := s.Release(t.Context(), free, "t1", 0); err != nil {
		t.Fatalf("Release: %v", err)
	}
	mustAcquire(t, s, held, "t2", time.Minute)

	rowExists := func(key string) bool {
		t.Helper()
		var n int
		if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM reqlock_locks WHERE lock_key = ?", key).Scan(&n); err != nil {
			t.Fatalf("count rows: %v", err)
		}
		return n == 1
	}
	if _, err := s.Purge(t.Context(), MinRetention); err != nil {
		t.Fatalf("Purge: %v", err)
	}
	if !rowExists(free[0]) {
		t.Fatal("Purge deleted a row released less than the retention ago")
	}
	// With a retention of 200ms, the released row goes once its fence is
	// 200ms behind the clock; waiting for that is the behaviour under test.
	const retention = 200 * time.Millisecond
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for rowExists(free[0]) {
		if time.Now().After(deadline) {
			t.Fatal("the released row was never purged")
		}
		<-tick.C
		if _, err := s.purge(t.Context(), retention); err != nil {
			t.Fatalf("purge: %v", err)
		}
	}
	if !rowExists(held[0]) {
		t.Fatal("purge deleted the row of a held key")
	}
	if g, err := s.Acquire(t.Context(), held, "t3", time.Minute); err != nil || g.OK {
		t.Fatalf("Acquire of the held key after a purge: %+v, %v; want refused", g, err)
	}
	next := mustAcquire(t, s, free, "t4", time.Minute)
	if next.Fences[0]-first.Fences[0] < stores.FenceStride {
		t.Fatalf("fence of a purged key: %d after %d, want a stride above", next.Fences[0], first.Fences[0])
	}
	for _, k := range [][]string{free, held} {
		_ = s.Release(t.Context(), k, "t4", 0)
		_ = s.Release(t.Context(), k, "t2", 0)
	}
}
