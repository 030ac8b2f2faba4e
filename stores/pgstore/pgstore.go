package pgstore

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reqlock/reqlock/internal/holders"
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

// tableName is what WithTable accepts: an identifier, optionally qualified
// by a schema, each of lower-case letters, digits and underscores.
var tableName = regexp.MustCompile(`^([a-z_][a-z0-9_]{0,62}\.)?[a-z_][a-z0-9_]{0,62}$`)

// Store is a stores.Store on PostgreSQL, a stores.Notifier, a
// stores.SharedStore and a stores.RecordStore. It is safe for concurrent
// use. It owns a purge goroutine (unless WithPurge turned it off) until
// Close. Once NotifyRelease has been called it owns a listening connection
// and a goroutine until Close; while it owes the undo of abandoned
// acquires, up to two goroutines more.
type Store struct {
	pool     *pgxpool.Pool
	ownsPool bool   // Open made the pool; Close closes it
	table    string // validated, as written in SQL
	channel  string // NOTIFY channel: the table name

	q queries

	bounds atomic.Pointer[stores.Bounds] // from the server's page size; see Bounds

	lazy      bool          // WithLazyConnect: New leaves setup to the first call
	setupTurn chan struct{} // held by the one call that runs setup
	ready     atomic.Bool   // setup succeeded

	callLimit time.Duration // see WithCallLimit

	writers holders.Writers // the waiting-writer records this Store made; see shared.go

	background sync.WaitGroup          // acquires in flight, detached from their callers
	undo       *undoqueue.Queue[*debt] // the undo of acquires whose callers left
	abandoned  atomic.Int64            // undos owed so far, for tests

	mu     sync.Mutex // guards notify and closed, and background.Add
	notify *notifier  // nil until the first NotifyRelease
	closed bool

	purgeEvery   time.Duration      // see WithPurge; 0: no purge goroutine
	retention    time.Duration      // the purge goroutine's
	minRetention time.Duration      // MinRetention, lower in tests
	purgeCtx     context.Context    // the purge goroutine's, cancelled by Close
	stopPurge    context.CancelFunc // cancels purgeCtx
	purgeDone    chan struct{}      // closed when the purge goroutine returns
}

