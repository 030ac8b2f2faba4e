// Package mysqlstore is a stores.Store on MySQL or MariaDB through
// database/sql: the caller brings the *sql.DB and its driver (New), or Open
// makes one from a mysql:// URL with github.com/go-sql-driver/mysql. Its
// tests run on MariaDB 10.11; it uses nothing newer than MySQL 5.7 and
// MariaDB 10.3 have (DATETIME(6), INSERT ... ON DUPLICATE KEY UPDATE,
// LAST_INSERT_ID(expr)).
//
// # Why lease rows, not GET_LOCK
//
// MySQL offers two ways to lock. GET_LOCK(name) is a lock of the session: it
// holds one connection per held lock for the lock's whole life (a pinned
// *sql.Conn, out of the pool), RELEASE_LOCK works only from that same
// connection, the lock ends silently with the session (a dropped connection,
// a server restart, a proxy that recycles connections), it has no TTL, no
// fence and no atomic multi-key form, and it is unsafe for statement-based
// replication. A lease row needs none of that: the lock is a row of an
// InnoDB table holding the owner's token and an expiry, written by one
// statement on any pooled connection, so a held lock costs no connection, a
// lost connection loses no lock, the row survives a restart, and the expiry
// gives a TTL with Refresh, as SET PX does on Redis. This package uses lease
// rows.
//
// # What is stored
//
// One row per key ever locked, in one table (DefaultTable, or WithTable):
//
//	lock_key   VARBINARY(512) PRIMARY KEY  the key, byte for byte
//	token      VARBINARY(255)              the token of the key's last grant
//	expires_at DATETIME(6)                 UTC, by the server's clock
//	fence      BIGINT                      the last fence issued for the key
//
// A key is held by the row's token while expires_at is later than the
// server's clock. Release sets expires_at to 1970-01-01, a fixed instant
// and not the clock's now, so that a released key stays free should the
// server's clock step back; the row, its token and its fence stay, so a
// grant to a token of the same length (a Locker's tokens all have one)
// updates the row in place. The Store creates the table with CREATE TABLE
// IF NOT EXISTS on first use (Open does it at once), which needs the CREATE
// privilege; for a managed schema, apply schema.sql (or the statement
// Schema returns, with the table's name in it) beforehand and pass
// WithoutCreateTable. Either way, the first use checks the table's columns
// and refuses, with ErrMisconfigured naming the column, one that cannot
// hold what the Store writes: lock_key and token must be VARBINARY of at
// least 512 and 255 bytes (a VARCHAR would compare keys by a collation),
// lock_key the primary key, expires_at a DATETIME(6) (a DATETIME without
// fractions rounds expiries to the second, and a TIMESTAMP cannot hold the
// release's 1970-01-01 00:00:00), fence a BIGINT.
//
// Rows of keys no longer used are deleted by a purge (WithPurge, default
// every hour): a row released, or expired for the retention (default 24h),
// whose fence the server clock has passed by the retention (the key was
// last granted longer ago than that), with the key's expired rows of the
// holders table (see Shared and limited grants), and not while one of
// those is unexpired.
//
// # Limits
//
// The Store states them as stores.Bounds (Bounds), and refuses arguments
// beyond them with stores.ErrInvalid before any statement, as the Locker
// does before it calls the Store: keys of up to MaxKeyLen (512) bytes, the
// width of the key column, VARBINARY(512) (within InnoDB's 767-byte index
// limit of every row format); tokens of up to MaxTokenLen (255) bytes; up to
// MaxKeysPerCall (1000) keys in one call, so that a statement stays far
// below the 65535 placeholders of a prepared statement and MySQL 5.7's
// default max_allowed_packet (4 MB); records of up to about half the
// server's max_allowed_packet (see Idempotency records); and every TTL from
// 1ns to math.MaxInt64, each rounded up to the microsecond of DATETIME(6):
// 292 years from the server's clock stay far within DATETIME (to the year
// 9999), and their microseconds within a BIGINT.
//
// # The server's clock
//
// Every expiry is judged in the statement by the server's clock,
// UTC_TIMESTAMP(6), never by a client's: clients whose clocks disagree see
// one lock. MySQL evaluates it once per statement, at its start, so an
// expiry the server sets is never later than the client's own start plus
// the TTL, and neither the session's time zone nor daylight saving time
// moves it. Should the server's clock step, the keys held then are held
// longer by a step back and shorter by a step forward (a step forward past
// a holder's remaining TTL lets another take the key while the holder's
// validity runs: keep the server's clock slewed, not stepped, as for any
// lease judged by a server's clock); released keys stay free either way.
//
// # What the server's sessions need
//
// autocommit on, the server's default: each one-statement grant, release
// and refresh must commit by itself. With autocommit=0 (in my.cnf,
// init_connect or a DSN) a grant would stay uncommitted, others would wait
// for its row lock, and the grant would vanish with its connection while
// its holder's validity ran. The Store reads autocommit on its first use
// and on each connection it takes for an Acquire, and refuses to work with
// ErrMisconfigured when it is off; Open sets autocommit=1 on its
// connections, and refuses a URL that turns it off.
//
// The privilege to end their own sessions (KILL of the same user's
// threads, which every user has) and to read their own rows of
// information_schema.PROCESSLIST: see Failures.
//
// # sql_mode
//
// The statements mean the same under every sql_mode a session may set,
// EMPTY_STRING_IS_NULL, ANSI_QUOTES, NO_BACKSLASH_ESCAPES,
// PAD_CHAR_TO_FULL_LENGTH and MariaDB's SIMULTANEOUS_ASSIGNMENT, ORACLE and
// ANSI included (the tests run them under each): identifiers are quoted
// with backticks, no argument or literal is an empty string, no column is a
// CHAR, and the driver escapes arguments for the session. Open's
// connections run at sql_mode STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION
// unless the URL sets one.
//
// # Fences
//
// A grant's fence is max(the key's last fence + stores.FenceStride, the
// server's clock in microseconds since 1970), and becomes the key's last
// fence. So fences grow by at least the stride across expiry, release (the
// row stays), server restarts (the row is on disk) and purges (a purge
// waits until the clock has passed the row's fence by the retention), unless
// the server's clock steps back by more than the retention. Should rows be
// lost (a crash that loses the last commits, a table dropped), the next
// fences start from the clock, above the lost ones unless the key was
// granted more than about a thousand times a second just before.
//
// # Round trips
//
// Acquire of one key is one statement, INSERT ... ON DUPLICATE KEY UPDATE,
// taking the key when it is free, expired or already the caller's: one
// round trip, whose outcome (the fence, or the holder's remaining TTL) comes
// back in the statement's LAST_INSERT_ID. Release and Refresh are one UPDATE
// each, for any number of keys. Acquire of several keys first looks for a
// held key without locking (one read; a refusal ends there), then runs a
// transaction: one INSERT ... ON DUPLICATE KEY UPDATE for all rows in key
// order, a SELECT of them, and COMMIT only when every row holds the token
// (else ROLLBACK): all or nothing. Refresh of several keys is an UPDATE in
// a transaction, committed only when it found every key. Statements are
// prepared once per connection (database/sql re-prepares them as needed),
// so each takes one round trip; a statement whose prepare the server
// refuses (max_prepared_stmt_count, a proxy) runs unprepared, which with a
// driver that interpolates arguments, as Open's does, is one round trip
// too. The first Acquire on a connection also reads the connection's id
// (see Failures). A *sql.DB keeps only 2 idle connections
// unless told otherwise: give it SetMaxIdleConns near its concurrency, as
// Open does (64).
//
// Every call needs one connection at a time, and holds no lock of the
// Store while it waits for one: a transaction's statements are prepared
// before it takes its connection. So a pool capped by SetMaxOpenConns(n),
// even at one connection, serves any number of concurrent calls, n at a
// time; the others wait for a connection, within their context.
//
// # Contention
//
// Waiters on a held key poll it (see below), and a statement that writes a
// row first takes its InnoDB row lock, even when it then refuses: a hundred
// waiters' INSERTs would queue with the holder's Release for that lock. So
// once this Store has found a key held, its next attempts on that key first
// read the row without locking (a consistent read), and refuse on what they
// read while the key is held; only an attempt that finds it free runs the
// INSERT. A key this Store has not found held costs no read.
//
// Concurrent writers of one row queue for its InnoDB row lock; concurrent
// first INSERTs of one key, and transactions over overlapping sets of keys,
// can deadlock. The server then rolls back one of them (error 1213), or a
// statement waits innodb_lock_wait_timeout in vain (1205): nothing changed,
// so the Store tries again after a random sleep of a few milliseconds, up to
// 10 attempts, while the caller waits (a Release, which is owed, also when
// its caller has left). Only then does the call give up: an Acquire
// refuses, with a Wait of 10ms (the keys are busy, if not held), and a
// Release or Refresh fails with ErrContention. A deadlock never yields a
// wrong grant: a grant is what a committed row says.
//
// # Failures
//
// What the Store survives, each checked by its tests against a real server
// (the conformance suite's Faults group, through a fault proxy, and the
// package's own) except the restart, which follows from rows on disk: a lost
// connection (the lease is a row, any connection refreshes or releases it);
// a server restart (rows are on disk, fences grow from them); a reply lost
// or late, a server paused past the caller's wait or past the call limit, a
// connection cut after the request, and a request held up in the network
// until after the call gave up on it (an abandoned Acquire is undone: the
// key is free soon after the fault ends, within the suite's 3 seconds, not
// at the end of its TTL, and the late request grants nothing); a COMMIT
// whose reply is lost (undone the same way); a holder cut off from the
// server (its key expires after its TTL, not before); a stale holder's
// Refresh or Release after its key passed to another token (ErrNotHeld); a
// Refresh racing the Release of its grant (it never takes the key back);
// and contention for row locks (see Contention).
//
// Every call returns once its context ends, even while the server has not
// answered. The statements do not run on the caller's context: the driver
// would close the connection on cancellation, and the server may still
// apply the statement after that, too late for a release sent at once to
// undo it. They run on a context without the caller's cancellation, bounded
// by the call limit (WithCallLimit, default a minute), so that they reach
// an outcome; an Acquire whose caller left is then undone: a grant is
// released, owner-checked, and a transaction that sees its caller gone
// rolls back instead of committing. The caller gets an error wrapping
// stores.ErrAbandoned and the context's error.
//
// A statement with no answer within the call limit (a server paused, a
// readTimeout of the DSN, a lock wait longer than the limit), or whose
// connection broke, may still apply: go-sql-driver/mysql closes the
// connection without KILL QUERY, and the server runs what it has received,
// or receives late. So the Store first ends the session that carried it
// (KILL CONNECTION, on another connection, of the connection id and client
// address it read when it first used that connection), waits until the
// server shows it gone, so that nothing of the statement can apply any
// more, and only then releases the keys, owner-checked. It tries both
// again, after a pause of up to a second, while they fail, until they land,
// a grant the statement could have made has expired (its TTL after the
// session ended), or the Store is closed; at most two such undos run at a
// time. A caller still waiting gets an error wrapping stores.ErrAbandoned
// (with context.DeadlineExceeded past the call limit) once the undo has
// landed or its context has ended, so that it does not release the keys
// itself. Of an acquire of several keys only the COMMIT can be in that
// state: a transaction whose COMMIT was never sent rolls back when its
// connection ends, whenever its statements reach the server. For this the
// Store takes a connection of the pool for each attempt of an Acquire and
// runs its statement there (prepared once per connection, for a driver that
// does not interpolate arguments), and reads the connection's id once per
// connection. Through a proxy that shares server connections among its
// clients (ProxySQL's multiplexing), the session of a statement cannot be
// named, and the Store must not be used.
//
// Connections that break change nothing else: the lease is a row, so
// Refresh and Release work from any other connection. When the server
// cannot be reached at all, calls fail with an error wrapping
// stores.ErrUnreachable, Refresh too, so a Locker's watchdog ends the
// holder's context (reqlock.ErrLockLost) once the lock's validity runs out.
//
// The locks live on the server the *sql.DB reaches: lock on the primary.
// After a failover to an asynchronous replica the last grants may be gone,
// as on Redis; fences still grow, from the clock. The statements are
// deterministic for replication (UTC_TIMESTAMP and LAST_INSERT_ID(expr) are
// logged with the statement; the table has one unique key).
//
// # Open and the driver
//
// New takes any *sql.DB, so an application keeps its own driver, pool and
// settings. Open takes a URL, mysql://user:password@host:port/database?
// table=reqlock_locks, for configuration that names a store by a string (the
// example service does): turning that into a *sql.DB needs one driver, so
// Open uses github.com/go-sql-driver/mysql, the driver the tests run on, and
// this module depends on it. The module is separate from reqlock's, so
// users of other stores never download it. Open converts the URL to the
// driver's DSN, user:password@tcp(host:port)/database?params, passing on
// the driver's own parameters.
//
// # Shared and limited grants
//
// The Store is a stores.SharedStore. The holders of a key held shared are
// rows of a second table beside the lease table, named after it
// (reqlock_locks_holders; a name that would pass 64 bytes becomes
// reqlock_holders_ and a digest), whose definition HoldersSchema returns:
// a row per holder, named by the SHA-256 of the key and of the token, with
// its own expiry by the server's clock, and a row per waiting writer. While
// a key has holders its lease row holds a marker as its token (a NUL byte
// and "reqlock:shared": tokens that start with a NUL byte are reserved for
// such values, and refused: Acquire and ClaimRecord answer
// stores.ErrInvalid, Release and Refresh stores.ErrNotHeld, before any
// statement),
// the longest holder's expiry and the key's fence, so that Acquire,
// unchanged, reads the key as held and both kinds of grant draw fences
// from one sequence.
//
// AcquireShared first looks without locking (one read, the lease row
// joined with the holders), so that a refusal holds no row lock; a grant
// then runs a transaction on a pinned connection that locks the lease row
// and the holders (the same join, FOR UPDATE), upserts the holder, sets
// the lease row (the next fence in LAST_INSERT_ID; its expiry from a later
// reading of the clock than the place's, so that it ends no sooner) and
// commits: the limit is counted under the lease row's lock, held for three
// round trips. These transactions, and ReleaseShared's and RefreshShared's,
// run under READ COMMITTED (unless the server writes a statement-based
// binary log, which refuses it), so that they lock the rows they read and
// no gap between keys: under REPEATABLE READ the grants of two keys next
// to each other in the holders table deadlocked on the gap between their
// places.
// Expired places it saw are deleted after the commit. ReleaseShared and
// RefreshShared are a transaction each (lock, change the place, set the
// lease row's expiry to the longest place left, commit). This costs several
// times a plain lock's round trips: on the test machine (MariaDB on
// localhost, one caller, a loaded 2-core machine) an AcquireShared and
// ReleaseShared pair took 1.3 ms (2.7 ms under -race), against 0.27 ms
// (0.36 ms) for Acquire and Release. Since grants of one key are
// serialized by its lease row's lock, a key takes a few hundred grants a
// second at most.
//
// A waiting writer (stores.WriterWindow) is a row per token, written by an
// Acquire refused by holders (a flag in its LAST_INSERT_ID; one statement
// more, on such refusals only). The Store notes the records it made, and
// ends a token's record, with one statement more, when it grants the key to
// that token or the token releases it: other grants and releases pay
// nothing. A record made through another Store, or before a restart, ends
// at its expiry, at most WriterWindow after the writer's last refusal. A
// key's expired holders and records are deleted by its next grant, or by
// the purge (WithPurge, Purge), so that the holders table does not grow
// with keys held shared once and never again: for each batch of lease rows
// it would delete, a transaction locks them first, as every transaction on
// a key's holders does (the lease row, then the holders), deletes their
// expired holders and records, and deletes a lease row only when none of
// them is left; then it deletes the rows of the holders table expired for
// the retention, whatever their key (those of lease rows an older version
// purged included), in transactions that lock holder rows alone. Expired
// rows count for nothing, and a grant counts the holders it has locked, so
// the purge never takes a place a grant counts; its deadlocks and lock
// waits are retried as the other statements' are (see Contention).
//
// An existing deployment keeps its lease table as it is: the first call of
// this version creates the holders table (unless WithoutCreateTable: create
// it from HoldersSchema first; without it, shared calls fail with the
// server's error). A process of an older version reads a key held shared
// as held, so mixed versions exclude each other; it records no waiting
// writer.
//
// # Idempotency records
//
// The Store is a stores.RecordStore. A record key's claim is a plain lease
// row: ClaimRecord runs Acquire's one-key statement, as Acquire runs it
// (its fence, its retries under contention, the undo of a claim whose
// caller left or whose outcome is unknown), with one more flag in its
// LAST_INSERT_ID, set when a finished record refused it; the record is then
// read by a second statement (a statement that writes returns no rows on
// MySQL), so that a new key's claim takes one round trip and a replay two.
// A finished record lives in two places: the key's lease row, whose token
// becomes the record's owner (a NUL byte, "reqlock:record:" and the SHA-256
// of the finishing token: 48 bytes; no caller's token starts with a NUL
// byte, see above) and
// whose expiry becomes the end of the retention, so that Acquire, Release
// and Refresh, unchanged, leave it alone; and a row of a third table beside
// the lease table, named after it (reqlock_locks_records; a name past 64
// bytes becomes reqlock_records_ and a digest), which keeps the lease
// table's schema and its rows' size as they were (see RecordsSchema, or
// records.sql):
//
//	lock_key   VARBINARY(512) PRIMARY KEY  the record's key
//	record     MEDIUMBLOB                  a byte, the fingerprint, then the response
//	fp_len     INT                         the fingerprint's length
//	fence      BIGINT                      the fence of the claim it finished
//	expires_at DATETIME(6)                 the end of the retention (indexed)
//
// FinishRecord takes two statements, each of which checks the token's
// unexpired claim itself: the first writes the fields, the second replaces
// the claim by the owner, which makes the record. Fields written without the
// owner (the claim ended in between, or the second statement was lost) are
// never read, and the next finish of the key overwrites them; a finish that
// lands late changes nothing. Records are kept for any retention the TTLs
// allow, up to what FinishRecord's statement takes within the server's
// max_allowed_packet, which the Store reads when it starts (Open, or the
// first call after New; until then it assumes 4 MiB, MySQL 5.7's default),
// with every byte escaped as the driver interpolates it: about half the
// packet (2 MiB less 5 KiB for 4 MiB, 8 MiB less 5 KiB for MariaDB's default
// 16 MiB), at most MaxRecordBytes (16 MiB less 1 KiB, within the column's
// MEDIUMBLOB), as Bounds states. A max_allowed_packet lowered after the
// Store started, or a driver's maxAllowedPacket below the server's on a
// *sql.DB given to New, makes a FinishRecord near the bound fail with the
// driver's error. The purge (WithPurge, Purge) deletes expired records, and,
// like any row's, their lease rows once expired for the purge's retention; a
// purged key's next claim draws its fence from the clock. With
// WithoutCreateTable, create the records table from RecordsSchema too.
//
// # No release notification, no fair mode
//
// MySQL has no publish/subscribe: a stores.Notifier could only poll the
// table, which is what the Locker's waiters already do, with backoff capped
// by the holder's remaining TTL. GET_LOCK could wake waiters, but only by
// pinning a connection per waiter. Fair mode (stores.FairStore) would add a
// queue table whose head still learns of a release only by polling, so every
// queued waiter would poll in turn for nothing. The Store implements
// neither: within one process the Locker's local queue already orders
// waiters and hands a grant on without a round trip.
//
// # Start-up
//
// Open connects, checks the sessions, reads max_allowed_packet (see
// Idempotency records), creates the table and prepares the statements, and
// fails, naming the address, when the server cannot be
// reached within 5s (DefaultConnectTimeout) or its context's deadline. With
// connect=lazy in the URL it sends nothing: calls fail with store errors
// until the server answers, and the first call that reaches it sets the
// table up (a problem with the sessions or the table is that call's error,
// wrapping ErrMisconfigured). New sends nothing, as a lazy Open. Until the
// Store has started, Bounds assume a max_allowed_packet of 4 MiB; a Locker
// reads Bounds once, in reqlock.New.
package mysqlstore
