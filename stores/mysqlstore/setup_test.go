package mysqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
)

// TestAutocommitOff: a server or DSN whose sessions run with autocommit=0
// is refused with ErrMisconfigured before any grant. With autocommit off a
// one-statement grant never committed: others waited for its row lock, and
// when the connection closed the grant vanished while its holder's validity
// ran, so that two held the key. Open turns autocommit on, and refuses a
// URL that turns it off.
func TestAutocommitOff(t *testing.T) {
	off := openDB(t, withParam("autocommit", "0"))
	s := newStore(t, off)
	keys := testKeys(1)
	g, err := s.Acquire(t.Context(), keys, "t1", time.Minute)
	if g.OK || !errors.Is(err, ErrMisconfigured) || !strings.Contains(err.Error(), "autocommit") {
		t.Fatalf("Acquire with autocommit off: %+v, %v; want ErrMisconfigured naming autocommit", g, err)
	}
	_ = off.Close()
	direct := newStore(t, openDB(t))
	mustAcquire(t, direct, keys, "t2", time.Minute)

	if _, err := Open(t.Context(), testURL(t, "autocommit=0")); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("Open with autocommit=0: %v, want stores.ErrInvalid", err)
	}
	cfg, _, _, err := parseURL(testURL(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Params["autocommit"] != "1" {
		t.Fatalf("Open's driver parameters %v, want autocommit=1", cfg.Params)
	}
}

// TestSchemaChecked: a table made beforehand (WithoutCreateTable) or found
// existing, whose columns cannot hold what the Store writes, is refused
// with ErrMisconfigured naming the column. A DATETIME without fractions
// rounded expiries to the second; a TIMESTAMP cannot hold the release's
// 1970-01-01 00:00:00; a VARCHAR compares keys by a collation; a short
// VARBINARY truncates or refuses keys.
func TestSchemaChecked(t *testing.T) {
	db := openDB(t)
	good, err := Schema("reqlock_schema_test")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, from, to, column string }{
		{"DATETIME without fractions", "DATETIME(6)", "DATETIME", "expires_at"},
		{"TIMESTAMP", "DATETIME(6)", "TIMESTAMP(6) NULL", "expires_at"},
		{"VARCHAR key", "lock_key   VARBINARY(512)", "lock_key VARCHAR(512)", "lock_key"},
		{"short key", "lock_key   VARBINARY(512)", "lock_key VARBINARY(100)", "lock_key"},
		{"INT fence", "BIGINT", "INT", "fence"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := db.ExecContext(t.Context(), "DROP TABLE IF EXISTS reqlock_schema_test"); err != nil {
				t.Fatal(err)
			}
			ddl := strings.Replace(good, c.from, c.to, 1)
			if ddl == good {
				t.Fatalf("the schema has no %q to change", c.from)
			}
			if _, err := db.ExecContext(t.Context(), ddl); err != nil {
				t.Fatalf("%s: %v", ddl, err)
			}
			for _, opts := range [][]Option{{WithTable("reqlock_schema_test"), WithoutCreateTable()}, {WithTable("reqlock_schema_test")}} {
				s := newStore(t, db, opts...)
				_, err := s.Acquire(t.Context(), testKeys(1), "t1", time.Minute)
				if !errors.Is(err, ErrMisconfigured) || !strings.Contains(err.Error(), c.column) {
					t.Fatalf("Acquire on a table made with %q: %v, want ErrMisconfigured naming %s", c.to, err, c.column)
				}
			}
		})
	}
	if _, err := db.ExecContext(t.Context(), "DROP TABLE IF EXISTS reqlock_schema_test"); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, db, WithTable("reqlock_schema_test"), WithoutCreateTable())
	if _, err := s.Acquire(t.Context(), testKeys(1), "t1", time.Minute); !errors.Is(err, ErrMisconfigured) {
		t.Fatalf("Acquire with WithoutCreateTable and no table: %v, want ErrMisconfigured", err)
	}
	if _, err := db.ExecContext(t.Context(), good); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, newStore(t, db, WithTable("reqlock_schema_test"), WithoutCreateTable()), testKeys(1), "t1", time.Minute)
}

// TestPrepareRefusedRunsUnprepared: a server that refuses to prepare
// statements (max_prepared_stmt_count reached; some proxies) still serves a
// Store whose driver interpolates arguments, as Open's does: a failed
// prepare runs the statement unprepared. It used to fail every call. The
// refusal is the server's error 1461, returned by a driver wrapper (the
// test's user may not set max_prepared_stmt_count).
func TestPrepareRefusedRunsUnprepared(t *testing.T) {
	cfg, err := mysql.ParseDSN(testservers.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.InterpolateParams = true
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var refused atomic.Int64
	db := sql.OpenDB(noPrepareConnector{connector, &refused})
	t.Cleanup(func() { _ = db.Close() })
	s := newStore(t, db)
	for _, n := range []int{1, 3} {
		keys := testKeys(n)
		mustAcquire(t, s, keys, "t1", time.Minute)
		if g, err := s.Acquire(t.Context(), keys, "t2", time.Minute); err != nil || g.OK {
			t.Fatalf("%d keys: second token: %+v, %v; want refused", n, g, err)
		}
		if err := s.Refresh(t.Context(), keys, "t1", time.Minute); err != nil {
			t.Fatalf("%d keys: Refresh: %v", n, err)
		}
		if err := s.Release(t.Context(), keys, "t1", 0); err != nil {
			t.Fatalf("%d keys: Release: %v", n, err)
		}
	}
	if refused.Load() == 0 {
		t.Fatal("no prepare was refused: the test caught nothing")
	}
}

// noPrepareConnector makes connections that refuse every prepare as a
// server past max_prepared_stmt_count does, and count the refusals.
type noPrepareConnector struct {
	driver.Connector
	refused *atomic.Int64
}

func (c noPrepareConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return noPrepareConn{conn.(mysqlConn), c.refused}, nil
}

// mysqlConn is what go-sql-driver/mysql's connections implement.
type mysqlConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ExecerContext
	driver.QueryerContext
	driver.NamedValueChecker
	driver.SessionResetter
	driver.Validator
}

type noPrepareConn struct {
	mysqlConn
	refused *atomic.Int64
}

func (c noPrepareConn) Prepare(string) (driver.Stmt, error) { return nil, c.refuse() }

func (c noPrepareConn) PrepareContext(context.Context, string) (driver.Stmt, error) {
	return nil, c.refuse()
}

func (c noPrepareConn) refuse() error {
	c.refused.Add(1)
	return &mysql.MySQLError{Number: 1461, Message: "Can't create more than max_prepared_stmt_count statements (current value: 0)"}
}
