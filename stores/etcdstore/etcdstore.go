// Package etcdstore is a stores.Store on etcd (3.3 or later) through
// go.etcd.io/etcd/client/v3. It is also a stores.Notifier and a
// stores.FairStore: etcd orders waiters by create revision and tells
// watchers of every delete, so fair waiting costs no polling.
//
// # What is stored
//
// Every key of the Locker gets a directory, the Store's prefix plus the key
// with '%' and '/' percent-escaped plus "/". In it:
//
//   - holder: the lock is held while this key exists. Its value is the
//     holder's token, a NUL byte, the sequence of the call that set it (see
//     below), a NUL byte, and the TTL it was given in milliseconds, which
//     refusals report as Wait. One fixed name per lock key, so that etcd's
//     index does not grow with every acquisition until the next
//     compaction, and a grant compares one key, not a range.
//   - q/<token>: a fair waiter, ordered by its create revision (the queue is
//     etcd's revision order, as in concurrency.Mutex). Its value is the
//     waiter's lease, in milliseconds. Each waiter leaves a deleted name in
//     etcd's index until the next compaction, which fair use of a busy key
//     therefore needs (etcd's --auto-compaction-retention).
//
// Every owner check compares the holder's value with the caller's token, in
// the same transaction as the change it guards, so a release or refresh
// never acts on another acquisition, even one of the same Store and the
// same etcd lease (etcd issue 22082 is a concurrency.Mutex that identifies
// its owner by its session's lease alone). A token must not contain a NUL
// byte.
//
// # TTL and leases
//
// Every holder and waiter key is attached to an etcd lease that expires by
// itself; nothing is kept alive. A grant of ttl uses a lease of ttl plus an
// eighth, rounded up to whole seconds, which the Store shares between the
// calls that start early enough for the lease to outlive their start plus
// ttl (a lease's clock starts when its grant is sent, at the earliest), so
// that a lease costs one LeaseGrant per second or so and not one per lock;
// a lease requested for a call always serves it, however slow the round
// trip. Refresh moves the keys to a lease of the new TTL, and a Release
// with keep to one of keep. So a key is held at least its TTL from the
// start of the call that set it, as the Locker counts its validity, and
// outlives it by at most an eighth of it plus a second, plus the round
// trip of its lease's grant and what the call waited before sending it,
// plus etcd's expiry sweep (500ms), whether its holder lives or died; a
// leader change renews every lease, so that a key may then outlive its TTL
// by up to once more its lease. etcd raises a lease below its minimum (1.5
// x the election timeout, rounded up: 2s by default) to that minimum: a
// lock of 50ms is honoured, and held up to 2.5s if its holder dies without
// releasing it. Fair-waiter leases round the same way.
//
// Each call takes a sequence when it starts: its start in Unix
// nanoseconds, or one more than the Store's previous one, so that the
// Store's calls are numbered in the order they started. Refresh, and a
// Release with keep, act only on holder keys set by a call of the token
// with a sequence no later than theirs, compared in their transaction: a
// renewal that reaches etcd late (its reply lost, its request held in the
// network) cannot move the keys back to its own lease, which lasts from
// its earlier start, after a later renewal succeeded; the Locker confirms
// validity from the later one (see Refresh). A token's calls are meant to
// go through one Store, as the Locker's do: across Stores, their order is
// that of the clocks that numbered them.
//
// The Store remembers every lease it granted until etcd confirms it gone.
// A lease that can serve no call any more (its TTL and a second have
// passed since its grant, by the local clock) is revoked, a few at each
// new grant, rather than forgotten, since etcd may keep it longer; Close
// revokes the rest: the Store's keys go at once rather than at their TTL
// (etcd issue 17470 is a lease kept alive after its client exits; here
// none is kept alive at all).
//
// # Limits
//
// Bounds states them (see stores.Bounded), and every call refuses
// arguments beyond them with stores.ErrInvalid before any request:
//
//   - TTLs, keeps and fair leases up to MaxTTL (8e9s, about 253 years),
//     whose lease, an eighth longer, is etcd's longest; none is too short
//     (see above).
//   - Keys up to MaxKeyBytes, which follows from etcd's request size limit
//     (--max-request-bytes, 1.5 MiB by default; WithMaxRequestBytes for
//     another): a fair attempt names its key's directory 11 times in one
//     transaction, and '%' and '/' take three bytes escaped, so a key may
//     take a 33rd of a request: 45 KiB by default. Keys that together (or
//     with a token longer than 1 KiB) would make a request above the limit,
//     and more than MaxKeys keys, are refused too. etcd's refusal of a
//     request for its size, the client's refusal to send one (its
//     MaxCallSendMsgSize, which Open raises to match max-request-bytes),
//     and etcd's refusal of more operations than its --max-txn-ops (a
//     cluster below the default 128 refuses calls of many keys) are
//     stores.ErrInvalid as well: nothing was done. A reply larger than
//     the client takes (its MaxCallRecvMsgSize) comes after etcd acted,
//     and is an unknown outcome.
//   - Tokens: not empty, no NUL byte. A token whose acquire returned
//     stores.ErrAbandoned serves no other: its abandon marks (below) make
//     every later acquire of it fail with stores.ErrInvalid, and one
//     granted before its undo landed is deleted by that undo. The Locker
//     never reuses a token.
//
// # Fences
//
// A grant's fence is the revision of the transaction that granted it times
// stores.FenceStride. etcd revisions are cluster-wide, persist across
// restarts, member replacement and compaction, and grow with every write,
// so two grants of a key (or of any keys) get revisions at least one apart
// and fences at least the stride apart. A cluster restored from a snapshot
// must be restored with etcdutl's --bump-revision (and --mark-compacted), as
// etcd's own documentation advises, or it could issue revisions again; a
// cluster that loses every member's data starts again from revision 1.
//
// # Round trips and costs
//
// Acquire, Release and Refresh are one transaction each, for any number of
// keys (up to MaxKeys), plus a LeaseGrant when no shared lease fits (about
// once a second per TTL in use, which also revokes up to four spent
// leases), and a second transaction for a retried Acquire that finds its
// own grant, or for a Refresh (or Release with keep) refused, which reads
// its keys to tell a key not held from one renewed by a later call. Every
// request is a write through etcd's log, a refused acquire too. A fair
// attempt is one transaction, and a second one when its caller heads the
// queue behind other waiters; its reply holds the whole queue of the key,
// so that it grows with the waiters and the length of the key (100 waiters
// on a key of 45 KiB, every byte escaped, make a reply of about 14 MB). An
// acquire's check that its token was not abandoned (below) is one more
// comparison in its transaction, not a round trip; abandoned acquires cost
// their undos, up to 63 of them in one transaction. While etcd does not
// answer (see "Leader changes" below), a lease grant, a Release or a
// Refresh is sent again every 250ms (or twice the latest round trip, when
// longer, at most 1s), so that a fault costs up to a few more copies of these small requests per call, 8 at a time at most.
//
// # Calls, contexts and faults
//
// Every call returns as soon as its context ends (a Release may land
// after, see "Leader changes"). An acquire (plain or
// fair) runs on a context that the caller's cancellation does not end,
// bounded by the request timeout, and the caller who left gets an error
// wrapping stores.ErrAbandoned and the context's error; so does a caller
// whose acquire ran out of the request timeout with a transaction
// unanswered, so that it does not release the keys itself (a release that
// the late transaction could overtake). Once such an acquire has an answer
// or has timed out, the Store queues its undo: put an abandon mark of the
// token on each lease the acquire's transactions used, then delete what
// the acquire may have set (owner-checked). Every acquire transaction
// compares that its token has no mark, so a transaction of the acquire
// that etcd applies only after the marks (a request held in a paused
// member's socket, say) changes nothing: while its lease lives the mark
// does, and once the lease is gone a put on it fails.
//
// One goroutine per Store works through the undos, only while some are
// pending: it puts as many marks and deletes in one transaction as etcd
// takes (128 operations by default, fewer after etcd refuses them, and the
// request size), and while etcd does not answer it tries again, pausing up
// to a second between tries that failed; a try waits 250ms for the answer
// (or twice the latest round trip, when longer, at most 1s),
// and the next follows at once, and once etcd has answered none for 2s,
// each waits twice as long as the one before, up to the request timeout.
// An undo ends only when it has landed, or when
// etcd reports every lease of its acquire gone (revoked, or expired),
// after which nothing the acquire sent can hold a key: never on the local
// clock, since a leader change renews every lease. So during a partition
// the undos wait in memory (their keys and token each, no goroutine), as
// many as the acquires abandoned meanwhile; PendingUndos tells how many.
// Close waits for them, and revokes every lease meanwhile, within its
// time (see Close), and says how many may still be granted after it.
//
// A call that failed because no member could be dialled before any of its
// requests changed something never reached etcd and wraps
// stores.ErrUnreachable; any other failure leaves its outcome unknown. The
// client spreads requests over the members and moves on when one fails: a
// killed or paused member, the leader included, costs the calls in flight
// on it and an election, and no lock is lost or granted twice. A holder
// cut off from etcd keeps its keys until their lease ends, at least its
// TTL from its call's start, and its Refresh and Release then answer
// stores.ErrNotHeld, never acting on another's grant: every write compares
// the holder's token in its own transaction, so a Refresh racing a Release
// never sets a key again after it.
//
// # Leader changes
//
// A request that a follower forwards to the leader as the leader dies is
// never answered: etcd drops it, and the follower waits for its own
// request timeout (7s by default) or the client's. So the Store does not
// wait on one copy of an idempotent request for long: a lease grant that
// etcd has not answered within 250ms (or twice the latest request's round
// trip, when longer, at most 1s: a distant cluster gets each request once)
// is joined by another, and the calls that share the pool's lease
// take whichever answers first (a grant answered after another took its
// place is revoked at once); a Release or a Refresh, which compares the
// owner (and the sequence) in its transaction and so may land twice with
// no other effect, is sent again on the same bound while etcd does not answer,
// the earlier copies still counting, and at once after a transient failure
// (no leader yet). A refusal settles such a call only once its earlier
// copies have answered too, since one of them may have ended the grant
// first. A Release goes on after its caller left, up to the request
// timeout, so that its key is free as soon as the new leader answers, and
// not at its TTL; 16 at most at once: beyond, a Release whose caller
// leaves goes to the undo queue (its owner-checked deletes), or, with a
// keep, is given up (its keys keep their TTL). An acquire's transaction is not sent twice (a late copy
// could take a key again after its release): an acquire caught by the
// kill costs its caller's wait, or is abandoned, and its undo follows the
// same bounds. With three members and etcd's default election timeout
// (1s), the leader killed under steady load on one hot key (two Stores,
// Lockers with a wait of 1s): both sell again 1-2.1s after the kill, as
// soon as the election (1-2s here) is over and the waits caught by the
// kill have ended (TestLeaderKilledEveryInstanceSellsAgain). It took 6.5s
// when every acquire of a Store waited behind one grant caught by the
// kill, until the request timeout. A paused (SIGSTOP) leader costs more:
// its connection stays up, so the client goes on sending it a share of the
// requests, and an acquire sent there waits for its caller's context; in
// the same test with the leader paused, the instances sold again 1.5-4.5s
// after the pause (6.5-13s before).
//
// # Start-up
//
// Open fails, naming the endpoints, unless a member answers within the dial
// timeout (default 5s) or its context's deadline; with connect=lazy in the
// URL it starts anyway: the client connects in the background, and calls
// fail with store errors until a member answers, then work with no restart.
// New sends nothing.
package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/reqlock/reqlock/internal/storeargs"
	"github.com/reqlock/reqlock/stores"
)

