package pgstore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/testservers"
)

// TestSharedTables: an existing lease table, made before shared grants
// (with a lock held in it), keeps working: the Store creates the holders
// table beside it, the held key refuses a holder, and other keys take
// holders; tables named with a keyword or at the 63-byte limit (whose
// holders table takes a digest's name) hold shared grants independently.
func TestSharedTables(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
	p := pool(t, dsn)
	if _, err := p.Exec(t.Context(), `DROP TABLE IF EXISTS reqlock_test_old, reqlock_test_old_holders`); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(t.Context(), `CREATE TABLE reqlock_test_old (key bytea PRIMARY KEY, token bytea,
		expires_at timestamptz, fence bigint NOT NULL, watched_until timestamptz)`); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(t.Context(), `INSERT INTO reqlock_test_old (key, token, expires_at, fence)
		VALUES ('held', 'old-process', clock_timestamp() + interval '1 minute', 1024)`); err != nil {
		t.Fatal(err)
	}
	old := open(t, "reqlock_test_old")
	if g, err := old.AcquireShared(t.Context(), "held", "r", 0, time.Minute); err != nil || g.OK {
		t.Fatalf("AcquireShared of a key an older process holds: %+v, %v; want refused", g, err)
	}
	if g, err := old.AcquireShared(t.Context(), "free", "r", 0, time.Minute); err != nil || !g.OK {
		t.Fatalf("AcquireShared on the existing table: %+v, %v", g, err)
	}
	if err := old.ReleaseShared(t.Context(), "free", "r", 0); err != nil {
		t.Fatal(err)
	}

	key := "shared-tables:" + t.Name()
	for _, table := range []string{"order", strings.Repeat("h", 63), "public.reqlock_test_s"} {
		s := open(t, table)
		if g, err := s.AcquireShared(t.Context(), key, "only", 1, time.Minute); err != nil || !g.OK {
			t.Fatalf("AcquireShared on %s: %+v, %v; want granted (tables are independent)", table, g, err)
		}
		if g, err := s.AcquireShared(t.Context(), key, "second", 1, time.Minute); err != nil || g.OK {
			t.Fatalf("a second holder under a limit of 1 on %s: %+v, %v; want refused", table, g, err)
		}
		if err := s.ReleaseShared(t.Context(), key, "only", 0); err != nil {
			t.Fatalf("ReleaseShared on %s: %v", table, err)
		}
	}
}
