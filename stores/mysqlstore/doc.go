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
// server's clock. Release sets expires_at to now; the row, its token and its
// fence stay, so a grant to a token of the same length (a Locker's tokens
// all have one) updates the row in place. The Store creates the table with
// CREATE TABLE IF NOT EXISTS on first use (Open does it at once), which
// needs the CREATE privilege; for a managed schema, apply schema.sql (or the
// statement Schema returns, with the table's name in it) beforehand and
// pass WithoutCreateTable. Keys are limited to MaxKeyLen bytes and tokens to
// MaxTokenLen; longer ones are refused with stores.ErrInvalid.
//
// Rows of keys no longer used are deleted by a purge (WithPurge, default
// every hour): a row free for the retention (default 24h) whose fence the
// server clock has passed by the retention.
//
// # The server's clock
//
// Every expiry is judged in the statement by the server's clock,
// UTC_TIMESTAMP(6), never by a client's: clients whose clocks disagree see
// one lock. MySQL evaluates it once per statement, at its start, so an
// expiry the server sets is never later than the client's own start plus
// the TTL, and neither the session's time zone nor daylight saving time
// moves it.
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
// so each takes one round trip. A *sql.DB keeps only 2 idle connections
// unless told otherwise: give it SetMaxIdleConns near its concurrency, as
// Open does (64).
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
// 10 attempts, while the caller waits. Only then does the call fail, with
// ErrContention. A deadlock never yields a wrong grant: a grant is what a
// committed row says.
//
// # Failures
//
// Every call returns once its context ends, even while the server has not
// answered. The statements do not run on the caller's context: the driver
// would close the connection on cancellation, and the server may still
// apply the statement after that, too late for anyone to undo it. They run
// on a context without the caller's cancellation, bounded by a minute, so
// that they reach an outcome; an Acquire whose caller left is then undone:
// a grant is released, owner-checked, and a transaction that sees its
// caller gone rolls back instead of committing. The caller gets an error
// wrapping stores.ErrAbandoned and the context's error.
//
// A COMMIT whose reply is lost (the connection breaks) leaves the outcome
// unknown: Acquire returns the driver's error, which the Locker treats as a
// possible grant and releases, owner-checked. Connections that break change
// nothing else: the lease is a row, so Refresh and Release work from any
// other connection. When the server cannot be reached at all, calls fail
// with an error wrapping stores.ErrUnreachable, Refresh too, so a Locker's
// watchdog ends the holder's context (reqlock.ErrLockLost) once the lock's
// validity runs out.
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
package mysqlstore
