package mysqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// purgeTimeout bounds one purge run of the purge goroutine.
const purgeTimeout = time.Minute

// Purge deletes the expired idempotency records (see Idempotency records
// in the package documentation), and the rows that were released or have
// been expired for
// retention, and whose fence the server clock has passed by retention (the
// key was last granted more than retention ago), in batches of purgeBatch
// keys, and returns how many it deleted. A row that is held, expired less
// than retention ago or granted less than retention ago, stays. The next grant of a purged key
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
			return deleted, err
		}
		vals := append(anys(keys), ret, ret)
		var n int64
		err = s.retry(ctx, nil, func() error {
			res, err := s.db.ExecContext(ctx, withKeys(s.q.purge, len(keys)), vals...)
			if err != nil {
				return err
			}
			n, err = res.RowsAffected()
			return err
		})
		if err != nil {
			return deleted, err
		}
		deleted += n
		if len(keys) < purgeBatch {
			return deleted, nil
		}
		after = []any{keys[len(keys)-1]}
	}
}

// purgeCandidates returns the next keys that purgeSQL may delete, in key
// order, at most purgeBatch: after after's one key, or from the first when
// after is empty.
func (s *Store) purgeCandidates(ctx context.Context, after []any, ret int64) ([]string, error) {
	query := s.q.purgeFirst
	if len(after) > 0 {
		query = s.q.purgeAfter
	}
	rows, err := s.db.QueryContext(ctx, query, append(after, ret, ret, purgeBatch)...)
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
