package zkstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/reqlock/reqlock/internal/storeargs"
	"github.com/reqlock/reqlock/stores"
)

// Store is a stores.Store, stores.Notifier, stores.FairStore and
// stores.SharedStore on ZooKeeper; see the package documentation. It is
// safe for concurrent use.
// The zero value is not usable; call New or Open.
type Store struct {
	conn     *zk.Conn
	root     string
	acl      []zk.ACL
	aclBytes int // its encoded size
	bounds   stores.Bounds
	log      *slog.Logger

	// askedMs is the session timeout, in milliseconds, the Store asks for
	// on every connection; sessionMs is the one the server granted on the
	// last (see sessionConn), and shortMs the last short one logged.
	askedMs   int32
	sessionMs atomic.Int64
	maxMs     atomic.Int64 // bounds.MaxTTL in milliseconds, once New has set it
	shortMs   atomic.Int64

	ages ages // what this Store knows of the age of lock and queue nodes

	rootMu   sync.Mutex  // held while a call creates the root
	rootMade atomic.Bool // the root exists

	// joined holds the fair waiters this Store has queued, so that their
	// release subscriptions watch the node ahead of them.
	joinedMu sync.Mutex
	joined   map[waiterID]place

	notify notifier

	// life guards closed and wg, so that no goroutine starts once Close
	// waits for them.
	life   sync.Mutex
	closed bool
	done   chan struct{} // closed by Close
	wg     sync.WaitGroup

	inFlight atomic.Int64 // calls running, undo included; for tests
}

// waiterID names a fair waiter.
type waiterID struct{ key, token string }

// args checks the arguments of Store's methods; its errors start "zkstore:".
const args storeargs.Checker = "zkstore"

var (
	_ stores.Store     = (*Store)(nil)
	_ stores.Notifier  = (*Store)(nil)
	_ stores.FairStore = (*Store)(nil)
	_ stores.Bounded   = (*Store)(nil)
)

// Defaults, written in one place.
const (
	// DefaultRoot is the znode under which a Store keeps its keys.
	DefaultRoot = "/reqlock"

	// DefaultSessionTimeout is the session timeout a Store asks for unless
	// told otherwise. The server may grant another, within its
	// minSessionTimeout and maxSessionTimeout.
	DefaultSessionTimeout = 10 * time.Second

	// MinTTL is the shortest TTL, keep and lease a Store takes: lock and
	// queue nodes keep them in whole milliseconds.
	MinTTL = time.Millisecond

	// minKeyBytes is the least Bounds.MaxKeyBytes a root may leave.
	minKeyBytes = 1024
)

// DefaultConnectTimeout bounds how long New waits for a session when its
// context has no deadline.
const DefaultConnectTimeout = storeargs.DefaultConnectTimeout

// Option configures New.
type Option func(*config) error

type config struct {
	root    string
	session time.Duration
	acl     []zk.ACL
	log     *slog.Logger
	dialer  zk.Dialer // tests cut the network with theirs
	lazy    bool      // WithLazyConnect
}

// WithLazyConnect makes New return at once, without waiting for a session:
// the client connects in the background, calls fail with store errors
// (stores.ErrUnreachable) until it has a session, and the first call with
// one creates the root. Until a server has granted a session timeout, Bounds
// take the one asked for as MaxTTL; a server that grants less makes calls
// with longer TTLs fail (see ErrShortSession). Open's connect=lazy sets it.
func WithLazyConnect() Option {
	return func(c *config) error {
		c.lazy = true
		return nil
	}
}

// WithRoot sets the znode under which the Store keeps its keys: an absolute
// path, not "/", without a trailing slash. Default DefaultRoot. New creates
// it, with its missing ancestors, as persistent nodes.
func WithRoot(path string) Option {
	return func(c *config) error {
		if err := checkRoot(path); err != nil {
			return fmt.Errorf("WithRoot: %w", err)
		}
		c.root = path
		return nil
	}
}

// WithSessionTimeout sets the session timeout the Store asks for: how long
// the server keeps the session, and so the Store's locks and queue places,
// after it last heard from the Store. Default DefaultSessionTimeout. The
// timeout the server grants (within its minSessionTimeout and
// maxSessionTimeout) is the longest TTL the Store takes (see Store.Bounds).
func WithSessionTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Second {
			return fmt.Errorf("WithSessionTimeout: %v is below 1s", d)
		}
		c.session = d
		return nil
	}
}

// WithACL sets the ACL of every znode the Store creates. Default
// zk.WorldACL(zk.PermAll).
func WithACL(acl []zk.ACL) Option {
	return func(c *config) error {
		if len(acl) == 0 {
			return errors.New("WithACL: the ACL is empty")
		}
		c.acl = acl
		return nil
	}
}

// WithLogger sets the logger of the conditions a Store cannot report to a
// caller: a server that granted a session timeout below the Store's MaxTTL
// on a reconnection, and the clean-up of an abandoned call that failed for
// good. Default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("WithLogger: the logger is nil")
		}
		c.log = l
		return nil
	}
}

