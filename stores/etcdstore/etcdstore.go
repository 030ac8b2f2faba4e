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

// Store is a stores.Store on etcd, and a stores.Notifier,
// stores.FairStore, stores.SharedStore and stores.RecordStore. It is safe
// for concurrent use. It owns the leases it grants for locks and the
// watches NotifyRelease starts, until Close; the leases of its records
// outlive it (see FinishRecord).
type Store struct {
	client      *clientv3.Client
	ownsClient  bool // Open made the client; Close closes it
	kv          clientv3.KV
	prefix      string
	timeout     time.Duration
	maxRequest  int // etcd's --max-request-bytes
	bounds      stores.Bounds
	leases      *leasePool
	records     *leasePool // of finished records, which Close does not revoke
	rtt         roundTrip  // of the latest request etcd answered
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

	places places // the slots of this Store's limited holders (see AcquireShared)

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
		MaxKeyBytes:    maxKeyBytes(len(s.prefix), s.maxRequest),
		MaxTTL:         MaxTTL,
		MaxRecordBytes: maxRecordBytes(len(s.prefix), s.maxRequest),
		MaxRetention:   MaxTTL,
		Reason:         fmt.Sprintf("etcd's longest lease (9e9s, less the Store's margin of an eighth) and its request size limit (--max-request-bytes=%d)", s.maxRequest),
	}
	if s.bounds.MaxKeyBytes < 1 {
		return nil, fmt.Errorf("%w: etcdstore: a prefix of %d bytes leaves no room for a key in a request of %d bytes", stores.ErrInvalid, len(s.prefix), s.maxRequest)
	}
	s.bg, s.stopBG = context.WithCancel(context.Background())
	s.undos = newUndoQueue(s)
	lease := clientv3.NewLeaseFromLeaseClient(failFastLease{pb.NewLeaseClient(conn)}, client, s.timeout)
	s.leases = newLeasePool(lease, s.timeout, s.attemptBound(), &s.rtt, leaseSeconds, s.undos.leasesGone)
	s.records = newLeasePool(lease, s.timeout, s.attemptBound(), &s.rtt, recordLeaseSeconds, nil)
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
	revokeErr = errors.Join(revokeErr, s.records.stop(ctx))
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
	_, rest, _ := strings.Cut(string(v), "\x00")
	_, rest, _ = strings.Cut(rest, "\x00")
	ttl, _, _ := strings.Cut(rest, "\x00") // a shared holder's limit follows
	return parseMillis([]byte(ttl))
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

// unheld compares true when neither the holder key h nor a shared holder
// of it (see sharedKey) exists: the key is free.
func unheld(h string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(h), "=", 0).WithRange(holdersEnd(h))
}

// getHolders reads the holder key h and the key's shared holders, in key
// order: the holder key, when it exists, comes first.
func getHolders(h string) clientv3.Op {
	return clientv3.OpGet(h, clientv3.WithRange(holdersEnd(h)))
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

// Acquire sets every key to token for at least ttl when none is held by
// another token, in one transaction (see stores.Store): it compares, per
// key, that neither its holder key nor a shared holder exists (and that
// token was not abandoned, see the package documentation), and then puts
// token's holder key on a shared lease that lasts ttl from the call's
// start, and deletes token's writer record on the key. A key refused for
// its shared holders gets token's writer record, in a second transaction,
// SharedHeld and Wait the longest TTL they were given (see AcquireShared). A retry finds keys holding
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
		g, err = s.acquire(ctx, start, seq, keys, token, ttl, &fl, nil)
		return err
	}, func() *pendingUndo { return s.newUndo(keys, token, false, &fl) })
	if err != nil {
		return stores.Grant{}, err
	}
	return g, nil
}

