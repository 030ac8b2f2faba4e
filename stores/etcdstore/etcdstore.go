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
//     holder's token, a NUL byte, and the TTL it was given in milliseconds,
//     which refusals report as Wait. One fixed name per lock key, so that
//     etcd's index does not grow with every acquisition until the next
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
// grants that still find at least ttl left in it, so that a lease costs one
// LeaseGrant per second or so and not one per lock. Refresh moves the keys
// to a lease of the new TTL. A key therefore outlives its TTL by at most an
// eighth of it plus a second plus etcd's expiry sweep (500ms), whether its
// holder lives or died, and never lives shorter. etcd raises a lease below
// its minimum (1.5 x the election timeout, rounded up: 2s by default) to that
// minimum, which is thus the shortest TTL the store honours: a lock of 50ms
// is held 2s if its holder dies without releasing it. Fair-waiter leases
// round the same way.
//
// Close revokes every lease the Store granted that may still be alive: its
// keys go at once rather than at their TTL (etcd issue 17470 is a lease kept
// alive after its client exits; here none is kept alive at all).
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
// # Round trips
//
// Acquire, Release and Refresh are one transaction each, for any number of
// keys (up to MaxKeys), plus a LeaseGrant when no shared lease fits (about
// once a second per TTL in use), and a second transaction for a retried
// Acquire that finds its own grant. Every request is a
// write through etcd's log, a refused acquire too. A fair
// attempt is one transaction, and a second one when its caller heads the
// queue behind other waiters.
//
// # Calls and contexts
//
// Every call returns as soon as its context ends. An acquire (plain or fair)
// runs on a context that the caller's cancellation does not end, bounded by
// the request timeout; when the caller left first, the Store releases what
// it may have granted, owner-checked, once the transaction answered, and the
// caller gets an error wrapping stores.ErrAbandoned and the context's error.
// A call that failed because no member could be dialled never reached etcd
// and wraps stores.ErrUnreachable; any other failure leaves its outcome
// unknown.
package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
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
	leases      *leasePool
	notify      *notifier
	closeOnce   sync.Once
	closeErr    error
	lifeMu      sync.RWMutex   // Close holds it to set closed; detached calls to start
	closed      bool           // guarded by lifeMu
	cleanupWait sync.WaitGroup // detached acquires and their undo, which Close waits for
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

// New returns a Store on client. The caller keeps owning client, and closes
// it after the Store. It returns an error wrapping stores.ErrInvalid for a
// nil client or an invalid option.
func New(client *clientv3.Client, opts ...Option) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: etcdstore: nil client", stores.ErrInvalid)
	}
	conn := client.ActiveConnection()
	s := &Store{
		client:  client,
		kv:      clientv3.NewKVFromKVClient(failFastKV{pb.NewKVClient(conn)}, client),
		prefix:  DefaultPrefix,
		timeout: DefaultRequestTimeout,
	}
	for _, opt := range opts {
		if err := opt(s); err != nil {
			return nil, err
		}
	}
	s.leases = newLeasePool(clientv3.NewLeaseFromLeaseClient(failFastLease{pb.NewLeaseClient(conn)}, client, s.timeout), s.timeout)
	s.notify = newNotifier(s)
	return s, nil
}

// isClosed reports whether Close was called.
func (s *Store) isClosed() bool {
	s.lifeMu.RLock()
	defer s.lifeMu.RUnlock()
	return s.closed
}

// Close stops the Store's watches, waits for the acquires it finishes for
// callers that left (bounded by the request timeout), revokes the leases it granted that may
// still be alive (so its locks and queue places go at once), and closes the
// client when Open made it. Calls after Close return ErrClosed, and
// NotifyRelease a nil channel. It returns the first error; calling it again
// returns the same.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.lifeMu.Lock()
		s.closed = true
		s.lifeMu.Unlock()
		s.notify.close()
		s.cleanupWait.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
		defer cancel()
		s.closeErr = s.leases.revokeAll(ctx)
		if s.ownsClient {
			if err := s.client.Close(); err != nil && s.closeErr == nil {
				s.closeErr = err
			}
		}
	})
	return s.closeErr
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

// dir returns the directory of key: the prefix, the key with '%' and '/'
// escaped (so that no key's directory contains another's), and "/".
func (s *Store) dir(key string) string {
	if strings.ContainsAny(key, "%/") {
		key = strings.NewReplacer("%", "%25", "/", "%2F").Replace(key)
	}
	return s.prefix + key + "/"
}

// holderKey is key's holder key, and queueDir the parent of its waiters.
func holderKey(dir string) string { return dir + "holder" }
func queueDir(dir string) string  { return dir + "q/" }

// holderValue is the value of a holder key: the token, a NUL byte, and the
// TTL in milliseconds (which refusals report as Wait).
func holderValue(token string, ttl time.Duration) string { return token + "\x00" + millis(ttl) }

// holderToken and holderTTL read a holderValue.
func holderToken(v []byte) string {
	tok, _, _ := strings.Cut(string(v), "\x00")
	return tok
}

