package mysqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/reqlock/reqlock/internal/holders"
	"github.com/reqlock/reqlock/internal/storeargs"
	"github.com/reqlock/reqlock/internal/undoqueue"
	"github.com/reqlock/reqlock/stores"
)

// args checks the arguments of Store's methods; its errors start "mysqlstore:".
const args storeargs.Checker = "mysqlstore"

// Defaults and limits, written in one place.
const (
	// DefaultTable is the table a Store keeps its leases in unless
	// WithTable says otherwise.
	DefaultTable = "reqlock_locks"

	// MaxKeyLen is the longest key, in bytes, the table holds (its primary
	// key is VARBINARY(512), within InnoDB's 767-byte index limit of every
	// row format).
	MaxKeyLen = 512

	// MaxTokenLen is the longest token, in bytes, the table holds.
	MaxTokenLen = 255

	// MaxKeysPerCall is the most keys one call takes. A call on several
	// keys is one statement with a row of placeholders per key: with 1000
	// keys of MaxKeyLen bytes it stays far below MySQL's limit of 65535
	// placeholders per prepared statement and, with the arguments
	// interpolated, below max_allowed_packet's smallest default (4 MB,
	// MySQL 5.7).
	MaxKeysPerCall = 1000

	// DefaultPurgeInterval is how often a Store purges rows unless
	// WithPurge says otherwise.
	DefaultPurgeInterval = time.Hour

	// DefaultRetention is how long a purged row must have been free, and
	// its fence behind the server clock, unless WithPurge says otherwise.
	DefaultRetention = 24 * time.Hour

	// MinRetention is the shortest retention WithPurge accepts: the server
	// clock may step back by up to the retention without a purge letting a
	// fence repeat.
	MinRetention = time.Minute

	// contentionAttempts is how many times an operation that lost to row
	// lock contention (a deadlock, a lock wait timeout) is tried in all.
	contentionAttempts = 10

	// purgeBatch is how many rows a purge deletes per statement.
	purgeBatch = 500
)

// Store is a stores.Store on MySQL or MariaDB: a lease row per key in one
// InnoDB table; a stores.SharedStore, whose holders are rows of a second
// (see HoldersSchema); and a stores.RecordStore, whose records' fields are
// rows of a third (see RecordsSchema). It is safe for concurrent use. It owns a purge goroutine
// (unless WithPurge turned it off) and, from Open, its *sql.DB, until Close.
// It does not implement stores.Notifier or stores.FairStore; see the package
// documentation.
type Store struct {
	db          *sql.DB
	ownsDB      bool // from Open: Close closes db
	table       string
	q           queries
	createTable bool
	purgeEvery  time.Duration
	retention   time.Duration

	// setupTurn is held by the one call that runs setup; the others wait
	// for it or for their context to end.
	setupTurn chan struct{}
	ready     atomic.Bool // the table exists
	stmts     stmtCache
	// contended holds the keys an Acquire of one key found held lately.
	contended contendedKeys
	dbx       dbExecer // db, to run statements on

	callLimit time.Duration           // see WithCallLimit
	attempts  int                     // contentionAttempts, or fewer in tests
	sessions  sessionCache            // of the connections the Store pinned
	undo      *undoqueue.Queue[*debt] // the undo of acquires whose callers left
	writers   holders.Writers         // the waiting-writer records it made; see shared.go
	holdersTx *sql.TxOptions          // of the transactions on holders (see holdersIsolation), set by setup

	// packet is the max_allowed_packet of Bounds().MaxRecordBytes (see
	// recordBytes): the server's, read by setup, or assumedPacket until
	// then; at most assumedPacket when Bounds was read before setup
	// (stated, under packetMu), so that the Store keeps to what it stated.
	packet   atomic.Int64
	packetMu sync.Mutex
	stated   bool
	// clientPacket is the driver's own max_allowed_packet when Open knows
	// it (its maxAllowedPacket parameter), else 0.
	clientPacket int

	// mu guards closed; calls counts the operations in flight, which Close
	// waits for.
	mu     sync.RWMutex
	closed bool
	calls  sync.WaitGroup

	stopPurge chan struct{} // closed by Close
	purgeDone chan struct{} // closed when the purge goroutine returns

	// retries counts attempts made again after a loss to row lock
	// contention, undos the releases of grants whose callers left; for
	// tests and diagnostics.
	retries, undos atomic.Int64
}

