package mysqlstore

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/reqlock/reqlock/internal/holders"
	"github.com/reqlock/reqlock/stores"
)

// HoldersSchema returns the CREATE TABLE IF NOT EXISTS statement of the
// holders table of a Store's table (see Shared grants in the package
// documentation), for a managed schema: table is as WithTable takes it;
// empty means DefaultTable. It returns an error wrapping stores.ErrInvalid
// for an invalid name.
func HoldersSchema(table string) (string, error) {
	table, err := schemaTable(table)
	if err != nil {
		return "", err
	}
	return tableQueries(table).createHolders, nil
}

// holdersTable names the holders table of table (see holders.Table).
func holdersTable(table string) string { return holders.Table(table, 64) }

// AcquireShared makes token a holder of key for ttl, as stores.SharedStore
// describes, in one transaction on a pinned connection: it creates and
// locks the key's lease row, reads it and the key's unexpired holders, and,
// on a grant, upserts the holder, then sets the lease row to
// holders.Marker, the longest holder's expiry and the next fence of the
// key's one sequence, commits, and deletes the expired places; a refusal
// rolls back. A refusal's Wait is the exclusive holder's remaining TTL, the
// longest remaining window among the waiting writers, or the soonest expiry
// among the holders of a key that has limit holders or more.
//
// Its errors are Acquire's; a grant whose caller left, or whose COMMIT's
// outcome is unknown, is undone with ReleaseShared, owner-checked.
func (s *Store) AcquireShared(ctx context.Context, key, token string, limit int, ttl time.Duration) (stores.Grant, error) {
	if err := args.CheckShared(ctx, key, limit); err != nil {
		return stores.Grant{}, err
	}
	if err := args.CheckTTL(ttl); err != nil {
		return stores.Grant{}, err
	}
	keys := []string{key}
	if err := s.checkArgs(keys, token, ttl); err != nil {
		return stores.Grant{}, err
	}
	op := func(ctx context.Context, c *call[acquired]) (acquired, error) {
		var r acquired
		g, err := s.acquireShared(ctx, c, key, token, limit, micros(ttl), &r.a)
		r.g, r.limit = g, ctx.Err() != nil
		return r, markUnreachable(err)
	}
	r, err := detached(s, ctx, op, func(r acquired, err error) {
		if r.g.OK || r.a.unknown || r.a.maybe {
			s.owe(keys, token, ttl, r.a, true)
		}
	})
	return s.acquiredOutcome(ctx, r, err, keys, token, ttl, true)
}

// acquireShared is AcquireShared's operation.
func (s *Store) acquireShared(ctx context.Context, c *call[acquired], key, token string, limit int, ttl int64, a *attempt) (stores.Grant, error) {
	if err := s.setup(ctx); err != nil {
		return stores.Grant{}, err
	}
	var g stores.Grant
	err := s.retry(ctx, c.left, func() error {
		var err error
		g, err = s.acquireSharedTx(ctx, c, key, token, limit, ttl, a)
		return err
	})
	if errors.Is(err, ErrContention) {
		return stores.Grant{Held: 0, Wait: contentionWait}, nil
	}
	return g, err
}

// sharedStmts are the statements of AcquireShared, prepared (see prepare)
// before its transaction takes its connection.
type sharedStmts struct {
	lockKey, selectKey, sweepHolders stmt
	grantKey, upsertHolder           stmt
}

// prepareShared prepares the statements of AcquireShared.
func (s *Store) prepareShared(ctx context.Context) (sharedStmts, error) {
	var (
		st  sharedStmts
		err error
	)
	for _, p := range []struct {
		st    *stmt
		query string
	}{
		{&st.lockKey, s.q.lockKey}, {&st.selectKey, s.q.selectKey},
		{&st.sweepHolders, s.q.sweepHolders}, {&st.grantKey, s.q.grantKey}, {&st.upsertHolder, s.q.upsertHolder},
	} {
		if *p.st, err = s.prepare(ctx, p.query); err != nil {
			return sharedStmts{}, err
		}
	}
	return st, nil
}

