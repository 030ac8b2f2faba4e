package mysqlstore

import (
	"strings"
	"testing"
	"time"
)

// TestSharedTables: an existing lease table, made before shared grants
// (with a lock held in it), keeps working: the Store creates the holders
// table beside it, the held key refuses a holder, and other keys take
// holders; a table named at the 64-byte limit (whose holders table takes a
// digest's name) holds shared grants too; and with WithoutCreateTable the
// holders table comes from HoldersSchema.
func TestSharedTables(t *testing.T) {
	db := openDB(t)
	ctx := t.Context()
	for _, q := range []string{"DROP TABLE IF EXISTS reqlock_test_old, reqlock_test_old_holders, reqlock_test_managed, reqlock_test_managed_holders"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	ddl, err := Schema("reqlock_test_old")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO reqlock_test_old (lock_key, token, expires_at, fence)
		VALUES ('held', 'old-process', UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE, 1024)`); err != nil {
		t.Fatal(err)
	}
	old := newStore(t, db, WithTable("reqlock_test_old"))
	if g, err := old.AcquireShared(ctx, "held", "r", 0, time.Minute); err != nil || g.OK {
		t.Fatalf("AcquireShared of a key an older process holds: %+v, %v; want refused", g, err)
	}

	// A managed schema: both tables made beforehand.
	for _, schema := range []func(string) (string, error){Schema, HoldersSchema} {
		ddl, err := schema("reqlock_test_managed")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	managed := newStore(t, db, WithTable("reqlock_test_managed"), WithoutCreateTable())

	key := "shared-tables:" + t.Name()
	for _, s := range []*Store{old, managed, newStore(t, db, WithTable(strings.Repeat("h", 64)))} {
		if g, err := s.AcquireShared(ctx, key, "only", 1, time.Minute); err != nil || !g.OK {
			t.Fatalf("AcquireShared on %s: %+v, %v; want granted", s.Table(), g, err)
		}
		if g, err := s.AcquireShared(ctx, key, "second", 1, time.Minute); err != nil || g.OK {
			t.Fatalf("a second holder under a limit of 1 on %s: %+v, %v; want refused", s.Table(), g, err)
		}
		if err := s.ReleaseShared(ctx, key, "only", 0); err != nil {
			t.Fatalf("ReleaseShared on %s: %v", s.Table(), err)
		}
	}
}
