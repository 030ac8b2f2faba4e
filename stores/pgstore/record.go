package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reqlock/reqlock/internal/holders"
	"github.com/reqlock/reqlock/stores"
)

var _ stores.RecordStore = (*Store)(nil)

// MaxRecordBytes is the largest record (stores.Record.Size) a Store keeps,
// stated in its Bounds: half of PostgreSQL's 1 GB limit on a field and on a
// protocol message, which carries the record's two fields at once.
const MaxRecordBytes = 512 << 20

// purgePerFinish is how many expired records a FinishRecord deletes, at
// most, beside writing its own (see Idempotency records in the package
// documentation): more than one, so that expired records never pile up
// while records are written.
const purgePerFinish = 4

// ClaimRecord is Acquire of key for token, as stores.RecordStore describes,
// unless key holds a finished record: it then returns a copy of it with a
// Grant whose OK is false, and claims nothing. One round trip: Acquire's
// upsert, then a read of the record, in one implicit transaction, so that
// the read sees a record whose finish the upsert waited for.
//
// Its errors, and what it does when ctx ends while the statement is in
// flight, are Acquire's: a claim it made, or may yet make, is undone by the
// Store. It returns an error wrapping stores.ErrInvalid for an empty or too
// long key, a non-positive ttl or a token that starts with a NUL byte, as a
// record's owner does (such tokens are reserved: see Shared and limited
// grants in the package documentation).
func (s *Store) ClaimRecord(ctx context.Context, key, token string, ttl time.Duration) (stores.Grant, *stores.Record, error) {
	if err := s.checkRecordCall(ctx, key, token); err != nil {
		return stores.Grant{}, nil, err
	}
	if err := args.CheckBounds(s.Bounds(), []string{key}, ttl); err != nil {
		return stores.Grant{}, nil, err
	}
	if err := args.CheckTTL(ttl); err != nil {
		return stores.Grant{}, nil, err
	}
	if err := s.setup(ctx); err != nil {
		return stores.Grant{}, nil, err
	}
	keys := []string{key}
	var rec *stores.Record // set by the call before detached returns it, read only on success
	g, err := s.detached(ctx, keys, token, ttl, func(ctx context.Context, a *attempt) (stores.Grant, error) {
		conn, err := s.acquireConn(ctx, a)
		if err != nil {
			return stores.Grant{}, err // the claim not sent
		}
		defer conn.Release()
		g, found, shared, err := s.claimOne(ctx, conn, []byte(key), token, ttl)
		settled(a, err, conn.Conn().IsClosed())
		switch {
		case err != nil:
		case g.OK:
			s.withdraw(ctx, keys, token)
		case found != nil:
			rec = found
		case shared:
			g.SharedHeld = true
			s.writerRefused(ctx, conn, [][]byte{[]byte(key)}, token)
		}
		return g, err
	}, false)
	if err != nil {
		return stores.Grant{}, nil, err
	}
	if rec != nil {
		return stores.Grant{}, rec, nil
	}
	return g, nil, nil
}

// claimOne is ClaimRecord's batch on conn: acquireOne's upsert, then the
// read of the key's record, which finds one only when the row holds a
// record's owner, unexpired.
func (s *Store) claimOne(ctx context.Context, conn *pgxpool.Conn, key []byte, token string, ttl time.Duration) (stores.Grant, *stores.Record, bool, error) {
	var (
		rec    *stores.Record
		shared bool
	)
	g, err := retrying(ctx, func(ctx context.Context) (stores.Grant, error) {
		rec, shared = nil, false
		batch := &pgx.Batch{}
		batch.Queue(s.q.acquireOne, key, []byte(token), micros(ttl), int64(stores.FenceStride))
		batch.Queue(s.q.readRecord, key)
		res := conn.SendBatch(ctx, batch)
		defer res.Close()
		var (
			granted   bool
			fence     int64
			remaining int64
		)
		if err := res.QueryRow().Scan(&granted, &fence, &remaining, &shared); err != nil {
			return stores.Grant{}, err
		}
		var (
			r  stores.Record
			fp []byte
		)
		err := res.QueryRow().Scan(&fp, &r.Response, &r.Fence)
		r.Fingerprint = string(fp)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return stores.Grant{}, err
		case granted:
			return stores.Grant{}, fmt.Errorf("%w: claim of %s granted and read a record", ErrUnexpectedReply, stores.KeyForMessage(string(key)))
		default:
			if r.Response == nil {
				r.Response = []byte{}
			}
			rec = &r
		}
		if err := res.Close(); err != nil {
			return stores.Grant{}, err
		}
		if granted {
			return stores.Grant{OK: true, Fences: []int64{fence}}, nil
		}
		return stores.Grant{Wait: waitOf(remaining)}, nil
	})
	return g, rec, shared, err
}

