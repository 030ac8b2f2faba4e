package mysqlstore

import (
	_ "embed"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/reqlock/reqlock/internal/holders"
	"github.com/reqlock/reqlock/stores"
)

// The SQL of the store. Every value is a placeholder; the only text put into
// a query is the table name, which New validates (see validTable), the
// stride stores.FenceStride, and for the calls on several keys one "?" per
// key. Times are the server's: UTC_TIMESTAMP(6), which MySQL and MariaDB
// evaluate once per statement (at its start) and which neither the
// session's time_zone nor daylight saving time moves. In the templates
// {table} stands for the quoted table name, {stride} for
// stores.FenceStride, {now} for the server's clock, {micros} for that
// clock in microseconds since 1970 and {released} for the expiry of a
// released key.
//
// The statements mean the same under every sql_mode a session may set
// (TestSQLModes runs them under each): identifiers are quoted with
// backticks, which ANSI_QUOTES keeps, strings with single quotes; no
// argument and no literal is an empty string, which EMPTY_STRING_IS_NULL
// reads as NULL; no column is a CHAR, which PAD_CHAR_TO_FULL_LENGTH pads;
// the driver escapes arguments for the session's NO_BACKSLASH_ESCAPES; and
// the assignments of an UPDATE give the same row whether they see each
// other (MySQL) or the row as it was (SIMULTANEOUS_ASSIGNMENT).

// schemaSQL is the table's definition; see Schema.
//
//go:embed schema.sql
var schemaSQL string

// holdersSchemaSQL is the holders table's definition; see HoldersSchema.
//
//go:embed holders.sql
var holdersSchemaSQL string

// recordsSchemaSQL is the records table's definition; see RecordsSchema.
//
//go:embed records.sql
var recordsSchemaSQL string