// checkRoot returns an error unless path is a valid root for a Store.
func checkRoot(path string) error {
	switch {
	case path == "" || path[0] != '/':
		return fmt.Errorf("root %q is not an absolute path", path)
	case path == "/":
		return errors.New("root is /: a Store needs a znode of its own")
	case strings.HasSuffix(path, "/"):
		return fmt.Errorf("root %q ends with a slash", path)
	}
	for _, part := range strings.Split(path[1:], "/") {
		if part == "" || part == "." || part == ".." {
			return fmt.Errorf("root %q has an empty, . or .. element", path)
		}
		for i := 0; i < len(part); i++ {
			if part[i] < 0x20 || part[i] == 0x7F {
				return fmt.Errorf("root %q has a control character", path)
			}
		}
	}
	return nil
}

// New connects to the ZooKeeper ensemble at servers (host:port each) and
// returns a Store once it has a session and its root exists. When that takes
// longer than ctx, or DefaultConnectTimeout when ctx has no deadline, it
// returns an error wrapping stores.ErrUnreachable that names the servers.
// WithLazyConnect returns at once instead. It returns an error wrapping
// stores.ErrInvalid, naming the problem, when servers is empty or an option
// is invalid. Close the Store to end its session, which frees every lock and
// queue place it holds at once.
func New(ctx context.Context, servers []string, opts ...Option) (*Store, error) {
	c := config{root: DefaultRoot, session: DefaultSessionTimeout, acl: zk.WorldACL(zk.PermAll), log: slog.Default(), dialer: net.DialTimeout}
	if len(servers) == 0 {
		return nil, fmt.Errorf("%w: zkstore: no servers", stores.ErrInvalid)
	}
	for _, srv := range servers {
		if srv == "" || strings.ContainsAny(srv, "/, ") {
			return nil, fmt.Errorf("%w: zkstore: server %q is not host:port", stores.ErrInvalid, srv)
		}
	}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: zkstore: nil option", stores.ErrInvalid)
		}
		if err := opt(&c); err != nil {
			return nil, fmt.Errorf("%w: zkstore: %w", stores.ErrInvalid, err)
		}
	}
	s := &Store{
		root:     c.root,
		acl:      c.acl,
		aclBytes: aclBytes(c.acl),
		log:      c.log,
		askedMs:  int32(min(c.session.Milliseconds(), math.MaxInt32)),
		joined:   make(map[waiterID]place),
		done:     make(chan struct{}),
	}
	maxKey := maxKeyBytes(c.root, c.acl)
	if maxKey < minKeyBytes {
		return nil, fmt.Errorf("%w: zkstore: the root and ACL leave keys of %d bytes at most, fewer than %d", stores.ErrInvalid, maxKey, minKeyBytes)
	}
	s.notify.init()
	sessionUp := make(chan struct{}, 1)
	dial := func(network, addr string, timeout time.Duration) (net.Conn, error) {
		conn, err := c.dialer(network, addr, timeout)
		if err != nil {
			return nil, err
		}
		return &sessionConn{Conn: conn, s: s}, nil
	}
	conn, _, err := zk.Connect(servers, c.session,
		zk.WithLogger(log.New(io.Discard, "", 0)),
		zk.WithDialer(dial),
		zk.WithEventCallback(func(ev zk.Event) {
			if ev.Type == zk.EventSession && ev.State == zk.StateHasSession {
				select {
				case sessionUp <- struct{}{}:
				default:
				}
			}
			s.onEvent(ev)
		}))
	if err != nil {
		return nil, fmt.Errorf("zkstore: connect: %w", err)
	}
	s.conn = conn
	if c.lazy {
		s.bounds = sessionBounds(maxKey, c.session, c.session)
		s.maxMs.Store(c.session.Milliseconds())
		return s, nil
	}
	ctx, cancel := storeargs.ConnectContext(ctx)
	defer cancel()
	if conn.State() != zk.StateHasSession {
		select {
		case <-sessionUp:
		case <-ctx.Done():
			// Close waits up to two connect timeouts for a server to take
			// its close request: it ends on its own, after Open returned.
			go conn.Close()
			return nil, args.Unreachable(servers, fmt.Errorf("no session: %w", ctx.Err()))
		}
	}
	granted := time.Duration(s.sessionMs.Load()) * time.Millisecond
	if granted <= 0 {
		go conn.Close()
		return nil, fmt.Errorf("zkstore: the server's answer to the connect request gave no session timeout")
	}
	s.bounds = sessionBounds(maxKey, c.session, granted)
	s.maxMs.Store(granted.Milliseconds())
	// A call creates the root first.
	if _, err := detached(ctx, s, func(*effects) (struct{}, error) { return struct{}{}, nil }, nil); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// sessionConn is a connection to a server that asks for the Store's
