package mysqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/reqlock/reqlock/internal/undoqueue"
	"github.com/reqlock/reqlock/stores"
)

// Acquire sets every key to token for ttl when none is held by another
// token, and issues each key its next fence, as stores.Store describes.
// When a key is held it sets nothing and returns a Grant with OK false,
// Held the index of the first held key and Wait its holder's remaining TTL
// by the server's clock. A key that already holds token (a retried call
// whose reply was lost) is granted again with a fresh fence and TTL.
//
// One key takes one statement and one round trip. Several keys take a
// transaction (begin, one INSERT for all rows, one SELECT, commit or
// rollback) that locks their rows in key order.
//
// Contention is not a failure: a statement the server chose as a
// deadlock's victim, or that timed out waiting for a row lock, changed
// nothing and is tried again after a short random sleep, up to
// contentionAttempts times while the caller waits; then Acquire refuses,
// with Held 0 and a Wait of a few milliseconds: the keys are busy, if not
// held.
//
// It returns as soon as ctx ends, even while the server has not answered:
// the statement goes on (see Failures in the package documentation), a
// grant it makes is released, owner-checked, once it returns, and the error
// wraps stores.ErrAbandoned and ctx's error. A statement whose outcome is
// unknown (no answer within the call limit, or a lost connection, a COMMIT
// among them) is undone by the Store, which first ends the session that
// carried it, so that it cannot apply later; the error then wraps
// stores.ErrAbandoned. It returns an error wrapping stores.ErrInvalid for
// no keys, more than MaxKeysPerCall, an empty, duplicate, unsorted or too
// long key (see Bounds), an empty or too long token or a non-positive ttl,
// before any statement; ErrClosed after Close; ErrMisconfigured for a
// server or table the Store cannot use; ErrUnexpectedReply for a reply it
// cannot read; and the driver's error otherwise, wrapped with
// stores.ErrUnreachable when no connection could be made.
func (s *Store) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return stores.Grant{}, err
	}
	if err := s.checkArgs(keys, token, ttl); err != nil {
		return stores.Grant{}, err
	}
	op := func(ctx context.Context, c *call[acquired]) (acquired, error) {
		var r acquired
		g, err := s.acquire(ctx, c, keys, token, micros(ttl), &r.a)
		r.g, r.limit = g, ctx.Err() != nil
		return r, markUnreachable(err)
	}
	r, err := run(s, ctx, op, func(r acquired, err error) {
		// The caller left: undo in its stead what may have been granted.
		if r.g.OK || r.a.unknown || r.a.maybe {
			s.owe(keys, token, ttl, r.a)
		}
	})
	if !r.a.unknown {
		return r.g, err
	}
	// No answer, or a lost connection: the statement may still apply. The
	// Store undoes it while the caller waits, so that it cannot apply after
	// the call returned; what is left goes on in the background.
	cause := fmt.Errorf("mysqlstore: connection lost with the outcome unknown: %w", err)
	if r.limit {
		cause = fmt.Errorf("mysqlstore: no answer within the call limit %v: %w", s.callLimit, context.DeadlineExceeded)
	}
	d := s.debtOf(keys, token, ttl, r.a)
	if undoqueue.SettleNow(ctx, d, s.settle, s.undoLimit()) {
		return stores.Grant{}, fmt.Errorf("%w: %w; the store ended the session that carried it and released the keys", stores.ErrAbandoned, cause)
	}
	s.undo.Add(d)
	return stores.Grant{}, fmt.Errorf("%w: %w; the store undoes it", stores.ErrAbandoned, cause)
}

// acquired is the outcome of Acquire's operation.
type acquired struct {
	g     stores.Grant
	a     attempt
	limit bool // the call limit ended the operation
}

// attempt is what an acquire's statement leaves behind, for its undo.
type attempt struct {
	sess    session // of the connection that carried the statement
	unknown bool    // the statement may still apply: no answer came, and the connection is gone
	maybe   bool    // the statement returned a reply the Store could not read: it may have granted
}

