package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reqlock/reqlock/internal/holders"
	"github.com/reqlock/reqlock/stores"
)

// AcquireShared makes token a holder of key for ttl, as stores.SharedStore
// describes, in one round trip: one implicit transaction that creates and
// locks the key's lease row, deletes the key's expired holders (notifying
// their release when the key is watched), then grants or refuses in one
// statement at one reading of the server's clock. A grant upserts the
// holder's row in the holders table and sets the lease row to
// holders.Marker, the longest holder's expiry and the next fence of the
// key's one sequence; a refusal's Wait is the exclusive holder's remaining
// lease, the longest remaining window among the waiting writers, or the
// soonest expiry among the holders of a key that has limit holders or
// more.
//
// Its errors are Acquire's: ErrInvalid for an empty or too long key, a
// negative limit or a non-positive ttl, before any statement; ErrAbandoned
// when ctx ended in flight or the outcome is unknown, and the Store then
// undoes the grant with ReleaseShared, owner-checked.
func (s *Store) AcquireShared(ctx context.Context, key, token string, limit int, ttl time.Duration) (stores.Grant, error) {
	if err := args.CheckShared(ctx, key, limit); err != nil {
		return stores.Grant{}, err
	}
	if err := args.CheckTTL(ttl); err != nil {
		return stores.Grant{}, err
	}
	if err := args.CheckBounds(s.Bounds(), []string{key}, ttl); err != nil {
		return stores.Grant{}, err
	}
	if s.isClosed() {
		return stores.Grant{}, ErrClosed
	}
	if err := s.setup(ctx); err != nil {
		return stores.Grant{}, err
	}
	keys := []string{key}
	return s.detached(ctx, keys, token, ttl, func(ctx context.Context, a *attempt) (stores.Grant, error) {
		conn, err := s.acquireConn(ctx, a)
		if err != nil {
			return stores.Grant{}, err // nothing sent
		}
		defer conn.Release()
		g, err := retrying(ctx, func(ctx context.Context) (stores.Grant, error) {
			batch := &pgx.Batch{}
			batch.Queue(s.q.lockKey, []byte(key))
			batch.Queue(s.q.sweepHolders, []byte(key), holders.Digest(key), s.channel)
			batch.Queue(s.q.acquireShared, []byte(key), holders.Digest(key), holders.Digest(token),
				micros(ttl), int64(stores.FenceStride), limit)
			res := conn.SendBatch(ctx, batch)
			defer res.Close()
			if _, err := res.Exec(); err != nil {
				return stores.Grant{}, err
			}
			if _, err := res.Exec(); err != nil {
				return stores.Grant{}, err
			}
			var (
				granted   bool
				fence     *int64
				remaining int64
			)
			if err := res.QueryRow().Scan(&granted, &fence, &remaining); err != nil {
				return stores.Grant{}, err
			}
			if err := res.Close(); err != nil {
				return stores.Grant{}, err
			}
			switch {
			case !granted:
				return stores.Grant{Wait: waitOf(remaining)}, nil
			case fence == nil:
				return stores.Grant{}, fmt.Errorf("%w: no fence for %s", ErrUnexpectedReply, stores.KeyForMessage(key))
			}
			return stores.Grant{OK: true, Fences: []int64{*fence}}, nil
		})
		settled(a, err, conn.Conn().IsClosed())
		return g, err
	}, true)
}

// ReleaseShared ends token's place among key's holders, as
// stores.SharedStore describes, in one round trip: it locks the key's lease
// row, then, in one statement, deletes the place (or, with keep positive,
// sets it to end keep from now) and sets the lease row to the longest
// place left, or frees it. A freed place notifies the key's waiters when
// the key is watched (see Release notification in the package
// documentation). It returns an error wrapping stores.ErrNotHeld when token
// holds no place, and Release's errors otherwise.
func (s *Store) ReleaseShared(ctx context.Context, key, token string, keep time.Duration) error {
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	var durations []time.Duration
	if keep > 0 {
		durations = append(durations, keep)
	}
	if err := args.CheckBounds(s.Bounds(), []string{key}, durations...); err != nil {
		return err
	}
	if s.isClosed() {
		return ErrClosed
	}
	if err := s.setup(ctx); err != nil {
		return err
	}
	return s.releaseShared(ctx, key, token, keep)
}

// releaseShared is ReleaseShared without the checks, for the undo of an
// AcquireShared.
func (s *Store) releaseShared(ctx context.Context, key, token string, keep time.Duration) error {
	var us int64
	if keep > 0 {
		us = micros(keep)
	}
	return s.onHolder(ctx, "release", key, s.q.releaseShared,
		[]byte(key), holders.Digest(key), holders.Digest(token), us, s.channel)
}

// RefreshShared resets the TTL of token's place among key's holders to ttl,
// and the lease row's expiry to the longest place's, in one round trip that
// locks the lease row first. It returns an error wrapping stores.ErrNotHeld,
// changing nothing, when token holds no place, and Refresh's errors
// otherwise.
func (s *Store) RefreshShared(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	if err := args.CheckTTL(ttl); err != nil {
		return err
	}
	if err := args.CheckBounds(s.Bounds(), []string{key}, ttl); err != nil {
		return err
	}
	if s.isClosed() {
		return ErrClosed
	}
	if err := s.setup(ctx); err != nil {
		return err
	}
	return s.onHolder(ctx, "refresh", key, s.q.refreshShared,
		[]byte(key), holders.Digest(key), holders.Digest(token), micros(ttl))
}

// onHolder runs query, releaseShared or refreshShared, after lockHeld in
// one implicit transaction, and returns an error wrapping stores.ErrNotHeld
// when it found no place of the token.
func (s *Store) onHolder(ctx context.Context, what, key, query string, vals ...any) error {
	n, err := retrying(ctx, func(ctx context.Context) (int64, error) {
		return s.lockedExec(ctx, [][]byte{[]byte(key)}, query, vals...)
	})
	if err != nil {
		return endedErr(ctx, err)
	}
	if n == 0 {
		return fmt.Errorf("%w: pgstore: %s of %s: the token holds no place", stores.ErrNotHeld, what, stores.KeyForMessage(key))
	}
	return nil
}

// writerRefused records token as a waiting writer on keys, which holders
// refused it, and notes the records (see holders.Writers). The records
// serve fairness alone: a failure to make them is not the call's.
func (s *Store) writerRefused(ctx context.Context, conn *pgxpool.Conn, keys [][]byte, token string) {
	if _, err := conn.Exec(ctx, s.q.writerWaits, keys, holders.Digest(token)); err != nil {
		return
	}
	for _, k := range keys {
		s.writers.Add(string(k), token)
	}
}

// withdraw ends token's waiting-writer records on those of keys it noted:
// a Release by token, or a grant to it, ends its wait (see
// stores.SharedStore). A failure leaves the records to their expiry.
func (s *Store) withdraw(ctx context.Context, keys []string, token string) {
	taken := s.writers.Take(keys, token)
	if len(taken) == 0 {
		return
	}
	_, _ = s.pool.Exec(ctx, s.q.withdraw, byteKeys(taken), holders.Digest(token), s.channel)
}