// session timeout and notes the one the server grants, which go-zookeeper
// does not export.
//
// The first bytes written on a connection are the connect request
// (ZooKeeper's ConnectRequest: a 4-byte length, a 4-byte protocol version,
// an 8-byte zxid, then the timeout in milliseconds). go-zookeeper asks for
// the timeout granted last, so that a server that once granted less, such
// as a member of an ensemble with a lower maxSessionTimeout, would shorten
// every later session of the Store; sessionConn asks for the configured
// timeout instead.
//
// The first bytes the server sends are its answer (a 4-byte length, a
// 4-byte protocol version, then the timeout in milliseconds). An answer
// that refuses an expired session has a zero timeout, and is ignored.
// go-zookeeper writes a connection from one goroutine at a time, and reads
// it from one goroutine at a time.
//
// Until that answer has come, sessionConn also bounds the connection's
// deadlines to two thirds of the session timeout asked, the bound
// go-zookeeper keeps for every later read: go-zookeeper waits for the
// answer ten times as long (67s for a 10s session), and a server that
// accepted the connection while it started and then neither answered nor
// closed it (ZooKeeper 3.8 fails to close such a connection when it is
// not running yet: a NullPointerException) left the Store without a
// session, every call failing, for that long.
type sessionConn struct {
	net.Conn
	s        *Store
	wrote    bool
	head     [12]byte
	n        int
	answered atomic.Bool // the server's answer came: deadlines pass as set
}

// SetDeadline bounds t while the server has not answered (see
// sessionConn).
func (c *sessionConn) SetDeadline(t time.Time) error { return c.Conn.SetDeadline(c.bound(t)) }

// SetReadDeadline bounds t while the server has not answered (see
// sessionConn).
func (c *sessionConn) SetReadDeadline(t time.Time) error {
	return c.Conn.SetReadDeadline(c.bound(t))
}

// SetWriteDeadline bounds t while the server has not answered (see
// sessionConn).
func (c *sessionConn) SetWriteDeadline(t time.Time) error {
	return c.Conn.SetWriteDeadline(c.bound(t))
}

// bound returns t, or two thirds of the session timeout asked from now
// when t is later or none and the server has not answered yet.
func (c *sessionConn) bound(t time.Time) time.Time {
	if c.answered.Load() {
		return t
	}
	limit := time.Now().Add(time.Duration(c.s.askedMs) * time.Millisecond * 2 / 3)
	if t.IsZero() || t.After(limit) {
		return limit
	}
	return t
}

func (c *sessionConn) Write(b []byte) (int, error) {
	if !c.wrote {
		c.wrote = true
		if len(b) >= 20 {
			b = slices.Clone(b)
			binary.BigEndian.PutUint32(b[16:20], uint32(c.s.askedMs))
		}
	}
	return c.Conn.Write(b)
}

func (c *sessionConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.n < len(c.head) {
		c.n += copy(c.head[c.n:], b[:n])
		if c.n == len(c.head) {
			if ms := int32(binary.BigEndian.Uint32(c.head[8:])); ms > 0 {
				c.s.sessionMs.Store(int64(ms))
			}
			c.answered.Store(true)
		}
	}
	return n, err
}

// ensureRoot creates the root unless a call has: the first call of a Store
// does, New's or, with WithLazyConnect, the first with a session. One call
// at a time tries; a failure is that call's, and the next one tries again.
func (s *Store) ensureRoot(e *effects) error {
	if s.rootMade.Load() {
		return nil
	}
	s.rootMu.Lock()
	defer s.rootMu.Unlock()
	if s.rootMade.Load() {
		return nil
	}
	if err := s.makeRoot(e); err != nil {
		return fmt.Errorf("zkstore: create root %q: %w", s.root, err)
	}
	s.rootMade.Store(true)
	return nil
}

