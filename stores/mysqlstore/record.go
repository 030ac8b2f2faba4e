package mysqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/reqlock/reqlock/internal/holders"
	"github.com/reqlock/reqlock/stores"
)

var _ stores.RecordStore = (*Store)(nil)

// MaxRecordBytes is the largest record (stores.Record.Size) a Store keeps on
// any server: 16 MiB less 1 KiB, within the records table's MEDIUMBLOB
// (16 MiB less a byte, which also holds a byte of its own). A Store states
// less in its Bounds when FinishRecord's statement would not fit the
// server's max_allowed_packet (see recordBytes).
const MaxRecordBytes = 16<<20 - 1<<10

// assumedPacket is the max_allowed_packet that Bounds assumes until the
// Store has read the server's: 4 MiB, the smallest default of the servers
// the Store supports (MySQL 5.7).
const assumedPacket = 4 << 20

// statementReserve is what FinishRecord's statement holds besides the
// record, escaped: its SQL, a key of up to MaxKeyLen and a token of up to
// MaxTokenLen bytes, each byte escaped to two at most, and four numbers.
const statementReserve = 8 << 10

// recordBytes is the largest record whose FinishRecord statement fits a
// max_allowed_packet of packet bytes, rounded down to KiB, at most
// MaxRecordBytes and at least 1: the record's value (a byte and the record)
// and statementReserve, with every byte of the value escaped to two, as the
// driver interpolates a NUL, a quote or a backslash into an unprepared
// statement (a prepared one sends them as they are). So 2 MiB less 5 KiB
// for MySQL 5.7's default of 4 MiB, 8 MiB less 5 KiB for MariaDB's 16 MiB,
// and MaxRecordBytes from about 32 MiB (MySQL 8's default is 64 MiB).
func recordBytes(packet int) int {
	n := (packet-statementReserve)/2 - 1
	n &^= 1<<10 - 1
	return max(min(n, MaxRecordBytes), 1)
}

// RecordsSchema returns the CREATE TABLE IF NOT EXISTS statement of the
// records table of a Store's table (see Idempotency records in the package
// documentation), for a managed schema: table is as WithTable takes it;
// empty means DefaultTable. It returns an error wrapping stores.ErrInvalid
// for an invalid name.
func RecordsSchema(table string) (string, error) {
	table, err := schemaTable(table)
	if err != nil {
		return "", err
	}
	return tableQueries(table).createRecords, nil
}

// recordsTable names the records table of table (see holders.RecordsTable).
func recordsTable(table string) string { return holders.RecordsTable(table, 64) }

// ClaimRecord is Acquire of key for token, as stores.RecordStore describes,
// unless key holds a finished record: it then returns a copy of it with a
// Grant whose OK is false, and claims nothing. The claim is Acquire's
// statement, run as Acquire runs it (its fence, its retries under
// contention, the undo of a claim whose caller left or whose outcome is
// unknown), whose refusal also says whether a record refused it; the record
// is then read by a second statement, so that a replay takes two round
// trips (a statement that writes returns no rows on MySQL).
//
// Its errors are Acquire's, which refuses a token that starts with a NUL
// byte, as a record's owner does (such tokens are reserved: see Shared and
// limited grants in the package documentation).
func (s *Store) ClaimRecord(ctx context.Context, key, token string, ttl time.Duration) (stores.Grant, *stores.Record, error) {
	if err := checkRecordArgs(ctx, key, token); err != nil {
		return stores.Grant{}, nil, err
	}
	if err := args.CheckTTL(ttl); err != nil {
		return stores.Grant{}, nil, err
	}
	if err := s.checkArgs([]string{key}, token, ttl); err != nil {
		return stores.Grant{}, nil, err
	}
	for try := 1; ; try++ {
		g, rec, err := s.claimRecord(ctx, key, token, ttl)
		if err != nil || g.OK || rec != nil || g.Wait != 0 || try == 3 {
			if !g.OK && rec == nil && g.Wait == 0 && err == nil {
				g.Wait = time.Microsecond // a record refused it, and was gone at each read
			}
			return g, rec, err
		}
		// A record refused the claim and was gone when read: claim again.
	}
}

