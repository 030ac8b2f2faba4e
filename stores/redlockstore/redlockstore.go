package redlockstore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/callctx"
	"github.com/reqlock/reqlock/internal/storeargs"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// args checks the arguments of Store's methods; its errors start "redlockstore:".
const args storeargs.Checker = "redlockstore"

// MarkerKey is the key each node keeps to tell that it has not lost its data
// (see Restarts in the package documentation).
const MarkerKey = "reqlock:redlock:node"

// Defaults of the options.
const (
	DefaultNodeTimeout    = time.Second // lower it on a fast network for a faster failover
	DefaultMaxTTL         = time.Minute
	DefaultDriftFactor    = 0.01
	DefaultDriftFixed     = 2 * time.Millisecond
	DefaultFenceRetention = 24 * time.Hour
	// MinFenceRetention is the shortest fence retention WithFenceRetention
	// accepts.
	MinFenceRetention = time.Minute
)

// tombstoneMargin is how much longer than the max TTL and the drift
// allowance a tombstone lives (see tombstoneTTL).
const tombstoneMargin = 2 * time.Second

// NodeStat counts one node's calls and failures since New, and the
// clean-up the Store owes it.
type NodeStat struct {
	Node        string
	Calls       uint64 // script calls sent to the node
	Failures    uint64 // calls that failed: errors, timeouts, quarantine
	Quarantines uint64 // calls refused while the node was quarantined
	Skipped     uint64 // calls not sent because the node was skipped (see Skipped nodes)
	Owed        int    // releases the Store owes the node and has not landed yet (see Clean-up)
	GivenUp     uint64 // owed releases given up: expired first, too many owed, or the Store closed
}

var (
	_ stores.Store    = (*Store)(nil)
	_ stores.Notifier = (*Store)(nil)
)

// Store is a stores.Store on Redlock over N independent Redis masters, a
// stores.Notifier and a stores.SharedStore. It is safe for concurrent use. Close stops its pub/sub
// connection and waits for its background calls.
type Store struct {
	nodes  []*node
	quorum int

	nodeTimeout    time.Duration
	maxTTL         time.Duration
	driftFactor    float64
	driftFixed     time.Duration
	fenceRetention time.Duration
	onFailure      func(node string, err error)
	clientTimeouts bool

	notify []*redisstore.Store // per node: release signals of the keys it ranks second for
	owned  []*redis.Client     // clients Open made, closed by Close

	attempts atomic.Int64 // the last attempt number given to a write (see Late calls)

	identified atomic.Int32 // nodes whose server identity (run_id) is known
	firstProbe sync.Once    // the first identify, which every Acquire waits for
	duplicate  atomic.Pointer[error]

	wg             sync.WaitGroup // background calls; see track
	life           sync.RWMutex   // guards closing
	closing        bool           // Close has begun: track counts no more
	mu             sync.Mutex     // guards what follows, and each node's clean
	tokens         map[string]*tokenState
	inflight       map[string]int       // Acquires in flight per first key
	refused        map[string]refusedBy // tokens whose last Acquire was refused
	nextTokenSweep time.Time            // see sweepLocked

	// The owed clean-up (see undo.go).
	debts     map[string][]*debt // by token
	debtCount int
	debtBytes int
	nextSweep time.Time
	janitorOn bool
	wake      chan struct{}
	closed    bool

	stop    context.Context // ends when Close begins: stops the probes of skipped nodes
	stopAll context.CancelFunc
}

// node is one Redis master.
type node struct {
	name                         string
	id                           string // canonical address, or the name
	idHash                       uint64 // hash of id, for ranking
	driver                       redisstore.Driver
	calls, failures, quarantines atomic.Uint64
	failing                      atomic.Bool // its last call failed
	runID                        atomic.Pointer[string]
	probing                      atomic.Bool
	clean                        nodeCleanup // guarded by Store.mu

	// Health (see health.go).
	timeouts       atomic.Int32  // calls in a row that timed out
	rtt            atomic.Int64  // mean round trip of its calls, in ns
	skipped        atomic.Bool   // calls are not sent to it
	pinging        atomic.Bool   // its probe runs
	skips, notSent atomic.Uint64 // times it was skipped; calls not sent
	lastReply      atomic.Int64  // when it last answered a call, in Unix ns
}