// makeRoot creates the root and its missing ancestors, as persistent nodes.
func (s *Store) makeRoot(e *effects) error {
	path := ""
	for _, part := range strings.Split(s.root[1:], "/") {
		path += "/" + part
		if _, err := s.conn.Create(path, nil, 0, s.acl); e.note(err) != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

// Close closes the connection, which ends the session: ZooKeeper then
// deletes every lock and queue place of the Store at once, kept keys
// included. It then waits for the Store's goroutines: the calls still in
// flight, which fail, and the release subscriptions, whose channels get no
// more signals. Calls made after Close return an error wrapping ErrClosed.
// Close is idempotent and returns nil.
func (s *Store) Close() error {
	s.life.Lock()
	if s.closed {
		s.life.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	s.life.Unlock()
	// Closing the session first ends the requests still in flight, which
	// would otherwise wait for a lost server, and deletes the Store's
	// nodes, which is every clean-up an abandoned call had left to do.
	s.conn.Close()
	s.wg.Wait()
	return nil
}

// isClosed reports whether Close has been called.
func (s *Store) isClosed() bool {
	s.life.Lock()
	defer s.life.Unlock()
	return s.closed
}

// goTracked runs fn in a goroutine that Close waits for, and reports false,
// without running it, once the Store is closed.
func (s *Store) goTracked(fn func()) bool {
	s.life.Lock()
	defer s.life.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		fn()
	}()
	return true
}

// onEvent is the connection's event callback. go-zookeeper calls it from
// its receiving goroutine, in the order the server sent the events, before
// it wakes the watches: so signals reach subscribers in release order. It
// never blocks.
func (s *Store) onEvent(ev zk.Event) {
	switch ev.Type {
	case zk.EventNodeDeleted:
		s.notify.deleted(ev.Path)
	case zk.EventSession:
		// A new session has none of the old one's nodes and watches, and a
		// session that came back may have missed events: every waiter
		// tries again, and every subscription watches anew.
		if ev.State == zk.StateHasSession || ev.State == zk.StateExpired {
			s.notify.wakeAll()
		}
		if ev.State == zk.StateHasSession {
			s.noteSession(ev.Server)
		}
	case zk.EventNotWatching:
		s.notify.wakeAll()
	}
}

// noteSession logs a session timeout granted below the Store's MaxTTL, and
// its end, once each: until then, calls with a TTL above it fail (see
// checkSession).
func (s *Store) noteSession(server string) {
	ms, maxMs := s.sessionMs.Load(), s.maxMs.Load()
	switch {
	case maxMs == 0: // New has not set the bounds: this is the first session
	case ms < maxMs && s.shortMs.Swap(ms) != ms:
		s.log.Warn("zkstore: the server granted a session timeout below the store's MaxTTL; calls with a longer TTL fail until a server grants more",
			slog.Duration("granted", time.Duration(ms)*time.Millisecond), slog.Duration("max_ttl", time.Duration(maxMs)*time.Millisecond),
			slog.String("server", server))
	case ms >= maxMs && s.shortMs.Swap(0) != 0:
		s.log.Info("zkstore: the server granted a session timeout of the store's MaxTTL again",
			slog.Duration("granted", time.Duration(ms)*time.Millisecond), slog.String("server", server))
	}
}

// Root returns the znode under which the Store keeps its keys.
func (s *Store) Root() string { return s.root }

// maxAttempts bounds the rounds of one call that lose a race to another
// writer of the same nodes (a version conflict) and read them again.
const maxAttempts = 10

// lockNode is what a read of one key's lock node found.
type lockNode struct {
	exists   bool
	readable bool   // its data parsed; otherwise it is held, by nobody's token, while it stands
	token    string // when readable
	version  int32  // the node's data version
	czxid    int64  // the transaction that created it, which names one grant
	left     time.Duration
	noHolder bool // it has no holder node (another version's grant, or a marker): a takeover deletes none

	// shared is set for the marker of a key held shared (see shared.go);
	// inspected once its holders were read, holders of them live, and left
	// the longest time one has left.
	shared    bool
	inspected bool
	holders   int

	// guarded is set once pver names the node's grant for a takeover: the
	// data version of the key's parent node (see guard).
	guarded bool
	pver    int32
}

// free reports whether a grant to token may take the node: it is absent,
// expired, or token's own (a retried acquire); or a shared marker whose
// holders were read and none is live.
func (n lockNode) free(token string) bool {
	if n.shared {
		return n.inspected && n.holders == 0
	}
	return !n.exists || (n.readable && (n.token == token || n.left <= 0))
}

// heldBy reports whether the node holds token's grant, not expired.
func (n lockNode) heldBy(token string) bool {
	return n.exists && n.readable && !n.shared && n.token == token && n.left > 0
}

// wait is a refusal's Wait for the node: its holder's remaining TTL, or
// zero (unknown) for data this Store cannot read.
func (n lockNode) wait() time.Duration {
	if !n.readable {
		return 0
	}
	return n.left
}

// ownerChecked returns the operations that apply op to the lock node at
// lock only while it holds token's grant: a check of the grant's holder
// node first, in the same transaction (see holderName).
func ownerChecked(lock, token string, op any) []any {
	return []any{&zk.CheckVersionRequest{Path: holderOf(lock, token), Version: -1}, op}
}

// Acquire sets every key to token for ttl when none is held by another
// token, in one ZooKeeper transaction, and returns each key's fence: the
// transaction's zxid times stores.FenceStride. See stores.Store. A refusal's
// Wait is the holder's remaining TTL as this Store ages it, or zero when
// every attempt lost its race for a key found free to other callers.
// Errors wrap stores.ErrInvalid (bad arguments), stores.ErrUnreachable (no
// session: nothing sent), stores.ErrAbandoned (ctx ended in flight; undone),
// ErrClosed, ErrFenceRange, or a go-zookeeper error (outcome unknown).
func (s *Store) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	if err := s.checkCall(ctx, keys, token, "ttl", ttl, false); err != nil {
		return stores.Grant{}, err
	}
	return detached(ctx, s, func(e *effects) (stores.Grant, error) {
		return s.acquire(e, s.lockPaths(keys), token, ttl)
	}, func(g stores.Grant, err error) {
		if err == nil && !g.OK {
			return
		}
		s.undo(keys, token, false) // owner-checked: a no-op when nothing was granted
	})
}

// acquire is Acquire on the lock nodes at paths, noting its writes in e.
func (s *Store) acquire(e *effects, paths []string, token string, ttl time.Duration) (stores.Grant, error) {
	data := lockData(ttl, token)
	var nodes []lockNode // nil until read: first try to create every node
	now := time.Now()
	if slices.ContainsFunc(paths, func(p string) bool { return s.ages.live(p, now) }) {
		// A key seen held: read first, so a refusal costs one round trip.
		var err error
		if nodes, err = s.readLocks(paths); err != nil {
			return stores.Grant{}, fmt.Errorf("acquire: %w", err)
		}
	}
	for attempt := 1; ; attempt++ {
		start := time.Now()
		if err := s.guardAll(e, paths, nodes, token); err != nil {
			return stores.Grant{}, fmt.Errorf("acquire: %w", err)
		}
		writers, err := s.inspectAll(e, paths, nodes, token)
		if err != nil {
			return stores.Grant{}, fmt.Errorf("acquire: %w", err)
		}
		for i, n := range nodes {
			if !n.free(token) {
				if n.shared {
					s.writerWaits(e, paths[i], token)
				}
				return stores.Grant{Held: i, Wait: n.wait(), SharedHeld: n.shared}, nil
			}
		}
		ops, stamps, holders, err := s.grantOps(paths, nodes, token, data)
		if err != nil {
			return stores.Grant{}, fmt.Errorf("acquire: %w", err)
		}
		resp, err := s.multi(e, ops...)
		if err == nil {
			g, err := s.granted(e, paths, token, ttl, start, resp, stamps)
			if err == nil {
				for i, p := range paths {
					s.dropWriter(e, p, token, writers != nil && writers[i])
				}
			}
			return g, err
		}
		if k, ok := missingHolder(ops, resp, holders); ok && attempt < maxAttempts {
			// The grant read has no holder node: another version's grant.
			// It is still the key's grant (its guard, before the delete of
			// the holder node, passed): take it over without deleting one,
			// under the same guard, which fails should another grant be
			// made in between.
			nodes[k].noHolder = true
			continue
		}
		if attempt >= maxAttempts && errors.Is(err, zk.ErrNodeExists) {
			// Every attempt lost a race for a key that was free when read:
			// others keep taking it. A refusal, for how long unknown.
			return stores.Grant{Held: failedKey(ops, resp, paths)}, nil
		}
		if err = s.retryable(e, err, paths, attempt); err != nil {
			return stores.Grant{}, fmt.Errorf("acquire: %w", err)
		}
		if nodes, err = s.readLocks(paths); err != nil {
			return stores.Grant{}, fmt.Errorf("acquire: %w", err)
		}
	}
}

// grantOps returns the transaction that grants the lock nodes at paths,
// found as nodes (nil: assumed absent), to token with data. For each key,
// it first sets the parent's data: at the version that names the grant
// read (see guard) when the lock node is present, so that the transaction
// fails should another grant of the key have been made since; and in any
// case so that the next grant's guard changes, and because the reply
// carries the transaction's zxid, the fence, which a create in a
// transaction does not report. Then a lock node present is deleted at the
// version read, with its holder's node, and the lock node is created anew
// as an ephemeral node, with token's holder node. stamps holds the index of
// each key's SetData, and holders maps the index of each delete of a holder
// node to its key. Every node present must be guarded.
func (s *Store) grantOps(paths []string, nodes []lockNode, token string, data []byte) (ops []any, stamps []int, holders map[int]int, err error) {
	ops = make([]any, 0, 5*len(paths))
	stamps = make([]int, len(paths))
	for i, p := range paths {
		present := nodes != nil && nodes[i].exists
		guard := int32(-1) // absent: the create fails should the node exist
		if present {
			if !nodes[i].guarded {
				return nil, nil, nil, errors.New("internal error: a takeover of a grant not guarded")
			}
			guard = nodes[i].pver
		}
		stamps[i] = len(ops)
		ops = append(ops, &zk.SetDataRequest{Path: parentOf(p), Version: guard})
		if present {
			ops = append(ops, &zk.DeleteRequest{Path: p, Version: nodes[i].version})
			if !nodes[i].noHolder {
				if holders == nil {
					holders = make(map[int]int)
				}
				holders[len(ops)] = i
				ops = append(ops, &zk.DeleteRequest{Path: holderOf(p, nodes[i].token), Version: -1})
			}
		}
		ops = append(ops,
			&zk.CreateRequest{Path: p, Data: data, Acl: s.acl, Flags: zk.FlagEphemeral},
			&zk.CreateRequest{Path: holderOf(p, token), Acl: s.acl, Flags: zk.FlagEphemeral})
	}
	return ops, stamps, holders, nil
}

// guardAll guards (see guard) every node of nodes, read at paths, that a
// grant to token would take over, in parallel.
func (s *Store) guardAll(e *effects, paths []string, nodes []lockNode, token string) error {
	return forEach(len(nodes), func(i int) error {
		if n := &nodes[i]; n.exists && n.free(token) && !n.guarded {
			return s.guard(e, paths[i], n, nil)
		}
		return nil
	})
}

// guard names the grant n, read at the lock node at path, for a
// transaction that takes it over (grantOps): n.pver is the data version of
// the key's parent node, which every grant's transaction sets, so that a
// takeover that sets the parent at that version fails once another grant
// of the key has been made since n was read, and never deletes that grant.
// The lock node's own version cannot name a grant: it starts again at 0
// with each node, and two contenders that take over the same expired grant
// would each find the other's new node at the version they read.
//
// parent is the parent's stat as read alongside n, or nil. Its version
// names n's grant when the parent's last write is n's creation; otherwise
// (another grant in between, or a node made by another writer) the parent
// and then the node are read again, in that order, which may change n. A
// parent version of -1, which ZooKeeper takes for "any version" (versions
// wrap there after 2^32-1 writes), is moved on first.
func (s *Store) guard(e *effects, path string, n *lockNode, parent *zk.Stat) error {
	after := false // n was read after parent
	for {
		if parent == nil {
			ok, st, err := s.conn.Exists(parentOf(path))
			if err != nil {
				return err
			}
			if !ok {
				*n = lockNode{} // the node went with its parent
				return nil
			}
			parent, after = st, false
		}
		switch {
		case parent.Version == -1:
			if _, err := s.conn.Set(parentOf(path), nil, -1); e.note(err) != nil && !errors.Is(err, zk.ErrNoNode) {
				return err
			}
			parent = nil
			continue
		case after || parent.Mzxid == n.czxid:
			n.guarded, n.pver = true, parent.Version
			return nil
		}
		if err := s.readLock(path, n); err != nil {
			return err
		}
		if !n.exists {
			return nil
		}
		after = true
	}
}

// missingHolder reports whether the transaction ops failed, per resp, on the
// delete of a holder node that did not exist, and returns its key's index
// in holders.
func missingHolder(ops []any, resp []zk.MultiResponse, holders map[int]int) (int, bool) {
	for i, r := range resp {
		if r.Error == nil || i >= len(ops) {
			continue
		}
		k, ok := holders[i]
		return k, ok && errors.Is(r.Error, zk.ErrNoNode)
	}
	return 0, false
}

// failedKey returns the index in paths of the node of the first operation
// of ops that failed, per resp, or 0 when none is known.
func failedKey(ops []any, resp []zk.MultiResponse, paths []string) int {
	for i, r := range resp {
		if r.Error == nil || i >= len(ops) {
			continue
		}
		if c, ok := ops[i].(*zk.CreateRequest); ok {
			if k := slices.Index(paths, c.Path); k >= 0 {
				return k
			}
		}
		break
	}
	return 0
}

// granted returns the Grant of a transaction that created the lock nodes at
// paths, whose last operation's stat is stat, and records the grant as this
// Store's write, made by a call that started at start.
//
// Fences: every create of a lock node is a transaction of its own (a
// release deletes the node, a retry or takeover deletes and creates it), and
// ZooKeeper numbers transactions with zxids that grow strictly, ensemble-wide,
// and survive restarts in the transaction log. So the zxid of a grant's
// transaction, its nodes' czxid, is above the previous grant's by at least
// one, and times stores.FenceStride by at least the stride.
func (s *Store) granted(e *effects, paths []string, token string, ttl time.Duration, start time.Time, resp []zk.MultiResponse, stamps []int) (stores.Grant, error) {
	var zxid int64
	session := s.conn.SessionID() // the session that made the grant, or a later one
	for i, p := range paths {
		st := resp[stamps[i]].Stat
		if st == nil {
			return stores.Grant{}, errors.New("acquire: the transaction's reply has no stat")
		}
		zxid = st.Mzxid // the same for every key: one transaction
		s.ages.wrote(p, zxid, token, session, ttl, start)
	}
	if zxid <= 0 || zxid > math.MaxInt64/stores.FenceStride {
		_ = s.releasePaths(e, paths, token, 0, time.Now())
		return stores.Grant{}, fmt.Errorf("%w: zxid %#x", ErrFenceRange, zxid)
	}
	fences := make([]int64, len(paths))
	for i := range fences {
		fences[i] = zxid * stores.FenceStride
	}
	return stores.Grant{OK: true, Fences: fences}, nil
}

// retryable returns nil when err, the failure of attempt, is a conflict with
// another writer worth a new read and attempt, after creating the parents
// of the lock nodes at paths when one was missing (noted in e); and err
// otherwise.
func (s *Store) retryable(e *effects, err error, paths []string, attempt int) error {
	switch {
	case attempt >= maxAttempts:
		return fmt.Errorf("gave up after %d conflicting attempts: %w", attempt, err)
	case errors.Is(err, zk.ErrNoNode):
		return s.makeParents(e, paths)
	case errors.Is(err, zk.ErrNodeExists), errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNotEmpty):
		return nil
	}
	return err
}