var (
	_ stores.Store       = (*Store)(nil)
	_ stores.Bounded     = (*Store)(nil)
	_ stores.SharedStore = (*Store)(nil)
)

// Option configures a Store.
type Option func(*Store) error

// WithTable sets the table the Store keeps its leases in: a name of letters,
// digits, '_' and '$' (at most 64), optionally qualified by a database name
// of the same form ("locks.reqlock_locks"). Default DefaultTable, in the
// connection's database.
func WithTable(name string) Option {
	return func(s *Store) error {
		if err := checkTable(name); err != nil {
			return err
		}
		s.table = name
		return nil
	}
}

// WithoutCreateTable makes the Store use the table as it finds it: it does
// not run CREATE TABLE IF NOT EXISTS on first use. For managed schemas:
// create the table beforehand from Schema (or schema.sql), and, for shared
// grants, its holders table from HoldersSchema (or holders.sql), and, for
// idempotency records, its records table from RecordsSchema (or
// records.sql). Default: the Store creates all three.
func WithoutCreateTable() Option {
	return func(s *Store) error {
		s.createTable = false
		return nil
	}
}

// WithCallLimit sets the call limit: the longest a statement of the Store
// runs whatever its caller's context (see Failures in the package
// documentation). An Acquire with no answer within it returns an error
// wrapping stores.ErrAbandoned, and the Store undoes it: it ends the
// session that carried the statement, so keep the limit above the
// server's innodb_lock_wait_timeout, lest a statement that waits for a row
// lock cost a session. Close takes up to the limit and 5s more. Default
// DefaultCallLimit; it must be positive.
func WithCallLimit(d time.Duration) Option {
	return func(s *Store) error {
		if d <= 0 {
			return fmt.Errorf("WithCallLimit: %v is not positive", d)
		}
		s.callLimit = d
		return nil
	}
}

// WithPurge sets how often the Store deletes rows that have been free for
// retention and whose fence the server clock has passed by retention (see
// Purge), in a goroutine that Close stops. An interval of zero turns the
// goroutine off (Purge can still be called), whatever the retention.
// Default DefaultPurgeInterval and DefaultRetention; retention at least
// MinRetention when interval is positive.
func WithPurge(interval, retention time.Duration) Option {
	return func(s *Store) error {
		if interval < 0 || (interval > 0 && retention < MinRetention) {
			return fmt.Errorf("WithPurge: interval %v must not be negative and retention %v at least %v",
				interval, retention, MinRetention)
		}
		s.purgeEvery, s.retention = interval, retention
		return nil
	}
}

// validTable matches the table names WithTable accepts.
var validTable = regexp.MustCompile(`^([A-Za-z0-9_$]{1,64}\.)?[A-Za-z0-9_$]{1,64}$`)

// checkTable returns an error naming the problem unless name is a table
// name WithTable accepts.
func checkTable(name string) error {
	if !validTable.MatchString(name) {
		return fmt.Errorf("table %q is not a name of 1 to 64 letters, digits, '_' and '$' (optionally database.table)", name)
	}
	return nil
}

// quoteTable quotes a name validTable matched.
func quoteTable(name string) string {
	return "`" + strings.ReplaceAll(name, ".", "`.`") + "`"
}

// New returns a Store that keeps its leases in a table of db, which must
// reach MySQL (5.7 or later) or MariaDB (10.3 or later) through a driver
// that reports LAST_INSERT_ID as sql.Result.LastInsertId, such as
// github.com/go-sql-driver/mysql. The caller keeps owning db and closes it
// after the Store. New does no I/O: the first operation creates the table
// (unless WithoutCreateTable) and prepares the statements. It starts the
// purge goroutine (see WithPurge); Close stops it.
//
// It returns an error wrapping stores.ErrInvalid, naming the problem, when
// db is nil or an option is invalid.
func New(db *sql.DB, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: mysqlstore: db is nil", stores.ErrInvalid)
	}
	s := &Store{
		db:          db,
		dbx:         dbExecer{db},
		table:       DefaultTable,
		createTable: true,
		purgeEvery:  DefaultPurgeInterval,
		retention:   DefaultRetention,
		setupTurn:   make(chan struct{}, 1),
		stopPurge:   make(chan struct{}),
		purgeDone:   make(chan struct{}),
		callLimit:   DefaultCallLimit,
		attempts:    contentionAttempts,
	}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: mysqlstore: an option is nil", stores.ErrInvalid)
		}
		if err := opt(s); err != nil {
			return nil, fmt.Errorf("%w: mysqlstore: %w", stores.ErrInvalid, err)
		}
	}
	s.q = tableQueries(s.table)
	s.packet.Store(assumedPacket)
	s.undo = undoqueue.New(s.settle, s.undoLimit())
	if s.purgeEvery > 0 {
		go s.purgeLoop()
	} else {
		close(s.purgeDone)
	}
	return s, nil
}