// args checks the arguments of Store's methods; its errors start "etcdstore:".
const args storeargs.Checker = "etcdstore"

// Defaults of the options.
const (
	// DefaultPrefix is the prefix of every etcd key the Store writes, unless
	// WithPrefix says otherwise.
	DefaultPrefix = "reqlock/"

	// DefaultRequestTimeout bounds every etcd request of the Store unless
	// WithRequestTimeout says otherwise.
	DefaultRequestTimeout = 5 * time.Second

	// DefaultMaxRequestBytes is etcd's default --max-request-bytes (1.5
	// MiB), the largest request the Store makes unless
	// WithMaxRequestBytes says otherwise.
	DefaultMaxRequestBytes = 1536 << 10
)

// acquireAttempts bounds the transactions of one Acquire: the first, and
// those of a retry that found its own grants and lost a race for them.
const acquireAttempts = 3

// MaxKeys is the most keys one call takes: etcd limits a transaction to 128
// operations by default (--max-txn-ops), and an acquire compares two ranges
// per key.
const MaxKeys = 64

var (
	// ErrUnexpectedReply means etcd answered in a shape this package does
	// not expect.
	ErrUnexpectedReply = errors.New("etcdstore: unexpected reply from etcd")

	// ErrClosed means the Store was closed. It wraps stores.ErrUnreachable:
	// a call on a closed Store changes nothing.
	ErrClosed = fmt.Errorf("%w: etcdstore: store closed", stores.ErrUnreachable)

	// ErrOvertaken means that a Refresh, or a Release with keep, found
	// its keys set by a later call of the same token first, which keeps
	// them for less than this call asked: it changed nothing. It is a
	// store failure (the Locker then trusts no more than this call's TTL).
	ErrOvertaken = errors.New("etcdstore: a later call of the token set the keys first, for a shorter time; this one changed nothing")

	// ErrUndoPending is Close's error when etcd answered neither the undo
	// of some abandoned acquires nor the revocation of their leases in
	// time: each may still be granted, and hold its keys until its lease
	// expires.
	ErrUndoPending = errors.New("etcdstore: abandoned acquires may still be granted")
)