// makeParents creates the parents of the nodes at paths, as container nodes
// (the server deletes them once empty), when missing.
func (s *Store) makeParents(e *effects, paths []string) error {
	return forEach(len(paths), func(i int) error {
		_, err := s.conn.CreateContainer(parentOf(paths[i]), nil, zk.FlagContainer, s.acl)
		if e.note(err) != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
		return nil
	})
}

// readLocks reads the lock nodes at paths, in parallel.
func (s *Store) readLocks(paths []string) ([]lockNode, error) {
	nodes := make([]lockNode, len(paths))
	err := forEach(len(paths), func(i int) error { return s.readLock(paths[i], &nodes[i]) })
	return nodes, err
}

// readLock reads the lock node at path into n.
func (s *Store) readLock(path string, n *lockNode) error {
	data, stat, err := s.conn.Get(path)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		*n = lockNode{}
		return nil
	case err != nil:
		return err
	}
	if isMarker(data) {
		*n = lockNode{exists: true, readable: true, shared: true, version: stat.Version, czxid: stat.Czxid}
		return nil
	}
	ttl, token, ok := parseLockData(data)
	*n = lockNode{exists: true, readable: ok, token: token, version: stat.Version, czxid: stat.Czxid,
		left: s.ages.remaining(path, stat.Mzxid, ttl, time.Now())}
	return nil
}

