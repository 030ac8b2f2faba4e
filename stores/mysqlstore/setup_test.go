package mysqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/reqlock/reqlock/internal/testservers"
)

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