// claimRecord is one try of ClaimRecord: a claim, and the read of the
// record that refused it, if one did. A Grant with OK false and no Wait and
// no record is a record that refused the claim and was gone when read.
func (s *Store) claimRecord(ctx context.Context, key, token string, ttl time.Duration) (stores.Grant, *stores.Record, error) {
	keys := []string{key}
	op := func(ctx context.Context, c *call[acquired]) (acquired, error) {
		var r acquired
		if err := s.setup(ctx); err != nil {
			return r, markUnreachable(err)
		}
		err := s.retry(ctx, c.left, func() error {
			var err error
			r.g, r.record, err = s.claimOne(ctx, key, token, micros(ttl), &r.a)
			return err
		})
		if errors.Is(err, ErrContention) {
			r.g, err = stores.Grant{Wait: contentionWait}, nil
		}
		if err == nil && r.g.OK {
			s.withdraw(ctx, keys, token)
		}
		r.limit = ctx.Err() != nil
		return r, markUnreachable(err)
	}
	r, err := detached(s, ctx, op, func(r acquired, err error) {
		if r.g.OK || r.a.unknown || r.a.maybe {
			s.owe(keys, token, ttl, r.a, false)
		}
	})
	g, err := s.acquiredOutcome(ctx, r, err, keys, token, ttl, false)
	if err != nil || !r.record {
		return g, nil, err
	}
	rec, err := s.readRecord(ctx, key)
	if err != nil {
		return stores.Grant{}, nil, err
	}
	return stores.Grant{}, rec, nil // a nil rec: gone since (purged, or claimed again)
}

// claimOne runs claimOneSQL on a pinned connection, as acquireOne runs
// acquireOneSQL, and reads its outcome from LAST_INSERT_ID: a grant, or a
// refusal, by a record or not.
func (s *Store) claimOne(ctx context.Context, key, token string, ttl int64, a *attempt) (stores.Grant, bool, error) {
	var (
		res driver.Result
		err error
	)
	for range maxBadConnTries {
		var p pinned
		if p, err = s.pin(ctx); err != nil {
			return stores.Grant{}, false, err // nothing sent
		}
		res, err = p.execOne(ctx, s.q.claimOne, key, token, ttl, token, token, token, token, ttl)
		_ = p.conn.Close()
		a.sent(p.session, err)
		if !errors.Is(err, driver.ErrBadConn) {
			break
		}
	}
	if err != nil {
		return stores.Grant{}, false, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		a.maybe = true
		return stores.Grant{}, false, fmt.Errorf("%w: claim %s: %w", ErrUnexpectedReply, stores.KeyForMessage(key), err)
	}
	switch {
	case id > 0 && id < refusedFlag:
		return stores.Grant{OK: true, Fences: []int64{id}}, false, nil
	case id >= refusedFlag+sharedFlag:
		s.writerRefused(ctx, key, token)
		return stores.Grant{Wait: remaining(id - refusedFlag - sharedFlag), SharedHeld: true}, false, nil
	case id >= refusedFlag+recordFlag:
		return stores.Grant{}, true, nil
	case id > refusedFlag:
		return stores.Grant{Wait: remaining(id - refusedFlag)}, false, nil
	}
	a.maybe = true
	return stores.Grant{}, false, fmt.Errorf("%w: claim %s answered LAST_INSERT_ID %d", ErrUnexpectedReply, stores.KeyForMessage(key), id)
}

// readRecord returns key's record while its lease row holds a record's
// owner; nil otherwise.
func (s *Store) readRecord(ctx context.Context, key string) (*stores.Record, error) {
	if !s.begin() {
		return nil, ErrClosed
	}
	defer s.calls.Done()
	var (
		value []byte
		fpLen int
		rec   stores.Record
	)
	rows, err := s.queryDB(ctx, s.q.readRecord, key)
	if err != nil {
		return nil, markUnreachable(err)
	}
	defer rows.Close()
	if !rows.Next() {
		return nil, markUnreachable(rows.Err())
	}
	if err := rows.Scan(&value, &fpLen, &rec.Fence); err != nil {
		return nil, fmt.Errorf("%w: record of %s: %w", ErrUnexpectedReply, stores.KeyForMessage(key), err)
	}
	if len(value) < 1 || fpLen < 0 || fpLen > len(value)-1 {
		return nil, fmt.Errorf("%w: record of %s: %d bytes with a fingerprint of %d", ErrUnexpectedReply, stores.KeyForMessage(key), len(value), fpLen)
	}
	rec.Fingerprint = string(value[1 : 1+fpLen])
	rec.Response = append([]byte{}, value[1+fpLen:]...)
	return &rec, nil
}