// Store is a stores.Store on etcd, and a stores.Notifier and
// stores.FairStore. It is safe for concurrent use. It owns the leases it
// grants and the watches NotifyRelease starts, until Close.
type Store struct {
	client      *clientv3.Client
	ownsClient  bool // Open made the client; Close closes it
	kv          clientv3.KV
	prefix      string
	timeout     time.Duration
	maxRequest  int // etcd's --max-request-bytes
	bounds      stores.Bounds
	leases      *leasePool
	rtt         roundTrip // of the latest request etcd answered
	notify      *notifier
	undos       *undoQueue
	bg          context.Context // of the undo queue; Close ends it
	stopBG      context.CancelFunc
	closeOnce   sync.Once
	closeErr    error
	lifeMu      sync.RWMutex   // Close holds it to set closed; detached calls to start
	closed      bool           // guarded by lifeMu
	cleanupWait sync.WaitGroup // detached acquires and releases, which Close waits for

	backgroundReleases atomic.Int64 // releases going on after their caller left (see goOn)

	seqMu   sync.Mutex
	lastSeq uint64 // the sequence of the latest call (see begin)
}

// Option configures a Store.
type Option func(*Store) error

// WithPrefix sets the prefix of every etcd key the Store writes (default
// DefaultPrefix). Stores that share a prefix share their locks. It must not
// be empty.
func WithPrefix(prefix string) Option {
	return func(s *Store) error {
		if prefix == "" {
			return fmt.Errorf("%w: etcdstore: WithPrefix: empty prefix", stores.ErrInvalid)
		}
		s.prefix = prefix
		return nil
	}
}

// WithRequestTimeout bounds every etcd request of the Store (default
// DefaultRequestTimeout), also the acquires it finishes after their caller
// left and the releases that undo them. It must be positive.
func WithRequestTimeout(d time.Duration) Option {
	return func(s *Store) error {
		if d <= 0 {
			return fmt.Errorf("%w: etcdstore: WithRequestTimeout: %v is not positive", stores.ErrInvalid, d)
		}
		s.timeout = d
		return nil
	}
}

// WithMaxRequestBytes declares the cluster's --max-request-bytes, when it
// is not etcd's default (DefaultMaxRequestBytes): the Store's Bounds, the
// longest key it takes, follow from it. Above 2 MiB, the client's
// MaxCallSendMsgSize must be raised too. It must be at least 64 KiB.
func WithMaxRequestBytes(n int) Option {
	return func(s *Store) error {
		if n < 64<<10 {
			return fmt.Errorf("%w: etcdstore: WithMaxRequestBytes: %d is below 64 KiB", stores.ErrInvalid, n)
		}
		s.maxRequest = n
		return nil
	}
}

// New returns a Store on client. The caller keeps owning client, and closes
// it after the Store. It returns an error wrapping stores.ErrInvalid for a
// nil client or an invalid option.
//
// New cannot read the client's settings: with WithMaxRequestBytes above 2
// MiB, the client's MaxCallSendMsgSize must be raised too (Open does it),
// or the client refuses the largest requests the Store's Bounds admit
// (with stores.ErrInvalid); and its MaxCallRecvMsgSize must not be
// lowered below the largest reply (see the package documentation).
func New(client *clientv3.Client, opts ...Option) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: etcdstore: nil client", stores.ErrInvalid)
	}
	conn := client.ActiveConnection()
	s := &Store{
		client:     client,
		kv:         clientv3.NewKVFromKVClient(failFastKV{pb.NewKVClient(conn)}, client),
		prefix:     DefaultPrefix,
		timeout:    DefaultRequestTimeout,
		maxRequest: DefaultMaxRequestBytes,
	}
	for _, opt := range opts {
		if err := opt(s); err != nil {
			return nil, err
		}
	}
	s.bounds = stores.Bounds{
		MaxKeyBytes: maxKeyBytes(len(s.prefix), s.maxRequest),
		MaxTTL:      MaxTTL,
		Reason:      fmt.Sprintf("etcd's longest lease (9e9s, less the Store's margin of an eighth) and its request size limit (--max-request-bytes=%d)", s.maxRequest),
	}
	if s.bounds.MaxKeyBytes < 1 {
		return nil, fmt.Errorf("%w: etcdstore: a prefix of %d bytes leaves no room for a key in a request of %d bytes", stores.ErrInvalid, len(s.prefix), s.maxRequest)
	}
	s.bg, s.stopBG = context.WithCancel(context.Background())
	s.undos = newUndoQueue(s)
	s.leases = newLeasePool(clientv3.NewLeaseFromLeaseClient(failFastLease{pb.NewLeaseClient(conn)}, client, s.timeout), s.timeout, s.attemptBound(), &s.rtt, s.undos.leasesGone)
	s.notify = newNotifier(s)
	return s, nil
}