// forEach runs fn for 0..n-1, in parallel when n > 1 (go-zookeeper
// pipelines the requests on its connection), and returns the first error.
func forEach(n int, fn func(i int) error) error {
	if n == 1 {
		return fn(0)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = fn(i) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Release ends token's grant on every key that still holds it: it deletes
// the key's lock node, which wakes the key's waiters, or with keep positive
// sets the node's TTL to keep, which wakes nobody. A key whose TTL has
// passed counts as not held. It returns an error wrapping stores.ErrNotHeld
// when some key did not hold token, after ending the grant on the others.
// A kept key stays held until keep has passed or the Store's session ends,
// whichever comes first (see the package documentation). Without a session,
// a Release of keys whose grants this Store knows ended (their TTL passed,
// or their session is gone) returns stores.ErrNotHeld without the server.
func (s *Store) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	if err := s.checkCall(ctx, keys, token, "keep", keep, false); err != nil {
		return err
	}
	paths := s.lockPaths(keys)
	if s.conn.State() != zk.StateHasSession && s.allGone(paths, token) {
		return fmt.Errorf("%w: zkstore: release: the grant's TTL has passed or its session ended", stores.ErrNotHeld)
	}
	_, err := detached(ctx, s, func(e *effects) (struct{}, error) {
		return struct{}{}, s.releasePaths(e, paths, token, keep, time.Now())
	}, nil)
	return err
}

// release is Release, without its checks.
func (s *Store) release(keys []string, token string, keep time.Duration) error {
	return s.releasePaths(nil, s.lockPaths(keys), token, keep, time.Now())
}

// allGone reports whether this Store's records show that token's grant of
// every lock node at paths has ended.
func (s *Store) allGone(paths []string, token string) bool {
	session, now := s.conn.SessionID(), time.Now()
	for _, p := range paths {
		if s.ages.owned(p, token, session, now) != ownGone {
			return false
		}
	}
	return true
}

// releasePaths is Release on the lock nodes at paths, by a call that
// started at start, noting its writes in e.
func (s *Store) releasePaths(e *effects, paths []string, token string, keep time.Duration, start time.Time) error {
	data := lockData(keep, token)
	end := func(p string, version int32) []any {
		if keep > 0 {
			return ownerChecked(p, token, &zk.SetDataRequest{Path: p, Data: data, Version: version})
		}
		return append(ownerChecked(p, token, &zk.DeleteRequest{Path: p, Version: version}),
			&zk.DeleteRequest{Path: holderOf(p, token), Version: -1})
	}
	// This Store's own grant in its current session: no read needed.
	if s.ownAll(paths, token, start) {
		var ops []any
		for _, p := range paths {
			ops = append(ops, end(p, -1)...)
		}
		resp, err := s.multi(e, ops...)
		if err == nil {
			s.released(paths, ops, resp, token, keep, start)
			return nil
		}
		if err = s.retryable(e, err, nil, 1); err != nil {
			return fmt.Errorf("release: %w", err)
		}
	}
	for attempt := 1; ; attempt++ {
		start = time.Now()
		nodes, err := s.readLocks(paths)
		if err != nil {
			return fmt.Errorf("release: %w", err)
		}
		var (
			ops     []any
			touched []string
			notHeld []string
		)
		for i, n := range nodes {
			switch {
			case !n.exists || !n.readable || n.shared || n.token != token:
				notHeld = append(notHeld, paths[i])
			case n.left <= 0: // expired, not yet taken over: cleaned up
				notHeld = append(notHeld, paths[i])
				ops = append(ops, ownerChecked(paths[i], token, &zk.DeleteRequest{Path: paths[i], Version: n.version})...)
				ops = append(ops, &zk.DeleteRequest{Path: holderOf(paths[i], token), Version: -1})
				touched = append(touched, paths[i])
			default:
				ops = append(ops, end(paths[i], n.version)...)
				touched = append(touched, paths[i])
			}
		}
		if len(ops) > 0 {
			resp, err := s.multi(e, ops...)
			if err != nil {
				if err = s.retryable(e, err, nil, attempt); err != nil {
					return fmt.Errorf("release: %w", err)
				}
				continue
			}
			s.released(touched, ops, resp, token, keep, start)
		}
		if len(notHeld) > 0 {
			// A waiting writer withdraws its records (see shared.go).
			if err := s.withdraw(e, notHeld, token); err != nil {
				return fmt.Errorf("release: withdraw the writer's records: %w", err)
			}
			return fmt.Errorf("%w: zkstore: release: %d of %d keys not held by the token", stores.ErrNotHeld, len(notHeld), len(paths))
		}
		return nil
	}
}

// released records a release transaction ops of the lock nodes at paths,
// whose replies are resp: a kept node's new version is this Store's write,
// a deleted node is forgotten.
func (s *Store) released(paths []string, ops []any, resp []zk.MultiResponse, token string, keep time.Duration, start time.Time) {
	session := s.conn.SessionID()
	for i, op := range ops {
		switch op := op.(type) {
		case *zk.SetDataRequest:
			if st := resp[i].Stat; st != nil && keep > 0 {
				s.ages.wrote(op.Path, st.Mzxid, token, session, keep, start)
			}
		case *zk.DeleteRequest:
			if slices.Contains(paths, op.Path) {
				s.ages.forget(op.Path)
			}
		}
	}
}

// ownAll reports whether this Store granted the lock nodes at paths to
// token, or kept or refreshed them since, in its current session, and none
// has expired at now. The nodes may have changed since: the holder node
// checks the token on the server.
func (s *Store) ownAll(paths []string, token string, now time.Time) bool {
	session := s.conn.SessionID()
	for _, p := range paths {
		if s.ages.owned(p, token, session, now) != ownLive {
			return false
		}
	}
	return true
}

// Refresh sets the TTL of every key to ttl when each still holds token and
// its TTL has not passed; otherwise it changes nothing and returns an error
// wrapping stores.ErrNotHeld. A key whose holder's session has ended
// (expired, or closed) is gone, and so not held. A key whose grant this
// Store made and knows ended (its TTL passed, or its session is gone) is
// not held either: Refresh answers so without the server, even while it
// cannot reach one.
func (s *Store) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	if err := s.checkCall(ctx, keys, token, "ttl", ttl, false); err != nil {
		return err
	}
	paths := s.lockPaths(keys)
	session, now := s.conn.SessionID(), time.Now()
	for i, p := range paths {
		if s.ages.owned(p, token, session, now) == ownGone {
			return fmt.Errorf("%w: zkstore: refresh: key %d of %d: the grant's TTL has passed or its session ended",
				stores.ErrNotHeld, i+1, len(paths))
		}
	}
	_, err := detached(ctx, s, func(e *effects) (struct{}, error) {
		return struct{}{}, s.refresh(e, paths, token, ttl)
	}, nil)
	return err
}

