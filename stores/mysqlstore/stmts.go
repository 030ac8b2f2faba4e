package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
)

// maxCachedStmts bounds the prepared statements a Store keeps: the
// statements on several keys differ by their number of keys.
const maxCachedStmts = 64

// stmtCache keeps the Store's prepared statements by their SQL, so that a
// statement takes one round trip (an execute) instead of two (a prepare and
// an execute) with a driver that does not interpolate arguments itself.
// database/sql prepares a *sql.Stmt again on each connection it runs on,
// within the connection the statement runs on.
//
// Preparing takes a connection from the pool. So the cache never holds its
// mutex while it prepares (a call waiting for a connection would hold up
// every other call, including those that hold the connections it waits for),
// and the Store prepares the statements of a transaction before it begins
// the transaction, never while it holds the transaction's connection: every
// call needs one connection at a time, and a pool capped at one serves
// them all.
type stmtCache struct {
	mu        sync.Mutex
	stmts     map[string]*sql.Stmt
	preparing map[string]bool      // being prepared by a call, outside mu
	failed    map[string]time.Time // when its prepare last failed
	closed    bool
}

// prepareAgainAfter is how long a statement whose prepare failed runs
// unprepared before the cache tries to prepare it again: a failed prepare
// costs a round trip.
const prepareAgainAfter = time.Minute

// get returns the prepared statement of query, preparing it on first use;
// nil (and no error) when the cache is full or closed, another call is
// preparing query at the moment, or the prepare failed: the caller then
// runs query unprepared. A prepare may fail where an unprepared statement
// runs: past the server's max_prepared_stmt_count, through a proxy that
// does not support prepared statements, or as a driver that interpolates
// arguments sends it. A query whose prepare failed runs unprepared for
// prepareAgainAfter.
func (c *stmtCache) get(ctx context.Context, db *sql.DB, query string) (*sql.Stmt, error) {
	c.mu.Lock()
	st, ok := c.stmts[query]
	failed, hasFailed := c.failed[query]
	prepare := !ok && !c.closed && !c.preparing[query] && len(c.stmts)+len(c.preparing) < maxCachedStmts &&
		(!hasFailed || time.Since(failed) > prepareAgainAfter)
	if prepare {
		if c.preparing == nil {
			c.preparing = make(map[string]bool)
		}
		c.preparing[query] = true
	}
	c.mu.Unlock()
	if !prepare {
		return st, nil
	}
	st, err := db.PrepareContext(ctx, query)
	var serverErr *mysql.MySQLError
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.preparing, query)
	switch {
	case errors.As(err, &serverErr):
		// The server refused it (max_prepared_stmt_count, a proxy).
		if c.failed == nil {
			c.failed = make(map[string]time.Time)
		}
		c.failed[query] = time.Now()
		return nil, nil // run unprepared; a failure that is not the prepare's comes back from the run
	case err != nil:
		return nil, nil
	case c.closed:
		_ = st.Close()
		return nil, nil
	}
	if c.stmts == nil {
		c.stmts = make(map[string]*sql.Stmt)
	}
	c.stmts[query] = st
	return st, nil
}

// close closes every statement; get prepares none after it.
func (c *stmtCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.stmts {
		_ = st.Close()
	}
	c.stmts, c.closed = nil, true
}

// execer runs statements on the Store's *sql.DB or on a transaction of it.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	StmtContext(ctx context.Context, st *sql.Stmt) *sql.Stmt
}

// dbExecer is the Store's *sql.DB as an execer.
type dbExecer struct{ *sql.DB }

// StmtContext returns st itself: it belongs to the *sql.DB.
func (dbExecer) StmtContext(_ context.Context, st *sql.Stmt) *sql.Stmt { return st }

// stmt is one statement of the Store: its SQL and, when the cache had room
// for it, its prepared form.
type stmt struct {
	query    string
	prepared *sql.Stmt // nil: run query unprepared
}

// prepare returns the statement of query, prepared when the cache has room.
// It takes a connection from the pool to prepare: call it before taking one
// for a transaction, never while holding one.
func (s *Store) prepare(ctx context.Context, query string) (stmt, error) {
	st, err := s.stmts.get(ctx, s.db, query)
	return stmt{query: query, prepared: st}, err
}

// exec runs st with args on e.
func (st stmt) exec(ctx context.Context, e execer, args ...any) (sql.Result, error) {
	if st.prepared == nil {
		return e.ExecContext(ctx, st.query, args...)
	}
	return e.StmtContext(ctx, st.prepared).ExecContext(ctx, args...)
}

// rows runs st with args on e and returns its rows.
func (st stmt) rows(ctx context.Context, e execer, args ...any) (*sql.Rows, error) {
	if st.prepared == nil {
		return e.QueryContext(ctx, st.query, args...)
	}
	return e.StmtContext(ctx, st.prepared).QueryContext(ctx, args...)
}

// execDB prepares query (see prepare) and runs it with args on the Store's
// *sql.DB, on one connection of the pool.
func (s *Store) execDB(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, err := s.prepare(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.exec(ctx, s.dbx, args...)
}

// queryDB prepares query (see prepare) and runs it with args on the Store's
// *sql.DB, returning its rows.
func (s *Store) queryDB(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := s.prepare(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.rows(ctx, s.dbx, args...)
}
