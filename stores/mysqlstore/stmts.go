package mysqlstore

import (
	"context"
	"database/sql"
	"sync"
)

// maxCachedStmts bounds the prepared statements a Store keeps: the
// statements on several keys differ by their number of keys.
const maxCachedStmts = 64

// stmtCache keeps the Store's prepared statements by their SQL, so that a
// statement takes one round trip (an execute) instead of two (a prepare and
// an execute) with a driver that does not interpolate arguments itself.
// database/sql prepares a *sql.Stmt again on each connection it runs on.
type stmtCache struct {
	mu     sync.Mutex
	stmts  map[string]*sql.Stmt
	closed bool
}

// get returns the prepared statement of query, preparing it on first use;
// nil (and no error) when the cache is full or closed: the caller then runs
// query unprepared.
func (c *stmtCache) get(ctx context.Context, db *sql.DB, query string) (*sql.Stmt, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.stmts[query]; ok {
		return st, nil
	}
	if c.closed || len(c.stmts) >= maxCachedStmts {
		return nil, nil
	}
	st, err := db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
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

// exec runs query with args on e, prepared when the cache has room.
func (s *Store) execOn(ctx context.Context, e execer, query string, args ...any) (sql.Result, error) {
	st, err := s.stmts.get(ctx, s.db, query)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return e.ExecContext(ctx, query, args...)
	}
	return e.StmtContext(ctx, st).ExecContext(ctx, args...)
}

// queryOn runs query with args on e, prepared when the cache has room.
func (s *Store) queryOn(ctx context.Context, e execer, query string, args ...any) (*sql.Rows, error) {
	st, err := s.stmts.get(ctx, s.db, query)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return e.QueryContext(ctx, query, args...)
	}
	return e.StmtContext(ctx, st).QueryContext(ctx, args...)
}