var (
	_ stores.Store    = (*Store)(nil)
	_ stores.Notifier = (*Store)(nil)
	_ stores.Bounded  = (*Store)(nil)

	_ stores.SharedStore = (*Store)(nil)
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
// first call. New starts the purge goroutine (see WithPurge). It returns an
// error wrapping stores.ErrInvalid when pool is nil, the table name is
// invalid, the purge interval negative or the retention below
// MinRetention, and the server's error when the table cannot be created.
func New(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pgstore: pool is nil", stores.ErrInvalid)
	}
	s := &Store{pool: pool, table: DefaultTable, callLimit: DefaultCallLimit, setupTurn: make(chan struct{}, 1),
		purgeEvery: DefaultPurgeInterval, retention: DefaultRetention, minRetention: MinRetention}
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
	if s.purgeEvery < 0 {
		return nil, fmt.Errorf("%w: pgstore: purge interval %v is negative", stores.ErrInvalid, s.purgeEvery)
	}
	if s.purgeEvery > 0 && s.retention < s.minRetention {
		return nil, fmt.Errorf("%w: pgstore: purge retention %v is below %v", stores.ErrInvalid, s.retention, MinRetention)
	}
	s.undo = undoqueue.New(s.settle, s.callLimit)
	s.channel = channelOf(s.table)
	s.q = newQueries(s.table)
	s.setBounds(defaultBlockSize)
	if !s.lazy {
		if err := s.setup(ctx); err != nil {
			return nil, err
		}
	}
	s.purgeCtx, s.stopPurge = context.WithCancel(context.Background())
	s.purgeDone = make(chan struct{})
	if s.purgeEvery > 0 {
		go s.purgeLoop()
	} else {
		close(s.purgeDone)
	}
	return s, nil
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
	if err := s.createTable(ctx, s.table, s.q.create); err != nil {
		return err
	}
	if err := s.createTable(ctx, holdersTable(s.table), s.q.createHolders); err != nil {
		return err
	}
	if err := s.createTable(ctx, recordsTable(s.table), s.q.createRecords); err != nil {
		return err
	}
	if err := s.createTable(ctx, recordsTable(s.table), s.q.createRecordsIndex); err != nil {
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

// createTable creates a table, named table, with ddl unless it exists. Two
// sessions creating the same table at once may collide in the catalogue
// (SQLSTATE 23505 or 42P07) although both said IF NOT EXISTS; the loser
// finds it made.
func (s *Store) createTable(ctx context.Context, table, ddl string) error {
	_, err := s.pool.Exec(ctx, ddl)
	if err != nil && (sqlState(err) == "23505" || sqlState(err) == "42P07") {
		_, err = s.pool.Exec(ctx, ddl)
	}
	if err != nil {
		return fmt.Errorf("pgstore: creating table %s: %w", table, classify(err))
	}
	return nil
}

// Table returns the name of the Store's table.
func (s *Store) Table() string { return s.table }

// Close stops the listening connection of NotifyRelease, if any, and the
// purge goroutine (ending a purge in flight), waits for the acquires in
// flight (each bounded by the call limit), gives the undo
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
	s.stopPurge()
	<-s.purgeDone
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
// duplicate, unsorted or too long key (see Bounds), a non-positive ttl or a
// token that starts with a NUL byte (reserved: see Shared and limited
// grants in the package documentation), before any statement, or when the
// server refuses a key as beyond its
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
	if err := args.CheckGrantToken(token, holders.Reserved); err != nil {
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
		conn, err := s.acquireConn(ctx, a)
		if err != nil {
			return stores.Grant{}, err // the acquire not sent
		}
		defer conn.Release()
		var (
			g      stores.Grant
			shared [][]byte // keys refused by holders
		)
		if len(keys) == 1 {
			g, shared, err = s.acquireOne(ctx, conn, bkeys[0], token, ttl)
		} else {
			g, shared, err = s.acquireAll(ctx, conn, bkeys, token, ttl)
		}
		settled(a, err, conn.Conn().IsClosed())
		switch {
		case err != nil:
		case g.OK:
			s.withdraw(ctx, keys, token) // the wait, if any, ended
		case len(shared) > 0:
			g.SharedHeld = true
			s.writerRefused(ctx, conn, shared, token)
		}
		return g, err
	}, false)
}

// acquireConn takes a connection from the pool for an acquire, and records
// its session in a (see detached).
func (s *Store) acquireConn(ctx context.Context, a *attempt) (*pgxpool.Conn, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	if a.sess, err = sessionOf(ctx, conn); err != nil {
		conn.Release()
		return nil, err
	}
	return conn, nil
}

// acquireOne is Acquire of one key on conn: one upsert. It returns the key
// too when holders refused it (see shared.go).
func (s *Store) acquireOne(ctx context.Context, conn *pgxpool.Conn, key []byte, token string, ttl time.Duration) (stores.Grant, [][]byte, error) {
	var shared bool
	g, err := retrying(ctx, func(ctx context.Context) (stores.Grant, error) {
		var (
			granted   bool
			fence     int64
			remaining int64
		)
		err := conn.QueryRow(ctx, s.q.acquireOne, key, []byte(token), micros(ttl), int64(stores.FenceStride)).
			Scan(&granted, &fence, &remaining, &shared)
		if err != nil {
			return stores.Grant{}, err
		}
		if granted {
			return stores.Grant{OK: true, Fences: []int64{fence}}, nil
		}
		return stores.Grant{Wait: waitOf(remaining)}, nil
	})
	if err == nil && !g.OK && shared {
		return g, [][]byte{key}, nil
	}
	return g, nil, err
}

