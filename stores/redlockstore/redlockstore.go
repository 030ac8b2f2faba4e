// Package redlockstore is a stores.Store on Redlock: the same lock on N
// independent Redis masters (5.0 or later, or Valkey, no Cluster between
// them), granted while a majority of them holds it.
//
// # Algorithm
//
// Acquire runs one Lua script per node, each call bounded by a node timeout
// (WithNodeTimeout, default 1s, and at most a third of the TTL). The script
// sets every key to the token with SET NX semantics for the TTL plus the
// drift allowance (WithDrift: 1% of the TTL + 2ms by default), so that the
// lock lasts at least the TTL from the call's start in spite of clock drift
// between the nodes and the client. The lock is granted once a quorum
// (N/2+1) of nodes granted and the validity, TTL - elapsed, is positive:
// the Locker counts the TTL from its call's start, which equals the classic
// TTL - elapsed - drift on the nodes' clocks.
//
// A first attempt asks every node at once: one round trip for a free key.
// Each key has a gate node, the same for every client: the node that ranks
// first for the key by rendezvous hashing of the key with each node's
// address (host canonicalised), so the order in which a process lists the
// nodes plays no part; processes must name each node by the same address.
// Contenders that race split the nodes so that none may reach a quorum; the
// one that won the gate then asks the nodes that refused it again, after
// 1ms, 2ms, 4ms... (6 times at most), while the others, which lost the
// gate, let go of what they took. So racing contenders still yield one
// winner. A retry with a refused token (a waiter), or an Acquire of a key
// that another Acquire of this process is acquiring, asks the gate alone
// first, and the other nodes only when the gate granted: a contender that
// loses costs one call, not one per node. A gate whose last call failed is
// not asked alone, and a gate that alone refuses a waiter with the same
// holder as the waiter's last refusal is not trusted: the holder may have
// released everywhere but there (a lost release), so the other nodes are
// asked too, and a quorum of them grants at once.
//
// Acquire decides as soon as the replies settle it (a quorum of grants, or
// so many refusals or failures that no quorum is possible), then gives the
// other nodes whose last call did not fail as long again as the decision
// took, so that healthy nodes' grants are in hand and a refusal's Wait
// comes from most nodes. A later grant stays part of the lock; Release
// waits for it on a healthy node, and closes the token (a tombstone, see
// Late calls) on a node whose last call failed, and when the lock was
// refused, abandoned or released it is released as soon as it lands. When the lock is not
// granted, every node that granted, or whose outcome is unknown, is
// released, owner-checked, at once (a node still in flight once it answers,
// so the release never overtakes the grant), and again until it lands (see
// Clean-up). Such an undo releases only what its own attempt wrote (see
// Late calls), so a new Acquire with the same token, a waiter's retry,
// waits for none of them.
//
// Release and Refresh go to every node at once and, once the answers
// settle the outcome (a quorum released or renewed, too many did not, or
// no quorum is possible), give the nodes still out a short grace (twice
// the slowest answer, 5 to 50 ms; none to a node whose last call failed)
// before they return, each call bounded by the node timeout: on a healthy
// cluster every node has answered by then. What is still out is settled in
// the background (the token stays ended for Refresh until it is in). Refresh needs a quorum that still
// holds the token, within the TTL; only on top of such a quorum do nodes
// that answered that they lost the keys (restarted empty) take them again
// where they are free, so a minority that still holds the token never
// revives a lock that expired on the others. Release ends the lock on
// every node it reaches, and on the others once they answer (see Clean-up).
//
// # Skipped nodes
//
// A node that keeps timing out (frozen by SIGSTOP, partitioned) is skipped:
// after 2 calls in a row timed out (each given at least 50ms, and timed
// out after at least half of it: a TTL under 150ms gives its calls less,
// which a loaded process overruns on a healthy node, so their timeouts
// skip no node for the other callers), or as soon as one call has had no answer for its stall time (16 of the
// node's mean round trips, at least 200ms, at most a quarter of the node
// timeout above that) while most other live nodes answered calls sent
// after it, or pings sent then (that call then answers at once, an
// unknown outcome undone as a timeout is; the client's own call ends at
// its deadline). While the nodes that failed or did not answer leave no
// quorum of answers, an Acquire is a store failure, never a refusal: with
// 3 of 5 nodes frozen every request gets a store error. A skipped node gets no calls: they fail at once with
// ErrNodeSkipped, as unsent, and count as failed nodes toward the quorum.
// One probe at a time (a script call bounded by the node timeout, 50ms
// apart) checks it in the background, and the first answer, of a probe or
// of an owed release, brings it back. So 2 frozen nodes of 5 cost the
// calls in flight at most the stall time once, then nothing: Acquire,
// Release and Refresh run at the speed of the other 3 (measured by
// TestFrozenMinority). A skipped gate passes to the next node of the key's
// ranking, the notify node likewise, and a contended Acquire waits for the
// gate alone only 4 of its round trips + 2ms before it asks the others.
//
// # Late calls
//
// A node call whose reply did not come (a timeout, a lost reply) may still
// reach its node later. Every write carries an attempt number (one per
// Acquire or Refresh call of the Store) and sets each key to TOKEN#ATTEMPT,
// and the release that undoes a call whose outcome is unknown leaves on
// that node a tombstone, KEY:dead:TOKEN, holding the attempt it closed; the
// acquire and refresh scripts write nothing for a closed attempt, and an
// acquire writes nothing over a later attempt of its token. So an abandoned
// or failed acquire's late grants never outlive its undo, whichever reaches
// the node first, and an undo, which releases only what its attempt or an
// earlier one wrote, never releases a later attempt's grant (a Refresh
// makes the keys it renews its own). A Release ends its token in the Store
// until it returns (a Refresh running or starting meanwhile starts no more
// calls) and closes every attempt of the token on the nodes where a
// Refresh call is in flight or was lost within the refresh's TTL (with keep
// positive, on every node, for the keep), so no renewal or re-take lands
// after it, also when the Refresh's context ended. A tombstone lives for the max TTL plus the drift
// allowance and 2s: a call that reaches its node later than that after its
// undo is not stopped. An uncontended lock writes no tombstone; a refused
// or failed attempt writes them only on the nodes whose outcome it does
// not know.
//
// # Clean-up
//
// What the Store owes after a call it did not finish is a release per node,
// owner-checked by attempt and leaving the attempt's tombstone: the undo of
// an acquire that did not grant the lock, was abandoned, or whose call to a
// node has an unknown outcome; the release of a late grant nobody uses; a
// Release's call that failed on a node (whatever Release returned, also
// after its context ended). The Store sends it at once, and again while it
// fails, with a backoff per node (10ms doubling to 1s, with jitter), until
// it lands, until what it releases has surely expired (the TTL plus twice
// the drift allowance after the debt arose; the tombstone's life for a
// Release), or until Close. A node that answers gets up to 64 owed calls at
// once; a node in backoff gets one at a time, so an outage costs one call
// per node per backoff however much is owed to it, and no goroutine per
// debt (one waits for the backoffs); the releases owed for one token are
// one. At most 16384 debts (64 MiB of keys) are held: a new one beyond is
// given up, and what it would release expires with its TTL. NodeStats
// tells, per node, the releases owed and those given up. A late call that
// reaches its node after its undo was given up (a node paused past the
// TTL) is not stopped.
//
// # Errors
//
// A key held by another token is a refusal (Grant.OK false, so ErrHeld and
// 423 upstream) when refusals make a quorum impossible. When failed nodes
// (errors, timeouts, quarantine) make it impossible, Acquire returns an
// error wrapping ErrNoQuorum that names each failed node and its error: a
// store failure (503 upstream). It also wraps stores.ErrUnreachable when no
// node was reached (every node's call failed to connect, on clients
// that do not retry a command: with go-redis's retries, an earlier attempt
// may have reached the node, so every failure counts as reached). Release
// returns stores.ErrNotHeld when a key was not released on a quorum of the
// nodes that answered, and ErrNoQuorum when too few answered. NodeStats
// counts each node's calls and failures, and WithNodeFailureHook reports
// each failure, for metrics that alert when a node is down.
//
// # Fencing
//
// Fences grow strictly per key from grant to grant, also when the quorums
// of two grants differ, without any assumption about clocks while no node
// loses its data. Each node keeps a fence key per lock key: a grant on the
// node issues last + stores.FenceStride. The grant's fence F is the largest
// fence its quorum issued, and before Acquire returns F is stored on a
// quorum: nodes that saw the same grants issue the same fence, so this
// usually holds already; otherwise (a node that missed grants or was
// restarted) Acquire raises the lagging nodes' fence keys to F, one more
// round trip, and fails unless a quorum then stores F.
//
// Claim: a later grant G2 of the key gets a fence above G1's F1. G1 stored
// F1 on a quorum S1; G2 was granted by a quorum Q2; two majorities of N
// nodes share a node j. A fence key only grows, so j's last fence is at
// least F1 when G2 reaches it, and G2's fence, the largest of its quorum,
// is at least F1 + stride. This holds whichever nodes failed in between,
// and needs no clock. (A majority-quorum register needs a read before its
// write, or clocks; agreement between the nodes saves that round trip.)
//
// A new fence key (the first grant of a key, or after the fence retention,
// WithFenceRetention, default 24h, without grants) starts from the client's
// proposal, its clock + 1s, clamped on each node to [node clock, node clock
// + 2s], so that nodes agree on it without a raise. Two events remove a
// fence key, and monotonicity then rests on clocks. Expiry after the
// retention: a fence key lives on by the lead of its fence over the node's
// clock, so the next fence, at least that clock, exceeds every fence it
// held if the node's clock does not step back. A node restarted empty: it
// stays out of quorums for the quarantine (see Restarts), so when it next
// issues a fence its clock has moved on by the max TTL since it last held
// F1; that exceeds F1 when F1 led the clock of the node that issued it by
// less than the max TTL minus the clock skew between the nodes. A fence
// leads the clock by at most 2s when its key is created, and then gains
// 1024µs per grant against the clock's 1µs per µs, so it leads more only
// while a key is granted more than about 976 times a second for long.
//
// # Restarts
//
// A node restarted empty has lost the locks it held; if it joined a quorum
// at once, a second client could take a lock that a majority still held
// before the restart (the Redis documentation's "delayed restarts" rule).
// Every node keeps a marker key, MarkerKey. A script that finds it absent
// (data lost, or a new node) sets it to the moment the node will have been
// up for the max TTL (WithMaxTTL, default 1 minute), reading the node's
// uptime from INFO, and the node refuses to take part in grants and renewals
// until then: a quarantined node is a failed node, named in errors. Redis
// counts uptime_in_seconds between two clocks truncated to whole seconds,
// up to 1s more than the real uptime, so the node is credited 1s less: it
// never rejoins early, and may stay out up to 1s longer than the max TTL.
// TTLs above the max TTL are refused, so every lock the node held has
// expired by then. Every client of the nodes must use the same max TTL.
//
// What the operator must do: nothing for a node that comes back empty (with
// no data files). A node restarted from an RDB snapshot or an AOF without
// appendfsync always may come back with a marker but without recent locks:
// either configure appendfsync always, or delete its data files before
// starting it, or keep it away from clients for the max TTL. FLUSHALL on a
// node that has been up longer than the max TTL is not detected: don't.
// Nor is a lock key evicted for memory: set maxmemory-policy noeviction
// (every volatile-* policy evicts lock keys, which have a TTL).
// On a brand-new deployment, nodes started less than the max TTL ago are
// quarantined until then; SET MarkerKey to 0 on each to admit them at once
// (only on nodes that held no lock within the max TTL).
//
// # Release notification
//
// Every node publishes the release of a key in the same script that
// deletes it; NotifyRelease subscribes on the key's notify node, the node
// that ranks second for the key (the first is its gate, which a waiter's
// retry asks first), through a redisstore.Store per node (one pub/sub
// connection per node for all its keys). One node keeps a key's signals in
// release order, as stores.Notifier's users expect, and every process
// listens to the same node for a key, whatever its order of the nodes.
// While that node is down, waiters fall back to polling.
//
// # Duplicate nodes
//
// One server given twice would count as two votes. New refuses two nodes
// with the same address (the host in lower case, localhost, 127.0.0.1 and
// ::1 as one host, the database number ignored), and the first Acquire (or
// Refresh) of a Store asks every node for its run_id (one round trip, once)
// and refuses, with ErrInvalid and ErrDuplicateNode, nodes that are one
// server under two addresses (a host name and its IP address, a proxy); a
// node that did not answer then is asked again in the background once it
// answers calls, and until its run_id is known its grants and renewals do
// not count toward a quorum (they are released like a refused lock's).
//
// # Limits and costs
//
// Keys up to MaxKeyBytes (1 MiB; 16 MiB for the keys of one call
// together); TTLs and keeps from MinTTL (10ms: a grant needs a round trip
// to a quorum within a third of the TTL) to the max TTL; see Bounds.
// Arguments out of range are refused with stores.ErrInvalid before any
// node call. An uncontended lock costs one round trip to every node at
// once for Acquire and one for Release (and one for each Refresh); the
// scripts read a tombstone key per lock key, and every node publishes its
// releases (a PUBLISH with no subscriber is cheap); it owes nothing, and
// runs no background goroutine (each node call whose deadline leaves room
// arms a stall timer; a skipped node has one probe goroutine). A tombstone (a few dozen bytes plus the
// key and the token) lives for the max TTL: a long max TTL keeps the
// tombstones of abandoned acquires and lost renewals that long. The first Acquire of a Store costs one
// more round trip (run_ids).
//
// # Fair mode
//
// Store does not implement stores.FairStore. A FIFO queue needs every node
// to agree on the order of waiters; each node would keep its own queue, the
// queues' heads could differ, and then no waiter would get a majority until
// leases expire. Agreeing on one order needs consensus (etcd, ZooKeeper).
//
// # Start-up
//
// Open sends PING to every node and fails, naming the nodes that did not
// answer, unless a quorum answers within 5s (DefaultConnectTimeout) or its
// context's deadline: a dead minority does not stop it. With connect=lazy in
// the URL it starts anyway, and calls fail with store errors until a quorum
// answers. New sends nothing.
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