// Schema returns the CREATE TABLE IF NOT EXISTS statement of a Store's
// table, for a managed schema (see WithoutCreateTable). table is as
// WithTable takes it; empty means DefaultTable. It returns an error wrapping
// stores.ErrInvalid for an invalid name.
func Schema(table string) (string, error) {
	table, err := schemaTable(table)
	if err != nil {
		return "", err
	}
	return strings.ReplaceAll(schemaSQL, "{table}", quoteTable(table)), nil
}

// schemaTable checks table as Schema, HoldersSchema and RecordsSchema take
// it: empty means DefaultTable; an invalid name is an error wrapping
// stores.ErrInvalid.
func schemaTable(table string) (string, error) {
	if table == "" {
		table = DefaultTable
	}
	if err := checkTable(table); err != nil {
		return "", fmt.Errorf("%w: mysqlstore: %w", stores.ErrInvalid, err)
	}
	return table, nil
}

// tableQueries returns the queries of a Store's table table, with its
// holders and records tables.
func tableQueries(table string) queries {
	return newQueries(quoteTable(table), quoteTable(holdersTable(table)), quoteTable(recordsTable(table)))
}

// Table returns the name of the Store's table, as WithTable took it.
func (s *Store) Table() string { return s.table }

// Close stops the purge goroutine, waits for the operations in flight
// (including those whose callers left, which end within the call limit,
// even on a stalled server), gives the undo of every acquire whose caller
// left one more try (within 5s and the call limit; an undo that fails then
// is given up, and its grant, if any, held until its TTL ends), closes the
// prepared statements and, for a Store from Open, the *sql.DB. Operations
// after Close return ErrClosed. Close may be called more than once; it
// returns the error of closing the *sql.DB.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	close(s.stopPurge)
	<-s.purgeDone
	s.calls.Wait()
	s.undo.Close(s.undoLimit())
	s.stmts.close()
	if s.ownsDB {
		return s.db.Close()
	}
	return nil
}

// begin counts an operation in, unless the Store is closed.
func (s *Store) begin() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return false
	}
	s.calls.Add(1)
	return true
}

// setup checks the session (autocommit), reads the server's
// max_allowed_packet (see Bounds), creates the table (unless
// WithoutCreateTable) and prepares the one-key statements, once: a failure is returned and tried again by the
// next operation. The statements on several keys are prepared on first use.
// One call at a time runs it; the others wait for it, or return when their
// context ends. No call holds a connection while it waits (setup comes
// first in every operation).
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
	var autocommit, packet int
	if err := s.db.QueryRowContext(ctx, "SELECT @@SESSION.autocommit, @@SESSION.max_allowed_packet").Scan(&autocommit, &packet); err != nil {
		return fmt.Errorf("mysqlstore: reading autocommit and max_allowed_packet: %w", markUnreachable(err))
	}
	if autocommit != 1 {
		return errAutocommitOff
	}
	if s.clientPacket > 0 {
		packet = min(packet, s.clientPacket)
	}
	s.packetMu.Lock()
	if s.stated {
		packet = min(packet, int(s.packet.Load()))
	}
	s.packet.Store(int64(packet))
	s.packetMu.Unlock()
	var err error
	if s.holdersTx, err = s.holdersIsolation(ctx); err != nil {
		return err
	}
	if s.createTable {
		ddl, err := Schema(s.table)
		if err != nil {
			return err
		}
		if _, err := s.db.ExecContext(ctx, ddl); err != nil {
			return fmt.Errorf("mysqlstore: create table %s: %w", s.table, markUnreachable(err))
		}
		if _, err := s.db.ExecContext(ctx, s.q.createHolders); err != nil {
			return fmt.Errorf("mysqlstore: create table %s: %w", holdersTable(s.table), markUnreachable(err))
		}
		if _, err := s.db.ExecContext(ctx, s.q.createRecords); err != nil {
			return fmt.Errorf("mysqlstore: create table %s: %w", recordsTable(s.table), markUnreachable(err))
		}
	}
	if err := s.checkSchema(ctx); err != nil {
		return err
	}
	for _, q := range []string{s.q.acquireOne, withKeys(s.q.release, 1), withKeys(s.q.expire, 1)} {
		if _, err := s.prepare(ctx, q); err != nil {
			return fmt.Errorf("mysqlstore: prepare statements on table %s: %w", s.table, markUnreachable(err))
		}
	}
	s.ready.Store(true)
	return nil
}

