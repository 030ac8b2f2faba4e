package mysqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
)

// session names the server thread of one connection of the pool: its
// connection id, and the client address the server sees, which together
// name it even after a restart of the server gave the id to another
// connection (ids restart from 1).
type session struct {
	id   uint64
	host string
}

// sessionSQL reads the session of the connection that runs it, and whether
// it commits each statement by itself.
const sessionSQL = "SELECT ID, HOST, @@SESSION.autocommit FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()"

// pinned is one connection of the pool, taken for one call, and what the
// Store knows of its session.
type pinned struct {
	conn *sql.Conn
	*sessionEntry
}

// sessionEntry is what the Store knows of one connection: its session, and
// the statements it prepared on it for a driver that does not interpolate
// arguments (see execOne). Only the call that holds the connection uses it.
type sessionEntry struct {
	session
	stmts map[string]driver.Stmt
	used  time.Time // when last pinned; guarded by sessionCache.mu
}

// sessionCache keeps the sessionEntry of each connection the Store has
// pinned, by the driver's connection. database/sql does not say when it
// closes a connection, so an entry goes once it has not been used for
// sessionIdle, when the cache has grown: a connection that comes back later
// has its session read again.
type sessionCache struct {
	mu      sync.Mutex
	m       map[any]*sessionEntry
	pruneAt int // prune when the cache holds this many
}

// sessionIdle is how long an entry stays unused before a prune drops it.
const sessionIdle = 10 * time.Minute

// get returns the entry of dc, or nil.
func (c *sessionCache) get(dc any) *sessionEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[dc]
	if e != nil {
		e.used = time.Now()
	}
	return e
}

// put records e as the entry of dc.
func (c *sessionCache) put(dc any, e *sessionEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[any]*sessionEntry)
	}
	now := time.Now()
	e.used = now
	c.m[dc] = e
	if len(c.m) < max(c.pruneAt, 64) {
		return
	}
	for k, old := range c.m {
		if now.Sub(old.used) > sessionIdle {
			delete(c.m, k)
		}
	}
	c.pruneAt = 2 * len(c.m)
}

// pin takes a connection from the pool for one call, and returns it with
// its session, read on the connection's first use. The caller closes it.
// It returns ErrMisconfigured for a session that does not commit each
// statement by itself (autocommit off).
func (s *Store) pin(ctx context.Context) (pinned, error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return pinned{}, err
	}
	var dc any
	_ = conn.Raw(func(c any) error { dc = c; return nil })
	e := s.sessions.get(dc)
	if e == nil {
		e = &sessionEntry{}
		var autocommit int
		if err := conn.QueryRowContext(ctx, sessionSQL).Scan(&e.id, &e.host, &autocommit); err != nil {
			_ = conn.Close()
			if errors.Is(err, sql.ErrNoRows) {
				err = fmt.Errorf("%w: %s found no row", ErrUnexpectedReply, sessionSQL)
			}
			return pinned{}, err
		}
		if autocommit != 1 {
			_ = conn.Close()
			return pinned{}, errAutocommitOff
		}
		s.sessions.put(dc, e)
	}
	return pinned{conn: conn, sessionEntry: e}, nil
}

// errNoDriverPath means the driver cannot run a statement as execOne does:
// run it through database/sql instead.
var errNoDriverPath = errors.New("mysqlstore: the driver's connection cannot prepare and execute with a context")

// execOne runs one statement with args on p, through the driver's
// connection: database/sql runs a prepared *sql.Stmt on a connection of
// its choosing, not on a pinned one, and on a pinned one prepares, runs and
// closes the statement for each call. A driver that interpolates arguments
// runs it in one round trip; for one that does not, it is prepared once per
// connection and kept with the connection's session.
func (p pinned) execOne(ctx context.Context, query string, args ...any) (driver.Result, error) {
	named := make([]driver.NamedValue, len(args))
	for i, a := range args {
		named[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
	}
	var res driver.Result
	err := p.conn.Raw(func(dc any) error {
		if ec, ok := dc.(driver.ExecerContext); ok {
			r, err := ec.ExecContext(ctx, query, named)
			if !errors.Is(err, driver.ErrSkip) {
				res = r
				return err
			}
		}
		st := p.stmts[query]
		if st == nil {
			pc, ok := dc.(driver.ConnPrepareContext)
			if !ok {
				return errNoDriverPath
			}
			var err error
			if st, err = pc.PrepareContext(ctx, query); err != nil {
				return err
			}
			if _, ok := st.(driver.StmtExecContext); !ok {
				_ = st.Close()
				return errNoDriverPath
			}
			if p.stmts == nil {
				p.stmts = make(map[string]driver.Stmt)
			}
			p.stmts[query] = st
		}
		r, err := st.(driver.StmtExecContext).ExecContext(ctx, named)
		res = r
		return err
	})
	if errors.Is(err, errNoDriverPath) {
		return p.conn.ExecContext(ctx, query, args...)
	}
	return res, err
}

// Server error numbers of KILL.
const (
	erNoSuchThread = 1094 // ER_NO_SUCH_THREAD: the session has ended
	erKillDenied   = 1095 // ER_KILL_DENIED_ERROR: another user's session
)

// sessionAliveSQL counts the threads of a session: 1 while it runs (killed
// or not), 0 once it has ended.
const sessionAliveSQL = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ? AND HOST = ?"

// errCannotEnd means the Store may not end a session: it is another user's.
var errCannotEnd = errors.New("mysqlstore: no privilege to end the session")

// endSession ends sess, whose connection carried a statement the Store gave
// up on, and returns once the server shows it gone: the statement can then
// no longer apply, and whatever it did is committed or rolled back. KILL
// ends an idle session at once and a running statement at its next check
// (rolling back its transaction, unless it was committing).
func (s *Store) endSession(ctx context.Context, sess session) error {
	pause := time.Millisecond
	for {
		var n int
		if err := s.db.QueryRowContext(ctx, sessionAliveSQL, sess.id, sess.host).Scan(&n); err != nil {
			return markUnreachable(err)
		}
		if n == 0 {
			return nil
		}
		_, err := s.db.ExecContext(ctx, "KILL CONNECTION "+strconv.FormatUint(sess.id, 10))
		var me *mysql.MySQLError
		switch {
		case err == nil:
		case errors.As(err, &me) && me.Number == erNoSuchThread:
		case errors.As(err, &me) && me.Number == erKillDenied:
			return fmt.Errorf("%w: %w", errCannotEnd, err)
		default:
			return markUnreachable(err)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, 50*time.Millisecond)
	}
}