// sent records in a that a statement on sess is on its way, or, once err
// is its outcome, whether that outcome is known: a server's error reply
// (the statement, or its transaction, changed nothing) and a connection
// that went bad before anything was written (driver.ErrBadConn) are.
func (a *attempt) sent(sess session, err error) {
	var me *mysql.MySQLError
	a.sess = sess
	a.unknown = err != nil && !errors.As(err, &me) && !errors.Is(err, driver.ErrBadConn)
}

// owe queues the undo of an acquire of keys by token whose caller left.
func (s *Store) owe(keys []string, token string, ttl time.Duration, a attempt) {
	s.undo.Add(s.debtOf(keys, token, ttl, a))
}

// debtOf returns the undo of an acquire of keys by token that left a: its
// session must end first when its statement may still apply.
func (s *Store) debtOf(keys []string, token string, ttl time.Duration, a attempt) *debt {
	s.undos.Add(1)
	return &debt{keys: keys, token: token, ttl: ttl, sess: a.sess, end: a.unknown, since: time.Now()}
}

// undoLimit bounds each try of an undo.
func (s *Store) undoLimit() time.Duration { return min(s.callLimit, undoTryLimit) }

// contentionWait is the Wait of a refusal after every attempt lost to row
// lock contention: the winners hold their rows for a round trip or two.
const contentionWait = contentionAttempts * time.Millisecond

// acquire is Acquire's operation. It records in a what its last statement
// leaves to undo.
func (s *Store) acquire(ctx context.Context, c *call[acquired], keys []string, token string, ttl int64, a *attempt) (stores.Grant, error) {
	if err := s.setup(ctx); err != nil {
		return stores.Grant{}, err
	}
	var g stores.Grant
	err := s.retry(ctx, c.left, func() error {
		var err error
		if len(keys) == 1 {
			g, err = s.acquireOne(ctx, keys[0], token, ttl, a)
			switch {
			case err != nil:
			case g.OK:
				s.contended.forget(keys[0])
			default:
				s.contended.mark(keys[0], g.Wait)
			}
		} else {
			g, err = s.acquireMany(ctx, c, keys, token, ttl, a)
		}
		return err
	})
	if errors.Is(err, ErrContention) {
		// Nothing changed: the keys are busy, and the caller may try again
		// soon.
		return stores.Grant{Held: 0, Wait: contentionWait}, nil
	}
	return g, err
}

// retry runs attempt, and again after a random sleep of a few milliseconds
// while it loses to row lock contention, up to contentionAttempts times in
// all and only while the caller waits (left, unless nil, reports false) and
// ctx lasts. A loss to contention changed nothing, so trying again is safe.
func (s *Store) retry(ctx context.Context, left func() bool, attempt func() error) error {
	for n := 1; ; n++ {
		err := attempt()
		if !contended(err) {
			return err
		}
		if n >= s.attempts || (left != nil && left()) || ctx.Err() != nil {
			return fmt.Errorf("%w after %d attempts: %w", ErrContention, n, err)
		}
		s.retries.Add(1)
		// The transactions that won hold their rows for a round trip or
		// two: wait about that long, longer after each loss.
		sleep := time.Duration(rand.Int64N(int64(n) * int64(time.Millisecond)))
		t := time.NewTimer(sleep)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w after %d attempts: %w", ErrContention, n, err)
		}
	}
}

// maxBadConnTries is how many connections a statement is tried on while
// each turns out bad before anything was written to it (as database/sql
// does).
const maxBadConnTries = 3

