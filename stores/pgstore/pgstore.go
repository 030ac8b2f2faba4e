// Package pgstore is a stores.Store on PostgreSQL (11 or later) through
// pgx v5 (github.com/jackc/pgx/v5), and a stores.Notifier.
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
// row (first use, or a row deleted by hand, or a new table) start above
// every fence an earlier row could have issued, as long as fences did not
// run ahead of the clock (a key granted more than about a thousand times a
// second) and the server's clock does not step back. With
// synchronous_commit=off a crash can lose the last commits (grants) of
// under a second; their fences are then issued again only for a key whose
// fences ran ahead of the clock.
//
// Rows are never deleted: a row per key ever locked stays (about 100 bytes
// plus the key). Deleting free rows (token IS NULL OR expires_at <
// clock_timestamp()) is safe for keys whose fences follow the clock (see
// above).
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
// # The table
//
// New creates the table with CREATE TABLE IF NOT EXISTS, named by WithTable
// (default DefaultTable): lower-case letters, digits and underscores,
// starting with a letter or underscore, at most 63 bytes, optionally
// qualified by a schema of the same form. The role needs CREATE on the
// schema the first time, and SELECT, INSERT and UPDATE on the table.
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

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reqlock/reqlock/internal/storeargs"
	"github.com/reqlock/reqlock/internal/undoqueue"
	"github.com/reqlock/reqlock/stores"
)

// args checks the arguments of Store's methods; its errors start "pgstore:".
const args storeargs.Checker = "pgstore"

// DefaultTable is the table a Store uses unless WithTable names another.
const DefaultTable = "reqlock_locks"

// DefaultCallLimit is the call limit of a Store unless WithCallLimit sets
// another.
const DefaultCallLimit = 5 * time.Second

var (
	// ErrUnexpectedReply means the server answered in a shape this package
	// does not expect, such as a table of the same name made by another
	// program.
	ErrUnexpectedReply = errors.New("pgstore: unexpected reply from PostgreSQL")

	// ErrClosed means the Store was closed.
	ErrClosed = errors.New("pgstore: store closed")
)

// tableName is what WithTable accepts: an identifier, optionally qualified
// by a schema, each of lower-case letters, digits and underscores.
var tableName = regexp.MustCompile(`^([a-z_][a-z0-9_]{0,62}\.)?[a-z_][a-z0-9_]{0,62}$`)

// Store is a stores.Store on PostgreSQL, and a stores.Notifier. It is safe
// for concurrent use. Once NotifyRelease has been called it owns a
// listening connection and a goroutine until Close; while it owes the undo
// of abandoned acquires, up to two goroutines more.
type Store struct {
	pool     *pgxpool.Pool
	ownsPool bool   // Open made the pool; Close closes it
	table    string // validated, as written in SQL
	channel  string // NOTIFY channel: the table name

	sql statements

	bounds atomic.Pointer[stores.Bounds] // from the server's page size; see Bounds

	lazy      bool          // WithLazyConnect: New leaves setup to the first call
	setupTurn chan struct{} // held by the one call that runs setup
	ready     atomic.Bool   // setup succeeded

	callLimit time.Duration // see WithCallLimit

	background sync.WaitGroup          // acquires in flight, detached from their callers
	undo       *undoqueue.Queue[*debt] // the undo of acquires whose callers left
	abandoned  atomic.Int64            // undos owed so far, for tests

	mu     sync.Mutex // guards notify and closed, and background.Add
	notify *listener  // nil until the first NotifyRelease
	closed bool
}

var (
	_ stores.Store    = (*Store)(nil)
	_ stores.Notifier = (*Store)(nil)
	_ stores.Bounded  = (*Store)(nil)
)

// Option configures a Store.
type Option func(*Store)

// WithTable sets the table the Store keeps its locks in, created by New
// when missing. Default DefaultTable. See The table in the package
// documentation for the names it accepts.
func WithTable(name string) Option {
	return func(s *Store) { s.table = name }
}

// WithCallLimit sets the call limit: the longest an Acquire's statement
// runs, whatever its caller's context, and each try of the undo of an
// acquire whose caller left (see Contexts and unknown outcomes in the
// package documentation). An Acquire with no answer within it returns an
// error wrapping stores.ErrAbandoned, and the Store undoes it. Close takes
// up to twice the limit. Default DefaultCallLimit; New refuses a limit that
// is not positive.
func WithCallLimit(d time.Duration) Option {
	return func(s *Store) { s.callLimit = d }
}