const (
	nowSQL    = "UTC_TIMESTAMP(6)"
	microsSQL = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"

	// releasedSQL is the expiry of a released key: a fixed instant long
	// past, not the clock, so that a key released stays free should the
	// server's clock step back.
	releasedSQL = "'1970-01-01 00:00:00'"

	// refusedFlag marks a refusal in the LAST_INSERT_ID of acquireOneSQL:
	// the holder's remaining TTL in microseconds is added to it. Fences stay
	// far below it (2^62 microseconds is about 146,000 years).
	refusedFlag = 1 << 62

	// sharedFlag is added to refusedFlag when the key's holders refused it
	// (see shared.go). A remaining TTL stays below it: DATETIME ends in the
	// year 9999, 2^61 microseconds after about 73,000 years.
	sharedFlag = 1 << 61

	// recordFlag is added to refusedFlag by claimOneSQL when the key holds
	// a finished record (see record.go). A remaining TTL stays below it:
	// DATETIME ends in the year 9999, less than 2^60 microseconds from now.
	recordFlag = 1 << 60

	// acquireOneSQL takes one key in one statement and one round trip. A
	// new key is inserted; an existing one is taken when it has expired (or
	// was released) or already holds the token (a retried call), else left
	// as it is. The outcome comes back as the statement's LAST_INSERT_ID,
	// which the server sends in its OK packet: the new fence when granted,
	// refusedFlag plus the holder's remaining microseconds when refused.
	// MySQL assigns left to right, each assignment seeing the ones before
	// it, and MariaDB with sql_mode SIMULTANEOUS_ASSIGNMENT all at once,
	// each seeing the row as it was: the assignments give the same row
	// either way. fence and token see the row as it was in both, and
	// expires_at's condition holds exactly when token became (left to
	// right) or was to become (at once) the caller's.
	//
	// Arguments: key, token, ttl µs, token, token, token, token, ttl µs.
	acquireOneSQL = `INSERT INTO {table} (lock_key, token, expires_at, fence)
VALUES (?, ?, {now} + INTERVAL ? MICROSECOND, LAST_INSERT_ID(GREATEST({stride}, {micros})))
ON DUPLICATE KEY UPDATE
  fence = IF(token = ? OR expires_at <= {now},
    LAST_INSERT_ID(GREATEST(fence + {stride}, {micros})),
    fence + 0 * LAST_INSERT_ID({refused} + IF({isMarker}, {sharedFlag}, 0) + TIMESTAMPDIFF(MICROSECOND, {now}, expires_at))),
  token = IF(token = ? OR expires_at <= {now}, ?, token),
  expires_at = IF(token = ? OR expires_at <= {now}, {now} + INTERVAL ? MICROSECOND, expires_at)`

	// acquireManyRowSQL is one row of acquireManySQL. Arguments: key,
	// token, ttl µs.
	acquireManyRowSQL = `(?, ?, {now} + INTERVAL ? MICROSECOND, GREATEST({stride}, {micros}))`

	// acquireManySQL sets several keys as acquireOneSQL does, row by row in
	// key order, inside a transaction: it locks every row exclusively (an
	// existing one as its duplicate key), and selectManySQL then reads what
	// each row holds. The assignments are as in acquireOneSQL. Arguments:
	// the rows, then token, token, token, token, ttl µs.
	acquireManySQL = `INSERT INTO {table} (lock_key, token, expires_at, fence)
VALUES {rows}
ON DUPLICATE KEY UPDATE
  fence = IF(token = ? OR expires_at <= {now}, GREATEST(fence + {stride}, {micros}), fence),
  token = IF(token = ? OR expires_at <= {now}, ?, token),
  expires_at = IF(token = ? OR expires_at <= {now}, {now} + INTERVAL ? MICROSECOND, expires_at)`

	// heldSQL finds, without locking, the first of several keys that is
	// held by another token, and its remaining TTL in microseconds: a
	// multi-key acquire that finds one refuses without taking any row lock.
	// Arguments: the keys, token.
	heldSQL = `SELECT lock_key, TIMESTAMPDIFF(MICROSECOND, {now}, expires_at), {isMarker} FROM {table}
WHERE lock_key IN ({keys}) AND token <> ? AND expires_at > {now}
ORDER BY lock_key LIMIT 1`

	// selectManySQL reads the rows acquireManySQL locked, with each one's
	// remaining TTL in microseconds. Arguments: the keys.
	selectManySQL = `SELECT lock_key, token, fence, TIMESTAMPDIFF(MICROSECOND, {now}, expires_at)
FROM {table} WHERE lock_key IN ({keys}) ORDER BY lock_key FOR UPDATE`

	// releaseSQL ends the token's grant on the keys that still hold it: the
	// row's expiry becomes {released}, keeping its fence and token (so that
	// InnoDB updates it in place, every column keeping its size; an expired
	// row is free whatever its token). Not the clock's now: after the clock
	// stepped back, such a key would read as held again, and the released
	// holder's Refresh, or one that started before the Release and waited
	// for its row lock, would take it back. The row always changes
	// (expires_at was later than now), so the affected rows count the keys
	// released whatever the driver's found-rows mode. Arguments: the keys,
	// token.
	releaseSQL = `UPDATE {table} SET expires_at = {released}
WHERE lock_key IN ({keys}) AND token = ? AND expires_at > {now}`

	// expireSQL sets the TTL of the keys that still hold the token: Refresh,
	// and Release with a keep. When the new expiry equals the old one to
	// the microsecond it adds one, so that the row changes and counts in
	// the affected rows whatever the driver's found-rows mode. Arguments:
	// ttl µs, ttl µs, the keys, token.
	expireSQL = `UPDATE {table}
SET expires_at = IF(expires_at = {now} + INTERVAL ? MICROSECOND,
  expires_at + INTERVAL 1 MICROSECOND, {now} + INTERVAL ? MICROSECOND)
WHERE lock_key IN ({keys}) AND token = ? AND expires_at > {now}`

	// purgeCandidatesSQL finds, without locking, the next keys that
	// purgeSQL may delete, in key order: the first ones with {after} empty,
	// else those after a given key, with {after} "lock_key > ? AND" (not a
	// comparison with an empty string, which EMPTY_STRING_IS_NULL reads as
	// NULL, so that the purge deleted nothing). Arguments: after when
	// {after} is set, retention µs, retention µs, limit.
	purgeCandidatesSQL = `SELECT lock_key FROM {table}
WHERE {after} expires_at <= {now} - INTERVAL ? MICROSECOND
  AND fence + {stride} <= {micros} - ?
ORDER BY lock_key LIMIT ?`

	// purgeSQL deletes rows that were released or have been expired for
	// the retention, and whose fence the server clock has passed by the
	// retention, checking both again under the row locks: the next grant of
	// such a key starts from the clock, above every fence the row held,
	// unless the clock steps back by more than the retention. Arguments:
	// the keys, retention µs, retention µs.
	purgeSQL = `DELETE FROM {table}
WHERE lock_key IN ({keys}) AND expires_at <= {now} - INTERVAL ? MICROSECOND
  AND fence + {stride} <= {micros} - ?`

	// purgeLockSQL locks, in key order, the lease rows of the keys that
	// purgeSQL may still delete, and returns their keys: the purge's
	// transaction locks them before their holders, as every transaction on
	// a key's holders does. Arguments: the keys, retention µs, retention µs.
	purgeLockSQL = `SELECT lock_key FROM {table}
WHERE lock_key IN ({keys}) AND expires_at <= {now} - INTERVAL ? MICROSECOND
  AND fence + {stride} <= {micros} - ?
ORDER BY lock_key FOR UPDATE`

	// purgeHoldersSQL deletes the expired holders and writer records of
	// keys whose lease rows the purge locked. Arguments: the key digests.
	purgeHoldersSQL = `DELETE FROM {holders} WHERE key_sum IN ({keys}) AND expires_at <= {now}`

	// purgeLiveSQL returns the digests of those keys that have rows left
	// in the holders table (unexpired, after purgeHoldersSQL): their lease
	// rows stay. Arguments: the key digests.
	purgeLiveSQL = `SELECT DISTINCT key_sum FROM {holders} WHERE key_sum IN ({keys})`

	// staleHoldersSQL finds, without locking, the next key digests that
	// have holders or writer records expired for the retention, in digest
	// order: the first ones with {after} empty, else those after a given
	// digest, with {after} "key_sum > ? AND". Arguments: after when
	// {after} is set, retention µs, limit.
	staleHoldersSQL = `SELECT DISTINCT key_sum FROM {holders}
WHERE {after} expires_at <= {now} - INTERVAL ? MICROSECOND
ORDER BY key_sum LIMIT ?`

	// purgeStaleSQL deletes the holders and writer records of the keys
	// that have been expired for the retention, whatever their lease rows:
	// those of keys whose lease rows are gone (purged by an earlier version,
	// which left them) have no other way out. Expired rows count for
	// nothing, and every locking read of a key's holders locks them before
	// it counts them. Arguments: the key digests, retention µs.
	purgeStaleSQL = `DELETE FROM {holders}
WHERE key_sum IN ({keys}) AND expires_at <= {now} - INTERVAL ? MICROSECOND`
)