// acquireOne runs acquireOneSQL on a pinned connection, whose session it
// records in a, and reads its outcome from LAST_INSERT_ID; on a contended
// key it first looks for a holder without locking (see contendedKeys).
func (s *Store) acquireOne(ctx context.Context, key, token string, ttl int64, a *attempt) (stores.Grant, error) {
	if s.contended.contended(key) {
		if g, err := s.findHeld(ctx, []string{key}, token); err != nil || !g.OK {
			return g, err
		}
	}
	var (
		res driver.Result
		err error
	)
	for range maxBadConnTries {
		var p pinned
		if p, err = s.pin(ctx); err != nil {
			return stores.Grant{}, err // nothing sent
		}
		res, err = p.execOne(ctx, s.q.acquireOne, key, token, ttl, token, token, token, token, ttl)
		_ = p.conn.Close()
		a.sent(p.session, err)
		if !errors.Is(err, driver.ErrBadConn) {
			break
		}
	}
	if err != nil {
		return stores.Grant{}, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		a.maybe = true
		return stores.Grant{}, fmt.Errorf("%w: acquire %s: %w", ErrUnexpectedReply, stores.KeyForMessage(key), err)
	}
	switch {
	case id > 0 && id < refusedFlag:
		return stores.Grant{OK: true, Fences: []int64{id}}, nil
	case id > refusedFlag:
		return stores.Grant{Wait: remaining(id - refusedFlag)}, nil
	}
	a.maybe = true
	return stores.Grant{}, fmt.Errorf("%w: acquire %s answered LAST_INSERT_ID %d", ErrUnexpectedReply, stores.KeyForMessage(key), id)
}

