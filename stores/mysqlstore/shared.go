package mysqlstore

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
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
	if table == "" {
		table = DefaultTable
	}
	if err := checkTable(table); err != nil {
		return "", fmt.Errorf("%w: mysqlstore: %w", stores.ErrInvalid, err)
	}
	return newQueries(quoteTable(table), quoteTable(holdersTable(table))).createHolders, nil
}

// holdersTable names the holders table of table (see holders.Table).
func holdersTable(table string) string { return holders.Table(table, 64) }

// AcquireShared makes token a holder of key for ttl, as stores.SharedStore
// describes, in one transaction on a pinned connection: it creates and
// locks the key's lease row, reads it and the key's unexpired holders, and,
// on a grant, deletes the expired ones, sets the lease row to
// holders.Marker(limit), the longest holder's expiry and the next fence of
// the key's one sequence, upserts the holder, and commits (six round trips
// and the begin); a refusal rolls back. A refusal's Wait is the exclusive
// holder's remaining TTL, the waiting writer's remaining window, the
// soonest expiry among the holders of a full key, or the longest among
// holders of another limit.
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

// keyHolders is what a transaction read of a key's unexpired holders.
type keyHolders struct {
	n                         int   // holders
	mine                      bool  // the caller's token is one
	others                    int64 // the longest remaining µs of the others
	soonest, longest          int64 // remaining µs among all
	writer                    int64 // the waiting writer's remaining µs, or 0
	writerWanted              int64 // 1 when a valid writer's record was read
	expired                   bool  // an expired holder or record was read
}

