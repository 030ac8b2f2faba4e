package mysqlstore

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/reqlock/reqlock/internal/testservers"
)

// TestSimultaneousAssignment: with MariaDB's sql_mode
// SIMULTANEOUS_ASSIGNMENT, where every assignment of an UPDATE sees the row
// as it was, a key taken over after its holder's expiry still gets the new
// holder's expiry, so a third token is refused.
func TestSimultaneousAssignment(t *testing.T) {
	cfg, err := mysql.ParseDSN(testservers.MySQLDSN(t))
	if err != nil {
		t.Fatalf("ParseDSN: %v", err)
	}
	cfg.Params = map[string]string{"sql_mode": "'STRICT_TRANS_TABLES,SIMULTANEOUS_ASSIGNMENT'"}
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatalf("NewConnector: %v", err)
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { _ = db.Close() })
	var mode string
	if err := db.QueryRowContext(t.Context(), "SELECT @@SESSION.sql_mode").Scan(&mode); err != nil || !strings.Contains(mode, "SIMULTANEOUS_ASSIGNMENT") {
		t.Fatalf("sql_mode %q, %v; want SIMULTANEOUS_ASSIGNMENT", mode, err)
	}
	s := newStore(t, db)
	for _, n := range []int{1, 3} {
		keys := testKeys(n)
		mustAcquire(t, s, keys, "t1", 20*time.Millisecond)
		// Waiting for the TTL to run out is the behaviour under test.
		deadline := time.Now().Add(5 * time.Second)
		tick := time.NewTicker(5 * time.Millisecond)
		for {
			g, err := s.Acquire(t.Context(), keys, "t2", time.Minute)
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			if g.OK {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d keys: never free after a 20ms TTL", n)
			}
			<-tick.C
		}
		tick.Stop()
		if g, err := s.Acquire(t.Context(), keys, "t3", time.Minute); err != nil || g.OK || g.Wait <= 50*time.Second {
			t.Fatalf("%d keys: Acquire by a third token after a takeover: %+v, %v; want refused with the new holder's minute left", n, g, err)
		}
		if err := s.Release(t.Context(), keys, "t2", 0); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
}