// Option configures a Store.
type Option func(*Store)

// WithNodeTimeout bounds each call to one node; a call is further bounded by
// a third of its TTL. Default DefaultNodeTimeout.
func WithNodeTimeout(d time.Duration) Option { return func(s *Store) { s.nodeTimeout = d } }

// WithMaxTTL sets the longest TTL (and keep) the Store accepts, which is
// also how long a node that lost its data stays out of quorums, and how
// long a tombstone closes a late call. Every client of the nodes must use
// the same. Default DefaultMaxTTL; at most MaxMaxTTL.
func WithMaxTTL(d time.Duration) Option { return func(s *Store) { s.maxTTL = d } }

// WithDrift sets the clock drift allowance of a lock of TTL ttl to
// factor*ttl + fixed. Defaults DefaultDriftFactor and DefaultDriftFixed.
func WithDrift(factor float64, fixed time.Duration) Option {
	return func(s *Store) { s.driftFactor, s.driftFixed = factor, fixed }
}

// WithFenceRetention sets how long a fence key outlives the last grant of
// its lock key. Default DefaultFenceRetention; at least MinFenceRetention.
func WithFenceRetention(d time.Duration) Option { return func(s *Store) { s.fenceRetention = d } }

// WithNodeFailureHook calls f with the node's name and error on every failed
// node call, for metrics that alert when a node is down. f must not block.
func WithNodeFailureHook(f func(node string, err error)) Option {
	return func(s *Store) { s.onFailure = f }
}

// WithClientTimeoutsOnly accepts clients without ContextTimeoutEnabled: each
// call is then bounded by the clients' own read and write timeouts only,
// not by the node timeout.
func WithClientTimeoutsOnly() Option { return func(s *Store) { s.clientTimeouts = true } }

// New returns a Store over nodes, independent Redis masters (such as one
// *redis.Client each, with ContextTimeoutEnabled set): at least 3, and an
// odd number is best (5 tolerates 2 failed nodes). Their order does not
// matter: each key's gate and notify node are ranked by the nodes'
// addresses (see Algorithm), so processes must name every node by the same
// address, in any order (a node whose client is not a *redis.Client has no
// address New can read, and is ranked by its position). New sends nothing. It returns an error wrapping
// stores.ErrInvalid when there are fewer than 3 nodes, a node is nil or
// ignores context deadlines (see WithClientTimeoutsOnly), two nodes have
// the same address (also wrapping ErrDuplicateNode; localhost, 127.0.0.1
// and ::1 are one host), or an option is invalid. The first Acquire also
// refuses nodes that turn out to be one server (see Duplicate nodes).
// Each node's calls go through redisstore.NewDriver; NewWithNodes takes
// nodes on another client.
func New(nodes []redis.Scripter, opts ...Option) (*Store, error) {
	s, err := newStore(len(nodes), opts)
	if err != nil {
		return nil, err
	}
	ns := make([]Node, len(nodes))
	for i, c := range nodes {
		if isNil(c) {
			return nil, fmt.Errorf("%w: redlockstore: node %d is nil", stores.ErrInvalid, i)
		}
		if enabled, known := callctx.ContextTimeoutEnabled(c); known && !enabled && !s.clientTimeouts {
			return nil, fmt.Errorf("%w: redlockstore: the go-redis client of node %d ignores context deadlines, so a "+
				"stalled node would hold calls past the node timeout; set ContextTimeoutEnabled: true in its options "+
				"(or pass redlockstore.WithClientTimeoutsOnly() to accept this)", stores.ErrInvalid, i)
		}
		ns[i] = Node{Driver: redisstore.NewDriver(c)}
		if rc, ok := c.(*redis.Client); ok {
			ns[i].Addr = rc.Options().Addr
		}
	}
	return s.addNodes(ns)
}