// begin returns the start of a call, from which its TTL counts, and its
// sequence: the call's start in Unix nanoseconds, or one more than the
// latest sequence of the Store's calls when that is larger (the clock
// stepped back, or two calls began within a nanosecond), so that the
// Store's calls are numbered in the order they started. A holder key keeps
// the sequence of the call that set it, and Refresh and a Release with
// keep act only on keys set by calls that started no later than theirs.
func (s *Store) begin() (time.Time, uint64) {
	s.seqMu.Lock()
	defer s.seqMu.Unlock()
	start := time.Now()
	s.lastSeq = max(s.lastSeq+1, uint64(max(start.UnixNano(), 0)))
	return start, s.lastSeq
}

// PendingUndos returns how many abandoned acquires (see stores.ErrAbandoned)
// the Store has yet to undo: while etcd answers neither their undo nor
// (through Close) the revocation of their leases, each may still be
// granted, and hold its keys until its lease expires. It counts too the
// Releases whose callers left that the undo queue sends (see Release).
func (s *Store) PendingUndos() int { return s.undos.len() }

// isClosed reports whether Close was called.
func (s *Store) isClosed() bool {
	s.lifeMu.RLock()
	defer s.lifeMu.RUnlock()
	return s.closed
}

// Close stops the Store's watches, waits for the acquires and releases it
// finishes for callers that left, revokes every lease it granted that etcd may still
// know (so its locks and queue places go at once, and no transaction still
// in flight can set a key on them) while its undo queue goes on, and
// closes the client when Open made it. Calls after Close return ErrClosed,
// and NotifyRelease a nil channel.
//
// Close returns within twice the request timeout: up to one for the
// acquires and releases in flight, and up to one for the revocations and
// the undos.
// When etcd did not answer in time, the undo of some abandoned acquire
// neither landed nor was made needless by the revocation of its leases:
// Close then returns an error wrapping ErrUndoPending that says how many
// such acquires may still be granted (each then holds its keys until its
// lease expires, at most its TTL plus an eighth and a second from its
// start, longer across a leader change). It returns the first error;
// calling it again returns the same.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

func (s *Store) close() error {
	s.lifeMu.Lock()
	s.closed = true
	s.lifeMu.Unlock()
	s.notify.close()
	s.cleanupWait.Wait() // each within the request timeout; acquires queue their undos
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	// The undo queue goes on meanwhile, and an undo whose every lease is
	// revoked is over.
	_, revokeErr := s.leases.close(ctx)
	left := s.undos.finish(ctx, s.stopBG)
	var undoErr error
	if left > 0 {
		undoErr = fmt.Errorf("%w: %d abandoned acquires: etcd answered neither their undo nor the revocation of their leases within %v",
			ErrUndoPending, left, s.timeout)
	}
	err := errors.Join(undoErr, revokeErr)
	if s.ownsClient {
		err = errors.Join(err, s.client.Close())
	}
	return err
}

// failFastKV makes etcd requests fail at once, rather than wait for a
// connection, when no member can be dialled: such a request surely never
// reached etcd, so it can report stores.ErrUnreachable.
type failFastKV struct{ pb.KVClient }

func (c failFastKV) Txn(ctx context.Context, in *pb.TxnRequest, opts ...grpc.CallOption) (*pb.TxnResponse, error) {
	return c.KVClient.Txn(ctx, in, append(opts, grpc.WaitForReady(false))...)
}

// failFastLease is failFastKV for lease grants and revocations.
type failFastLease struct{ pb.LeaseClient }

func (c failFastLease) LeaseGrant(ctx context.Context, in *pb.LeaseGrantRequest, opts ...grpc.CallOption) (*pb.LeaseGrantResponse, error) {
	return c.LeaseClient.LeaseGrant(ctx, in, append(opts, grpc.WaitForReady(false))...)
}

func (c failFastLease) LeaseRevoke(ctx context.Context, in *pb.LeaseRevokeRequest, opts ...grpc.CallOption) (*pb.LeaseRevokeResponse, error) {
	return c.LeaseClient.LeaseRevoke(ctx, in, append(opts, grpc.WaitForReady(false))...)
}

// escape percent-escapes '%' and '/' in name, so that it is one path
// element that no other name's escape starts with followed by "/".
func escape(name string) string {
	if strings.ContainsAny(name, "%/") {
		return strings.NewReplacer("%", "%25", "/", "%2F").Replace(name)
	}
	return name
}

// dir returns the directory of key: the prefix, the key escaped (so that
// no key's directory contains another's), and "/".
func (s *Store) dir(key string) string { return s.prefix + escape(key) + "/" }

// abandonedDir is the directory of token's abandon marks: the prefix, "/"
// (which no key's directory has there, a key being neither empty nor
// holding an unescaped '/'), "abandoned/", the token escaped, and "/".
func (s *Store) abandonedDir(token string) string {
	return s.prefix + "/abandoned/" + escape(token) + "/"
}

// abandonedKey is the mark of token's abandoned acquire on lease: see
// the package documentation.
func (s *Store) abandonedKey(token string, lease clientv3.LeaseID) string {
	return s.abandonedDir(token) + strconv.FormatUint(uint64(lease), 16)
}

// notAbandoned compares true while token has no abandon mark.
func (s *Store) notAbandoned(token string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(s.abandonedDir(token)), "=", 0).WithPrefix()
}

// countAbandoned reads how many abandon marks token has.
func (s *Store) countAbandoned(token string) clientv3.Op {
	return clientv3.OpGet(s.abandonedDir(token), clientv3.WithPrefix(), clientv3.WithCountOnly())
}