// acquireSharedTx is one attempt of acquireShared.
func (s *Store) acquireSharedTx(ctx context.Context, c *call[acquired], key, token string, limit int, ttl int64, a *attempt) (stores.Grant, error) {
	// A look without locking first: under contention most attempts are
	// refused, and those then hold no row lock and hold up no one.
	peek, err := s.readKey(ctx, s.db, key, token)
	switch {
	case err != nil:
		return stores.Grant{}, err
	case peek.refusal != nil:
		return *peek.refusal, nil
	}
	if g, refused := decide(peek, limit); refused {
		return g, nil
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
	if !peek.found {
		if _, err := tx.ExecContext(ctx, s.q.lockKey, key); err != nil {
			return stores.Grant{}, err
		}
	}
	k, err := s.readKey(ctx, tx, key, token)
	if err == nil && !k.found { // purged since the look: create it
		if _, err := tx.ExecContext(ctx, s.q.lockKey, key); err != nil {
			return stores.Grant{}, err
		}
		k, err = s.readKey(ctx, tx, key, token)
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
	marker := holders.Marker(limit)
	if g, refused := decide(k, limit); refused {
		return g, nil
	}
	if h.expired {
		if _, err := tx.ExecContext(ctx, s.q.sweepHolders, ksum); err != nil {
			return stores.Grant{}, err
		}
	}
	res, err := tx.ExecContext(ctx, s.q.grantKey, marker, max(ttl, h.others), key)
	if err != nil {
		return stores.Grant{}, err
	}
	next, err := res.LastInsertId()
	if err != nil || next <= fence {
		return stores.Grant{}, fmt.Errorf("%w: shared acquire of %s answered fence %d after %d: %v", ErrUnexpectedReply, stores.KeyForMessage(key), next, fence, err)
	}
	if _, err := tx.ExecContext(ctx, s.q.upsertHolder, ksum, tsum, ttl, next, ttl, next); err != nil {
		return stores.Grant{}, err
	}
	if h.writerWanted != 0 {
		if _, err := tx.ExecContext(ctx, s.q.keepWriter, next, ksum, fence); err != nil {
			return stores.Grant{}, err
		}
	}
	if c.left() {
		return stores.Grant{}, errLeft // rolled back: nothing to undo
	}
	if err := tx.Commit(); err != nil {
		a.sess, a.unknown = p.session, true
		return stores.Grant{}, fmt.Errorf("mysqlstore: commit of the shared grant of %s (outcome unknown): %w", stores.KeyForMessage(key), err)
	}
	committed = true
	return stores.Grant{OK: true, Fences: []int64{next}}, nil
}

// querier runs a query: a *sql.DB or a *sql.Tx.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// keyState is what an acquire read of a key: its lease row and holders.
type keyState struct {
	found      bool          // the lease row exists
	refusal    *stores.Grant // held exclusively: the refusal, and nothing else read
	holder     []byte        // the lease row's token
	fence      int64         // the lease row's
	ksum, tsum []byte        // the digests of the key and of the caller's token
	h          keyHolders
}

// readKey reads key's lease row (locking it, in a transaction that locked
// it already; selectKeySQL's FOR UPDATE) and its unexpired holders, for the
// caller with token. A missing row reads as free.
func (s *Store) readKey(ctx context.Context, q querier, key, token string) (keyState, error) {
	k := keyState{ksum: holders.Digest(key), tsum: holders.Digest(token)}
	var (
		live, marked bool
		left         int64
	)
	query := s.q.selectKey
	if _, ok := q.(*sql.DB); ok {
		query = s.q.peekKey
	}
	switch err := q.QueryRowContext(ctx, query, key).Scan(&live, &marked, &k.holder, &left, &k.fence); {
	case errors.Is(err, sql.ErrNoRows):
		return k, nil
	case err != nil:
		return k, err
	}
	k.found = true
	if live && !marked {
		k.refusal = &stores.Grant{Wait: remaining(left)}
		return k, nil
	}
	var err error
	k.h, err = readHolders(ctx, q, s.q.selectHolders, k.ksum, k.tsum, k.fence)
	return k, err
}

// decide returns the refusal of an acquire under limit of a key read as k,
// not held exclusively, and true; or false when it may be granted.
func decide(k keyState, limit int) (stores.Grant, bool) {
	h := k.h
	switch {
	case h.n > 0 && !bytes.Equal(k.holder, holders.Marker(limit)):
		return stores.Grant{Wait: remaining(h.longest)}, true // another limit
	case h.mine: // a retry: granted again
	case h.writer > 0:
		return stores.Grant{Wait: remaining(h.writer)}, true
	case limit > 0 && h.n >= limit:
		return stores.Grant{Wait: remaining(h.soonest)}, true
	}
	return stores.Grant{}, false
}

// readHolders reads the unexpired holders of the key whose digest is ksum,
// for the caller whose token's digest is tsum, in tx; fence is the lease
// row's, which a waiting writer's record must bear to count.
func readHolders(ctx context.Context, tx querier, query string, ksum, tsum []byte, fence int64) (keyHolders, error) {
	rows, err := tx.QueryContext(ctx, query, ksum)
	if err != nil {
		return keyHolders{}, err
	}
	defer rows.Close()
	h := keyHolders{soonest: -1}
	for rows.Next() {
		var (
			sum        []byte
			left, fnce int64
		)
		if err := rows.Scan(&sum, &left, &fnce); err != nil {
			return keyHolders{}, fmt.Errorf("%w: the holders of a key: %w", ErrUnexpectedReply, err)
		}
		switch {
		case left <= 0:
			h.expired = true
		case string(sum) == holders.WriterDigest:
			if fnce == fence {
				h.writer, h.writerWanted = max(left, 1), 1
			}
		default:
			h.n++
			if bytes.Equal(sum, tsum) {
				h.mine = true
			} else {
				h.others = max(h.others, left)
			}
			h.longest = max(h.longest, left)
			if h.soonest < 0 || left < h.soonest {
				h.soonest = left
			}
		}
	}
	return h, rows.Err()
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
	return s.retry(ctx, left, func() error {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		committed := false
		defer func() {
			if !committed {
				_ = tx.Rollback()
			}
		}()
		var one int
		switch err := tx.QueryRowContext(ctx, s.q.lockRow, key).Scan(&one); {
		case errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("%w: mysqlstore: %s of %s: the token holds no place", stores.ErrNotHeld, what, stores.KeyForMessage(key))
		case err != nil:
			return err
		}
		res, err := tx.ExecContext(ctx, query, vals...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			if err != nil {
				return err
			}
			return fmt.Errorf("%w: mysqlstore: %s of %s: the token holds no place", stores.ErrNotHeld, what, stores.KeyForMessage(key))
		}
		if _, err := tx.ExecContext(ctx, s.q.settleKey, holders.Digest(key), key); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		committed = true
		return nil
	})
}

// writerWaits records a writer refused key by its holders (see
// stores.WriterWindow). The record serves fairness alone: its failure is
// not the refused call's.
func (s *Store) writerWaits(ctx context.Context, key string) {
	_, _ = s.execDB(ctx, s.q.writerWaits, holders.Digest(key), key)
}