// acquireMany takes several keys in one transaction on a pinned connection:
// acquireManySQL locks and sets their rows, selectManySQL reads them, and
// the transaction commits when every row holds token, else rolls back. It
// rolls back too when the caller has left meanwhile. Its statements are
// prepared before the transaction takes its connection (see stmtCache).
// Only its COMMIT can leave an outcome unknown: a transaction whose COMMIT
// was never sent rolls back on the server, whenever its statements arrive,
// when the connection ends.
func (s *Store) acquireMany(ctx context.Context, c *call[acquired], keys []string, token string, ttl int64, a *attempt) (stores.Grant, error) {
	if g, err := s.findHeld(ctx, keys, token); err != nil || !g.OK {
		return g, err
	}
	insert, err := s.prepare(ctx, withRows(s.q.acquireMany, s.q.acquireRow, len(keys)))
	if err != nil {
		return stores.Grant{}, err
	}
	read, err := s.prepare(ctx, withKeys(s.q.selectMany, len(keys)))
	if err != nil {
		return stores.Grant{}, err
	}
	p, err := s.pin(ctx)
	if err != nil {
		return stores.Grant{}, err
	}
	defer p.conn.Close()
	tx, err := p.conn.BeginTx(ctx, nil)
	if err != nil {
		return stores.Grant{}, err
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	values := make([]any, 0, 3*len(keys)+5)
	for _, k := range keys {
		values = append(values, k, token, ttl)
	}
	values = append(values, token, token, token, token, ttl)
	if _, err := insert.exec(ctx, tx, values...); err != nil {
		return stores.Grant{}, err
	}
	fences, held, wait, err := readRows(ctx, tx, read, keys, token)
	if err != nil {
		return stores.Grant{}, err
	}
	if held >= 0 {
		return stores.Grant{Held: held, Wait: remaining(wait)}, nil // rolled back
	}
	if c.left() {
		return stores.Grant{}, errLeft // rolled back: nothing to undo
	}
	if err := tx.Commit(); err != nil {
		// Whether the server committed is unknown.
		a.sess, a.unknown = p.session, true
		return stores.Grant{}, fmt.Errorf("mysqlstore: commit of the grant of %s (outcome unknown): %w", keysForMessage(keys), err)
	}
	committed = true
	return stores.Grant{OK: true, Fences: fences}, nil
}

// findHeld looks, without locking, for a key held by another token, and
// returns a refusal naming it, or a Grant with OK true (and no fences) when
// it found none: under contention most attempts on several keys then take
// one read and no row lock, and hold up no one.
func (s *Store) findHeld(ctx context.Context, keys []string, token string) (stores.Grant, error) {
	rows, err := s.queryDB(ctx, withKeys(s.q.held, len(keys)), append(anys(keys), token)...)
	if err != nil {
		return stores.Grant{}, err
	}
	defer rows.Close()
	if !rows.Next() {
		return stores.Grant{OK: true}, rows.Err()
	}
	var (
		key  string
		left int64
	)
	if err := rows.Scan(&key, &left); err != nil {
		return stores.Grant{}, fmt.Errorf("%w: acquire %s: %w", ErrUnexpectedReply, keysForMessage(keys), err)
	}
	i := slices.Index(keys, key)
	if i < 0 {
		return stores.Grant{}, fmt.Errorf("%w: acquire %s read row %s", ErrUnexpectedReply, keysForMessage(keys), stores.KeyForMessage(key))
	}
	return stores.Grant{Held: i, Wait: remaining(left)}, nil
}

// readRows reads the rows of keys within tx with read, selectManySQL: each
// one's fence and, when a row holds another token, the index of the first
// such and its remaining TTL in microseconds (held is -1 when every row
// holds token).
func readRows(ctx context.Context, tx *sql.Tx, read stmt, keys []string, token string) (fences []int64, held int, wait int64, err error) {
	rows, err := read.rows(ctx, tx, anys(keys)...)
	if err != nil {
		return nil, 0, 0, err
	}
	defer rows.Close()
	fences = make([]int64, len(keys))
	held = -1
	i := 0
	for rows.Next() {
		var (
			key, holder string
			fence, left int64
		)
		if err := rows.Scan(&key, &holder, &fence, &left); err != nil {
			return nil, 0, 0, fmt.Errorf("%w: acquire %s: %w", ErrUnexpectedReply, keysForMessage(keys), err)
		}
		if i >= len(keys) || key != keys[i] {
			return nil, 0, 0, fmt.Errorf("%w: acquire %s read row %s", ErrUnexpectedReply, keysForMessage(keys), stores.KeyForMessage(key))
		}
		if holder != token && held < 0 {
			held, wait = i, left
		}
		fences[i] = fence
		i++
	}
	if err := rows.Err(); err != nil {
		return nil, 0, 0, err
	}
	if i != len(keys) {
		return nil, 0, 0, fmt.Errorf("%w: acquire %s read %d rows", ErrUnexpectedReply, keysForMessage(keys), i)
	}
	return fences, held, wait, nil
}

// Release ends token's grant on every key that holds it, in one statement
// and one round trip, as stores.Store describes: with keep zero or negative
// it lets the row expire now, keeping its fence; with
// keep positive it sets the key's TTL to keep instead, so the key stays
// held until then. It returns an error wrapping stores.ErrNotHeld, saying
// how many keys, when some keys were absent, expired or held another token,
// after ending the grant on the others.
//
// It returns ctx.Err() as soon as ctx ends (the statement goes on); an
// error wrapping stores.ErrInvalid for no keys, more than MaxKeysPerCall,
// an empty, duplicate, unsorted or too long key (see Bounds), or an empty
// or too long token, before any statement; ErrClosed after Close; one wrapping ErrContention after contentionAttempts losses to row
// lock contention; and the driver's error otherwise.
func (s *Store) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	if err := args.CheckRelease(ctx, keys); err != nil {
		return err
	}
	var durations []time.Duration
	if keep > 0 {
		durations = append(durations, keep)
	}
	if err := s.checkArgs(keys, token, durations...); err != nil {
		return err
	}
	// A release is owed whether or not its caller waits: it tries again
	// after a loss to contention when its caller has left too.
	_, err := run(s, ctx, func(ctx context.Context, _ *call[struct{}]) (struct{}, error) {
		return struct{}{}, markUnreachable(s.release(ctx, nil, keys, token, keep))
	}, nil)
	return err
}