// errTokenAbandoned is the refusal of a token whose acquire was abandoned.
func errTokenAbandoned(token string) error {
	return fmt.Errorf("%w: etcdstore: token %s served an acquire that returned stores.ErrAbandoned; a token serves one acquisition",
		stores.ErrInvalid, stores.KeyForMessage(token))
}

// holderKey is key's holder key, and queueDir the parent of its waiters.
func holderKey(dir string) string { return dir + "holder" }
func queueDir(dir string) string  { return dir + "q/" }

// holderValue is the value of a holder key: the token, a NUL byte, the
// sequence of the call that set it (see Store.begin) in 16 hexadecimal
// digits, a NUL byte, and the TTL in milliseconds (which refusals report as
// Wait).
func holderValue(token string, seq uint64, ttl time.Duration) string {
	return token + "\x00" + seqString(seq) + "\x00" + millis(ttl)
}

// seqString is seq in 16 hexadecimal digits, which sort as the numbers do.
func seqString(seq uint64) string { return fmt.Sprintf("%016x", seq) }

// holderToken, holderSeq and holderTTL read a holderValue.
func holderToken(v []byte) string {
	tok, _, _ := strings.Cut(string(v), "\x00")
	return tok
}

func holderSeq(v []byte) uint64 {
	_, rest, _ := strings.Cut(string(v), "\x00")
	seq, _, _ := strings.Cut(rest, "\x00")
	n, _ := strconv.ParseUint(seq, 16, 64)
	return n
}

func holderTTL(v []byte) time.Duration {
	i := strings.LastIndexByte(string(v), 0)
	return parseMillis(v[i+1:])
}

// heldBy compares true when key exists and holds token: its value starts
// with token and a NUL byte, which no token contains (see checkToken).
func heldBy(key, token string) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(key), ">", token+"\x00"),
		clientv3.Compare(clientv3.Value(key), "<", token+"\x01"),
	}
}

// heldUpTo compares true when key exists, holds token, and was set by a
// call of a sequence no later than seq: its value lies between token and a
// NUL byte, and the same followed by seq and a byte above the NUL that
// follows it.
func heldUpTo(key, token string, seq uint64) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(key), ">", token+"\x00"),
		clientv3.Compare(clientv3.Value(key), "<", token+"\x00"+seqString(seq)+"\x01"),
	}
}

// absent compares true when key does not exist.
func absent(key string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
}

// othersAbsent compares true when no key under parent other than mine
// exists: two range comparisons, before and after mine.
func othersAbsent(parent, mine string) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(parent), "=", 0).WithRange(mine),
		clientv3.Compare(clientv3.CreateRevision(mine+"\x00"), "=", 0).WithRange(clientv3.GetPrefixRangeEnd(parent)),
	}
}

// millis is the value of a holder or waiter key: its TTL or lease in
// milliseconds, at least 1.
func millis(d time.Duration) string { return strconv.FormatInt(max(d.Milliseconds(), 1), 10) }

// parseMillis reads a value of millis; zero when it is not one, and the
// longest duration when it is longer.
func parseMillis(v []byte) time.Duration {
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return 0
	}
	return storeargs.Millis(n)
}

// fence is the fence of a grant made at revision rev.
func fence(rev int64) int64 { return rev * stores.FenceStride }

// checkToken refuses an empty token, and one with a NUL byte, which ends
// the token in a holder key's value.
func checkToken(token string) error {
	if token == "" || strings.Contains(token, "\x00") {
		return fmt.Errorf("%w: etcdstore: empty token, or one with a NUL byte", stores.ErrInvalid)
	}
	return nil
}

// Sizes of the estimate, from above, of a request's size (see
// Store.checkSize): etcd refuses a request larger than --max-request-bytes.
const (
	// requestReserve is what a request holds besides its keys: etcd's
	// raft header, the transaction's framing.
	requestReserve = 16 << 10
	// opOverhead is what each occurrence of a key in a request adds to
	// the key and the token: protobuf tags and lengths, nested
	// transactions, a value's TTL.
	opOverhead = 64
	// tokenAllowance is the longest token that every call on a key of
	// MaxKeyBytes takes; a longer one may make a call too large.
	tokenAllowance = 1 << 10
	// keyOccurrences is how many times a request of a plain call names
	// each of its keys, with the token: Acquire's condition, put and read;
	// Refresh's two conditions and put; Release's two conditions and
	// delete or put.
	keyOccurrences = 3
	// fairOccurrences is how many times AcquireFair's first transaction
	// names its key's directory, with the token: five conditions, a put
	// and a delete when granted, two reads and a put (the range read
	// counts twice) when not.
	fairOccurrences = 11
	// abandonedOccurrences is how many times a request names the
	// token's abandon marks: a condition and a read (each a range, so
	// twice), or an undo's marks.
	abandonedOccurrences = 4
)

// maxKeyBytes is the longest key whose every call fits a request of
// maxRequest bytes with a store prefix of prefixLen bytes, the key's
// every byte escaped to three and a token of tokenAllowance bytes,
// rounded down to KiB: fairOccurrences times the key, plus the abandon
// marks, plus requestReserve. About 45 KiB with the defaults.
func maxKeyBytes(prefixLen, maxRequest int) int {
	marks := abandonedOccurrences * (prefixLen + len("/abandoned/") + 3*tokenAllowance + 1 + 16 + opOverhead)
	perOccurrence := (maxRequest - requestReserve - marks) / fairOccurrences
	n := (perOccurrence - prefixLen - len("/holder") - tokenAllowance - opOverhead) / 3
	if n >= 1<<10 {
		n &^= 1<<10 - 1
	}
	return n
}