// WithLazyConnect makes New send nothing: the first call that reaches the
// server creates the table and reads the page size, as New would have, and
// calls fail with store errors until one does (a problem with the table is
// that call's error). Until then Bounds assumes PostgreSQL's default 8 kB
// pages. Open's connect=lazy sets it.
func WithLazyConnect() Option {
	return func(s *Store) { s.lazy = true }
}

// New returns a Store over pool and creates its table when missing. The
// caller keeps the pool and closes it after the Store. The pool's
// connections should run at READ COMMITTED (the default); Open sets that
// whatever the server's default. New reads the server's page size, which
// sets the longest key (see Bounds); WithLazyConnect leaves both to the
// first call. New returns an error wrapping stores.ErrInvalid when pool is
// nil or the table name is invalid, and the server's error when the table
// cannot be created.
func New(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pgstore: pool is nil", stores.ErrInvalid)
	}
	s := &Store{pool: pool, table: DefaultTable, callLimit: DefaultCallLimit, setupTurn: make(chan struct{}, 1)}
	for _, opt := range opts {
		opt(s)
	}
	if !tableName.MatchString(s.table) {
		return nil, fmt.Errorf("%w: pgstore: table name %q is not lower-case letters, digits and "+
			"underscores (at most 63, not starting with a digit), optionally schema-qualified", stores.ErrInvalid, s.table)
	}
	if s.callLimit <= 0 {
		return nil, fmt.Errorf("%w: pgstore: call limit %v is not positive", stores.ErrInvalid, s.callLimit)
	}
	s.undo = undoqueue.New(s.settle, s.callLimit)
	s.channel = channelOf(s.table)
	s.sql = newStatements(s.table)
	s.setBounds(defaultBlockSize)
	if s.lazy {
		return s, nil
	}
	if err := s.setup(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// defaultBlockSize is PostgreSQL's default page size, which Bounds assumes
// until the Store has read the server's.
const defaultBlockSize = 8192

// setBounds sets Bounds for pages of blockSize bytes.
func (s *Store) setBounds(blockSize int) {
	s.bounds.Store(&stores.Bounds{
		MaxKeyBytes: maxKeyBytes(blockSize),
		Reason:      fmt.Sprintf("PostgreSQL's btree entry limit for pgstore's primary key on the key (a third of a %d-byte page)", blockSize),
	})
}

// setup creates the table unless it exists and reads the server's page
// size, once: a failure is returned, and tried again by the next call. One
// call at a time runs it; the others wait for it, or return when their
// context ends.
func (s *Store) setup(ctx context.Context) error {
	if s.ready.Load() {
		return nil
	}
	select {
	case s.setupTurn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.setupTurn }()
	if s.ready.Load() {
		return nil
	}
	if err := s.createTable(ctx); err != nil {
		return err
	}
	var blockSize int
	if err := s.pool.QueryRow(ctx, `SELECT current_setting('block_size')::int`).Scan(&blockSize); err != nil {
		return fmt.Errorf("pgstore: reading the server's block_size: %w", classify(err))
	}
	s.setBounds(blockSize)
	s.ready.Store(true)
	return nil
}

// Bounds returns the keys and durations the Store honours: keys up to the
// longest a btree entry of the table's primary key holds (2692 bytes with
// PostgreSQL's 8 kB pages; longer keys that compress below it would fit,
// but a random one does not), and every duration from 1ns, rounded up to
// the server clock's microsecond, to math.MaxInt64: 292 years, far within
// timestamptz (to the year 294276) and an interval's 64-bit microseconds.
// It implements stores.Bounded.
func (s *Store) Bounds() stores.Bounds { return *s.bounds.Load() }

// maxKeyBytes returns the length of the longest key that the table's
// primary key indexes on a server whose pages are blockSize bytes, whatever
// its bytes (an incompressible key). A btree entry (version 4, PostgreSQL
// 12 and later; version 3 allows 8 bytes more) holds at most a third of
// what a page leaves after its headers, less a heap pointer, each rounded
// to the 8-byte alignment; the entry of a key is an 8-byte tuple header, a
// 4-byte bytea header and the key, rounded up to the alignment. With 8 kB
// pages: 2704 bytes an entry, 2692 a key.
func maxKeyBytes(blockSize int) int {
	const (
		align            = 8
		pageHeader       = 24 // SizeOfPageHeaderData
		itemID           = 4  // ItemIdData: a page holds at least 3 entries
		btreeSpecial     = 16 // BTPageOpaqueData
		heapPointer      = 6  // ItemPointerData
		indexTupleHeader = 8  // IndexTupleData
		varlenaHeader    = 4  // a bytea over 126 bytes
	)
	up := func(n int) int { return (n + align - 1) &^ (align - 1) }
	down := func(n int) int { return n &^ (align - 1) }
	entry := down((blockSize-up(pageHeader+3*itemID)-up(btreeSpecial))/3) - up(heapPointer)
	return entry - indexTupleHeader - varlenaHeader
}

// createTable creates the table unless it exists. Two sessions creating
// the same table at once may collide in the catalogue (SQLSTATE 23505 or
// 42P07) although both said IF NOT EXISTS; the loser finds it made.
func (s *Store) createTable(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, s.sql.create)
	if err != nil && (sqlState(err) == "23505" || sqlState(err) == "42P07") {
		_, err = s.pool.Exec(ctx, s.sql.create)
	}
	if err != nil {
		return fmt.Errorf("pgstore: creating table %s: %w", s.table, classify(err))
	}
	return nil
}

