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
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/reqlock/reqlock/internal/storeargs"
	"github.com/reqlock/reqlock/stores"
)

// Store is a stores.Store, stores.Notifier and stores.FairStore on
// ZooKeeper; see the package documentation. It is safe for concurrent use.
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

	subs subscriptions

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

// Errors of the package, checkable with errors.Is.
var (
	// ErrClosed is returned by the calls made after Close.
	ErrClosed = errors.New("zkstore: store closed")

	// ErrFenceRange is returned by an Acquire whose transaction id times
	// stores.FenceStride does not fit an int64: the ensemble has gone
	// through more than 2^21 leader epochs. The grant is released.
	ErrFenceRange = errors.New("zkstore: fence out of the int64 range")

	// ErrShortSession marks the failure of a call whose TTL is longer than
	// the session timeout the server granted when the Store last
	// connected, below the Store's MaxTTL: a grant's validity would outlive
	// the session, and so its node, should the Store be cut off. Such
	// errors wrap stores.ErrUnreachable too: nothing was sent.
	ErrShortSession = errors.New("zkstore: the server granted a session timeout shorter than the TTL")

	// errNoSession marks a call made while the connection has no session.
	errNoSession = errors.New("zkstore: no ZooKeeper session")
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
	s.subs.init()
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
	if _, err := call(ctx, s, func(*effects) (struct{}, error) { return struct{}{}, nil }, nil); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// DefaultConnectTimeout bounds how long New waits for a session when its
// context has no deadline.
const DefaultConnectTimeout = storeargs.DefaultConnectTimeout

// Open returns a Store from a URL of the form
//
//	zk://host:port[,host:port...]/root/path?session=10s&connect=check
//
// The path is the Store's root (DefaultRoot when empty or "/"); session is
// the session timeout (DefaultSessionTimeout when absent), a Go duration of
// at least 1s. With connect=check, the default, Open waits for a session as
// New does, and fails naming the servers when none answers in time; with
// connect=lazy (WithLazyConnect) it returns at once, and the Store works
// once a server answers. Open returns an error wrapping stores.ErrInvalid,
// naming the problem, for any other scheme, a missing host, a user, a
// fragment, an unknown parameter (also wrapping stores.ErrUnknownOption) or
// a connect other than check or lazy; and
// New's errors.
func Open(ctx context.Context, rawURL string) (*Store, error) {
	servers, opts, err := parseURL(rawURL)
	if errors.Is(err, stores.ErrInvalid) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("%w: zkstore: %w", stores.ErrInvalid, err)
	}
	return New(ctx, servers, opts...)
}

// parseURL parses Open's URL into New's arguments.
func parseURL(rawURL string) ([]string, []Option, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("bad URL: %w", err)
	}
	switch {
	case u.Scheme != "zk":
		return nil, nil, fmt.Errorf("URL scheme %q is not zk", u.Scheme)
	case u.Opaque != "":
		return nil, nil, fmt.Errorf("URL %q has no //host", rawURL)
	case u.Host == "":
		return nil, nil, errors.New("URL has no host:port")
	case u.User != nil:
		return nil, nil, errors.New("URL has a user: ZooKeeper authentication is not supported")
	case u.Fragment != "":
		return nil, nil, fmt.Errorf("URL has a fragment %q", u.Fragment)
	}
	var servers []string
	for _, h := range strings.Split(u.Host, ",") {
		if h == "" || !strings.Contains(h, ":") {
			return nil, nil, fmt.Errorf("server %q is not host:port", h)
		}
		servers = append(servers, h)
	}
	var opts []Option
	if p := u.Path; p != "" && p != "/" {
		opts = append(opts, WithRoot(p))
	}
	query := u.Query()
	connect, err := args.ParseConnect(query)
	if err != nil {
		return nil, nil, err
	}
	if connect == storeargs.ConnectLazy {
		opts = append(opts, WithLazyConnect())
	}
	if err := args.CheckOptions(query, storeargs.ConnectParam, "session"); err != nil {
		return nil, nil, err
	}
	if values, ok := query["session"]; ok {
		d, err := time.ParseDuration(values[len(values)-1])
		if err != nil {
			return nil, nil, fmt.Errorf("session %q is not a duration", values[len(values)-1])
		}
		opts = append(opts, WithSessionTimeout(d))
	}
	return servers, opts, nil
}