// Bounds returns the keys and TTLs the Store honours (see stores.Bounded):
//
//   - MaxKeyBytes follows from etcd's request size limit
//     (--max-request-bytes, DefaultMaxRequestBytes unless
//     WithMaxRequestBytes says otherwise): AcquireFair's transaction names
//     its key's directory 11 times, and a key's every '%' and '/' takes
//     three bytes escaped, so a key may take up to about a 33rd of a
//     request: 45 KiB with the defaults. A call whose keys together, or
//     with a token longer than 1 KiB, make a request too large for etcd
//     is refused with stores.ErrInvalid too.
//   - MaxTTL is MaxTTL (8e9s, about 253 years): its lease, an eighth
//     longer so that calls share it, is etcd's longest (9e9s).
//   - MinTTL is none: every positive TTL is honoured. etcd raises a lease
//     below its minimum (2s with the default election timeout) to that
//     minimum, so a key of a shorter TTL is held at least that TTL, and in
//     practice up to 2.5s when its holder dies without releasing it.
func (s *Store) Bounds() stores.Bounds { return s.bounds }

// checkKeys refuses more keys than MaxKeys, a key longer than the Store's
// MaxKeyBytes, and keys that with token make a request larger than etcd
// takes, each key named occ times in it.
func (s *Store) checkKeys(keys []string, token string, occ int) error {
	if len(keys) > MaxKeys {
		return fmt.Errorf("%w: etcdstore: %d keys in one call, at most %d", stores.ErrInvalid, len(keys), MaxKeys)
	}
	if err := args.CheckBounds(s.bounds, keys); err != nil {
		return err
	}
	n := requestReserve + abandonedOccurrences*(len(s.abandonedKey(token, 0))+16+opOverhead)
	for _, k := range keys {
		n += occ * (len(holderKey(s.dir(k))) + len(token) + opOverhead)
	}
	if n > s.maxRequest {
		return fmt.Errorf("%w: etcdstore: %d keys of %d bytes with a token of %d bytes make a request of up to %d bytes, above etcd's limit of %d (--max-request-bytes)",
			stores.ErrInvalid, len(keys), keyBytes(keys), len(token), n, s.maxRequest)
	}
	return nil
}

// keyBytes is the length of keys together.
func keyBytes(keys []string) int {
	n := 0
	for _, k := range keys {
		n += len(k)
	}
	return n
}

// checkTTL refuses a duration out of the Store's Bounds, naming it what.
func (s *Store) checkTTL(what string, d time.Duration) error {
	if err := s.bounds.CheckTTL(what, d); err != nil {
		return fmt.Errorf("%w: etcdstore: %s", stores.ErrInvalid, strings.TrimPrefix(err.Error(), stores.ErrInvalid.Error()+": "))
	}
	return nil
}

// keysForMessage names keys in an error message: the first few, each
// shortened by stores.KeyForMessage, and how many more there are.
func keysForMessage(keys []string) string {
	const shown = 3
	var b strings.Builder
	b.WriteByte('[')
	for i, k := range keys[:min(len(keys), shown)] {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(stores.KeyForMessage(k))
	}
	if len(keys) > shown {
		fmt.Fprintf(&b, " and %d more", len(keys)-shown)
	}
	b.WriteByte(']')
	return b.String()
}

// Acquire sets every key to token for at least ttl when none is held by
// another token, in one transaction (see stores.Store): it compares, per
// key, that its holder key does not exist (and that token was not
// abandoned, see the package documentation), and then puts token's holder
// key on a shared lease that lasts ttl from the call's start. A retry finds keys holding
// its own token and puts them again, with a fresh fence and lease, in a
// second transaction that compares they are unchanged. A refusal names the
// first key held by another token and, as Wait, the TTL that holder was
// given (an upper bound of what it has left). It returns an error wrapping
// stores.ErrInvalid for invalid arguments, arguments out of the Store's
// Bounds, more than MaxKeys keys, too many keys for the cluster's
// --max-txn-ops, or a token whose acquire was abandoned; and ctx.Err()
// without acting when ctx has ended.
//
// A token whose acquire returned stores.ErrAbandoned serves no other call:
// once its undo has landed, Acquire refuses it with stores.ErrInvalid, and
// an acquire of it granted before then is deleted by the undo when it
// lands. The Locker never reuses a token.
func (s *Store) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	start, seq := s.begin()
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return stores.Grant{}, err
	}
	if err := errors.Join(checkToken(token), s.checkTTL("ttl", ttl), s.checkKeys(keys, token, keyOccurrences)); err != nil {
		return stores.Grant{}, err
	}
	var g stores.Grant
	var fl flight
	err := s.detached(ctx, func(ctx context.Context) error {
		var err error
		g, err = s.acquire(ctx, start, seq, keys, token, ttl, &fl)
		return err
	}, func() *pendingUndo { return s.newUndo(keys, token, false, &fl) })
	if err != nil {
		return stores.Grant{}, err
	}
	return g, nil
}

func (s *Store) acquire(ctx context.Context, start time.Time, seq uint64, keys []string, token string, ttl time.Duration, fl *flight) (stores.Grant, error) {
	holders := make([]string, len(keys))
	for i, k := range keys {
		holders[i] = holderKey(s.dir(k))
	}
	// First every key must be absent; when only token's own grants stand
	// in the way (a retry), the keys must be as they were then read.
	conds := make([]clientv3.Cmp, len(keys))
	for i, h := range holders {
		conds[i] = absent(h)
	}
	for range acquireAttempts {
		var resp *clientv3.TxnResponse
		err := s.withLease(ctx, start, ttl, func(lease clientv3.LeaseID) error {
			fl.sending(lease)
			var err error
			resp, err = s.acquireTxn(ctx, holders, conds, token, seq, ttl, lease).Commit()
			return err
		})
		if err != nil {
			return stores.Grant{}, s.failed("acquire", keys, err)
		}
		if resp.Succeeded {
			fences := make([]int64, len(keys))
			for i := range fences {
				fences[i] = fence(resp.Header.Revision)
			}
			return stores.Grant{OK: true, Fences: fences}, nil
		}
		if len(resp.Responses) != len(keys)+1 {
			return stores.Grant{}, fmt.Errorf("%w: acquire answered %d ranges for %d keys", ErrUnexpectedReply, len(resp.Responses), len(keys))
		}
		if resp.Responses[len(keys)].GetResponseRange().GetCount() > 0 {
			return stores.Grant{}, errTokenAbandoned(token)
		}
		for i, r := range resp.Responses[:len(keys)] {
			kvs := r.GetResponseRange().GetKvs()
			if len(kvs) == 0 {
				conds[i] = absent(holders[i])
				continue
			}
			if holderToken(kvs[0].Value) != token {
				return stores.Grant{Held: i, Wait: holderTTL(kvs[0].Value)}, nil
			}
			conds[i] = clientv3.Compare(clientv3.ModRevision(holders[i]), "=", kvs[0].ModRevision)
		}
	}
	return stores.Grant{}, fmt.Errorf("etcdstore: acquire %s: the keys changed under %d attempts", keysForMessage(keys), acquireAttempts)
}