// Errors of the package.
var (
	// ErrNoQuorum means too few nodes answered for a quorum: a store
	// failure, not a refusal. The error names each failed node.
	ErrNoQuorum = errors.New("redlockstore: too few nodes for a quorum")

	// ErrQuarantined is a node's failure while it stays out of quorums
	// after losing its data.
	ErrQuarantined = errors.New("redlockstore: node quarantined after losing its data")

	// ErrUnexpectedReply means a script answered in a shape this package
	// does not expect.
	ErrUnexpectedReply = errors.New("redlockstore: unexpected reply from Redis")

	// ErrDuplicateNode means two of the nodes given are one Redis server,
	// which would count as two votes. Errors that wrap it also wrap
	// stores.ErrInvalid.
	ErrDuplicateNode = errors.New("redlockstore: two nodes are the same Redis server")
)

// NodeError is the failure of one node in a call.
type NodeError struct {
	Node string // the node's address, or "node <index>"
	Err  error
}

// Error returns "node <name>: <error>".
func (e *NodeError) Error() string { return "node " + e.Node + ": " + e.Err.Error() }

// Unwrap returns the node's error.
func (e *NodeError) Unwrap() error { return e.Err }

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

// Store is a stores.Store on Redlock over N independent Redis masters, and a
// stores.Notifier. It is safe for concurrent use. Close stops its pub/sub
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

	// The owed clean-up (see cleanup.go).
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
	client                       redis.Scripter
	calls, failures, quarantines atomic.Uint64
	failing                      atomic.Bool // its last call failed
	retries                      bool        // its client may send a command twice (see neverSent)
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
func New(nodes []redis.Scripter, opts ...Option) (*Store, error) {
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
	s.stop, s.stopAll = context.WithCancel(context.Background())
	for _, opt := range opts {
		opt(s)
	}
	switch {
	case len(nodes) < 3:
		return nil, fmt.Errorf("%w: redlockstore: %d nodes; Redlock needs at least 3", stores.ErrInvalid, len(nodes))
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
	for i, c := range nodes {
		if isNil(c) {
			return nil, fmt.Errorf("%w: redlockstore: node %d is nil", stores.ErrInvalid, i)
		}
		if enabled, known := contextTimeoutEnabled(c); known && !enabled && !s.clientTimeouts {
			return nil, fmt.Errorf("%w: redlockstore: the go-redis client of node %d ignores context deadlines, so a "+
				"stalled node would hold calls past the node timeout; set ContextTimeoutEnabled: true in its options "+
				"(or pass redlockstore.WithClientTimeoutsOnly() to accept this)", stores.ErrInvalid, i)
		}
		n := &node{name: nodeName(c, i), client: c, retries: retries(c)}
		n.id = canonicalAddr(c, i)
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
	for i, c := range nodes {
		notify, err := redisstore.New(c, ropts...)
		if err != nil {
			return nil, fmt.Errorf("redlockstore: node %d: %w", i, err)
		}
		s.notify = append(s.notify, notify)
	}
	return s, nil
}

// Limits of TTLs.
const (
	// MinTTL is the shortest TTL (and keep) a Store accepts: a grant takes
	// a round trip to a quorum, each node call is bounded by a third of
	// the TTL, and the validity left is the TTL less that (Redlock's ttl >
	// 2×RTT + drift); below a few milliseconds nothing is ever granted.
	MinTTL = 10 * time.Millisecond

	// MaxMaxTTL is the longest max TTL WithMaxTTL accepts: a node
	// restarted empty stays out of quorums that long.
	MaxMaxTTL = 365 * 24 * time.Hour

	// MaxKeyBytes is the longest key a Store accepts: every call sends
	// each key twice (the key and its fence key) to every node, and Redis
	// keeps a key and a channel of that name.
	MaxKeyBytes = 1 << 20

	// maxCallKeyBytes bounds the keys of one call together, far below
	// Redis's query buffer limit (1 GB by default).
	maxCallKeyBytes = 16 << 20
)

var _ stores.Bounded = (*Store)(nil)

// Bounds returns the keys and TTLs the Store honours: keys up to
// MaxKeyBytes, TTLs from MinTTL to the max TTL (WithMaxTTL).
func (s *Store) Bounds() stores.Bounds {
	return stores.Bounds{
		MaxKeyBytes: MaxKeyBytes,
		MinTTL:      MinTTL,
		MaxTTL:      s.maxTTL,
		Reason: fmt.Sprintf("Redlock (a TTL must exceed the round trips of a grant plus the clock drift allowance; "+
			"the max TTL %v is how long a node restarted empty stays out of quorums, max_ttl)", s.maxTTL),
	}
}

// checkKeys refuses keys longer than MaxKeyBytes, or too long together.
func (s *Store) checkKeys(keys []string) error {
	b, total := s.Bounds(), 0
	for _, k := range keys {
		if err := b.CheckKey(k); err != nil {
			return fmt.Errorf("redlockstore: %w", err)
		}
		total += len(k)
	}
	if total > maxCallKeyBytes {
		return fmt.Errorf("%w: redlockstore: %d keys of %d bytes together, above the limit of %d bytes per call",
			stores.ErrInvalid, len(keys), total, maxCallKeyBytes)
	}
	return nil
}

// checkArgs refuses keys out of Bounds (see checkKeys) and a duration d
// (what: "ttl" or "keep") out of Bounds.
func (s *Store) checkArgs(keys []string, what string, d time.Duration) error {
	if err := s.Bounds().CheckTTL(what, d); err != nil {
		return fmt.Errorf("redlockstore: %w", err)
	}
	return s.checkKeys(keys)
}

// keysForMessage quotes keys for an error message, each shortened as
// stores.KeyForMessage does, and at most 4 of them.
func keysForMessage(keys []string) string {
	const maxShown = 4
	parts := make([]string, 0, min(len(keys), maxShown)+1)
	for i, k := range keys {
		if i == maxShown {
			parts = append(parts, fmt.Sprintf("and %d more", len(keys)-maxShown))
			break
		}
		parts = append(parts, stores.KeyForMessage(k))
	}
	return "[" + strings.Join(parts, " ") + "]"
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

// NotifyRelease registers interest in releases of key until stop is called,
// as stores.Notifier describes, through the key's notify node: every node
// publishes the releases it makes, and the waiter listens on the node that
// ranks second for the key (the first is its gate), one pub/sub connection
// per node for all keys. It returns a nil channel after Close and when that
// client cannot subscribe.
func (s *Store) NotifyRelease(key, token string) (<-chan struct{}, func()) {
	return s.notify[s.notifyNode(key)].NotifyRelease(key, token)
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

// ErrClosed is the failure of a node call asked for after Close began: it
// is not sent.
var ErrClosed = errors.New("redlockstore: store closed")

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

// callTimeout bounds each node call of an operation with TTL ttl.
func (s *Store) callTimeout(ttl time.Duration) time.Duration {
	return min(s.nodeTimeout, max(ttl/3, time.Millisecond))
}

// nodeName names a node by its address when its client tells it.
func nodeName(c redis.Scripter, i int) string {
	if rc, ok := c.(*redis.Client); ok {
		return rc.Options().Addr
	}
	return fmt.Sprintf("node %d", i)
}

// canonicalAddr returns the identity of node i for ranking and duplicate
// checks: its address with the host in lower case, an IP address in its
// canonical form, and localhost, 127.0.0.1 and ::1 as one loopback host
// (the database number plays no part: two databases of one server are one
// server); "node i" when the client does not tell its address.
func canonicalAddr(c redis.Scripter, i int) string {
	rc, ok := c.(*redis.Client)
	if !ok {
		return fmt.Sprintf("node %d", i)
	}
	addr := rc.Options().Addr
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

// contextTimeoutEnabled reports whether client honours context deadlines,
// when its type tells.
func contextTimeoutEnabled(client redis.Scripter) (enabled, known bool) {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled, true
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled, true
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled, true
	}
	return false, false
}

// isNil reports whether client is nil or a nil pointer in an interface.
func isNil(client redis.Scripter) bool {
	if client == nil {
		return true
	}
	v := reflect.ValueOf(client)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