// sessionBounds returns the Bounds of a Store that takes keys of up to
// maxKey bytes and asked for a session timeout of asked, of which the server
// granted granted.
//
// MaxTTL is the session timeout granted: a grant's validity must end before
// the server can delete its node, which it does once it has heard nothing
// from the Store's session for that long. The server restarts a session's
// timer on each request it receives, after the Store sent it, so a grant or
// renewal that started at t stands, on the server, until t plus the timeout
// at the earliest; a holder's validity counts from t as well (the Locker's
// margin for clock drift covers clocks that run at slightly different
// rates). A TTL up to the session timeout therefore ends first.
func sessionBounds(maxKey int, asked, granted time.Duration) stores.Bounds {
	reason := fmt.Sprintf("the ZooKeeper session timeout (URL parameter session=%v, or WithSessionTimeout)", asked)
	if granted != asked {
		reason = fmt.Sprintf("the ZooKeeper session timeout of %v the server granted (the store asked for %v: URL parameter session=, "+
			"or WithSessionTimeout; the server keeps it within its minSessionTimeout and maxSessionTimeout)", granted, asked)
	}
	return stores.Bounds{
		MaxKeyBytes: maxKey,
		MinTTL:      MinTTL,
		MaxTTL:      granted,
		Reason:      reason + ", ZooKeeper's 1 MiB request limit (jute.maxbuffer) and TTLs kept in whole milliseconds",
	}
}

// Bounds returns the keys and TTLs the Store takes; see stores.Bounded and
// the package documentation. MaxTTL is the session timeout the server
// granted on the Store's first connection (a later connection granted less
// makes calls with longer TTLs fail, see ErrShortSession); MaxKeyBytes is
// what fits ZooKeeper's request limit with the Store's root.
func (s *Store) Bounds() stores.Bounds { return s.bounds }

// checkCall checks the arguments of Acquire and Refresh (what "ttl"), or of
// Release (what "keep", for which d may be zero or less), as storeargs does,
// and against the Store's bounds; see stores.Bounded.
func (s *Store) checkCall(ctx context.Context, keys []string, token, what string, d time.Duration, fair bool) error {
	var err error
	if what == "keep" {
		err = args.CheckRelease(ctx, keys)
	} else {
		err = args.CheckAcquire(ctx, keys, d)
	}
	if err != nil {
		return err
	}
	if d > 0 {
		if err := s.bounds.CheckTTL(what, d); err != nil {
			return fmt.Errorf("zkstore: %w", err)
		}
	}
	for _, k := range keys {
		if err := s.bounds.CheckKey(k); err != nil {
			return fmt.Errorf("zkstore: %w", err)
		}
	}
	if err := s.checkSize(keys, token, fair); err != nil {
		return err
	}
	if what == "ttl" {
		return s.checkSession(d)
	}
	return nil
}

// checkSession returns an error wrapping ErrShortSession and
// stores.ErrUnreachable when ttl, the validity of a grant, is longer than
// the session timeout the server granted when the Store last connected:
// the Store's MaxTTL is the timeout granted by the first connection, and a
// server of an ensemble configured with a lower maxSessionTimeout (or a
// larger tickTime) grants less. Should the Store then be cut off, the
// server would delete the grant's node before its validity ends. A keep
// or a lease is no validity: a kept key or a queue place held for less
// than asked, when its Store is cut off for longer than the session
// timeout, lets nobody in early who could then clash with a holder.
func (s *Store) checkSession(ttl time.Duration) error {
	granted := time.Duration(s.sessionMs.Load()) * time.Millisecond
	if ttl <= granted || granted == 0 { // 0: no session yet, and the call fails for that
		return nil
	}
	return fmt.Errorf("%w: %w: ttl %v is longer than the session timeout of %v that the server granted when the store last connected "+
		"(less than the store's MaxTTL of %v: a server of the ensemble has a lower maxSessionTimeout or a larger tickTime); "+
		"refused so that no grant outlives its session", stores.ErrUnreachable, ErrShortSession, ttl, granted, s.bounds.MaxTTL)
}

// checkFair checks key, ttl and lease of AcquireFair (zero ttl and lease
// for LeaveFair) against the Store's bounds.
func (s *Store) checkFair(key, token string, ttl, lease time.Duration) error {
	for _, d := range []struct {
		what string
		d    time.Duration
	}{{"ttl", ttl}, {"lease", lease}} {
		if d.d > 0 {
			if err := s.bounds.CheckTTL(d.what, d.d); err != nil {
				return fmt.Errorf("zkstore: %w", err)
			}
		}
	}
	if err := s.bounds.CheckKey(key); err != nil {
		return fmt.Errorf("zkstore: %w", err)
	}
	if err := s.checkSize([]string{key}, token, true); err != nil {
		return err
	}
	if ttl > 0 {
		return s.checkSession(ttl)
	}
	return nil
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
type sessionConn struct {
	net.Conn
	s     *Store
	wrote bool
	head  [12]byte
	n     int
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
		s.subs.deleted(ev.Path)
	case zk.EventSession:
		// A new session has none of the old one's nodes and watches, and a
		// session that came back may have missed events: every waiter
		// tries again, and every subscription watches anew.
		if ev.State == zk.StateHasSession || ev.State == zk.StateExpired {
			s.subs.wakeAll()
		}
		if ev.State == zk.StateHasSession {
			s.noteSession(ev.Server)
		}
	case zk.EventNotWatching:
		s.subs.wakeAll()
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