// acquireTxn is one transaction of acquire: if conds hold for holders and
// token has no abandon mark, it puts token's holder keys on lease, else it
// reads them and counts the marks.
func (s *Store) acquireTxn(ctx context.Context, holders []string, conds []clientv3.Cmp, token string, seq uint64, ttl time.Duration, lease clientv3.LeaseID) clientv3.Txn {
	puts := make([]clientv3.Op, len(holders))
	gets := make([]clientv3.Op, len(holders)+1)
	val := holderValue(token, seq, ttl)
	for i, h := range holders {
		puts[i] = clientv3.OpPut(h, val, clientv3.WithLease(lease))
		gets[i] = clientv3.OpGet(h)
	}
	gets[len(holders)] = s.countAbandoned(token)
	return s.kv.Txn(ctx).If(append(slices.Clip(conds), s.notAbandoned(token))...).Then(puts...).Else(gets...)
}

// Release ends token's grant on every key that still holds it, in one
// transaction: it deletes the holder keys that hold token, which signals
// waiters (see NotifyRelease); with keep positive it moves them to a lease
// that lasts keep from the call's start instead, so they stay held until
// it passes and nothing is signalled. A release with keep acts only on
// keys set by calls of token that started before it (see Refresh). It
// returns an error wrapping stores.ErrNotHeld when some key did not hold
// token, after ending the grant on the others, one wrapping
// stores.ErrInvalid for invalid arguments or arguments out of the Store's
// Bounds, and ctx.Err() without acting when ctx has ended. While etcd does
// not answer, the transaction is sent again (see "Leader changes" in the
// package documentation); when ctx ends first, Release returns an error
// wrapping ctx.Err(), its outcome unknown, and goes on until etcd answers
// or the request timeout has passed (beyond 16 such releases at once, one
// without keep goes to the undo queue, and one with a keep is given up).
func (s *Store) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	start, seq := s.begin()
	if err := args.CheckRelease(ctx, keys); err != nil {
		return err
	}
	if err := errors.Join(checkToken(token), s.checkKeys(keys, token, keyOccurrences)); err != nil {
		return err
	}
	if keep > 0 {
		if err := s.checkTTL("keep", keep); err != nil {
			return err
		}
	}
	var overflow func() // a keep is not a delete: given up beyond the bound
	if keep == 0 {
		overflow = func() { s.undos.add(s.releaseUndo(keys, token)) }
	}
	return s.goOn(ctx, "release", keys, func(ctx context.Context) error {
		return s.release(ctx, start, seq, keys, token, keep)
	}, overflow)
}

// release is Release as begun at start with sequence seq.
func (s *Store) release(ctx context.Context, start time.Time, seq uint64, keys []string, token string, keep time.Duration) error {
	holders := make([]string, len(keys))
	for i, k := range keys {
		holders[i] = holderKey(s.dir(k))
	}
	send := func(ctx context.Context) (resp *clientv3.TxnResponse, err error) {
		err = s.withLease(ctx, start, keep, func(lease clientv3.LeaseID) error {
			// One key is the transaction's condition; several each get a
			// nested transaction, so that the others are released anyway.
			var cmps []clientv3.Cmp
			ops := make([]clientv3.Op, len(keys))
			for i, h := range holders {
				held := heldBy(h, token)
				ops[i] = clientv3.OpDelete(h)
				if keep > 0 {
					held = heldUpTo(h, token, seq)
					ops[i] = clientv3.OpPut(h, holderValue(token, seq, keep), clientv3.WithLease(lease))
				}
				if len(keys) == 1 {
					cmps = held
				} else {
					ops[i] = clientv3.OpTxn(held, []clientv3.Op{ops[i]}, nil)
				}
			}
			var err error
			resp, err = s.kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
			return err
		})
		return resp, err
	}
	// Sent again while etcd does not answer: a copy deletes (or moves)
	// only keys that hold token, set by a call no later than this one.
	answers, unsure, err := s.resendUnsure(ctx, send, func(resp *clientv3.TxnResponse) bool {
		refused, err := releaseRefused(resp, len(keys))
		return err == nil && len(refused) == 0
	})
	if err != nil {
		return s.failed("release", keys, err)
	}
	sure := unsure == nil // no copy of unknown outcome
	// A key is refused when every answer refused it: a copy may have
	// released it before another found it released.
	var refused []int
	for i, resp := range answers {
		r, err := releaseRefused(resp, len(keys))
		if err != nil {
			return err
		}
		if i == 0 {
			refused = r
		} else {
			refused = slices.DeleteFunc(refused, func(k int) bool { return !slices.Contains(r, k) })
		}
	}
	if len(refused) == 0 {
		return nil
	}
	if keep == 0 && !sure {
		// A copy whose outcome is unknown may have deleted the keys the
		// later ones found gone, and a delete leaves no trace to read:
		// the outcome is unknown, not "not held".
		return fmt.Errorf("etcdstore: release %s: refused after a copy of unknown outcome, which may have released them: %w", keysForMessage(keys), unsure)
	}
	notHeld := pick(keys, refused)
	if keep > 0 {
		// Some may hold token from a later call: only the others are
		// not held.
		idx, covered, err := s.readRefused(ctx, pick(holders, refused), token, seq, keep)
		if err != nil {
			return fmt.Errorf("etcdstore: release %s: %d keys refused the keep, and reading them failed: %w", keysForMessage(keys), len(refused), err)
		}
		if len(idx) == 0 {
			if covered {
				return nil
			}
			return fmt.Errorf("%w: etcdstore: release %s with keep %v", ErrOvertaken, keysForMessage(keys), keep)
		}
		notHeld = pick(notHeld, idx)
	}
	return fmt.Errorf("%w: etcdstore: release: %s not held by the token", stores.ErrNotHeld, keysForMessage(notHeld))
}