// holdersIsolation returns the options of the transactions on a key's
// holders: READ COMMITTED, unless the server logs statements to its binary
// log (log_bin on, binlog_format STATEMENT), which refuses writes to InnoDB
// under it, and then the session's own (usually REPEATABLE READ). Under
// REPEATABLE READ the FOR UPDATE read of a key's places locks the gap
// before the next key's places too, and two keys' grants, each inserting a
// place into that gap, deadlock, again and again under load (each is tried
// again, up to contentionAttempts, then refused); READ COMMITTED locks the
// rows read alone. Both count the places alike: the lease row's lock, which
// every change of a key's places takes first, serializes them, and a
// locking read reads the latest committed rows.
func (s *Store) holdersIsolation(ctx context.Context) (*sql.TxOptions, error) {
	var (
		logBin int
		format string
	)
	if err := s.db.QueryRowContext(ctx, "SELECT @@GLOBAL.log_bin, @@SESSION.binlog_format").Scan(&logBin, &format); err != nil {
		return nil, fmt.Errorf("mysqlstore: reading log_bin and binlog_format: %w", markUnreachable(err))
	}
	if logBin == 1 && strings.EqualFold(format, "STATEMENT") {
		return nil, nil
	}
	return &sql.TxOptions{Isolation: sql.LevelReadCommitted}, nil
}

// keyHolders is what an acquire read of a key's holders.
type keyHolders struct {
	n       int   // holders
	mine    bool  // the caller's token is one
	others  int64 // the longest remaining µs of the others
	soonest int64 // the shortest remaining µs among all
	writer  int64 // the longest remaining µs of the waiting writers, or 0
	expired bool  // an expired holder or record was read
}

// acquireSharedTx is one attempt of acquireShared.
func (s *Store) acquireSharedTx(ctx context.Context, c *call[acquired], key, token string, limit int, ttl int64, a *attempt) (stores.Grant, error) {
	// A look without locking first: under contention most attempts are
	// refused, and those then hold no row lock and hold up no one.
	peekKey, err := s.prepare(ctx, s.q.peekKey)
	if err != nil {
		return stores.Grant{}, err
	}
	st, err := s.prepareShared(ctx)
	if err != nil {
		return stores.Grant{}, err
	}
	peek, err := readKey(ctx, s.dbx, peekKey, key, token)
	switch {
	case err != nil:
		return stores.Grant{}, err
	case peek.refusal != nil:
		return *peek.refusal, nil
	}
	if g, refused := decide(peek, limit); refused {
		return g, nil
	}
	p, tx, done, err := s.beginPinned(ctx, s.holdersTx)
	if err != nil {
		return stores.Grant{}, err
	}
	defer done()
	if !peek.found {
		if _, err := st.lockKey.exec(ctx, tx, key); err != nil {
			return stores.Grant{}, err
		}
	}
	k, err := readKey(ctx, tx, st.selectKey, key, token)
	if err == nil && !k.found { // purged since the look: create it
		if _, err := st.lockKey.exec(ctx, tx, key); err != nil {
			return stores.Grant{}, err
		}
		k, err = readKey(ctx, tx, st.selectKey, key, token)
	}
	switch {
	case err != nil:
		return stores.Grant{}, err
	case k.refusal != nil:
		return *k.refusal, nil
	case !k.found:
		return stores.Grant{}, fmt.Errorf("%w: no lease row for %s after inserting it", ErrUnexpectedReply, stores.KeyForMessage(key))
	}
	ksum, tsum, fence, h := k.ksum, k.tsum, k.fence, k.h
	if g, refused := decide(k, limit); refused {
		return g, nil
	}
	// The place first, then the lease row: each statement reads the clock
	// anew, so that the lease row, set from a later reading, ends no
	// sooner than the place (and the others, whose remaining TTL was read
	// earlier still).
	if _, err := st.upsertHolder.exec(ctx, tx, ksum, tsum, ttl, ttl); err != nil {
		return stores.Grant{}, err
	}
	res, err := st.grantKey.exec(ctx, tx, max(ttl, h.others), key)
	if err != nil {
		return stores.Grant{}, err
	}
	next, err := res.LastInsertId()
	if err != nil || next <= fence {
		return stores.Grant{}, fmt.Errorf("%w: shared acquire of %s answered fence %d after %d: %v", ErrUnexpectedReply, stores.KeyForMessage(key), next, fence, err)
	}
	if c.left() {
		return stores.Grant{}, errLeft // rolled back: nothing to undo
	}
	if err := tx.Commit(); err != nil {
		a.sess, a.unknown = p.session, true
		return stores.Grant{}, fmt.Errorf("mysqlstore: commit of the shared grant of %s (outcome unknown): %w", stores.KeyForMessage(key), err)
	}
	if h.expired {
		// Expired places count for nothing: they are deleted after the
		// commit, so that the lease row's lock is not held for it. A
		// failure leaves them to the next grant.
		_, _ = st.sweepHolders.exec(ctx, s.dbx, ksum)
	}
	return stores.Grant{OK: true, Fences: []int64{next}}, nil
}