// refresh is Refresh on the lock nodes at paths, noting its writes in e.
func (s *Store) refresh(e *effects, paths []string, token string, ttl time.Duration) error {
	data := lockData(ttl, token)
	known := s.ownAll(paths, token, time.Now())
	versions := make([]int32, len(paths))
	for i := range versions {
		versions[i] = -1 // this Store's own grants: the holder nodes check them
	}
	for attempt := 1; ; attempt++ {
		start := time.Now()
		if !known {
			nodes, err := s.readLocks(paths)
			if err != nil {
				return fmt.Errorf("refresh: %w", err)
			}
			for i, n := range nodes {
				if !n.heldBy(token) {
					return fmt.Errorf("%w: zkstore: refresh: key %d of %d not held by the token", stores.ErrNotHeld, i+1, len(paths))
				}
				versions[i] = n.version
			}
		}
		var ops []any
		for i, p := range paths {
			ops = append(ops, ownerChecked(p, token, &zk.SetDataRequest{Path: p, Data: data, Version: versions[i]})...)
		}
		resp, err := s.multi(e, ops...)
		if err == nil {
			session := s.conn.SessionID()
			for i, p := range paths {
				if st := resp[2*i+1].Stat; st != nil {
					s.ages.wrote(p, st.Mzxid, token, session, ttl, start)
				}
			}
			return nil
		}
		if err = s.retryable(e, err, nil, attempt); err != nil {
			return fmt.Errorf("refresh: %w", err)
		}
		known = false
	}
}