// micros rounds d up to whole microseconds: the server must not expire a
// lock before the holder's own clock says it has.
func micros(d time.Duration) int64 {
	us := d.Microseconds()
	if d%time.Microsecond != 0 {
		us++
	}
	return us
}

// remaining turns a remaining TTL in microseconds into a refusal's Wait: at
// least a microsecond, since zero would mean unknown, and at most the
// longest Duration (a TTL of math.MaxInt64 rounds up past it).
func remaining(us int64) time.Duration {
	if us > int64(math.MaxInt64/time.Microsecond) {
		return math.MaxInt64
	}
	return max(time.Duration(us)*time.Microsecond, time.Microsecond)
}

// anys returns keys as query arguments.
func anys(keys []string) []any {
	a := make([]any, len(keys))
	for i, k := range keys {
		a[i] = k
	}
	return a
}

// Acquire sets every key to token for ttl when none is held by another
// token, and issues each key its next fence, as stores.Store describes.
// When a key is held it sets nothing and returns a Grant with OK false,
// Held the index of the first held key and Wait its holder's remaining TTL
// by the server's clock. A key that already holds token (a retried call
// whose reply was lost) is granted again with a fresh fence and TTL.
//
// One key takes one statement and one round trip. Several keys take a
// transaction (begin, one INSERT for all rows, one SELECT, commit or
// rollback) that locks their rows in key order.
//
// Contention is not a failure: a statement the server chose as a
// deadlock's victim, or that timed out waiting for a row lock, changed
// nothing and is tried again after a short random sleep, up to
// contentionAttempts times while the caller waits; then Acquire refuses,
// with Held 0 and a Wait of a few milliseconds: the keys are busy, if not
// held.
//
// It returns as soon as ctx ends, even while the server has not answered:
// the statement goes on (see Failures in the package documentation), a
// grant it makes is released, owner-checked, once it returns, and the error
// wraps stores.ErrAbandoned and ctx's error. A statement whose outcome is
// unknown (no answer within the call limit, or a lost connection, a COMMIT
// among them) is undone by the Store, which first ends the session that
// carried it, so that it cannot apply later; the error then wraps
// stores.ErrAbandoned. It returns an error wrapping stores.ErrInvalid for
// no keys, more than MaxKeysPerCall, an empty, duplicate, unsorted or too
// long key (see Bounds), an empty or too long token, a token that starts
// with a NUL byte (reserved) or a non-positive ttl, before any statement;
// ErrClosed after Close; ErrMisconfigured for a
// server or table the Store cannot use; ErrUnexpectedReply for a reply it
// cannot read; and the driver's error otherwise, wrapped with
// stores.ErrUnreachable when no connection could be made.
func (s *Store) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return stores.Grant{}, err
	}
	if err := s.checkArgs(keys, token, ttl); err != nil {
		return stores.Grant{}, err
	}
	if err := args.CheckGrantToken(token, holders.Reserved); err != nil {
		return stores.Grant{}, err
	}
	op := func(ctx context.Context, c *call[acquired]) (acquired, error) {
		var r acquired
		g, err := s.acquire(ctx, c, keys, token, micros(ttl), &r.a)
		r.g, r.limit = g, ctx.Err() != nil
		return r, markUnreachable(err)
	}
	r, err := detached(s, ctx, op, func(r acquired, err error) {
		// The caller left: undo in its stead what may have been granted.
		if r.g.OK || r.a.unknown || r.a.maybe {
			s.owe(keys, token, ttl, r.a, false)
		}
	})
	return s.acquiredOutcome(ctx, r, err, keys, token, ttl, false)
}