// acquireAll is Acquire of several keys on conn: three statements in one
// implicit transaction and one round trip. The first locks every row in key
// order (creating the missing ones) unless a key is seen held; the second
// takes them all when none is held by another token; the third reads the
// holders, for a refusal, and marks them watched. It returns too the keys
// that holders refused it (see shared.go).
func (s *Store) acquireAll(ctx context.Context, conn *pgxpool.Conn, keys [][]byte, token string, ttl time.Duration) (stores.Grant, [][]byte, error) {
	var shared [][]byte
	g, err := retrying(ctx, func(ctx context.Context) (stores.Grant, error) {
		shared = shared[:0]
		batch := &pgx.Batch{}
		batch.Queue(s.q.lockAll, keys, []byte(token))
		batch.Queue(s.q.acquireAll, keys, []byte(token), micros(ttl), int64(stores.FenceStride))
		batch.Queue(s.q.holders, keys, []byte(token))
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
		var marked bool
		if _, err := pgx.ForEachRow(rows, []any{&key, &remaining, &marked}, func() error {
			if holder == nil {
				holder, holderLeft = bytes.Clone(key), remaining
			}
			if marked {
				shared = append(shared, bytes.Clone(key))
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
	if err != nil || g.OK {
		return g, nil, err
	}
	return g, shared, nil
}

// Release ends token's grant on every key that still holds it, in one
// statement; with several keys, after one that locks their rows in key
// order, in the same round trip and implicit transaction. With keep zero or
// negative it frees the key and notifies its release (see Release
// notification in the package documentation); with keep positive it sets
// the key's lease to end keep from now instead and notifies nothing, since
// the key stays held. It also withdraws token's waiting-writer records on
// the keys (see Shared and limited grants in the package documentation),
// with one statement more when it has any.
//
// It returns an error wrapping stores.ErrNotHeld, naming the keys, when some
// keys were absent, expired or held another token, after ending the grant
// on the others. It returns an error wrapping stores.ErrInvalid for no keys
// or an empty, duplicate, unsorted or too long key (see Bounds), and one
// wrapping stores.ErrNotHeld for a token that starts with a NUL byte
// (reserved: it holds no key), before any statement; ctx.Err() without acting when ctx has ended; ErrClosed after
// Close; one wrapping stores.ErrUnreachable when no connection could be
// made; and the server's error, or ctx's when it ended in flight, otherwise.
func (s *Store) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	if err := args.CheckRelease(ctx, keys); err != nil {
		return err
	}
	if err := args.CheckHeldToken(keys, token, holders.Reserved); err != nil {
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
	s.withdraw(ctx, keys, token)
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
			batch.Queue(s.q.lockHeld, bkeys)
		}
		if keep > 0 {
			batch.Queue(s.q.releaseKeep, bkeys, []byte(token), micros(keep))
		} else {
			batch.Queue(s.q.release, bkeys, []byte(token), s.channel)
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
// and one wrapping stores.ErrNotHeld for a token that starts with a NUL
// byte (reserved: it holds no key), before any statement; ctx.Err() without
// acting when ctx has ended;
// ErrClosed after Close; one wrapping stores.ErrUnreachable when no
// connection could be made; and the server's error, or ctx's when it ended
// in flight, otherwise.
func (s *Store) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return err
	}
	if err := args.CheckHeldToken(keys, token, holders.Reserved); err != nil {
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
			tag, err := s.pool.Exec(ctx, s.q.refreshOne, bkeys, []byte(token), micros(ttl))
			return tag.RowsAffected(), err
		}
		return s.lockedExec(ctx, bkeys, s.q.refreshAll, bkeys, []byte(token), micros(ttl))
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

// lockedExec runs query with vals after lockHeld of keys, in one round trip
// and implicit transaction, and returns the rows query affected (or
// returned).
func (s *Store) lockedExec(ctx context.Context, keys [][]byte, query string, vals ...any) (int64, error) {
	batch := &pgx.Batch{}
	batch.Queue(s.q.lockHeld, keys)
	batch.Queue(query, vals...)
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