// Table returns the name of the Store's table.
func (s *Store) Table() string { return s.table }

// Close stops the listening connection of NotifyRelease, if any, waits for
// the acquires in flight (each bounded by the call limit), gives the undo
// of every acquire whose caller left one more try, within the call limit,
// and closes the pool when Open made it; an undo that fails then is given
// up, and its grant, if any, held until its TTL ends. Calls after Close
// return ErrClosed. Close returns nil; later calls do nothing.
func (s *Store) Close() error {
	s.mu.Lock()
	l := s.notify
	s.notify = nil
	already := s.closed
	s.closed = true
	s.mu.Unlock()
	if already {
		return nil
	}
	if l != nil {
		l.close()
	}
	s.background.Wait()
	s.undo.Close(s.callLimit)
	if s.ownsPool {
		s.pool.Close()
	}
	return nil
}

// begin counts an acquire in, unless the Store is closed: under the lock
// that Close takes to close it, so that Close's wait never meets a call
// counted in after it began.
func (s *Store) begin() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.background.Add(1)
	return true
}

// isClosed reports whether Close has begun.
func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Acquire sets every key to token for ttl when none is held by another
// token, and issues each key its next fence (see Fencing in the package
// documentation), in one round trip. When a key is held it changes nothing
// and returns a Grant with OK false, Held the index of the first held key
// and Wait its remaining lease. A key that already holds token (a retried
// call whose reply was lost) is granted again with a fresh fence and TTL.
//
// It returns an error wrapping stores.ErrInvalid for no keys, an empty,
// duplicate, unsorted or too long key (see Bounds), or a non-positive ttl,
// before any statement, or when the server refuses a key as beyond its
// limits (SQLSTATE 54000); ctx.Err() without acting when ctx has ended;
// ErrClosed after Close; an error wrapping stores.ErrAbandoned and ctx's
// error when ctx ended while the statement was in flight, and one wrapping
// stores.ErrAbandoned when the statement's outcome is unknown (no answer
// within the call limit, or a connection lost): the Store then undoes what
// the statement granted or may yet grant (see Contexts and unknown outcomes
// in the package documentation); one wrapping stores.ErrUnreachable when no
// connection could be made; and the server's error otherwise.
func (s *Store) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return stores.Grant{}, err
	}
	if err := args.CheckBounds(s.Bounds(), keys, ttl); err != nil {
		return stores.Grant{}, err
	}
	if s.isClosed() {
		return stores.Grant{}, ErrClosed
	}
	if err := s.setup(ctx); err != nil {
		return stores.Grant{}, err
	}
	bkeys := byteKeys(keys)
	return s.detached(ctx, keys, token, ttl, func(ctx context.Context, a *attempt) (stores.Grant, error) {
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return stores.Grant{}, err // nothing sent
		}
		defer conn.Release()
		if a.sess, err = sessionOf(ctx, conn); err != nil {
			return stores.Grant{}, err // the acquire not sent
		}
		var g stores.Grant
		if len(keys) == 1 {
			g, err = s.acquireOne(ctx, conn, bkeys[0], token, ttl)
		} else {
			g, err = s.acquireAll(ctx, conn, bkeys, token, ttl)
		}
		settled(a, err, conn.Conn().IsClosed())
		return g, err
	})
}

// acquireOne is Acquire of one key on conn: one upsert.
func (s *Store) acquireOne(ctx context.Context, conn *pgxpool.Conn, key []byte, token string, ttl time.Duration) (stores.Grant, error) {
	return retrying(ctx, func(ctx context.Context) (stores.Grant, error) {
		var (
			granted   bool
			fence     int64
			remaining int64
		)
		err := conn.QueryRow(ctx, s.sql.acquireOne, key, []byte(token), micros(ttl), int64(stores.FenceStride)).
			Scan(&granted, &fence, &remaining)
		if err != nil {
			return stores.Grant{}, err
		}
		if granted {
			return stores.Grant{OK: true, Fences: []int64{fence}}, nil
		}
		return stores.Grant{Wait: waitOf(remaining)}, nil
	})
}