// acquire is Acquire as begun at start with sequence seq, recording the
// leases of its transactions in fl. With found not nil (ClaimRecord of one
// key), a key that holds a finished record sets *found to a copy of it,
// and acquire returns a Grant with OK false and Wait zero.
func (s *Store) acquire(ctx context.Context, start time.Time, seq uint64, keys []string, token string, ttl time.Duration, fl *flight, found **stores.Record) (stores.Grant, error) {
	holders := make([]string, len(keys))
	for i, k := range keys {
		holders[i] = holderKey(s.dir(k))
	}
	// First every key must be absent; when only token's own grants stand
	// in the way (a retry), the keys must be as they were then read.
	conds := make([]clientv3.Cmp, len(keys))
	for i, h := range holders {
		conds[i] = unheld(h)
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
				conds[i] = unheld(holders[i])
				continue
			}
			if string(kvs[0].Key) != holders[i] {
				// Shared holders: the writer waits, and new ones wait for it.
				s.writerWaits(ctx, holders[i], token)
				return stores.Grant{Held: i, Wait: longestTTL(kvs), SharedHeld: true}, nil
			}
			if found != nil && isRecord(kvs[0].Value) {
				rec, err := decodeRecord(kvs[0].Value)
				if err != nil {
					return stores.Grant{}, fmt.Errorf("%w: claim of %s: %w", ErrUnexpectedReply, stores.KeyForMessage(keys[i]), err)
				}
				*found = rec
				return stores.Grant{}, nil
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
// token has no abandon mark, it puts token's holder keys on lease and ends
// their writers' waits (see writerWaits), else it reads them with their
// shared holders and counts the marks.
func (s *Store) acquireTxn(ctx context.Context, holders []string, conds []clientv3.Cmp, token string, seq uint64, ttl time.Duration, lease clientv3.LeaseID) clientv3.Txn {
	puts := make([]clientv3.Op, 0, 2*len(holders))
	gets := make([]clientv3.Op, len(holders)+1)
	val := holderValue(token, seq, ttl)
	for i, h := range holders {
		puts = append(puts, clientv3.OpPut(h, val, clientv3.WithLease(lease)), clientv3.OpDelete(writerKey(h, token)))
		gets[i] = getHolders(h)
	}
	gets[len(holders)] = s.countAbandoned(token)
	return s.kv.Txn(ctx).If(append(slices.Clip(conds), s.notAbandoned(token))...).Then(puts...).Else(gets...)
}

// Release ends token's grant on every key that still holds it, in one
// transaction: it deletes the holder keys that hold token, which signals
// waiters (see NotifyRelease); with keep positive it moves them to a lease
// that lasts keep from the call's start instead, so they stay held until
// it passes and nothing is signalled. A release with keep acts only on
// keys set by calls of token that started before it (see Refresh). In the
// same transaction it deletes token's writer records on the keys, held or
// not (see AcquireShared). It returns an error wrapping stores.ErrNotHeld
// when some key did not hold
// token, after ending the grant on the others, and at once for a token
// that starts with a NUL byte, which holds no key; one wrapping
// stores.ErrInvalid for invalid arguments or arguments out of the Store's
// Bounds, and ctx.Err() without acting when ctx has ended. While etcd does
// not answer, the transaction is sent again (see "Leader changes" in the
// package documentation); when ctx ends first, Release returns an error
// wrapping ctx.Err(), its outcome unknown, and goes on for up to the
// request timeout; one without keep then goes to the undo queue, which
// sends it until etcd answers (at once beyond 16 such releases), and one
// with a keep is given up.
func (s *Store) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	start, seq := s.begin()
	if err := args.CheckRelease(ctx, keys); err != nil {
		return err
	}
	if err := args.CheckHeldToken(keys, token, reservedToken); err != nil {
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
		return s.release(ctx, start, seq, keys, s.holderKeys(keys), true, token, keep)
	}, overflow)
}

// holderKeys returns the holder keys of keys.
func (s *Store) holderKeys(keys []string) []string {
	holders := make([]string, len(keys))
	for i, k := range keys {
		holders[i] = holderKey(s.dir(k))
	}
	return holders
}

// release is Release as begun at start with sequence seq, of the holder
// keys holders of keys (or of shared holder keys); with withdraw, it also
// deletes token's writer records on the keys (see writerWaits), whatever
// the keys hold.
func (s *Store) release(ctx context.Context, start time.Time, seq uint64, keys, holders []string, withdraw bool, token string, keep time.Duration) error {
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
			// A token that waits as a writer (see writerWaits) withdraws,
			// whatever it holds.
			var withdrawals []clientv3.Op
			if withdraw {
				for _, h := range holders {
					withdrawals = append(withdrawals, clientv3.OpDelete(writerKey(h, token)))
				}
			}
			txn := s.kv.Txn(ctx).If(cmps...).Then(append(ops, withdrawals...)...)
			if len(keys) == 1 && withdraw {
				txn = txn.Else(withdrawals...)
			}
			var err error
			resp, err = txn.Commit()
			return err
		})
		return resp, err
	}
	// Sent again while etcd does not answer: a copy deletes (or moves)
	// only keys that hold token, set by a call no later than this one.
	s.leaseAhead(ctx, start, keep)
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
	case len(resp.Responses) < n:
		return nil, fmt.Errorf("%w: release answered %d results for %d keys", ErrUnexpectedReply, len(resp.Responses), n)
	default:
		for i, r := range resp.Responses[:n] { // then the withdrawals
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
// a refusal only. A token that starts with a NUL byte holds no key:
// ErrNotHeld, at once. It returns an error wrapping stores.ErrInvalid for
// invalid arguments or arguments out of the Store's Bounds, and ctx.Err()
// without acting when ctx has ended. While etcd does not answer, the
// transaction is sent again (see "Leader changes" in the package
// documentation).
func (s *Store) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	start, seq := s.begin()
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return err
	}
	if err := args.CheckHeldToken(keys, token, reservedToken); err != nil {
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
	return s.refresh(ctx, start, seq, keys, s.holderKeys(keys), token, ttl)
}

// refresh is Refresh as begun at start with sequence seq, of the holder
// keys holders of keys (or of shared holder keys).
func (s *Store) refresh(ctx context.Context, start time.Time, seq uint64, keys, holders []string, token string, ttl time.Duration) error {
	send := func(ctx context.Context) (resp *clientv3.TxnResponse, err error) {
		err = s.withLease(ctx, start, ttl, func(lease clientv3.LeaseID) error {
			var err error
			resp, err = s.refreshTxn(ctx, holders, holderValue(token, seq, ttl), token, seq, lease).Commit()
			return err
		})
		return resp, err
	}
	// Sent again while etcd does not answer: every copy compares the same
	// owner and sequence, and puts the same value.
	s.leaseAhead(ctx, start, ttl)
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
// and was set by a call of sequence seq or earlier, it puts val on them, on
// lease.
func (s *Store) refreshTxn(ctx context.Context, holders []string, val, token string, seq uint64, lease clientv3.LeaseID) clientv3.Txn {
	cmps := make([]clientv3.Cmp, 0, 2*len(holders))
	puts := make([]clientv3.Op, len(holders))
	for i, h := range holders {
		cmps = append(cmps, heldUpTo(h, token, seq)...)
		puts[i] = clientv3.OpPut(h, val, clientv3.WithLease(lease))
	}
	return s.kv.Txn(ctx).If(cmps...).Then(puts...)
}
