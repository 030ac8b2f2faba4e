package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// session names the server process (backend) of one connection of the
// pool: its pid and its start, which together name it even after the
// operating system gave the pid to another process.
type session struct {
	pid   uint32
	start time.Time

	// endable is false when the connection's backend cannot be named: the
	// pid the server reports is not the one the connection announced, as
	// behind a pooler (PgBouncer) that hands the connection's statements to
	// server connections of its own.
	endable bool
}

// sessionKey is the key of a connection's session in its CustomData.
const sessionKey = "github.com/reqlock/reqlock/stores/pgstore.session"

// sessionSQL reads the session of the connection that runs it.
const sessionSQL = `SELECT pg_backend_pid(), backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()`

// sessionOf returns the session of conn, read from the server on the
// connection's first use and kept with it.
func sessionOf(ctx context.Context, conn *pgxpool.Conn) (session, error) {
	pg := conn.Conn().PgConn()
	data := pg.CustomData()
	if sess, ok := data[sessionKey].(session); ok {
		return sess, nil
	}
	var (
		pid   int32
		start time.Time
	)
	if err := conn.QueryRow(ctx, sessionSQL).Scan(&pid, &start); err != nil {
		return session{}, err
	}
	sess := session{pid: uint32(pid), start: start, endable: uint32(pid) == pg.PID()}
	data[sessionKey] = sess
	return sess, nil
}

// errCannotEnd means the Store may not end a session: its role lacks the
// privilege (another role's session, or a superuser's).
var errCannotEnd = errors.New("pgstore: no privilege to end the session")

// insufficientPrivilege is the SQLSTATE of a refused privilege.
const insufficientPrivilege = "42501"

// endSQL ends a session unless it has ended, and returns a row while it
// still runs.
const endSQL = `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2`

// endSession ends sess, whose connection carried a statement the Store
// gave up on, and returns once the server shows it gone: the statement can
// then no longer apply, and whatever it did is committed or rolled back. A
// backend that is ending finishes a commit it began, then goes; one that is
// idle or waiting goes at once.
func (s *Store) endSession(ctx context.Context, sess session) error {
	pause := time.Millisecond
	for {
		rows, err := s.pool.Query(ctx, endSQL, int32(sess.pid), sess.start)
		if err != nil {
			return classify(err)
		}
		running := false
		for rows.Next() {
			running = true
		}
		rows.Close()
		switch err := rows.Err(); {
		case sqlState(err) == insufficientPrivilege:
			return fmt.Errorf("%w: %w", errCannotEnd, err)
		case err != nil:
			return classify(err)
		case !running:
			return nil
		}
		timer := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
		pause = min(2*pause, 50*time.Millisecond)
	}
}