// Node is one Redis master of a Store on any client library: the
// redisstore.Driver that runs its scripts (and its release signals), and
// the address that names and ranks it.
type Node struct {
	// Driver runs the node's calls: redisstore.NewDriver over a go-redis
	// client, or rueidisstore's over a rueidis client. Its Eval must wrap
	// stores.ErrUnreachable exactly when the call cannot have reached the
	// node, and honour the context's deadline.
	Driver redisstore.Driver
	// Addr is the node's host:port as every process names it (see
	// Algorithm); "" ranks the node by its position instead.
	Addr string
}

// NewWithNodes returns a Store over nodes, as New does over go-redis
// clients: one Driver per node, such as rueidisstore.NewRedlock makes over
// rueidis clients. It checks what New checks but the clients' options,
// which it cannot see.
func NewWithNodes(nodes []Node, opts ...Option) (*Store, error) {
	s, err := newStore(len(nodes), opts)
	if err != nil {
		return nil, err
	}
	return s.addNodes(nodes)
}

// newStore returns a Store without nodes yet, for n nodes, with opts
// applied and checked.
func newStore(n int, opts []Option) (*Store, error) {
	s := &Store{
		nodeTimeout:    DefaultNodeTimeout,
		maxTTL:         DefaultMaxTTL,
		driftFactor:    DefaultDriftFactor,
		driftFixed:     DefaultDriftFixed,
		fenceRetention: DefaultFenceRetention,
		tokens:         make(map[string]*tokenState),
		refused:        make(map[string]refusedBy),
		inflight:       make(map[string]int),
		debts:          make(map[string][]*debt),
		wake:           make(chan struct{}, 1),
	}
	for _, opt := range opts {
		opt(s)
	}
	switch {
	case n < 3:
		return nil, fmt.Errorf("%w: redlockstore: %d nodes; Redlock needs at least 3", stores.ErrInvalid, n)
	case s.nodeTimeout <= 0:
		return nil, fmt.Errorf("%w: redlockstore: node timeout %v is not positive", stores.ErrInvalid, s.nodeTimeout)
	case s.maxTTL < MinTTL || s.maxTTL > MaxMaxTTL:
		return nil, fmt.Errorf("%w: redlockstore: max TTL %v is out of [%v, %v]", stores.ErrInvalid, s.maxTTL, MinTTL, MaxMaxTTL)
	case s.driftFactor < 0 || s.driftFactor >= 0.5 || s.driftFixed < 0:
		return nil, fmt.Errorf("%w: redlockstore: drift %v*ttl + %v: want a factor in [0, 0.5) and a fixed part not negative",
			stores.ErrInvalid, s.driftFactor, s.driftFixed)
	case s.fenceRetention < MinFenceRetention:
		return nil, fmt.Errorf("%w: redlockstore: fence retention %v is below %v", stores.ErrInvalid, s.fenceRetention, MinFenceRetention)
	}
	return s, nil
}

// addNodes gives s its nodes and their release signals, and starts it.
func (s *Store) addNodes(nodes []Node) (*Store, error) {
	for i, nd := range nodes {
		if nd.Driver == nil || isNil(nd.Driver) {
			return nil, fmt.Errorf("%w: redlockstore: node %d is nil", stores.ErrInvalid, i)
		}
		n := &node{name: nodeName(nd.Addr, i), driver: nd.Driver}
		n.id = canonicalAddr(nd.Addr, i)
		h := fnv.New64a()
		_, _ = h.Write([]byte(n.id))
		n.idHash = h.Sum64()
		for j, o := range s.nodes {
			if o.id == n.id {
				return nil, fmt.Errorf("%w: %w: nodes %d and %d are both %s", stores.ErrInvalid, ErrDuplicateNode, j, i, n.id)
			}
		}
		s.nodes = append(s.nodes, n)
	}
	s.quorum = len(nodes)/2 + 1
	var ropts []redisstore.Option
	if s.clientTimeouts {
		ropts = append(ropts, redisstore.WithClientTimeoutsOnly())
	}
	for i, n := range s.nodes {
		notify, err := redisstore.NewWithDriver(n.driver, ropts...)
		if err != nil {
			return nil, fmt.Errorf("redlockstore: node %d: %w", i, err)
		}
		s.notify = append(s.notify, notify)
	}
	s.stop, s.stopAll = context.WithCancel(context.Background())
	return s, nil
}