// acquiredOutcome returns the outcome of an acquire (an AcquireShared when
// shared) to a caller that waited for it. No answer, or a lost connection:
// the statement may still apply. The Store undoes it while the caller
// waits, so that it cannot apply after the call returned; what is left goes
// on in the background.
func (s *Store) acquiredOutcome(ctx context.Context, r acquired, err error, keys []string, token string, ttl time.Duration, shared bool) (stores.Grant, error) {
	if !r.a.unknown {
		return r.g, err
	}
	cause := fmt.Errorf("mysqlstore: connection lost with the outcome unknown: %w", err)
	if r.limit {
		cause = fmt.Errorf("mysqlstore: no answer within the call limit %v: %w", s.callLimit, context.DeadlineExceeded)
	}
	d := s.debtOf(keys, token, ttl, r.a, shared)
	if undoqueue.SettleNow(ctx, d, s.settle, s.undoLimit()) {
		return stores.Grant{}, fmt.Errorf("%w: %w; the store ended the session that carried it and released the keys", stores.ErrAbandoned, cause)
	}
	s.undo.Add(d)
	return stores.Grant{}, fmt.Errorf("%w: %w; the store undoes it", stores.ErrAbandoned, cause)
}

// acquired is the outcome of Acquire's operation.
type acquired struct {
	g      stores.Grant
	a      attempt
	limit  bool // the call limit ended the operation
	record bool // ClaimRecord's claim was refused by a finished record
}

// contentionWait is the Wait of a refusal after every attempt lost to row
// lock contention: the winners hold their rows for a round trip or two.
const contentionWait = contentionAttempts * time.Millisecond

// acquire is Acquire's operation. It records in a what its last statement
// leaves to undo.
func (s *Store) acquire(ctx context.Context, c *call[acquired], keys []string, token string, ttl int64, a *attempt) (stores.Grant, error) {
	if err := s.setup(ctx); err != nil {
		return stores.Grant{}, err
	}
	var g stores.Grant
	err := s.retry(ctx, c.left, func() error {
		var err error
		if len(keys) == 1 {
			g, err = s.acquireOne(ctx, keys[0], token, ttl, a)
			switch {
			case err != nil:
			case g.OK:
				s.contended.forget(keys[0])
			default:
				s.contended.mark(keys[0], g.Wait)
			}
		} else {
			g, err = s.acquireMany(ctx, c, keys, token, ttl, a)
		}
		return err
	})
	if errors.Is(err, ErrContention) {
		// Nothing changed: the keys are busy, and the caller may try again
		// soon.
		return stores.Grant{Held: 0, Wait: contentionWait}, nil
	}
	if err == nil && g.OK {
		s.withdraw(ctx, keys, token) // the wait, if any, ended
	}
	return g, err
}

// retry runs attempt, and again after a random sleep of a few milliseconds
// while it loses to row lock contention, up to contentionAttempts times in
// all and only while the caller waits (left, unless nil, reports false) and
// ctx lasts. A loss to contention changed nothing, so trying again is safe.
func (s *Store) retry(ctx context.Context, left func() bool, attempt func() error) error {
	for n := 1; ; n++ {
		err := attempt()
		if !contended(err) {
			return err
		}
		if n >= s.attempts || (left != nil && left()) || ctx.Err() != nil {
			return fmt.Errorf("%w after %d attempts: %w", ErrContention, n, err)
		}
		s.retries.Add(1)
		// The transactions that won hold their rows for a round trip or
		// two: wait about that long, longer after each loss.
		sleep := time.Duration(rand.Int64N(int64(n) * int64(time.Millisecond)))
		t := time.NewTimer(sleep)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w after %d attempts: %w", ErrContention, n, err)
		}
	}
}

// maxBadConnTries is how many connections a statement is tried on while
// each turns out bad before anything was written to it (as database/sql
// does).
const maxBadConnTries = 3