// The SQL of idempotency records (see record.go). {records} stands for the
// quoted records table, {isRecord} for a test of the lease row's token
// against holders.RecordPrefix ({lIsRecord} of the row l's). ClaimRecord runs claimOneSQL, acquireOneSQL
// with recordFlag added to a refusal by a record.
const (
	// readRecordSQL reads the key's record while its lease row holds a
	// record's owner: run after a claim that a record refused, it reads the
	// record even when its retention ended in between (no claim took the
	// key since). Arguments: key.
	readRecordSQL = `SELECT r.record, r.fp_len, r.fence FROM {records} AS r JOIN {table} AS l ON l.lock_key = r.lock_key
WHERE r.lock_key = ? AND {lIsRecord}`

	// finishInsertSQL writes the record's fields while the key's lease row
	// holds the token's unexpired claim, and nothing otherwise: the first
	// statement of FinishRecord. Arguments: record, fingerprint length,
	// fence, retention µs, key, token.
	finishInsertSQL = `INSERT INTO {records} (lock_key, record, fp_len, fence, expires_at)
SELECT lock_key, ?, ?, ?, {now} + INTERVAL ? MICROSECOND FROM {table}
WHERE lock_key = ? AND token = ? AND expires_at > {now}
ON DUPLICATE KEY UPDATE record = VALUES(record), fp_len = VALUES(fp_len), fence = VALUES(fence), expires_at = VALUES(expires_at)`

	// finishUpdateSQL replaces the token's unexpired claim by the record's
	// owner, held until the end of the retention: the second statement of
	// FinishRecord, which makes the record. Arguments: owner, retention µs,
	// key, token.
	finishUpdateSQL = `UPDATE {table} SET token = ?, expires_at = {now} + INTERVAL ? MICROSECOND
WHERE lock_key = ? AND token = ? AND expires_at > {now}`

	// ownRecordSQL counts the key's lease row when it holds the record of
	// an owner, unexpired. Arguments: key, owner.
	ownRecordSQL = `SELECT COUNT(*) FROM {table} WHERE lock_key = ? AND token = ? AND expires_at > {now}`

	// purgeRecordsSQL deletes expired records, the earliest first; their
	// lease rows are the lease purge's. Arguments: limit.
	purgeRecordsSQL = `DELETE FROM {records} WHERE expires_at <= {now} ORDER BY expires_at LIMIT ?`
)

