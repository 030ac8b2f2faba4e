package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// The purge's defaults and limits (see Purge and WithPurge).
const (
	// DefaultPurgeInterval is how often a Store purges rows unless
	// WithPurge says otherwise.
	DefaultPurgeInterval = time.Hour

	// DefaultRetention is how long a purged row must have been free, and
	// its fence behind the server clock, unless WithPurge says otherwise.
	DefaultRetention = 24 * time.Hour

	// MinRetention is the shortest retention WithPurge and Purge accept:
	// the server clock may step back by up to the retention without a
	// purge letting a fence repeat.
	MinRetention = time.Minute

	// purgeBatch is how many keys, or records, a purge statement takes at
	// most: it never holds more row locks at once (and the holder rows of
	// those keys).
	purgeBatch = 500

	// purgeStatementLimit bounds each statement of a purge run by the
	// purge goroutine: a run over a large table takes as long as it needs,
	// a statement that gets no answer does not stall the goroutine.
	purgeStatementLimit = time.Minute
)

// WithPurge sets how often the Store purges (see Purge), in a goroutine
// that New and Open start and Close stops, and the retention it purges
// with. An interval of zero turns the goroutine off (Purge can still be
// called), whatever the retention. Default DefaultPurgeInterval and
// DefaultRetention; New refuses a negative interval, and a retention below
// MinRetention with a positive interval.
func WithPurge(interval, retention time.Duration) Option {
	return func(s *Store) { s.purgeEvery, s.retention = interval, retention }
}

// Purge deletes, in batches of up to 500 keys or records per statement,
// and returns how many rows it deleted:
//   - expired idempotency records (see Idempotency records in the package
//     documentation);
//   - the expired holders and waiting-writer records of keys held shared
//     (see Shared and limited grants), whether or not the key is used
//     again;
//   - lease rows that are released, or expired for retention, whose fence
//     the server clock has passed by retention (the key was last granted
//     more than retention ago), that are not watched by a waiter and have
//     no holders left.
//
// A row that is held (a lock, a shared grant, a claim or a live record),
// watched, granted less than retention ago, or expired less than retention
// ago stays. The next
// grant of a purged key draws its fence from the server clock in
// microseconds, which is then above every fence the row held, unless the
// clock has stepped back by more than retention since (see Fencing in the
// package documentation); so retention must be at least MinRetention.
// Purge locks rows in key order and waits for no lock: a row another call
// has locked is left for the next purge.
//
// The Store's purge goroutine calls it (see WithPurge); call it yourself
// with the goroutine turned off. It returns an error wrapping
// stores.ErrInvalid for a retention below MinRetention, ErrClosed after
// Close, and the server's error, or ctx's, otherwise, with the rows
// deleted so far.
func (s *Store) Purge(ctx context.Context, retention time.Duration) (int64, error) {
	if retention < MinRetention {
		return 0, fmt.Errorf("%w: pgstore: purge retention %v is below %v", stores.ErrInvalid, retention, MinRetention)
	}
	if s.isClosed() {
		return 0, ErrClosed
	}
	return s.purge(ctx, retention, 0)
}

// purge is Purge without the checks, so that tests can purge with a short
// retention. Each statement runs within limit when it is positive.
func (s *Store) purge(ctx context.Context, retention time.Duration, limit time.Duration) (int64, error) {
	if err := s.setup(ctx); err != nil {
		return 0, err
	}
	deleted, err := s.purgeRecordsAll(ctx, limit)
	if err != nil {
		return deleted, err
	}
	ret := micros(retention)
	var after []byte // nil: from the first key
	for {
		keys, err := s.purgeCandidates(ctx, limit, after, ret)
		if err != nil {
			return deleted, endedErr(ctx, err)
		}
		if len(keys) == 0 {
			return deleted, nil
		}
		n, err := retrying(ctx, func(ctx context.Context) (int64, error) {
			ctx, cancel := bounded(ctx, limit)
			defer cancel()
			var holders, rows int64
			err := s.pool.QueryRow(ctx, s.q.purge, keys, ret).Scan(&holders, &rows)
			return holders + rows, err
		})
		if err != nil {
			return deleted, endedErr(ctx, err)
		}
		deleted += n
		if len(keys) < purgeBatch {
			return deleted, nil
		}
		after = keys[len(keys)-1]
	}
}

// purgeRecordsAll deletes expired records, purgeBatch at a time, until a
// statement deletes fewer.
func (s *Store) purgeRecordsAll(ctx context.Context, limit time.Duration) (int64, error) {
	var deleted int64
	for {
		n, err := retrying(ctx, func(ctx context.Context) (int64, error) {
			ctx, cancel := bounded(ctx, limit)
			defer cancel()
			tag, err := s.pool.Exec(ctx, s.q.purgeRecords, purgeBatch)
			return tag.RowsAffected(), err
		})
		if err != nil {
			return deleted, endedErr(ctx, err)
		}
		deleted += n
		if n < purgeBatch {
			return deleted, nil
		}
	}
}

// purgeCandidates returns the next keys, at most purgeBatch, in key order,
// that the purge statement may act on: after after, or from the first key
// when after is nil.
func (s *Store) purgeCandidates(ctx context.Context, limit time.Duration, after []byte, ret int64) ([][]byte, error) {
	return retrying(ctx, func(ctx context.Context) ([][]byte, error) {
		ctx, cancel := bounded(ctx, limit)
		defer cancel()
		query, vals := s.q.purgeFirst, []any{ret, purgeBatch}
		if after != nil {
			query, vals = s.q.purgeAfter, append(vals, after)
		}
		rows, err := s.pool.Query(ctx, query, vals...)
		if err != nil {
			return nil, err
		}
		var keys [][]byte
		for rows.Next() {
			var k []byte
			if err := rows.Scan(&k); err != nil {
				rows.Close()
				return nil, err
			}
			keys = append(keys, k)
		}
		rows.Close()
		return keys, rows.Err()
	})
}

// bounded is ctx bounded by limit when limit is positive.
func bounded(ctx context.Context, limit time.Duration) (context.Context, context.CancelFunc) {
	if limit <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, limit)
}

// purgeLoop purges every purgeEvery until Close cancels purgeCtx, which also
// ends a purge in flight.
func (s *Store) purgeLoop() {
	defer close(s.purgeDone)
	t := time.NewTicker(s.purgeEvery)
	defer t.Stop()
	for {
		select {
		case <-s.purgeCtx.Done():
			return
		case <-t.C:
		}
		// A failure is tried again at the next tick: the purge has no
		// caller to report it to, and the rows wait.
		_, _ = s.purge(s.purgeCtx, s.retention, purgeStatementLimit)
	}
}