// acquireOne runs acquireOneSQL on a pinned connection, whose session it
// records in a, and reads its outcome from LAST_INSERT_ID; on a contended
// key it first looks for a holder without locking (see contendedKeys).
func (s *Store) acquireOne(ctx context.Context, key, token string, ttl int64, a *attempt) (stores.Grant, error) {
	if s.contended.contended(key) {
		if g, err := s.findHeld(ctx, []string{key}, token); err != nil || !g.OK {
			return g, err
		}
	}
	var (
		res driver.Result
		err error
	)
	for range maxBadConnTries {
		var p pinned
		if p, err = s.pin(ctx); err != nil {
			return stores.Grant{}, err // nothing sent
		}
		res, err = p.execOne(ctx, s.q.acquireOne, key, token, ttl, token, token, token, token, ttl)
		_ = p.conn.Close()
		a.sent(p.session, err)
		if !errors.Is(err, driver.ErrBadConn) {
			break
		}
	}
	if err != nil {
		return stores.Grant{}, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		a.maybe = true
		return stores.Grant{}, fmt.Errorf("%w: acquire %s: %w", ErrUnexpectedReply, stores.KeyForMessage(key), err)
	}
	switch {
	case id > 0 && id < refusedFlag:
		return stores.Grant{OK: true, Fences: []int64{id}}, nil
	case id >= refusedFlag+sharedFlag:
		s.writerRefused(ctx, key, token)
		return stores.Grant{Wait: remaining(id - refusedFlag - sharedFlag), SharedHeld: true}, nil
	case id > refusedFlag:
		return stores.Grant{Wait: remaining(id - refusedFlag)}, nil
	}
	a.maybe = true
	return stores.Grant{}, fmt.Errorf("%w: acquire %s answered LAST_INSERT_ID %d", ErrUnexpectedReply, stores.KeyForMessage(key), id)
}

// acquireMany takes several keys in one transaction on a pinned connection:
// acquireManySQL locks and sets their rows, selectManySQL reads them, and
// the transaction commits when every row holds token, else rolls back. It
// rolls back too when the caller has left meanwhile. Its statements are
// prepared before the transaction takes its connection (see stmtCache).
// Only its COMMIT can leave an outcome unknown: a transaction whose COMMIT
// was never sent rolls back on the server, whenever its statements arrive,
// when the connection ends.
func (s *Store) acquireMany(ctx context.Context, c *call[acquired], keys []string, token string, ttl int64, a *attempt) (stores.Grant, error) {
	if g, err := s.findHeld(ctx, keys, token); err != nil || !g.OK {
		return g, err
	}
	insert, err := s.prepare(ctx, withRows(s.q.acquireMany, s.q.acquireRow, len(keys)))
	if err != nil {
		return stores.Grant{}, err
	}
	read, err := s.prepare(ctx, withKeys(s.q.selectMany, len(keys)))
	if err != nil {
		return stores.Grant{}, err
	}
	p, tx, done, err := s.beginPinned(ctx, nil)
	if err != nil {
		return stores.Grant{}, err
	}
	defer done()
	values := make([]any, 0, 3*len(keys)+5)
	for _, k := range keys {
		values = append(values, k, token, ttl)
	}
	values = append(values, token, token, token, token, ttl)
	if _, err := insert.exec(ctx, tx, values...); err != nil {
		return stores.Grant{}, err
	}
	fences, held, wait, shared, err := readRows(ctx, tx, read, keys, token)
	if err != nil {
		return stores.Grant{}, err
	}
	if held >= 0 {
		if shared {
			_ = tx.Rollback()
			s.writerRefused(ctx, keys[held], token)
		}
		return stores.Grant{Held: held, Wait: remaining(wait), SharedHeld: shared}, nil // rolled back
	}
	if c.left() {
		return stores.Grant{}, errLeft // rolled back: nothing to undo
	}
	if err := tx.Commit(); err != nil {
		// Whether the server committed is unknown.
		a.sess, a.unknown = p.session, true
		return stores.Grant{}, fmt.Errorf("mysqlstore: commit of the grant of %s (outcome unknown): %w", keysForMessage(keys), err)
	}
	return stores.Grant{OK: true, Fences: fences}, nil
}

// beginPinned pins a connection (see pin) and begins a transaction on it;
// done rolls the transaction back unless it committed, and gives the
// connection back.
func (s *Store) beginPinned(ctx context.Context, opts *sql.TxOptions) (p pinned, tx *sql.Tx, done func(), err error) {
	if p, err = s.pin(ctx); err != nil {
		return pinned{}, nil, nil, err
	}
	if tx, err = p.conn.BeginTx(ctx, opts); err != nil {
		_ = p.conn.Close()
		return pinned{}, nil, nil, err
	}
	return p, tx, func() {
		_ = tx.Rollback() // sql.ErrTxDone after a commit
		_ = p.conn.Close()
	}, nil
}

