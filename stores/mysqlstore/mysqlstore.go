package mysqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
// InnoDB table. It is safe for concurrent use. It owns a purge goroutine
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
	_ stores.Store   = (*Store)(nil)
	_ stores.Bounded = (*Store)(nil)
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
// create the table beforehand from Schema (or schema.sql). Default: the
// Store creates it.
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
// goroutine off (Purge can still be called). Default DefaultPurgeInterval
// and DefaultRetention; retention at least MinRetention.
func WithPurge(interval, retention time.Duration) Option {
	return func(s *Store) error {
		if interval < 0 || retention < MinRetention {
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
	s.q = newQueries(quoteTable(s.table))
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
	if table == "" {
		table = DefaultTable
	}
	if err := checkTable(table); err != nil {
		return "", fmt.Errorf("%w: mysqlstore: %w", stores.ErrInvalid, err)
	}
	return strings.ReplaceAll(schemaSQL, "{table}", quoteTable(table)), nil
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

// setup creates the table (unless WithoutCreateTable) and prepares the
// one-key statements, once: a failure is returned and tried again by the
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
	var autocommit int
	if err := s.db.QueryRowContext(ctx, "SELECT @@SESSION.autocommit").Scan(&autocommit); err != nil {
		return fmt.Errorf("mysqlstore: reading autocommit: %w", markUnreachable(err))
	}
	if autocommit != 1 {
		return errAutocommitOff
	}
	if s.createTable {
		ddl, err := Schema(s.table)
		if err != nil {
			return err
		}
		if _, err := s.db.ExecContext(ctx, ddl); err != nil {
			return fmt.Errorf("mysqlstore: create table %s: %w", s.table, markUnreachable(err))
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

// Bounds returns the keys and durations the Store honours: keys of up to
// MaxKeyLen bytes, the width of the table's key column; every duration from
// 1ns, rounded up to the microsecond of DATETIME(6), to math.MaxInt64, 292
// years, which the server's clock plus the duration keeps far within
// DATETIME's range (to the year 9999) and TIMESTAMPDIFF's microseconds
// within a BIGINT. It implements stores.Bounded.
func (s *Store) Bounds() stores.Bounds {
	return stores.Bounds{MaxKeyBytes: MaxKeyLen, Reason: "mysqlstore's key column (lock_key VARBINARY(512), its primary key)"}
}

// checkArgs returns an error wrapping stores.ErrInvalid when a key is longer
// than the table holds (see Bounds), there are more than MaxKeysPerCall
// keys, a duration is out of Bounds, the token is longer than the table
// holds or it is empty (a token names one acquisition).
func (s *Store) checkArgs(keys []string, token string, durations ...time.Duration) error {
	if err := args.CheckBounds(s.Bounds(), keys, durations...); err != nil {
		return err
	}
	switch {
	case len(keys) > MaxKeysPerCall:
		return fmt.Errorf("%w: mysqlstore: %d keys in one call, more than %d", stores.ErrInvalid, len(keys), MaxKeysPerCall)
	case token == "":
		return fmt.Errorf("%w: mysqlstore: empty token", stores.ErrInvalid)
	case len(token) > MaxTokenLen:
		return fmt.Errorf("%w: mysqlstore: token of %d bytes is longer than %d", stores.ErrInvalid, len(token), MaxTokenLen)
	}
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

// keysForMessage names keys in an error message: the first, cut short by
// stores.KeyForMessage, and how many others.
func keysForMessage(keys []string) string {
	if len(keys) == 1 {
		return stores.KeyForMessage(keys[0])
	}
	return fmt.Sprintf("%s and %d more keys", stores.KeyForMessage(keys[0]), len(keys)-1)
}

// anys returns keys as query arguments.
func anys(keys []string) []any {
	a := make([]any, len(keys))
	for i, k := range keys {
		a[i] = k
	}
	return a
}