// FinishRecord replaces token's claim on key by rec, kept for retention, as
// stores.RecordStore describes, in two statements (two round trips): the
// first writes the record's fields to the records table while key's lease
// row holds token's unexpired claim; the second replaces that claim by the
// record's owner (holders.RecordOwner of token), held until the end of the
// retention, which makes the record. Each checks the claim itself, so that
// a finish whose claim ended between them, or that lands late, changes
// nothing a claim or a record reads (fields written without the owner are
// never read, and the next finish overwrites them). When the second changes
// nothing, a third statement tells whether key holds the record token
// finished (a retry: nil) or not (stores.ErrNotHeld).
//
// A FinishRecord whose outcome is unknown is not undone: it made the
// record, or changed nothing a reader sees. It returns an error wrapping
// stores.ErrInvalid for an empty or too long key or token, a record or
// retention out of Bounds, or a token refused as in ClaimRecord, before any
// statement of its own (a record larger than MaxRecordBytes before any
// statement at all; one within it but above Bounds once the Store has
// started, which reads the bound); ErrClosed after Close; and the driver's error otherwise,
// wrapped with stores.ErrUnreachable when no connection could be made.
func (s *Store) FinishRecord(ctx context.Context, key, token string, rec stores.Record, retention time.Duration) error {
	if err := checkRecordArgs(ctx, key, token); err != nil {
		return err
	}
	if err := s.checkArgs([]string{key}, token); err != nil {
		return err
	}
	if err := args.CheckRecord(stores.Bounds{MaxRecordBytes: MaxRecordBytes}, rec, retention); err != nil {
		return err
	}
	if !s.begin() {
		return ErrClosed
	}
	defer s.calls.Done()
	if err := s.setup(ctx); err != nil {
		return err
	}
	if err := args.CheckRecord(s.bounds(), rec, retention); err != nil {
		return err // once setup has read the server's bound, before the record's statements
	}
	value := make([]byte, 0, 1+rec.Size())
	value = append(append(append(value, 'r'), rec.Fingerprint...), rec.Response...)
	owner, ret := holders.RecordOwner(token), micros(retention)
	var made int64
	err := s.retry(ctx, nil, func() error {
		if _, err := s.exec(ctx, s.q.finishInsert, []any{value, len(rec.Fingerprint), rec.Fence, ret, key, token}); err != nil {
			return err
		}
		var err error
		made, err = s.exec(ctx, s.q.finishUpdate, []any{owner, ret, key, token})
		return err
	})
	if err != nil {
		return markUnreachable(err)
	}
	if made == 1 {
		return nil
	}
	var own int
	err = s.retry(ctx, nil, func() error {
		return s.db.QueryRowContext(ctx, s.q.ownRecord, key, owner).Scan(&own)
	})
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return markUnreachable(err)
	case own == 1:
		return nil
	}
	return fmt.Errorf("%w: mysqlstore: %s does not hold the token's claim", stores.ErrNotHeld, stores.KeyForMessage(key))
}

// purgeRecords deletes expired records, in batches of purgeBatch, and
// returns how many it deleted.
func (s *Store) purgeRecords(ctx context.Context) (int64, error) {
	var deleted int64
	for {
		var n int64
		err := s.retry(ctx, nil, func() error {
			var err error
			n, err = s.exec(ctx, s.q.purgeRecords, []any{purgeBatch})
			return err
		})
		deleted += n
		if err != nil || n < purgeBatch {
			return deleted, err
		}
	}
}

// checkRecordArgs checks the key and token of ClaimRecord and FinishRecord.
func checkRecordArgs(ctx context.Context, key, token string) error {
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	return args.CheckGrantToken(token, holders.Reserved)
}