// findHeld looks, without locking, for a key held by another token, and
// returns a refusal naming it, or a Grant with OK true (and no fences) when
// it found none: under contention most attempts on several keys then take
// one read and no row lock, and hold up no one.
func (s *Store) findHeld(ctx context.Context, keys []string, token string) (stores.Grant, error) {
	rows, err := s.queryDB(ctx, withKeys(s.q.held, len(keys)), append(anys(keys), token)...)
	if err != nil {
		return stores.Grant{}, err
	}
	defer rows.Close()
	if !rows.Next() {
		return stores.Grant{OK: true}, rows.Err()
	}
	var (
		key    string
		left   int64
		shared bool
	)
	if err := rows.Scan(&key, &left, &shared); err != nil {
		return stores.Grant{}, fmt.Errorf("%w: acquire %s: %w", ErrUnexpectedReply, keysForMessage(keys), err)
	}
	i := slices.Index(keys, key)
	if i < 0 {
		return stores.Grant{}, fmt.Errorf("%w: acquire %s read row %s", ErrUnexpectedReply, keysForMessage(keys), stores.KeyForMessage(key))
	}
	if shared {
		rows.Close()
		s.writerRefused(ctx, key, token)
	}
	return stores.Grant{Held: i, Wait: remaining(left), SharedHeld: shared}, nil
}

// readRows reads the rows of keys within tx with read, selectManySQL: each
// one's fence and, when a row holds another token, the index of the first
// such and its remaining TTL in microseconds (held is -1 when every row
// holds token), and whether holders hold it (see shared.go).
func readRows(ctx context.Context, tx *sql.Tx, read stmt, keys []string, token string) (fences []int64, held int, wait int64, shared bool, err error) {
	rows, err := read.rows(ctx, tx, anys(keys)...)
	if err != nil {
		return nil, 0, 0, false, err
	}
	defer rows.Close()
	fences = make([]int64, len(keys))
	held = -1
	i := 0
	for rows.Next() {
		var (
			key, holder string
			fence, left int64
		)
		if err := rows.Scan(&key, &holder, &fence, &left); err != nil {
			return nil, 0, 0, false, fmt.Errorf("%w: acquire %s: %w", ErrUnexpectedReply, keysForMessage(keys), err)
		}
		if i >= len(keys) || key != keys[i] {
			return nil, 0, 0, false, fmt.Errorf("%w: acquire %s read row %s", ErrUnexpectedReply, keysForMessage(keys), stores.KeyForMessage(key))
		}
		if holder != token && held < 0 {
			held, wait, shared = i, left, holders.IsMarker([]byte(holder))
		}
		fences[i] = fence
		i++
	}
	if err := rows.Err(); err != nil {
		return nil, 0, 0, false, err
	}
	if i != len(keys) {
		return nil, 0, 0, false, fmt.Errorf("%w: acquire %s read %d rows", ErrUnexpectedReply, keysForMessage(keys), i)
	}
	return fences, held, wait, shared, nil
}

// Release ends token's grant on every key that holds it, in one statement
// and one round trip, as stores.Store describes: with keep zero or negative
// it lets the row expire now, keeping its fence; with
// keep positive it sets the key's TTL to keep instead, so the key stays
// held until then. It returns an error wrapping stores.ErrNotHeld, saying
// how many keys, when some keys were absent, expired or held another token,
// after ending the grant on the others. It also withdraws token's
// waiting-writer records on the keys (see Shared and limited grants in the
// package documentation), with one statement more when it has any.
//
// It returns ctx.Err() as soon as ctx ends (the statement goes on); an
// error wrapping stores.ErrInvalid for no keys, more than MaxKeysPerCall,
// an empty, duplicate, unsorted or too long key (see Bounds), or an empty
// or too long token, before any statement; one wrapping stores.ErrNotHeld
// for a token that starts with a NUL byte (reserved: it holds no key),
// before any statement; ErrClosed after Close; one wrapping ErrContention
// after contentionAttempts losses to row lock contention; and the driver's
// error otherwise.
func (s *Store) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	if err := args.CheckRelease(ctx, keys); err != nil {
		return err
	}
	var durations []time.Duration
	if keep > 0 {
		durations = append(durations, keep)
	}
	if err := s.checkArgs(keys, token, durations...); err != nil {
		return err
	}
	if err := args.CheckHeldToken(keys, token, holders.Reserved); err != nil {
		return err
	}
	// A release is owed whether or not its caller waits: it tries again
	// after a loss to contention when its caller has left too.
	_, err := detached(s, ctx, func(ctx context.Context, _ *call[struct{}]) (struct{}, error) {
		s.withdraw(ctx, keys, token)
		return struct{}{}, markUnreachable(s.release(ctx, nil, keys, token, keep))
	}, nil)
	return err
}