// The SQL of shared grants (see shared.go). {holders} stands for the quoted
// holders table, {isMarker} for a test of the lease row's token against
// holders.Marker, {marker} for holders.Marker and {window} for
// stores.WriterWindow in microseconds. Every statement on a key's holders
// runs in a transaction that has locked the key's lease row first
// (lockKeySQL, selectKeySQL or lockRowSQL); the records of waiting writers
// (writer = 1) are written without it.
const (
	// lockKeySQL inserts the key's lease row, free, unless it exists, and
	// locks it. Arguments: key.
	lockKeySQL = `INSERT INTO {table} (lock_key, token, expires_at, fence)
VALUES (?, {marker}, {released}, 0)
ON DUPLICATE KEY UPDATE fence = fence`

	// selectKeySQL reads the key's lease row, locking it, and its holders
	// and writer records, locking them too, in one join: whether the key is
	// held, and by holders, its remaining TTL in microseconds and its
	// fence, on every row; then, on a row each (NULL when none), a holder's
	// or writer's kind, token digest and remaining TTL in microseconds
	// (zero or less once expired). The lease row is read first (by its
	// primary key), as every transaction on a key's holders locks it first.
	// Arguments: key digest, key.
	selectKeySQL = peekKeySQL + ` FOR UPDATE`

	// peekKeySQL is selectKeySQL without locking.
	peekKeySQL = `SELECT l.expires_at > {now}, l.{isMarker}, TIMESTAMPDIFF(MICROSECOND, {now}, l.expires_at), l.fence,
  h.writer, h.token_sum, TIMESTAMPDIFF(MICROSECOND, {now}, h.expires_at)
FROM {table} AS l LEFT JOIN {holders} AS h ON h.key_sum = ?
WHERE l.lock_key = ?`

	// lockRowSQL locks a key's lease row, when it exists. Arguments: key.
	lockRowSQL = `SELECT 1 FROM {table} WHERE lock_key = ? FOR UPDATE`

	// sweepHoldersSQL deletes the key's expired holders and writer
	// records. Arguments: key digest.
	sweepHoldersSQL = `DELETE FROM {holders} WHERE key_sum = ? AND expires_at <= {now}`

	// grantKeySQL sets the lease row of a key granted to a holder: the
	// marker, the longest expiry of its holders (the new one's ttl, or the
	// remaining TTL of another, in microseconds) and the next fence, in
	// LAST_INSERT_ID. It runs after upsertHolderSQL: its later reading of
	// the clock ends the lease row no sooner than the place. Arguments:
	// µs, key.
	grantKeySQL = `UPDATE {table} SET token = {marker}, expires_at = {now} + INTERVAL ? MICROSECOND,
  fence = LAST_INSERT_ID(GREATEST(fence + {stride}, {micros}))
WHERE lock_key = ?`

	// upsertHolderSQL sets a holder's place. Arguments: key digest, token
	// digest, ttl µs, ttl µs.
	upsertHolderSQL = `INSERT INTO {holders} (key_sum, writer, token_sum, expires_at)
VALUES (?, 0, ?, {now} + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE expires_at = {now} + INTERVAL ? MICROSECOND`

	// writerWaitsSQL records a writer refused by the key's holders for
	// stores.WriterWindow. Arguments: key digest, token digest, key.
	writerWaitsSQL = `INSERT INTO {holders} (key_sum, writer, token_sum, expires_at)
SELECT ?, 1, ?, {now} + INTERVAL {window} MICROSECOND FROM {table}
WHERE lock_key = ? AND {isMarker} AND expires_at > {now}
ON DUPLICATE KEY UPDATE expires_at = {now} + INTERVAL {window} MICROSECOND`

	// withdrawSQL ends a writer's record. Arguments: key digest, token
	// digest.
	withdrawSQL = `DELETE FROM {holders} WHERE key_sum = ? AND writer = 1 AND token_sum = ?`

	// dropHolderSQL ends an unexpired place. Arguments: key digest, token
	// digest.
	dropHolderSQL = `DELETE FROM {holders} WHERE key_sum = ? AND writer = 0 AND token_sum = ? AND expires_at > {now}`

	// expireHolderSQL sets an unexpired place to end in the given
	// microseconds (one more when that is its expiry already, so that the
	// row changes and counts). Arguments: µs, µs, key digest, token digest.
	expireHolderSQL = `UPDATE {holders}
SET expires_at = IF(expires_at = {now} + INTERVAL ? MICROSECOND,
  expires_at + INTERVAL 1 MICROSECOND, {now} + INTERVAL ? MICROSECOND)
WHERE key_sum = ? AND writer = 0 AND token_sum = ? AND expires_at > {now}`

	// settleKeySQL sets the lease row of a key whose place changed to the
	// longest expiry among its holders, or frees it when none is left.
	// Arguments: key digest, key.
	settleKeySQL = `UPDATE {table} SET expires_at = COALESCE(
  (SELECT MAX(expires_at) FROM {holders} WHERE key_sum = ? AND writer = 0 AND expires_at > {now}),
  {released})
WHERE lock_key = ?`
)