// acquireAll is Acquire of several keys on conn: three statements in one
// implicit transaction and one round trip. The first locks every row in key
// order (creating the missing ones) unless a key is seen held; the second
// takes them all when none is held by another token; the third reads the
// holders, for a refusal, and marks them watched.
func (s *Store) acquireAll(ctx context.Context, conn *pgxpool.Conn, keys [][]byte, token string, ttl time.Duration) (stores.Grant, error) {
	return retrying(ctx, func(ctx context.Context) (stores.Grant, error) {
		batch := &pgx.Batch{}
		batch.Queue(s.sql.lockAll, keys, []byte(token))
		batch.Queue(s.sql.acquireAll, keys, []byte(token), micros(ttl), int64(stores.FenceStride))
		batch.Queue(s.sql.holders, keys, []byte(token))
		res := conn.SendBatch(ctx, batch)
		defer res.Close()
		if _, err := res.Exec(); err != nil {
			return stores.Grant{}, err
		}
		rows, err := res.Query()
		if err != nil {
			return stores.Grant{}, err
		}
		fences := make(map[string]int64, len(keys))
		var (
			key       []byte
			fence     int64
			remaining int64
		)
		if _, err := pgx.ForEachRow(rows, []any{&key, &fence}, func() error {
			fences[string(key)] = fence
			return nil
		}); err != nil {
			return stores.Grant{}, err
		}
		if rows, err = res.Query(); err != nil {
			return stores.Grant{}, err
		}
		var (
			holder     []byte // the first key held by another token
			holderLeft int64  // its remaining lease in microseconds
		)
		if _, err := pgx.ForEachRow(rows, []any{&key, &remaining}, func() error {
			if holder == nil {
				holder, holderLeft = bytes.Clone(key), remaining
			}
			return nil
		}); err != nil {
			return stores.Grant{}, err
		}
		if err := res.Close(); err != nil {
			return stores.Grant{}, err
		}
		switch {
		case len(fences) == len(keys):
			g := stores.Grant{OK: true, Fences: make([]int64, len(keys))}
			for i, k := range keys {
				f, ok := fences[string(k)]
				if !ok {
					return stores.Grant{}, fmt.Errorf("%w: no fence for %s", ErrUnexpectedReply, stores.KeyForMessage(string(k)))
				}
				g.Fences[i] = f
			}
			return g, nil
		case len(fences) != 0:
			return stores.Grant{}, fmt.Errorf("%w: %d of %d keys granted", ErrUnexpectedReply, len(fences), len(keys))
		case holder == nil:
			// The holder's lease ran out between the statements' clocks.
			return stores.Grant{Held: 0, Wait: time.Microsecond}, nil
		}
		return stores.Grant{Held: slices.IndexFunc(keys, func(k []byte) bool { return bytes.Equal(k, holder) }),
			Wait: waitOf(holderLeft)}, nil
	})
}

// Release ends token's grant on every key that still holds it, in one
// statement; with several keys, after one that locks their rows in key
// order, in the same round trip and implicit transaction. With keep zero or
// negative it frees the key and notifies its release (see Release
// notification in the package documentation); with keep positive it sets
// the key's lease to end keep from now instead and notifies nothing, since
// the key stays held.
//
// It returns an error wrapping stores.ErrNotHeld, naming the keys, when some
// keys were absent, expired or held another token, after ending the grant
// on the others. It returns an error wrapping stores.ErrInvalid for no keys
// or an empty, duplicate, unsorted or too long key (see Bounds), before any
// statement; ctx.Err() without acting when ctx has ended; ErrClosed after
// Close; one wrapping stores.ErrUnreachable when no connection could be
// made; and the server's error, or ctx's when it ended in flight, otherwise.
func (s *Store) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	if err := args.CheckRelease(ctx, keys); err != nil {
		return err
	}
	var durations []time.Duration
	if keep > 0 {
		durations = append(durations, keep)
	}
	if err := args.CheckBounds(s.Bounds(), keys, durations...); err != nil {
		return err
	}
	if s.isClosed() {
		return ErrClosed
	}
	if err := s.setup(ctx); err != nil {
		return err
	}
	return s.release(ctx, keys, token, keep)
}