// release is Release's operation.
func (s *Store) release(ctx context.Context, left func() bool, keys []string, token string, keep time.Duration) error {
	if err := s.setup(ctx); err != nil {
		return err
	}
	query := s.q.release
	var vals []any
	if keep > 0 {
		query = s.q.expire
		vals = append(vals, micros(keep), micros(keep))
	}
	vals = append(append(vals, anys(keys)...), token)
	var n int64
	err := s.retry(ctx, left, func() error {
		var err error
		n, err = s.exec(ctx, withKeys(query, len(keys)), vals)
		return err
	})
	if err != nil {
		return err
	}
	if n < int64(len(keys)) {
		if len(keys) == 1 {
			return fmt.Errorf("%w: %s", stores.ErrNotHeld, stores.KeyForMessage(keys[0]))
		}
		return fmt.Errorf("%w: %d of %d keys", stores.ErrNotHeld, int64(len(keys))-n, len(keys))
	}
	return nil
}

// exec runs one statement and returns the rows it affected.
func (s *Store) exec(ctx context.Context, query string, vals []any) (int64, error) {
	res, err := s.execDB(ctx, query, vals...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Refresh resets the TTL of every key to ttl if each holds token; when one
// does not, it changes nothing and returns an error wrapping
// stores.ErrNotHeld. One key takes one statement; several a transaction
// (begin, one UPDATE, commit or rollback), rolled back unless the UPDATE
// found every key holding token.
//
// It returns ctx.Err() as soon as ctx ends (the statement goes on); an
// error wrapping stores.ErrInvalid for no keys, more than MaxKeysPerCall,
// an empty, duplicate, unsorted or too long key (see Bounds), an empty or
// too long token or a non-positive ttl, and one wrapping stores.ErrNotHeld
// for a token that starts with a NUL byte (reserved: it holds no key),
// before any statement; ErrClosed after Close; one wrapping ErrContention
// after
// contentionAttempts losses to row lock contention; and the driver's error
// otherwise, wrapped with stores.ErrUnreachable when no connection could be
// made. A lost connection is no lost lock: the lease is a row, which any
// connection refreshes.
func (s *Store) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return err
	}
	if err := s.checkArgs(keys, token, ttl); err != nil {
		return err
	}
	if err := args.CheckHeldToken(keys, token, holders.Reserved); err != nil {
		return err
	}
	_, err := detached(s, ctx, func(ctx context.Context, c *call[struct{}]) (struct{}, error) {
		return struct{}{}, markUnreachable(s.refresh(ctx, c.left, keys, token, micros(ttl)))
	}, nil)
	return err
}

// refresh is Refresh's operation.
func (s *Store) refresh(ctx context.Context, left func() bool, keys []string, token string, ttl int64) error {
	if err := s.setup(ctx); err != nil {
		return err
	}
	vals := append(append([]any{ttl, ttl}, anys(keys)...), token)
	return s.retry(ctx, left, func() error {
		if len(keys) == 1 {
			n, err := s.exec(ctx, withKeys(s.q.expire, 1), vals)
			if err != nil {
				return err
			}
			if n != 1 {
				return fmt.Errorf("%w: %s", stores.ErrNotHeld, stores.KeyForMessage(keys[0]))
			}
			return nil
		}
		return s.refreshMany(ctx, keys, vals)
	})
}

// refreshMany runs expireSQL on several keys in a transaction, committed
// only when every key held the token. The statement is prepared before the
// transaction takes its connection (see stmtCache).
func (s *Store) refreshMany(ctx context.Context, keys []string, vals []any) error {
	expire, err := s.prepare(ctx, withKeys(s.q.expire, len(keys)))
	if err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	res, err := expire.exec(ctx, tx, vals...)
	if err != nil {
		_ = tx.Rollback()
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		_ = tx.Rollback()
		return err
	}
	if n != int64(len(keys)) {
		if err := tx.Rollback(); err != nil {
			return err // unknown whether the rollback reached the server
		}
		return fmt.Errorf("%w: %d of %d keys (none refreshed)", stores.ErrNotHeld, int64(len(keys))-n, len(keys))
	}
	return tx.Commit()
}
