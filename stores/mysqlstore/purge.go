package mysqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/reqlock/reqlock/internal/holders"
	"github.com/reqlock/reqlock/stores"
)

// purgeTimeout bounds one purge run of the purge goroutine.
const purgeTimeout = time.Minute

// Purge deletes the expired idempotency records (see Idempotency records
// in the package documentation), and the rows that were released or have
// been expired for
// retention, and whose fence the server clock has passed by retention (the
// key was last granted more than retention ago), in batches of purgeBatch
// keys, with their expired holders and writer records (see Shared and
// limited grants); then the holders and writer records of any key expired
// for retention, those of keys whose lease rows are gone included. It
// returns how many rows it deleted, of all tables. A row that is held,
// expired less than retention ago or granted less than retention ago,
// stays, and so does a lease row with a holder or writer record left. The
// next grant of a purged key
// starts its fence from the server clock in microseconds, which is then
// above every fence the row held, unless the clock has stepped back by more
// than retention since; so retention must be at least MinRetention.
//
// The Store's purge goroutine calls it (see WithPurge); call it yourself
// with the goroutine turned off. It returns an error wrapping
// stores.ErrInvalid for a retention below MinRetention, ErrClosed after
// Close, and the driver's error otherwise, with the rows deleted so far.
func (s *Store) Purge(ctx context.Context, retention time.Duration) (int64, error) {
	if retention < MinRetention {
		return 0, fmt.Errorf("%w: mysqlstore: purge retention %v is below %v", stores.ErrInvalid, retention, MinRetention)
	}
	if !s.begin() {
		return 0, ErrClosed
	}
	defer s.calls.Done()
	return s.purge(ctx, retention)
}

// purge is Purge without the checks, so tests can purge with a short
// retention.
func (s *Store) purge(ctx context.Context, retention time.Duration) (int64, error) {
	if err := s.setup(ctx); err != nil {
		return 0, err
	}
	deleted, err := s.purgeRecords(ctx)
	if err != nil {
		return deleted, err
	}
	ret := micros(retention)
	var (
		after []any // none: from the first key
	)
	for {
		keys, err := s.purgeCandidates(ctx, after, ret)
		if err != nil || len(keys) == 0 {
			if err == nil {
				var n int64
				n, err = s.purgeStale(ctx, ret)
				deleted += n
			}
			return deleted, err
		}
		var n int64
		err = s.retry(ctx, nil, func() error {
			var err error
			n, err = s.purgeKeys(ctx, keys, ret)
			return err
		})
		if err != nil {
			return deleted, err
		}
		deleted += n
		if len(keys) < purgeBatch {
			n, err := s.purgeStale(ctx, ret)
			return deleted + n, err
		}
		after = []any{keys[len(keys)-1]}
	}
}

// purgeKeys deletes, in one transaction, the lease rows of keys that are
// still purgeable and their expired holders and writer records, and
// returns how many rows it deleted. It locks the lease rows first, in key
// order, then the holders, as AcquireShared, ReleaseShared and
// RefreshShared do, so that it never deletes a holder one of them counts
// (it counts under the lease row's lock), and keeps a lease row that still
// has holders or writer records (a lease row expires no sooner than its
// holders, but the purge does not rely on it).
func (s *Store) purgeKeys(ctx context.Context, keys []string, ret int64) (int64, error) {
	tx, err := s.db.BeginTx(ctx, s.holdersTx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }() // sql.ErrTxDone after a commit
	locked, err := queryKeys(ctx, tx, withKeys(s.q.purgeLock, len(keys)), append(anys(keys), ret, ret)...)
	if err != nil || len(locked) == 0 {
		return 0, err
	}
	sums := make([]any, len(locked))
	bySum := make(map[string]string, len(locked))
	for i, k := range locked {
		d := holders.Digest(k)
		sums[i], bySum[string(d)] = d, k
	}
	res, err := tx.ExecContext(ctx, withKeys(s.q.purgeHolders, len(sums)), sums...)
	if err != nil {
		return 0, err
	}
	deleted, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	live, err := queryKeys(ctx, tx, withKeys(s.q.purgeLive, len(sums)), sums...)
	if err != nil {
		return 0, err
	}
	for _, d := range live {
		delete(bySum, d)
	}
	if len(bySum) > 0 {
		free := make([]any, 0, len(bySum))
		for _, k := range bySum {
			free = append(free, k)
		}
		res, err := tx.ExecContext(ctx, withKeys(s.q.purge, len(free)), append(free, ret, ret)...)
		if err != nil {
			return 0, err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, err
		}
		deleted += n
	}
	return deleted, tx.Commit()
}

// purgeStale deletes the holders and writer records expired for the
// retention (ret µs) of any key (see purgeStaleSQL), in batches of
// purgeBatch keys, and returns how many it deleted. Each batch is a
// transaction of the holders' isolation that locks holder rows alone.
func (s *Store) purgeStale(ctx context.Context, ret int64) (int64, error) {
	var (
		deleted int64
		after   []any
	)
	for {
		query := s.q.staleFirst
		if len(after) > 0 {
			query = s.q.staleAfter
		}
		sums, err := queryKeys(ctx, s.db, query, append(after, ret, purgeBatch)...)
		if err != nil || len(sums) == 0 {
			return deleted, err
		}
		vals := make([]any, 0, len(sums)+1)
		for _, d := range sums {
			vals = append(vals, []byte(d)) // a digest is bytes, not a string of the connection's character set
		}
		vals = append(vals, ret)
		var n int64
		err = s.retry(ctx, nil, func() error {
			tx, err := s.db.BeginTx(ctx, s.holdersTx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			res, err := tx.ExecContext(ctx, withKeys(s.q.purgeStale, len(sums)), vals...)
			if err != nil {
				return err
			}
			if n, err = res.RowsAffected(); err != nil {
				return err
			}
			return tx.Commit()
		})
		if err != nil {
			return deleted, err
		}
		deleted += n
		if len(sums) < purgeBatch {
			return deleted, nil
		}
		after = []any{[]byte(sums[len(sums)-1])}
	}
}

// queryKeys runs query with args on q and returns its rows' one column.
func queryKeys(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, query string, args ...any) ([]string, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, rows.Err()
}

// purgeCandidates returns the next keys that purgeSQL may delete, in key
// order, at most purgeBatch: after after's one key, or from the first when
// after is empty.
func (s *Store) purgeCandidates(ctx context.Context, after []any, ret int64) ([]string, error) {
	query := s.q.purgeFirst
	if len(after) > 0 {
		query = s.q.purgeAfter
	}
	return queryKeys(ctx, s.db, query, append(after, ret, ret, purgeBatch)...)
}

// purgeLoop purges every purgeEvery until Close.
func (s *Store) purgeLoop() {
	defer close(s.purgeDone)
	t := time.NewTicker(s.purgeEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stopPurge:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), purgeTimeout)
		go func() {
			select {
			case <-s.stopPurge:
				cancel() // Close does not wait for a slow purge
			case <-ctx.Done():
			}
		}()
		_, _ = s.purge(ctx, s.retention)
		cancel()
	}
}