// queries holds the store's SQL for one table.
type queries struct {
	acquireOne, acquireMany, acquireRow string
	held, selectMany                    string
	release, expire                     string
	purgeFirst, purgeAfter, purge       string
	purgeLock, purgeHolders, purgeLive  string
	staleFirst, staleAfter, purgeStale  string

	claimOne, readRecord, finishInsert, finishUpdate   string
	ownRecord, purgeRecords, createRecords             string
	createHolders                                      string
	lockKey, lockRow, selectKey, peekKey, sweepHolders string
	grantKey, upsertHolder, writerWaits, withdraw      string
	dropHolder, expireHolder, settleKey                string
}

// newQueries returns the SQL for quoted, a validated and quoted table name,
// and holders, its holders table's.
func newQueries(quoted, holdersTable, recordsTable string) queries {
	r := strings.NewReplacer(
		"{holders}", holdersTable,
		"{records}", recordsTable,
		"{isRecord}", "LEFT(token, "+strconv.Itoa(len(holders.RecordPrefix))+") = X'"+hex.EncodeToString([]byte(holders.RecordPrefix))+"'",
		"{lIsRecord}", "LEFT(l.token, "+strconv.Itoa(len(holders.RecordPrefix))+") = X'"+hex.EncodeToString([]byte(holders.RecordPrefix))+"'",
		"{recordFlag}", strconv.FormatInt(recordFlag, 10),
		"{isMarker}", "token = X'"+hex.EncodeToString([]byte(holders.Marker))+"'",
		"{marker}", "X'"+hex.EncodeToString([]byte(holders.Marker))+"'",
		"{window}", strconv.FormatInt(stores.WriterWindow.Microseconds(), 10),
		"{sharedFlag}", strconv.FormatInt(sharedFlag, 10),
		"{table}", quoted,
		"{stride}", strconv.Itoa(stores.FenceStride),
		"{now}", nowSQL,
		"{micros}", microsSQL,
		"{refused}", strconv.FormatInt(refusedFlag, 10),
		"{released}", releasedSQL,
	)
	return queries{
		acquireOne:   r.Replace(acquireOneSQL),
		acquireMany:  r.Replace(acquireManySQL),
		acquireRow:   r.Replace(acquireManyRowSQL),
		held:         r.Replace(heldSQL),
		selectMany:   r.Replace(selectManySQL),
		release:      r.Replace(releaseSQL),
		expire:       r.Replace(expireSQL),
		purgeFirst:   strings.Replace(r.Replace(purgeCandidatesSQL), "{after}", "", 1),
		purgeAfter:   strings.Replace(r.Replace(purgeCandidatesSQL), "{after}", "lock_key > ? AND", 1),
		purge:        r.Replace(purgeSQL),
		purgeLock:    r.Replace(purgeLockSQL),
		purgeHolders: r.Replace(purgeHoldersSQL),
		purgeLive:    r.Replace(purgeLiveSQL),
		staleFirst:   strings.Replace(r.Replace(staleHoldersSQL), "{after}", "", 1),
		staleAfter:   strings.Replace(r.Replace(staleHoldersSQL), "{after}", "key_sum > ? AND", 1),
		purgeStale:   r.Replace(purgeStaleSQL),

		claimOne:      r.Replace(strings.Replace(acquireOneSQL, "IF({isMarker}, {sharedFlag}, 0)", "IF({isMarker}, {sharedFlag}, IF({isRecord}, {recordFlag}, 0))", 1)),
		readRecord:    r.Replace(readRecordSQL),
		finishInsert:  r.Replace(finishInsertSQL),
		finishUpdate:  r.Replace(finishUpdateSQL),
		ownRecord:     r.Replace(ownRecordSQL),
		purgeRecords:  r.Replace(purgeRecordsSQL),
		createRecords: r.Replace(recordsSchemaSQL),
		createHolders: r.Replace(holdersSchemaSQL),
		lockKey:       r.Replace(lockKeySQL),
		lockRow:       r.Replace(lockRowSQL),
		selectKey:     r.Replace(selectKeySQL),
		peekKey:       r.Replace(peekKeySQL),
		sweepHolders:  r.Replace(sweepHoldersSQL),
		grantKey:      r.Replace(grantKeySQL),
		upsertHolder:  r.Replace(upsertHolderSQL),
		withdraw:      r.Replace(withdrawSQL),
		writerWaits:   r.Replace(writerWaitsSQL),
		dropHolder:    r.Replace(dropHolderSQL),
		expireHolder:  r.Replace(expireHolderSQL),
		settleKey:     r.Replace(settleKeySQL),
	}
}

// withKeys puts n placeholders for keys into q.
func withKeys(q string, n int) string {
	return strings.Replace(q, "{keys}", placeholders(n), 1)
}

// withRows puts n copies of row into q.
func withRows(q, row string, n int) string {
	rows := strings.Repeat(row+", ", n-1) + row
	return strings.Replace(q, "{rows}", rows, 1)
}

// placeholders returns n comma-separated placeholders.
func placeholders(n int) string {
	return strings.Repeat("?, ", n-1) + "?"
}