// keyState is what an acquire read of a key: its lease row and holders.
type keyState struct {
	found      bool          // the lease row exists
	refusal    *stores.Grant // held exclusively: the refusal, and nothing else read
	fence      int64         // the lease row's
	ksum, tsum []byte        // the digests of the key and of the caller's token
	h          keyHolders
}

// readKey reads key's lease row and its holders and writer records on e
// with st (peekKeySQL, or selectKeySQL in a transaction, which locks them),
// for the caller with token. A missing row reads as free.
func readKey(ctx context.Context, e execer, st stmt, key, token string) (keyState, error) {
	k := keyState{ksum: holders.Digest(key), tsum: holders.Digest(token)}
	rows, err := st.rows(ctx, e, k.ksum, key)
	if err != nil {
		return k, err
	}
	defer rows.Close()
	k.h.soonest = -1
	for rows.Next() {
		var (
			live, marked bool
			left         int64
			writer       sql.NullBool
			sum          []byte
			hleft        sql.NullInt64
		)
		if err := rows.Scan(&live, &marked, &left, &k.fence, &writer, &sum, &hleft); err != nil {
			return k, fmt.Errorf("%w: the holders of %s: %w", ErrUnexpectedReply, stores.KeyForMessage(key), err)
		}
		k.found = true
		if live && !marked {
			k.refusal = &stores.Grant{Wait: remaining(left)}
			return k, rows.Close()
		}
		if writer.Valid {
			k.h.add(writer.Bool, sum, hleft.Int64, k.tsum)
		}
	}
	return k, rows.Err()
}

// scanOne runs st with args on e and scans its first row into dest; it
// returns sql.ErrNoRows when there is none.
func scanOne(ctx context.Context, e execer, st stmt, args []any, dest ...any) error {
	rows, err := st.rows(ctx, e, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return fmt.Errorf("%w: %w", ErrUnexpectedReply, err)
	}
	return rows.Close()
}

// decide returns the refusal of an acquire under limit of a key read as k,
// not held exclusively, and true; or false when it may be granted.
func decide(k keyState, limit int) (stores.Grant, bool) {
	h := k.h
	switch {
	case h.mine: // a retry: granted again
	case h.writer > 0:
		return stores.Grant{Wait: remaining(h.writer)}, true
	case limit > 0 && h.n >= limit:
		return stores.Grant{Wait: remaining(h.soonest)}, true
	}
	return stores.Grant{}, false
}

// add counts a row of the key's holders table: a holder's or a writer's
// (writer), whose token's digest is sum, with left µs remaining (zero or
// less once expired), for the caller whose token's digest is tsum.
func (h *keyHolders) add(writer bool, sum []byte, left int64, tsum []byte) {
	switch {
	case left <= 0:
		h.expired = true
	case writer:
		h.writer = max(h.writer, left)
	default:
		h.n++
		if bytes.Equal(sum, tsum) {
			h.mine = true
		} else {
			h.others = max(h.others, left)
		}
		if h.soonest < 0 || left < h.soonest {
			h.soonest = left
		}
	}
}