func holderTTL(v []byte) time.Duration {
	_, ttl, _ := strings.Cut(string(v), "\x00")
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

// parseMillis reads a value of millis; zero when it is not one.
func parseMillis(v []byte) time.Duration {
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(n) * time.Millisecond
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

// checkKeys refuses more keys than MaxKeys.
func checkCount(keys []string) error {
	if len(keys) > MaxKeys {
		return fmt.Errorf("%w: etcdstore: %d keys in one call, at most %d", stores.ErrInvalid, len(keys), MaxKeys)
	}
	return nil
}

// Acquire sets every key to token for at least ttl when none is held by
// another token, in one transaction (see stores.Store): it compares, per
// key, that its holder key does not exist, and then puts token's holder
// key on a shared lease of ttl. A retry finds keys holding its own token
// and puts them again, with a fresh fence and lease, in a second
// transaction that compares they are unchanged. A refusal names the first key
// held by another token and, as Wait, the TTL that holder was given (an
// upper bound of what it has left). It returns an error wrapping
// stores.ErrInvalid for invalid arguments or more than MaxKeys keys, and
// ctx.Err() without acting when ctx has ended.
func (s *Store) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return stores.Grant{}, err
	}
	if err := errors.Join(checkToken(token), checkCount(keys)); err != nil {
		return stores.Grant{}, err
	}
	var g stores.Grant
	err := s.detached(ctx, func(ctx context.Context) error {
		var err error
		g, err = s.acquire(ctx, keys, token, ttl)
		return err
	}, func(ctx context.Context) { _ = s.Release(ctx, keys, token, 0) })
	if err != nil {
		return stores.Grant{}, err
	}
	return g, nil
}

func (s *Store) acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
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
		err := s.withLease(ctx, ttl, func(lease clientv3.LeaseID) error {
			puts := make([]clientv3.Op, len(keys))
			gets := make([]clientv3.Op, len(keys))
			val := holderValue(token, ttl)
			for i, h := range holders {
				puts[i] = clientv3.OpPut(h, val, clientv3.WithLease(lease))
				gets[i] = clientv3.OpGet(h)
			}
			var err error
			resp, err = s.kv.Txn(ctx).If(conds...).Then(puts...).Else(gets...).Commit()
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
		if len(resp.Responses) != len(keys) {
			return stores.Grant{}, fmt.Errorf("%w: acquire answered %d ranges for %d keys", ErrUnexpectedReply, len(resp.Responses), len(keys))
		}
		for i, r := range resp.Responses {
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
	return stores.Grant{}, fmt.Errorf("etcdstore: acquire %q: the keys changed under %d attempts", keys, acquireAttempts)
}

// Release ends token's grant on every key that still holds it, in one
// transaction: it deletes the holder keys that hold token, which signals
// waiters (see NotifyRelease); with keep positive it moves them to a lease
// of keep instead, so they stay held until it passes and nothing is signalled. It
// returns an error wrapping stores.ErrNotHeld when some key did not hold
// token, after ending the grant on the others, one wrapping
// stores.ErrInvalid for invalid arguments, and ctx.Err() without acting
// when ctx has ended.
func (s *Store) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	if err := args.CheckRelease(ctx, keys); err != nil {
		return err
	}
	if err := errors.Join(checkToken(token), checkCount(keys)); err != nil {
		return err
	}
	if s.isClosed() {
		return ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var resp *clientv3.TxnResponse
	err := s.withLease(ctx, keep, func(lease clientv3.LeaseID) error {
		// One key is the transaction's condition; several each get a
		// nested transaction, so that the others are released anyway.
		var cmps []clientv3.Cmp
		ops := make([]clientv3.Op, len(keys))
		for i, k := range keys {
			h := holderKey(s.dir(k))
			ops[i] = clientv3.OpDelete(h)
			if keep > 0 {
				ops[i] = clientv3.OpPut(h, holderValue(token, keep), clientv3.WithLease(lease))
			}
			if len(keys) == 1 {
				cmps = heldBy(h, token)
			} else {
				ops[i] = clientv3.OpTxn(heldBy(h, token), []clientv3.Op{ops[i]}, nil)
			}
		}
		var err error
		resp, err = s.kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
		return err
	})
	if err != nil {
		return s.failed("release", keys, err)
	}
	var notHeld []string
	switch {
	case len(keys) == 1:
		if !resp.Succeeded {
			notHeld = keys
		}
	case len(resp.Responses) != len(keys):
		return fmt.Errorf("%w: release answered %d results for %d keys", ErrUnexpectedReply, len(resp.Responses), len(keys))
	default:
		for i, r := range resp.Responses {
			if !r.GetResponseTxn().GetSucceeded() {
				notHeld = append(notHeld, keys[i])
			}
		}
	}
	if len(notHeld) > 0 {
		return fmt.Errorf("%w: etcdstore: release: %q not held by the token", stores.ErrNotHeld, notHeld)
	}
	return nil
}

// Refresh moves every key to a lease of ttl, and sets the TTL its refusals
// report, in one transaction, when each still holds token; otherwise it
// changes nothing and returns an error wrapping stores.ErrNotHeld. It
// returns an error wrapping stores.ErrInvalid for invalid arguments, and
// ctx.Err() without acting when ctx has ended.
func (s *Store) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return err
	}
	if err := errors.Join(checkToken(token), checkCount(keys)); err != nil {
		return err
	}
	if s.isClosed() {
		return ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var resp *clientv3.TxnResponse
	err := s.withLease(ctx, ttl, func(lease clientv3.LeaseID) error {
		cmps := make([]clientv3.Cmp, 0, 2*len(keys))
		puts := make([]clientv3.Op, len(keys))
		for i, k := range keys {
			h := holderKey(s.dir(k))
			cmps = append(cmps, heldBy(h, token)...)
			puts[i] = clientv3.OpPut(h, holderValue(token, ttl), clientv3.WithLease(lease))
		}
		var err error
		resp, err = s.kv.Txn(ctx).If(cmps...).Then(puts...).Commit()
		return err
	})
	if err != nil {
		return s.failed("refresh", keys, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: etcdstore: refresh: %q not all held by the token", stores.ErrNotHeld, keys)
	}
	return nil
}