// Quorum returns how many nodes a grant needs: N/2+1.
func (s *Store) Quorum() int { return s.quorum }

// NodeStats returns each node's counters, in the order of the nodes given
// to New.
func (s *Store) NodeStats() []NodeStat {
	out := make([]NodeStat, len(s.nodes))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, n := range s.nodes {
		out[i] = NodeStat{Node: n.name, Calls: n.calls.Load(), Failures: n.failures.Load(), Quarantines: n.quarantines.Load(),
			Skipped: n.notSent.Load(),
			Owed:    n.clean.owed, GivenUp: n.clean.givenUp}
	}
	return out
}

// Close stops the pub/sub connections of release notifications, gives up
// the clean-up the Store still owes (see NodeStat.GivenUp), and waits for
// the Store's background calls (late replies, clean-ups in flight), each
// bounded by its timeout. It does not close the clients, which the caller
// owns and closes after the Store; a Store from Open closes the clients it
// made. It returns the error of closing the pub/subs (and those clients).
func (s *Store) Close() error {
	s.life.Lock()
	s.closing = true
	s.life.Unlock()
	s.mu.Lock()
	s.closed = true
	s.dispatchAllLocked() // the janitor gives up what is owed
	s.mu.Unlock()
	s.stopAll()
	var err error
	for _, n := range s.notify {
		err = errors.Join(err, n.Close())
	}
	s.wg.Wait()
	for _, c := range s.owned {
		err = errors.Join(err, c.Close())
	}
	s.owned = nil
	return err
}

// track counts n goroutines that Close waits for, and reports false,
// counting none, once Close has begun (its Wait may be running: an Add then
// would race with it).
func (s *Store) track(n int) bool {
	s.life.RLock()
	defer s.life.RUnlock()
	if s.closing {
		return false
	}
	s.wg.Add(n)
	return true
}

// drift returns the drift allowance of a TTL.
func (s *Store) drift(ttl time.Duration) time.Duration {
	return time.Duration(float64(ttl)*s.driftFactor) + s.driftFixed
}

// nodeName names node i by its address, when known.
func nodeName(addr string, i int) string {
	if addr != "" {
		return addr
	}
	return fmt.Sprintf("node %d", i)
}

// canonicalAddr returns the identity of node i for ranking and duplicate
// checks: its address with the host in lower case, an IP address in its
// canonical form, and localhost, 127.0.0.1 and ::1 as one loopback host
// (the database number plays no part: two databases of one server are one
// server); "node i" when its address is not known.
func canonicalAddr(addr string, i int) string {
	if addr == "" {
		return fmt.Sprintf("node %d", i)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr // a Unix socket's path
	}
	host = strings.ToLower(host)
	if ip := net.ParseIP(host); ip != nil {
		host = ip.String()
		if ip.Equal(net.IPv4(127, 0, 0, 1)) || ip.Equal(net.IPv6loopback) {
			host = "loopback"
		}
	} else if host == "localhost" {
		host = "loopback"
	}
	return net.JoinHostPort(host, port)
}

// isNil reports whether client is nil or a nil pointer in an interface.
func isNil(client any) bool {
	if client == nil {
		return true
	}
	v := reflect.ValueOf(client)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