// release is Release without the checks, for the undo of an acquire, which
// Close gives a last try.
func (s *Store) release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	bkeys := byteKeys(keys)
	released, err := retrying(ctx, func(ctx context.Context) (int, error) {
		batch := &pgx.Batch{}
		if len(keys) > 1 {
			// An UPDATE locks rows in the order of its scan, not the keys'.
			batch.Queue(s.sql.lockHeld, bkeys)
		}
		if keep > 0 {
			batch.Queue(s.sql.releaseKeep, bkeys, []byte(token), micros(keep))
		} else {
			batch.Queue(s.sql.release, bkeys, []byte(token), s.channel)
		}
		res := s.pool.SendBatch(ctx, batch)
		defer res.Close()
		if len(keys) > 1 {
			if _, err := res.Exec(); err != nil {
				return 0, err
			}
		}
		rows, err := res.Query()
		if err != nil {
			return 0, err
		}
		var n int
		for rows.Next() {
			n++ // a key released; the other column, if any, is pg_notify's void
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, err
		}
		return n, res.Close()
	})
	if err != nil {
		return endedErr(ctx, err)
	}
	if released != len(keys) {
		return fmt.Errorf("%w: pgstore: %d of %d keys, from %s", stores.ErrNotHeld, len(keys)-released, len(keys), stores.KeyForMessage(keys[0]))
	}
	return nil
}

// Refresh resets the lease of every key to ttl from now if each still holds
// token; when one does not, it changes nothing and returns an error wrapping
// stores.ErrNotHeld. Several keys are locked in key order first, in the same
// round trip and implicit transaction, so that the check and the update see
// one state. A lost connection does not lose the lock: Refresh takes a new
// one from the pool and finds the row; a server that lost the row answers
// stores.ErrNotHeld.
//
// It returns an error wrapping stores.ErrInvalid for no keys, an empty,
// duplicate, unsorted or too long key (see Bounds), or a non-positive ttl,
// before any statement; ctx.Err() without acting when ctx has ended;
// ErrClosed after Close; one wrapping stores.ErrUnreachable when no
// connection could be made; and the server's error, or ctx's when it ended
// in flight, otherwise.
func (s *Store) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return err
	}
	if err := args.CheckBounds(s.Bounds(), keys, ttl); err != nil {
		return err
	}
	if s.isClosed() {
		return ErrClosed
	}
	if err := s.setup(ctx); err != nil {
		return err
	}
	bkeys := byteKeys(keys)
	refreshed, err := retrying(ctx, func(ctx context.Context) (int64, error) {
		if len(keys) == 1 {
			tag, err := s.pool.Exec(ctx, s.sql.refreshOne, bkeys, []byte(token), micros(ttl))
			return tag.RowsAffected(), err
		}
		batch := &pgx.Batch{}
		batch.Queue(s.sql.lockHeld, bkeys)
		batch.Queue(s.sql.refreshAll, bkeys, []byte(token), micros(ttl))
		res := s.pool.SendBatch(ctx, batch)
		defer res.Close()
		if _, err := res.Exec(); err != nil {
			return 0, err
		}
		tag, err := res.Exec()
		if err != nil {
			return 0, err
		}
		return tag.RowsAffected(), res.Close()
	})
	if err != nil {
		return endedErr(ctx, err)
	}
	switch refreshed {
	case int64(len(keys)):
		return nil
	case 0:
		return fmt.Errorf("%w: pgstore: %d keys, from %s (none refreshed)", stores.ErrNotHeld, len(keys), stores.KeyForMessage(keys[0]))
	}
	return fmt.Errorf("%w: refresh of %d keys changed %d", ErrUnexpectedReply, len(keys), refreshed)
}

// byteKeys returns keys as bytea values: a key may hold any bytes.
func byteKeys(keys []string) [][]byte {
	b := make([][]byte, len(keys))
	for i, k := range keys {
		b[i] = []byte(k)
	}
	return b
}

// micros rounds d up to whole microseconds, PostgreSQL's clock resolution:
// the server must not end a lease before the holder's own clock says it has.
func micros(d time.Duration) int64 {
	us := d.Microseconds()
	if d%time.Microsecond != 0 {
		us++
	}
	return us
}

// waitOf turns a holder's remaining lease in microseconds into a refusal's
// Wait: at least a microsecond, since the key was seen held and zero would
// mean unknown, and at most the longest Duration (a lease of math.MaxInt64
// rounds up past it).
func waitOf(remaining int64) time.Duration {
	if remaining > int64(math.MaxInt64/time.Microsecond) {
		return math.MaxInt64
	}
	return max(time.Duration(remaining)*time.Microsecond, time.Microsecond)
}