// FinishRecord replaces token's claim on key by rec, kept for retention, as
// stores.RecordStore describes: in one statement, the key's row takes the
// record's owner (holders.RecordOwner of token) as its token and the end of
// the retention as its expiry, the record's fields go to the records table,
// and the key's waiters are notified when it is watched, as by a Release.
// The same round trip checks, for a call that changed nothing, whether the
// key holds the record token finished (a retry: nil), and deletes up to
// purgePerFinish expired records (see Idempotency records in the package
// documentation).
//
// It returns an error wrapping stores.ErrNotHeld, changing nothing, when
// key holds neither token's claim nor its record. A FinishRecord whose
// outcome is unknown is not undone: it replaced the claim, or will change
// nothing. It returns an error wrapping stores.ErrInvalid for an empty or
// too long key, a record or retention out of Bounds, or a token refused as
// in ClaimRecord, before any statement; ErrClosed after Close; one wrapping
// stores.ErrUnreachable when no connection could be made; and the server's
// error, or ctx's when it ended in flight, otherwise.
func (s *Store) FinishRecord(ctx context.Context, key, token string, rec stores.Record, retention time.Duration) error {
	if err := s.checkRecordCall(ctx, key, token); err != nil {
		return err
	}
	b := s.Bounds()
	if err := args.CheckBounds(b, []string{key}); err != nil {
		return err
	}
	if err := args.CheckRecord(b, rec, retention); err != nil {
		return err
	}
	if err := s.setup(ctx); err != nil {
		return err
	}
	bkey, owner := []byte(key), []byte(holders.RecordOwner(token))
	resp := rec.Response
	if resp == nil {
		resp = []byte{}
	}
	outcome, err := retrying(ctx, func(ctx context.Context) (int, error) {
		batch := &pgx.Batch{}
		batch.Queue(s.q.finishRecord, bkey, []byte(token), owner, micros(retention),
			[]byte(rec.Fingerprint), resp, rec.Fence, s.channel)
		batch.Queue(s.q.ownRecord, bkey, owner)
		batch.Queue(s.q.purgeRecords, purgePerFinish)
		res := s.pool.SendBatch(ctx, batch)
		defer res.Close()
		rows, err := res.Query()
		if err != nil {
			return 0, err
		}
		finished := 0
		for rows.Next() {
			finished++ // the other column is pg_notify's void
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, err
		}
		var own bool
		if err := res.QueryRow().Scan(&own); err != nil {
			return 0, err
		}
		if _, err := res.Exec(); err != nil {
			return 0, err
		}
		if err := res.Close(); err != nil {
			return 0, err
		}
		switch {
		case finished == 1:
			return 1, nil
		case finished > 1:
			return 0, fmt.Errorf("%w: finish of %s changed %d rows", ErrUnexpectedReply, stores.KeyForMessage(key), finished)
		case own:
			return 2, nil
		}
		return 0, nil
	})
	if err != nil {
		return endedErr(ctx, err)
	}
	if outcome == 0 {
		return fmt.Errorf("%w: pgstore: %s does not hold the token's claim", stores.ErrNotHeld, stores.KeyForMessage(key))
	}
	return nil
}

// checkRecordCall checks what ClaimRecord and FinishRecord have in common:
// ctx, the key, the token, and that the Store is open.
func (s *Store) checkRecordCall(ctx context.Context, key, token string) error {
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	if err := args.CheckGrantToken(token, holders.Reserved); err != nil {
		return err
	}
	if s.isClosed() {
		return ErrClosed
	}
	return nil
}
