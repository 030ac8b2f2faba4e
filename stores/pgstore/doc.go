// Package pgstore is a stores.Store on PostgreSQL (11 or later) through
// pgx v5 (github.com/jackc/pgx/v5), a stores.Notifier, a
// stores.SharedStore and a stores.RecordStore.
//
// # Mechanism: a lease row per key
//
// A lock is a row of a table the store owns, one row per key:
//
//	CREATE TABLE IF NOT EXISTS reqlock_locks (
//		key           bytea PRIMARY KEY,
//		token         bytea,          -- the holder's token; NULL when released
//		expires_at    timestamptz,    -- end of the holder's lease, by the server's clock
//		fence         bigint NOT NULL, -- the key's last fence; survives release and expiry
//		watched_until timestamptz     -- a waiter listens for the key's release until then
//	)
//
// A key is held while its token is set and expires_at is after the server's
// clock_timestamp(). Acquire is one upsert, INSERT ... ON CONFLICT (key) DO
// UPDATE, that takes the row only when it is free, expired or already holds
// the caller's token; Release sets token and expires_at to NULL, and
// Refresh moves expires_at, both only where the row still holds the
// caller's unexpired token. Expiry is judged by the server's clock alone,
// as Redis judges a PX TTL: the clocks of the processes that lock do not
// matter, and no connection is pinned to a lock, so a lock outlives the
// connection that took it (a dropped connection does not free it; its TTL
// does) and a pool of a few connections serves any number of locks.
//
// Session advisory locks (pg_try_advisory_lock) were the alternative. They
// were not chosen: they live on the connection that took them, so every
// held lock pins a connection (50 concurrent holders, 50 connections) and
// a TTL, a kept release (keep) and a lease that survives a reconnect cannot
// be had; they take a bigint, so keys must be hashed and two keys sharing a
// hash would block each other; and a fence still needs a table.
//
// # Why pgx and not database/sql
//
// Release notification needs a connection that waits for LISTEN/NOTIFY
// messages (pgx's WaitForNotification), which database/sql cannot express;
// pgx also runs several statements in one round trip as one implicit
// transaction (a batch, used for the all-or-nothing multi-key calls), sends
// bytea arrays natively, and exposes SQLSTATE codes (*pgconn.PgError).
//
// # Isolation and serialization failures
//
// Each call is one statement, or two or three statements in one implicit
// transaction that locks rows in key order, meant to run at READ COMMITTED:
// Open sets default_transaction_isolation on its connections, whatever the
// server's default, and the PostgreSQL default is READ COMMITTED for the
// pool given to New. Such statements cannot fail with 40001
// (serialization_failure), which only REPEATABLE READ and SERIALIZABLE
// raise; this is what cirello.io/pglock's SERIALIZABLE transactions hit
// under load (its issues 26 and 29). Rows are locked in one order (sorted
// keys), so the store's statements do not deadlock each other either.
// Should a 40001 or 40P01 (deadlock_detected) still come back (a pool whose
// connections run at SERIALIZABLE, a program of its own locking rows of
// the table), the transaction was rolled back and changed nothing, and the
// call runs again after a random pause of up to 5ms, until its context
// ends.
//
// # Fencing
//
// A grant's fence is greatest(last fence + stores.FenceStride, the server's
// clock in microseconds since 1970) and becomes the row's fence. The row
// survives release and expiry, and PostgreSQL keeps it across restarts, so
// fences grow by at least the stride per grant. The clock term makes a new
// row (first use, a row purged (see Purge) or deleted by hand, or a new
// table) start above
// every fence an earlier row could have issued, as long as fences did not
// run ahead of the clock (a key granted more than about a thousand times a
// second) and the server's clock does not step back. With
// synchronous_commit=off a crash can lose the last commits (grants) of
// under a second; their fences are then issued again only for a key whose
// fences ran ahead of the clock.
//
// # Purge
//
// Rows of keys no longer used are deleted by a purge, run by a goroutine of
// the Store every hour (WithPurge: its interval, and a retention of 24h by
// default, a minute at least; Close stops it and ends a purge in flight) or
// by Purge. It deletes, in statements of up to 500 keys:
//   - the lease rows that are released, or expired for the retention,
//     whose fence the server clock has passed by the retention
//     (fence + stores.FenceStride at most the clock in microseconds less the
//     retention: the key was last granted longer ago than that), that are
//     not watched (watched_until past; see Release notification) and have
//     no row left in the holders table: never a held key, a key held shared,
//     a claim or a live record, whose rows hold a token and an expiry to
//     come;
//   - the expired holders and waiting-writer records of every key (see
//     Shared and limited grants), whether the key is used again or not;
//   - expired idempotency records (see Idempotency records).
//
// A purged key's next grant creates its row again and draws its fence from
// the clock (greatest(0 + stride, the clock): the statement found no row).
// The purge deleted the row only when its fence plus the stride was at most
// its own clock reading less the retention, so the new fence is a stride
// above every fence the row held as long as the grant reads the clock less
// than the retention before the purge did: the server's clock did not step back by
// more than the retention in between (MinRetention, a minute, covers slewing
// and small steps), and the grant's statement, which read the clock when it
// began, did not wait for the purge's row lock longer than that (the
// purge's statement holds it for one statement).
//
// The purge locks lease rows in key order, as every statement does, with
// FOR UPDATE SKIP LOCKED, and then the expired holder rows of the keys it
// locked, SKIP LOCKED too: it waits for no lock, so it cannot deadlock with
// the Store's statements nor stall behind a grant in progress, and a row it
// skipped waits for the next purge. It deletes a key's holders only while it
// holds the key's lease row, which AcquireShared locks before it counts
// them, so it never changes a count in progress, and it judges a lease row
// on the row's latest version, which PostgreSQL reads again when it locks a
// row changed since the statement began: a row granted meanwhile stays. The
// purge finds the rows by a search of the lease table in key order, which
// computes the SHA-256 of every key to look up its holders (the holders
// table is keyed by the key's digest): a read of the table per run. Holder
// rows whose lease row is gone (deleted by hand) are not found. The role
// needs DELETE on the lease table.
//
// # Limits
//
// The Store states them as stores.Bounds (Bounds), and refuses arguments
// beyond them with stores.ErrInvalid before any statement, as the Locker
// does before it calls the Store. A key is at most what one entry of the
// primary key's btree holds: 2692 bytes with PostgreSQL's 8 kB pages (New
// reads block_size and computes it); a longer key that compresses below the
// entry limit would fit, but a random one does not, and the server would
// refuse it (SQLSTATE 54000, which the Store reports as stores.ErrInvalid
// too). Indexing a digest of the key would lift the limit, at the price of
// a primary key that existing tables do not have. Every TTL from 1ns to
// math.MaxInt64 is honoured, rounded up to the server clock's microsecond:
// 292 years stay far within timestamptz (to the year 294276) and an
// interval's 64-bit microseconds. Tokens and the number of keys of a call
// are not limited.
//
// # Several keys
//
// Acquire with several keys runs three statements in one round trip and one
// implicit transaction: the first creates missing rows and locks every row
// in key order, unless its snapshot shows a key held by another token (so a
// refusal does not wait for a grant in progress before it knows the key is
// held); the second takes them all, only when the first locked every row
// (it says so in the transaction-local setting reqlock.locked) and none is
// held by another token; the third reads the holders of a refusal and
// marks them watched, locking the rows in key order too. Refresh with
// several keys locks the rows in key order (SELECT ... FOR UPDATE) before
// it moves their leases, only when every key holds the token. Release
// frees each key that holds the token, in one statement, after locking the
// rows in key order when there are several.
//
// Every statement that locks several rows locks them in key order: an
// UPDATE of several rows would lock them in the order of its scan, and two
// transactions locking two rows in opposite orders wait for each other
// until PostgreSQL's deadlock check, deadlock_timeout (1s by default)
// later, rolls one back. Under contention the rolled-back call, run again,
// formed the next such cycle, so that an Acquire of a few keys could wait
// several seconds.
//
// # Release notification
//
// A plain release of a watched key sends NOTIFY (pg_notify) in the
// statement of the release, on the channel named like the table, with the
// hex SHA-256 of the key as payload; PostgreSQL delivers it once the release
// commits, in commit order. A key is watched for 30 seconds after an
// acquire was refused it (the refusal marks it, in the same statement) or a
// Store subscribed to it (NotifyRelease marks it in the background, and
// again every 10 seconds while subscribed). Releases of keys nobody waits
// for notify nothing: a transaction that notifies holds a database-wide lock
// from its NOTIFY to its commit, and notifying every release serialized all
// of them.
//
// The Store listens on one dedicated connection, opened by the first
// NotifyRelease, and hands each notification to the subscribers of its key;
// it pings the server when the connection has been idle for 15 seconds.
// Signals are hints: one sent while the listening connection is down is
// lost (the connection is redialled), one sent before a key's mark is
// committed is not sent, and an expiry sends none, so waiters keep a
// fallback poll capped by the holder's remaining TTL.
//
// # Fair mode
//
// Store does not implement stores.FairStore. A FIFO queue per key would
// need a queue table with a lease per waiter, written by every attempt of
// every waiter; the Locker's local queue already orders the waiters of one
// process, and the lease row grants across processes in no set order.
//
// # Failures
//
// What the Store survives, each checked by its tests against a real server
// (the conformance suite's Faults group, through a fault proxy, and the
// package's own) except the restart, which follows from rows on disk: a lost
// connection (the lease is a row, any connection refreshes or releases it);
// a server restart (rows are on disk); a reply lost or late, a server
// paused past the caller's wait or past the call limit, a connection cut
// after the request, and a request held up in the network until after the
// call gave up on it (an abandoned Acquire is undone: the key is free soon
// after the fault ends, within the suite's 3 seconds, not at the end of its
// TTL, and the late request grants nothing; see Contexts and unknown
// outcomes); a holder cut off from the server (its key expires after its
// TTL, not before); a stale holder's Refresh or Release after its key
// passed to another token (ErrNotHeld); a Refresh racing the Release of its
// grant (it never takes the key back); and the server's clock stepping back
// (a released key's token is NULL, free whatever the clock says; keys held
// then are held longer by the step). A step forward of the server's clock
// past a holder's remaining TTL lets another take the key while the
// holder's validity runs: keep the server's clock slewed, not stepped, as
// for any lease judged by a server's clock.
//
// # Contexts and unknown outcomes
//
// Every call returns once its context ends. An Acquire runs its statement
// on a context of its own, bounded by the call limit (WithCallLimit,
// default 5s) rather than by the caller's, so that a grant the server made
// after the caller left is seen, and released, owner-checked, once the
// statement returns; the caller gets an error wrapping stores.ErrAbandoned
// and the context's error.
//
// A statement that got no answer within the call limit, or whose
// connection broke, may still apply: pgx closes the connection without a
// cancel request, and the server runs what it has received, or receives
// late (a request held up in the network). A release sent then could land
// before it. So the Store first ends the session that carried the statement
// (pg_terminate_backend, on another connection, named by the backend's pid
// and start time), waits until the server shows it gone, so that nothing of
// the statement can apply any more, and only then releases the keys,
// owner-checked. It tries both again, after a pause of up to a second,
// while they fail (a server still unreachable), until they land, a grant
// the statement could have made has expired (its TTL after the session
// ended), or the Store is closed; at most two such undos run at a time. A
// caller still waiting gets an error wrapping stores.ErrAbandoned (with
// context.DeadlineExceeded past the call limit) once the undo has landed or
// its context has ended, so that it does not release the keys itself.
//
// Ending a session needs the privilege to signal the server processes of
// the Store's role, which every role has for its own, non-superuser
// sessions. Behind a pooler that runs a connection's statements on server
// connections of its own (PgBouncer in transaction mode), the session of a
// statement cannot be named (the pid the server reports is not the
// connection's), nor, without the privilege, ended: the Store then releases
// the keys, tried again until it lands, and a request that reaches the
// server after that release can still hold its key for its TTL.
//
// Release and Refresh end their statement with the context; their outcome
// is then unknown. A call that failed to connect returns an error wrapping
// stores.ErrUnreachable: it changed nothing. Calls after Close return
// ErrClosed; Close waits for the acquires in flight and gives each undo
// still owed one more try, both within the call limit.
//
// # Shared and limited grants
//
// The holders of a key held shared (stores.SharedStore) are rows of a second
// table beside the lease table, named after it (reqlock_locks_holders; a
// name that would pass 63 bytes becomes reqlock_holders_ and a digest):
//
//	CREATE TABLE IF NOT EXISTS reqlock_locks_holders (
//		key_sum    bytea NOT NULL,        -- SHA-256 of the key
//		writer     boolean NOT NULL,      -- a waiting writer's record, not a holder
//		token_sum  bytea NOT NULL,        -- SHA-256 of the token
//		expires_at timestamptz NOT NULL,  -- its own expiry, by the server's clock
//		PRIMARY KEY (key_sum, writer, token_sum)
//	)
//
// While a key has holders its lease row holds a marker as its token (a NUL
// byte and "reqlock:shared": tokens that start with a NUL byte are reserved
// for such values, and refused: Acquire and ClaimRecord answer
// stores.ErrInvalid, Release and Refresh stores.ErrNotHeld, before any
// statement), the longest holder's expiry and the key's fence, so that
// Acquire, unchanged, reads the key as held, and grants of either kind draw
// their fences from the row's one sequence. AcquireShared is one round trip:
// an implicit transaction that creates and locks the lease row, deletes the
// key's expired holders, and grants or refuses in one statement at one
// reading of the clock; ReleaseShared and RefreshShared lock the lease row,
// change their place and set the row's expiry to the longest place left (or
// free it), also in one round trip. The limit is thus counted under the
// lease row's lock. On the test machine (PostgreSQL on localhost, one
// caller, a loaded 2-core machine) an AcquireShared and ReleaseShared pair
// took 1.3-1.8 ms, against 0.8 ms for Acquire and Release.
//
// A waiting writer (stores.WriterWindow) is a row of the holders table per
// token, written by an Acquire refused by holders (acquireOne returns
// whether the holder is the marker; one statement more, on such refusals
// only). The Store notes the records it made, and ends a token's record,
// with one statement more, when it grants the key to that token or the
// token releases it (a withdrawal, which also notifies the key's waiters):
// other grants and releases pay nothing. A record made through another
// Store, or before a restart, ends at its expiry, at most WriterWindow
// after the writer's last refusal.
//
// A freed place, by release or by an expiry that AcquireShared cleans up,
// notifies a watched key as a release does. Expired holders of a key are
// deleted by its next AcquireShared, or by the purge (see Purge), which
// notifies nothing (an expiry sends no signal); so are the expired records
// of waiting writers.
//
// An existing deployment keeps its lease table as it is: the first call of
// this version creates the holders table beside it (the role needs CREATE
// on the schema again, and SELECT, INSERT, UPDATE and DELETE on the new
// table). A process of an older version reads a key held shared as held by
// a token it does not know, so mixed versions exclude each other; it just
// records no waiting writer.
//
// # Idempotency records
//
// A record key's claim is a plain lease row: ClaimRecord runs Acquire's
// upsert, with its fence, abandon and undo machinery, and, in the same
// round trip and implicit transaction, a read of the key's record. A
// finished record lives in two places, written by FinishRecord in one
// statement that requires the token's unexpired claim: the key's lease
// row, whose token becomes the record's owner (a NUL byte,
// "reqlock:record:" and the SHA-256 of the finishing token; no caller's
// token starts with a NUL byte, see above) and whose expiry becomes the end of the retention; and a row of
// a third table beside the lease table, named after it
// (reqlock_locks_records; a name past 63 bytes becomes reqlock_records_
// and a digest):
//
//	CREATE TABLE IF NOT EXISTS reqlock_locks_records (
//		key         bytea PRIMARY KEY,
//		fingerprint bytea NOT NULL,
//		response    bytea NOT NULL,
//		fence       bigint NOT NULL,
//		expires_at  timestamptz NOT NULL -- the lease row's, indexed for the purge
//	)
//
// The state lives in the lease row, so that a claim and a record exclude
// each other under its row lock, and Acquire, Release and Refresh, which
// see a token no caller has, leave a record alone until its retention ends;
// the fields live in their own table, so that the lease table keeps its
// schema (no migration) and its rows their size. ClaimRecord's read runs
// after its upsert with a snapshot of its own: a finish that the upsert
// waited for is seen. A claim refused by a record returns it in the same
// round trip; FinishRecord notifies a watched key's waiters, as a release
// does.
//
// Records are kept up to MaxRecordBytes (half of PostgreSQL's 1 GB limit on
// a field and on a message) for any retention the TTLs allow. Expired
// records are deleted by FinishRecord itself: the same round trip deletes
// up to 4 expired records, the earliest first, taking only records no
// other call has locked, and whose lease row no other call has locked (a
// claim that may read the record), so that it waits for nothing (SKIP
// LOCKED). Every finish deletes more than it adds, so expired records do
// not outnumber what expired since the previous finishes, and stay bounded
// while records are written; those left when writing stops are deleted by
// the next finishes or the purge (see Purge). The lease row of an expired
// record stays, free to any claim, until the purge deletes it, as any free
// row, once its fence is behind the clock by the retention; the key's next
// claim then draws its fence from the clock. The role needs CREATE on the
// schema the first time again, and SELECT, INSERT, UPDATE and DELETE on
// both tables.
//
// # The table
//
// New creates the table with CREATE TABLE IF NOT EXISTS, named by WithTable
// (default DefaultTable): lower-case letters, digits and underscores,
// starting with a letter or underscore, at most 63 bytes, optionally
// qualified by a schema of the same form. The role needs CREATE on the
// schema the first time, and SELECT, INSERT, UPDATE and DELETE (for the
// purge) on the table.
//
// # Start-up
//
// Open and New create the table and read the page size, and Open fails,
// naming the address, when the server cannot be reached within 5s
// (DefaultConnectTimeout) or its context's deadline. With connect=lazy in the
// URL (WithLazyConnect) they send nothing: calls fail with store errors
// until the server answers, and the first call that reaches it creates the
// table; until then Bounds assume 8 kB pages.
package pgstore