// release is Release's operation.
func (s *Store) release(ctx context.Context, left func() bool, keys []string, token string, keep time.Duration) error {
	if err := s.setup(ctx); err != nil {
		return err
	}
	query := s.q.release
	var vals []any
	if keep > 0 {
		query = s.q.expire
		vals = append(vals, micros(keep), micros(keep))
	}
	vals = append(append(vals, anys(keys)...), token)
	var n int64
	err := s.retry(ctx, left, func() error {
		var err error
		n, err = s.exec(ctx, withKeys(query, len(keys)), vals)
		return err
	})
	if err != nil {
		return err
	}
	if n < int64(len(keys)) {
		if len(keys) == 1 {
			return fmt.Errorf("%w: %s", stores.ErrNotHeld, stores.KeyForMessage(keys[0]))
		}
		return fmt.Errorf("%w: %d of %d keys", stores.ErrNotHeld, int64(len(keys))-n, len(keys))
	}
	return nil
}

// exec runs one statement and returns the rows it affected.
func (s *Store) exec(ctx context.Context, query string, vals []any) (int64, error) {
	res, err := s.execDB(ctx, query, vals...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Refresh resets the TTL of every key to ttl if each holds token; when one
// does not, it changes nothing and returns an error wrapping
// stores.ErrNotHeld. One key takes one statement; several a transaction
// (begin, one UPDATE, commit or rollback), rolled back unless the UPDATE
// found every key holding token.
//
// It returns ctx.Err() as soon as ctx ends (the statement goes on); an
// error wrapping stores.ErrInvalid for no keys, more than MaxKeysPerCall,
// an empty, duplicate, unsorted or too long key (see Bounds), an empty or
// too long token or a non-positive ttl, before any statement; ErrClosed
// after Close; one wrapping ErrContention after
// contentionAttempts losses to row lock contention; and the driver's error
// otherwise, wrapped with stores.ErrUnreachable when no connection could be
// made. A lost connection is no lost lock: the lease is a row, which any
// connection refreshes.
func (s *Store) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return err
	}
	if err := s.checkArgs(keys, token, ttl); err != nil {
		return err
	}
	_, err := run(s, ctx, func(ctx context.Context, c *call[struct{}]) (struct{}, error) {
		return struct{}{}, markUnreachable(s.refresh(ctx, c.left, keys, token, micros(ttl)))
	}, nil)
	return err
}

// refresh is Refresh's operation.
func (s *Store) refresh(ctx context.Context, left func() bool, keys []string, token string, ttl int64) error {
	if err := s.setup(ctx); err != nil {
		return err
	}
	vals := append(append([]any{ttl, ttl}, anys(keys)...), token)
	return s.retry(ctx, left, func() error {
		if len(keys) == 1 {
			n, err := s.exec(ctx, withKeys(s.q.expire, 1), vals)
			if err != nil {
				return err
			}
			if n != 1 {
				return fmt.Errorf("%w: %s", stores.ErrNotHeld, stores.KeyForMessage(keys[0]))
			}
			return nil
		}
		return s.refreshMany(ctx, keys, vals)
	})
}

// refreshMany runs expireSQL on several keys in a transaction, committed
// only when every key held the token. The statement is prepared before the
// transaction takes its connection (see stmtCache).
func (s *Store) refreshMany(ctx context.Context, keys []string, vals []any) error {
	expire, err := s.prepare(ctx, withKeys(s.q.expire, len(keys)))
	if err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	res, err := expire.exec(ctx, tx, vals...)
	if err != nil {
		_ = tx.Rollback()
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		_ = tx.Rollback()
		return err
	}
	if n != int64(len(keys)) {
		if err := tx.Rollback(); err != nil {
			return err // unknown whether the rollback reached the server
		}
		return fmt.Errorf("%w: %d of %d keys (none refreshed)", stores.ErrNotHeld, int64(len(keys))-n, len(keys))
	}
	return tx.Commit()
}