// ReleaseShared ends token's place among key's holders, as
// stores.SharedStore describes, in one transaction: it locks the key's
// lease row, deletes the place (or, with keep positive, sets it to end keep
// from now), and sets the lease row to the longest place left, or frees
// it. It returns an error wrapping stores.ErrNotHeld when token holds no
// place, and Release's errors otherwise.
func (s *Store) ReleaseShared(ctx context.Context, key, token string, keep time.Duration) error {
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	var durations []time.Duration
	if keep > 0 {
		durations = append(durations, keep)
	}
	if err := s.checkArgs([]string{key}, token, durations...); err != nil {
		return err
	}
	_, err := detached(s, ctx, func(ctx context.Context, _ *call[struct{}]) (struct{}, error) {
		return struct{}{}, markUnreachable(s.releaseShared(ctx, nil, key, token, keep))
	}, nil)
	return err
}

// releaseShared is ReleaseShared's operation, and the undo of an
// AcquireShared.
func (s *Store) releaseShared(ctx context.Context, left func() bool, key, token string, keep time.Duration) error {
	if keep > 0 {
		return s.onHolder(ctx, left, "release", key, s.q.expireHolder, micros(keep), micros(keep), holders.Digest(key), holders.Digest(token))
	}
	return s.onHolder(ctx, left, "release", key, s.q.dropHolder, holders.Digest(key), holders.Digest(token))
}

// RefreshShared resets the TTL of token's place among key's holders to ttl,
// and the lease row's expiry to the longest place's, in one transaction
// that locks the lease row first. It returns an error wrapping
// stores.ErrNotHeld, changing nothing, when token holds no place, and
// Refresh's errors otherwise.
func (s *Store) RefreshShared(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	if err := args.CheckTTL(ttl); err != nil {
		return err
	}
	if err := s.checkArgs([]string{key}, token, ttl); err != nil {
		return err
	}
	_, err := detached(s, ctx, func(ctx context.Context, c *call[struct{}]) (struct{}, error) {
		return struct{}{}, markUnreachable(s.onHolder(ctx, c.left, "refresh", key, s.q.expireHolder,
			micros(ttl), micros(ttl), holders.Digest(key), holders.Digest(token)))
	}, nil)
	return err
}

// onHolder runs query, which changes one place of key, in a transaction
// that locks the key's lease row first and then settles its expiry
// (settleKeySQL); it rolls back and returns an error wrapping
// stores.ErrNotHeld when query changed no place.
func (s *Store) onHolder(ctx context.Context, left func() bool, what, key, query string, vals ...any) error {
	if err := s.setup(ctx); err != nil {
		return err
	}
	var sts [3]stmt
	for i, q := range []string{s.q.lockRow, query, s.q.settleKey} {
		var err error
		if sts[i], err = s.prepare(ctx, q); err != nil {
			return err
		}
	}
	lockRow, change, settleKey := sts[0], sts[1], sts[2]
	return s.retry(ctx, left, func() error {
		tx, err := s.db.BeginTx(ctx, s.holdersTx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }() // sql.ErrTxDone after a commit
		var one int
		switch err := scanOne(ctx, tx, lockRow, []any{key}, &one); {
		case errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("%w: mysqlstore: %s of %s: the token holds no place", stores.ErrNotHeld, what, stores.KeyForMessage(key))
		case err != nil:
			return err
		}
		res, err := change.exec(ctx, tx, vals...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			if err != nil {
				return err
			}
			return fmt.Errorf("%w: mysqlstore: %s of %s: the token holds no place", stores.ErrNotHeld, what, stores.KeyForMessage(key))
		}
		if _, err := settleKey.exec(ctx, tx, holders.Digest(key), key); err != nil {
			return err
		}
		return tx.Commit()
	})
}

// writerRefused records token as a waiting writer on key, which holders
// refused it, and notes the record (see holders.Writers). The record
// serves fairness alone: a failure to make it is not the call's.
func (s *Store) writerRefused(ctx context.Context, key, token string) {
	if _, err := s.execDB(ctx, s.q.writerWaits, holders.Digest(key), holders.Digest(token), key); err == nil {
		s.writers.Add(key, token)
	}
}

// withdraw ends token's waiting-writer records on those of keys it noted:
// a Release by token, or a grant to it, ends its wait (see
// stores.SharedStore). A failure leaves the records to their expiry.
func (s *Store) withdraw(ctx context.Context, keys []string, token string) {
	for _, k := range s.writers.Take(keys, token) {
		if _, err := s.execDB(ctx, s.q.withdraw, holders.Digest(k), holders.Digest(token)); err != nil {
			return
		}
	}
}
