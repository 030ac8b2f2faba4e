package mysqlstore

import (
	"database/sql"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/holders"
)

// holderRows counts key's rows in s's holders table: all, and those
// unexpired by the server's clock.
func holderRows(t *testing.T, db *sql.DB, s *Store, key string) (all, live int) {
	t.Helper()
	if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*), COALESCE(SUM(expires_at > UTC_TIMESTAMP(6)), 0) FROM "+
		quoteTable(holdersTable(s.Table()))+" WHERE key_sum = ?", holders.Digest(key)).Scan(&all, &live); err != nil {
		t.Fatalf("count holders: %v", err)
	}
	return all, live
}

// leaseRow reports whether key has a lease row in s's table.
func leaseRow(t *testing.T, db *sql.DB, s *Store, key string) bool {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM "+quoteTable(s.Table())+" WHERE lock_key = ?", key).Scan(&n); err != nil {
		t.Fatalf("count lease rows: %v", err)
	}
	return n == 1
}

// purgeUntil purges s with retention every 50ms until done reports true,
// and fails the test after 20s.
func purgeUntil(t *testing.T, s *Store, retention time.Duration, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("after 20s of purges: %s", what)
		}
		<-tick.C
		if _, err := s.purge(t.Context(), retention); err != nil {
			t.Fatalf("purge: %v", err)
		}
	}
}

// TestPurgeHolders: the purge deletes the expired holders and writer
// records of a key held shared and never used again, with its lease row;
// it keeps live holders and their lease row, even a lease row that reads
// as purgeable (issue 22 follow-up: the holders table grew without bound,
// since only a key's next grant deleted its expired holders); and a key
// purged then taken again gets a fence above every fence it had.
func TestPurgeHolders(t *testing.T) {
	db := openDB(t)
	s := newStore(t, db)
	ctx := t.Context()
	const retention = 200 * time.Millisecond
	keys := testKeys(3)
	unused, live, forged := keys[0], keys[1], keys[2]

	var last int64
	for _, token := range []string{"a", "b"} {
		g, err := s.AcquireShared(ctx, unused, token, 0, 300*time.Millisecond)
		if err != nil || !g.OK {
			t.Fatalf("AcquireShared(%s): %+v, %v", token, g, err)
		}
		last = max(last, g.Fences[0])
	}
	// A writer refused by the holders leaves its record.
	if g, err := s.Acquire(ctx, []string{unused}, "w", time.Minute); err != nil || g.OK || !g.SharedHeld {
		t.Fatalf("Acquire by a writer: %+v, %v; want refused by holders", g, err)
	}
	if all, _ := holderRows(t, db, s, unused); all != 3 {
		t.Fatalf("%d holder rows, want 2 holders and a writer's record", all)
	}
	for _, k := range []string{live, forged} {
		if g, err := s.AcquireShared(ctx, k, "c", 0, time.Minute); err != nil || !g.OK {
			t.Fatalf("AcquireShared(%s): %+v, %v", k, g, err)
		}
	}
	// forged's lease row reads as released long ago while its holder's
	// place runs (as after the server's clock stepped back): the purge
	// must keep it.
	if _, err := db.ExecContext(ctx, "UPDATE "+quoteTable(s.Table())+
		" SET expires_at = '1970-01-01 00:00:00', fence = 1024 WHERE lock_key = ?", forged); err != nil {
		t.Fatal(err)
	}

	purgeUntil(t, s, retention, "the expired holders of an unused key are still there", func() bool {
		all, _ := holderRows(t, db, s, unused)
		return all == 0 && !leaseRow(t, db, s, unused)
	})
	for _, k := range []string{live, forged} {
		if all, n := holderRows(t, db, s, k); all != 1 || n != 1 {
			t.Fatalf("%s: %d holder rows, %d live, after purges; want its live holder kept", k, all, n)
		}
		if !leaseRow(t, db, s, k) {
			t.Fatalf("%s: the purge deleted the lease row of a key with a live holder", k)
		}
	}
	if g, err := s.AcquireShared(ctx, live, "d", 1, time.Minute); err != nil || g.OK {
		t.Fatalf("AcquireShared under a limit of 1 after purges: %+v, %v; want refused by the live holder", g, err)
	}

	g, err := s.AcquireShared(ctx, unused, "e", 0, time.Minute)
	if err != nil || !g.OK || g.Fences[0] <= last {
		t.Fatalf("AcquireShared of a purged key: %+v, %v; want a fence above %d", g, err, last)
	}
	if err := s.ReleaseShared(ctx, unused, "e", 0); err != nil {
		t.Fatal(err)
	}
	last = g.Fences[0]
	purgeUntil(t, s, retention, "the released key's lease row is still there", func() bool { return !leaseRow(t, db, s, unused) })
	if g := mustAcquire(t, s, []string{unused}, "f", time.Minute); g.Fences[0] <= last {
		t.Fatalf("Acquire of a purged key: fence %d, want above %d", g.Fences[0], last)
	}
	_ = s.Release(ctx, []string{unused}, "f", 0)
	for _, k := range []string{live, forged} {
		_ = s.ReleaseShared(ctx, k, "c", 0)
	}
}

// TestPurgeOrphanHolders: holder rows whose lease row is gone (an earlier
// version's purge deleted lease rows and left their holders) are deleted
// once expired for the retention.
func TestPurgeOrphanHolders(t *testing.T) {
	db := openDB(t)
	s := newStore(t, db)
	ctx := t.Context()
	key := testKeys(1)[0]
	if g, err := s.AcquireShared(ctx, key, "a", 0, time.Millisecond); err != nil || !g.OK {
		t.Fatalf("AcquireShared: %+v, %v", g, err)
	}
	if _, err := db.ExecContext(ctx, "DELETE FROM "+quoteTable(s.Table())+" WHERE lock_key = ?", key); err != nil {
		t.Fatal(err)
	}
	purgeUntil(t, s, 200*time.Millisecond, "the orphaned holder is still there", func() bool {
		all, _ := holderRows(t, db, s, key)
		return all == 0
	})
}