// releaseRefused returns the indexes of the n keys that a release's
// transaction, answered resp, did not release.
func releaseRefused(resp *clientv3.TxnResponse, n int) ([]int, error) {
	var refused []int
	switch {
	case n == 1:
		if !resp.Succeeded {
			refused = []int{0}
		}
	case len(resp.Responses) != n:
		return nil, fmt.Errorf("%w: release answered %d results for %d keys", ErrUnexpectedReply, len(resp.Responses), n)
	default:
		for i, r := range resp.Responses {
			if !r.GetResponseTxn().GetSucceeded() {
				refused = append(refused, i)
			}
		}
	}
	return refused, nil
}

// pick returns the elements of xs at the indexes idx.
func pick[T any](xs []T, idx []int) []T {
	out := make([]T, len(idx))
	for i, j := range idx {
		out[i] = xs[j]
	}
	return out
}

// readRefused reads the holder keys hs, which a transaction of a call of
// token and sequence seq refused (it compared heldUpTo), in one more
// transaction, and returns the indexes of those that do not hold token.
// covered reports whether each of the others was set by a later call of
// token, with a TTL of at least d: such a call started after this one
// (see Store.begin), so the key stays held until at least this call's
// start plus d.
func (s *Store) readRefused(ctx context.Context, hs []string, token string, seq uint64, d time.Duration) (notHeld []int, covered bool, err error) {
	gets := make([]clientv3.Op, len(hs))
	for i, h := range hs {
		gets[i] = clientv3.OpGet(h)
	}
	resp, err := s.kv.Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return nil, false, err
	}
	if len(resp.Responses) != len(hs) {
		return nil, false, fmt.Errorf("%w: %d reads answered %d results", ErrUnexpectedReply, len(hs), len(resp.Responses))
	}
	covered = true
	for i, r := range resp.Responses {
		kvs := r.GetResponseRange().GetKvs()
		switch {
		case len(kvs) == 0 || holderToken(kvs[0].Value) != token:
			notHeld = append(notHeld, i)
		case holderSeq(kvs[0].Value) <= seq || holderTTL(kvs[0].Value) < d:
			covered = false
		}
	}
	return notHeld, covered, nil
}

// Refresh moves every key to a lease that lasts ttl from the call's start,
// and sets the TTL its refusals report, in one transaction, when each still
// holds token and was set by a call of token that started before this one
// (each holder key keeps the sequence of the call that set it, see
// Store.begin); otherwise it changes nothing and returns an error wrapping
// stores.ErrNotHeld when a key does not hold token. So a Refresh that
// reaches etcd late, after a later Refresh or Release with keep of the
// same grant, cannot move the keys back to its own lease, which may end
// sooner: it returns nil when the later call keeps every key at least as
// long as it would have, and an error wrapping ErrOvertaken (a store
// failure: the Locker no longer trusts more than this call's TTL) when
// not. Telling these apart from ErrNotHeld costs a second transaction, on
// a refusal only. It returns an error wrapping stores.ErrInvalid for
// invalid arguments or arguments out of the Store's Bounds, and ctx.Err()
// without acting when ctx has ended. While etcd does not answer, the
// transaction is sent again (see "Leader changes" in the package
// documentation).
func (s *Store) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	start, seq := s.begin()
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return err
	}
	if err := errors.Join(checkToken(token), s.checkTTL("ttl", ttl), s.checkKeys(keys, token, keyOccurrences)); err != nil {
		return err
	}
	if s.isClosed() {
		return ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.refresh(ctx, start, seq, keys, token, ttl)
}

// refresh is Refresh as begun at start with sequence seq.
func (s *Store) refresh(ctx context.Context, start time.Time, seq uint64, keys []string, token string, ttl time.Duration) error {
	holders := make([]string, len(keys))
	for i, k := range keys {
		holders[i] = holderKey(s.dir(k))
	}
	send := func(ctx context.Context) (resp *clientv3.TxnResponse, err error) {
		err = s.withLease(ctx, start, ttl, func(lease clientv3.LeaseID) error {
			var err error
			resp, err = s.refreshTxn(ctx, holders, token, seq, ttl, lease).Commit()
			return err
		})
		return resp, err
	}
	// Sent again while etcd does not answer: every copy compares the same
	// owner and sequence, and puts the same value.
	answers, err := s.resend(ctx, send, func(resp *clientv3.TxnResponse) bool { return resp.Succeeded })
	if err != nil {
		return s.failed("refresh", keys, err)
	}
	if answers[0].Succeeded {
		return nil
	}
	notHeld, covered, err := s.readRefused(ctx, holders, token, seq, ttl)
	switch {
	case err != nil:
		return fmt.Errorf("etcdstore: refresh %s: refused, and reading the keys failed: %w", keysForMessage(keys), err)
	case len(notHeld) > 0:
		return fmt.Errorf("%w: etcdstore: refresh: %s not all held by the token", stores.ErrNotHeld, keysForMessage(keys))
	case !covered:
		return fmt.Errorf("%w: etcdstore: refresh %s to %v", ErrOvertaken, keysForMessage(keys), ttl)
	}
	return nil
}

// refreshTxn is Refresh's transaction: when every holder key holds token
// and was set by a call of sequence seq or earlier, it puts them on lease.
func (s *Store) refreshTxn(ctx context.Context, holders []string, token string, seq uint64, ttl time.Duration, lease clientv3.LeaseID) clientv3.Txn {
	cmps := make([]clientv3.Cmp, 0, 2*len(holders))
	puts := make([]clientv3.Op, len(holders))
	val := holderValue(token, seq, ttl)
	for i, h := range holders {
		cmps = append(cmps, heldUpTo(h, token, seq)...)
		puts[i] = clientv3.OpPut(h, val, clientv3.WithLease(lease))
	}
	return s.kv.Txn(ctx).If(cmps...).Then(puts...)
}
