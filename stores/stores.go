// Package stores is the contract between reqlock's Locker and the backends
// that hold its locks, as database/sql/driver is for database/sql: users of
// reqlock pass a Store to reqlock.New and never call it themselves; a store
// implements it, and proves it with the conformance suite in package
// stores/storetest.
//
// # The contract
//
// A lock is a set of keys held together under one token. Acquire takes all of
// them or none, Release and Refresh act only on keys that still hold the
// caller's token, and every grant carries a fence per key. The Locker has
// applied its key prefix to every key; keys arrive distinct and sorted. A
// store must be safe for concurrent use.
//
// Grants. Acquire sets every key to token, for at least ttl, only when no key
// is held by another token, in one atomic step as seen by every other caller
// of the store. A held key is not an error: the Grant then has OK false and
// changes nothing. A key that already holds token counts as free: a token
// serves one acquisition, so such a key was set by this very call, tried
// before (a client retry after a lost reply), and Acquire grants it again
// with a fresh fence and TTL.
//
// Owner check. Release and Refresh act on a key only while it holds token.
// They return an error wrapping ErrNotHeld when a key does not: Release after
// ending the grant on the others, Refresh having changed nothing.
//
// Fences. Each key's fence grows by at least FenceStride from one grant to
// the next, plain or fair, across expiry, release and the store's restarts
// (within the assumptions the store documents, such as a clock that does not
// step back). The Locker numbers the local holders of one grant fence,
// fence+1, ... (handoff), so the stride keeps them below the next grant's.
//
// Unknown outcomes. Any error other than ErrNotHeld and ErrInvalid is a store
// failure, after which the outcome of the call is unknown, unless it wraps
// ErrUnreachable: the call never reached the backend (a refused connection),
// so nothing changed. Every call returns
// once its context ends, by deadline or by cancellation, even while the
// backend has not answered; an acquire it leaves in flight must not leave a
// grant behind: the store releases it, owner-checked, once the call returns,
// and says so by returning an error that wraps ErrAbandoned and the
// context's error, so that the Locker does not release it a second time. A
// store may take on the same clean-up after other failures of unknown
// outcome (a connection that broke once the request was sent, which the
// server may still run after the caller's own release); it then returns an
// error wrapping ErrAbandoned and that failure.
// A store that refuses its arguments returns an error wrapping ErrInvalid
// before it acts.
//
// Bounds. A store whose backend cannot hold every key or TTL states the
// range it honours by implementing Bounded. Arguments out of that range are
// refused with ErrInvalid before the store acts: by the Locker before any
// store call, and by the store itself for callers that skip the Locker.
// They are never a store failure, and never an outage of other keys.
//
// # Optional capabilities
//
// The Locker resolves them once, in reqlock.New. A Notifier signals releases
// so waiters wake without polling; a FairStore keeps a FIFO queue of waiters
// per key for fair mode (reqlock.WithFairness); a Bounded store states the
// keys and TTLs it honours; a WaitReporter tells a releasing holder that
// another token was refused meanwhile, so that a hot key goes to other
// processes in turn without each having to poll for it often; a
// SharedStore grants one key to several holders at once; a RecordStore
// keeps idempotency records beside the locks.
//
// # Shared and limited grants
//
// A SharedStore grants a key to several tokens at once, each a holder of its
// own: with limit 0 to any number of them (shared, as readers), with limit
// N > 0 to at most N (a concurrency limit). The plain operations are
// unchanged, and the rules above hold for them as they are; these are the
// rules of the shared ones.
//
// Holders. A key is free, held exclusively (by a plain Acquire or
// AcquireFair) or held shared, by one or more holders, each admitted under
// its own limit. AcquireShared adds token as a holder, for at least ttl, in
// one atomic step, only when the key is not held exclusively, fewer than
// the caller's limit hold it (limit 0: any number), whatever limits they
// were admitted under, and no writer waits (see below). Otherwise it
// changes nothing and returns a Grant with OK false, Held 0 and Wait the
// time until the refusal may end: the exclusive holder's remaining TTL,
// the soonest expiry among the holders of a key that has limit holders or
// more, or the longest remaining window among the waiting writers. A token
// that already holds the key is granted again with a fresh fence and TTL,
// whatever the count, its limit and the writers (a retry after a lost
// reply, as in Acquire); it still counts once.
//
// Never more than limit. At no instant, as seen by every caller of the
// store, do more unexpired holders hold a key than the largest limit among
// them (none when one of them holds it under limit 0): each holder got in
// while fewer than its own limit held the key, under any interleaving of
// calls, retries, expiries and faults. So when every caller of a key uses
// one limit N, never more than N hold it; while callers change their limit
// (a rolling change), a caller under a larger limit gets in without
// waiting for the key to drain.
//
// Exclusion. While a key has a holder, it reads as held to Acquire and
// AcquireFair of every token: they are refused, with Wait the longest
// remaining TTL among the holders. A key held exclusively refuses
// AcquireShared. Release and Refresh of a holder's token answer ErrNotHeld,
// and so do ReleaseShared and RefreshShared of an exclusive holder's token:
// each kind of grant is let go and renewed by its own operations.
//
// Writer preference. An Acquire or AcquireFair of a token refused a key
// because it had holders records that token as a waiting writer on the key,
// a record of its own that lasts WriterWindow from the token's last such
// refusal, and sets Grant.SharedHeld. While an unexpired writer record of
// any token stands on a key, AcquireShared refuses tokens that do not hold
// the key yet, so that the holders drain and the writers get the key. A
// record ends at an exclusive grant of the key to its token (the records of
// other tokens stay), at its expiry, and when its writer withdraws it: a
// Release of the key by a token that has a writer record on it but does not
// hold it removes the record, and still returns an error wrapping
// ErrNotHeld (the token holds nothing). A refusal by an exclusive holder
// records nothing. The Locker withdraws the record of a writer that stops
// trying (its wait ended, a try-once refused, a cancellation), so that new
// holders come in at once rather than after WriterWindow.
//
// Expiry per holder. Each holder keeps its place for its own TTL: a holder
// that dies frees its place when its TTL has passed, whatever the TTLs of
// the others, and a RefreshShared renews its own TTL alone (with the rule of
// Refresh for a late call: never shorter than a later successful one gave).
//
// Owner check. ReleaseShared and RefreshShared act on token's place alone,
// and only while token holds the key; else they return an error wrapping
// ErrNotHeld and change nothing. ReleaseShared with keep positive leaves the
// place held until keep has passed (a hold-at-least release), else frees it
// and signals the key's waiters (see Notifier): a Notifier store signals
// every freed place, by release or expiry, as it does a released key.
//
// Fences. Exclusive and shared grants of a key draw their fences from one
// sequence, which grows by at least FenceStride per grant of either kind.
// So an exclusive grant's fence is above the fence of every earlier grant of
// the key, shared ones included, and a shared grant's fence is above every
// earlier exclusive grant's: a resource that remembers the highest fence it
// saw refuses a stale writer, and a reader's fence tells which writers'
// grants came before it. Shared fences do not order holders of one time
// among themselves beyond their grant order.
//
// Unknown outcomes and bounds. AcquireShared follows Acquire's rules: it
// returns once its context ends, an acquire it leaves in flight leaves no
// place behind (the store gives it up, owner-checked, and returns an error
// wrapping ErrAbandoned; after any other failure the caller releases it
// with ReleaseShared), and arguments out of Bounds or a negative limit are
// refused with ErrInvalid before the store acts.
//
// # Idempotency records
//
// A RecordStore keeps, beside the locks, the recorded answers of finished
// requests (for Idempotency-Key): one record key goes from free to claimed
// (a lock of one token) to finished (a record, for its retention) and back to
// free. The Locker keeps record keys apart from its lock keys (they have a
// prefix of their own); on a record key it calls ClaimRecord, FinishRecord,
// and Release, ReleaseWaited, Refresh and NotifyRelease for the claim. What
// the other operations do on a key that holds a record is up to the store.
//
// Claims. ClaimRecord is Acquire of its single key, with Acquire's rules
// (one atomic step, a fence that follows the fence rules, a key held by
// another token refused with Wait its holder's remaining TTL, a key that
// already holds token granted again with a fresh fence and TTL), unless the
// key holds a finished record: then it claims nothing and returns a copy of
// the record with a Grant whose OK is false (Wait zero). A claim is a lock:
// Release and Refresh of the Store end and extend it (Release of a claim
// leaves no record), and its expiry frees the key. A Notifier store signals
// the key's waiters on the release or expiry of a claim, as for any lock.
//
// Finishing. FinishRecord replaces token's claim on its key by a record, in
// one atomic step, and signals the key's waiters as a Release does, so that
// a waiter refused by the claim claims again and reads the record. It acts
// only while the key holds token's claim; otherwise (the claim expired, was
// released, or the key is another token's) it changes nothing and returns an
// error wrapping ErrNotHeld. A key that already holds the record token
// finished (a client retry after a lost reply) answers nil and changes
// nothing: a record is never written twice.
//
// Retention. A record is kept for at least its retention from FinishRecord
// (a store may keep it longer, up to its granularity, and says so); within
// it, the record is never replaced: ClaimRecord returns it, FinishRecord of
// any other token answers ErrNotHeld, and Release and Refresh of any token
// answer ErrNotHeld and leave it as it is. Once the retention has passed the
// store removes it by its own means (a TTL, an expiry, a purge), so that
// records do not grow without bound, and the key is free again.
//
// Contents. Fingerprint and Response are opaque bytes, kept and returned byte
// for byte (any bytes, not only UTF-8). Fence is the fence of the claim the
// record finished: the caller sets it to the fence ClaimRecord granted, and
// the store keeps it as given. A record's size is Record.Size; a Bounded
// store states the largest size and the longest retention it keeps
// (Bounds.MaxRecordBytes, Bounds.MaxRetention), and FinishRecord refuses a
// record or retention out of them with ErrInvalid before it acts.
//
// Unknown outcomes. ClaimRecord follows Acquire's rules: it returns once its
// context ends, and a claim it leaves in flight leaves no claim behind (the
// store releases it, owner-checked, and returns an error wrapping
// ErrAbandoned); after any other failure the caller releases the claim. A
// FinishRecord that fails with an unknown outcome leaves either the record or
// the claim, never both nor two records; the caller may then Release the
// claim, which answers ErrNotHeld when the record stands (and leaves it), and
// a FinishRecord that lands after that Release, or after another token's
// claim, changes nothing.
package stores

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// FenceStride is the least step between the fences of two successive grants
// of one key. The Locker hands one grant to at most FenceStride-1 local
// holders in turn, numbering their fences from the grant's.
const FenceStride = 1024

// Errors a Store returns for the Locker to tell apart. The root package
// reqlock exports the same values as reqlock.ErrNotHeld and
// reqlock.ErrInvalid.
var (
	// ErrNotHeld means a key no longer holds the caller's token: the lock
	// expired, was taken over or was released.
	ErrNotHeld = errors.New("reqlock: lock not held")

	// ErrInvalid means an argument is invalid, such as an empty key, a
	// non-positive TTL, or keys a store cannot lock together. A store
	// returns it before acting.
	ErrInvalid = errors.New("reqlock: invalid argument")

	// ErrUnreachable marks a store failure of a call that never reached
	// the backend, such as a refused connection: unlike other failures,
	// its outcome is known, and there is nothing to clean up.
	ErrUnreachable = errors.New("reqlock: store unreachable")

	// ErrAbandoned marks the failure of a call that the store left in
	// flight when its context ended: the store cleans up after the call
	// itself, once the backend answers (see the package documentation).
	ErrAbandoned = errors.New("reqlock: store call abandoned when its context ended")

	// ErrUnknownOption marks an Open error for a URL parameter the store
	// does not know. Such an error also wraps ErrInvalid, and names the
	// store, the parameter and the ones the store knows.
	ErrUnknownOption = errors.New("reqlock: unknown URL option")
)

// Store holds locks. See the package documentation for the contract every
// method keeps.
type Store interface {
	// Acquire sets every key to token for at least ttl when none is held
	// by another token, and issues each key its fence, all in one atomic
	// step; otherwise it changes nothing and returns a Grant with OK false.
	Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (Grant, error)

	// Release ends token's grant on every key that still holds it: it
	// deletes the key and signals its waiters (see Notifier), or, with
	// keep positive, leaves the key held until keep has passed and
	// signals nothing (a hold-at-least release). It returns an error
	// wrapping ErrNotHeld when some key did not hold token, after ending
	// the grant on the others. On a SharedStore it also withdraws token's
	// waiting-writer record on each key (see the package documentation).
	Release(ctx context.Context, keys []string, token string, keep time.Duration) error

	// Refresh resets the TTL of every key to ttl when each still holds
	// token; when one does not, it changes nothing and returns an error
	// wrapping ErrNotHeld. The TTL counts from when the backend applies
	// the call, or later: a Refresh that lands late, after a later Refresh
	// of the same token succeeded, must not leave the keys a shorter TTL
	// than that later one gave them (the Locker trusts the later one).
	Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error
}

// Grant is the outcome of one Acquire or AcquireFair.
type Grant struct {
	// OK reports whether every key was granted.
	OK bool

	// Fences holds the fence of each key, in the order of the keys asked
	// for. Nil when OK is false.
	Fences []int64

	// Held is, when OK is false, the index of a key held by another token.
	Held int

	// Wait is, when OK is false, how long the refusal is expected to
	// stand: the remaining TTL of that key's holder or, in fair mode, of
	// the lease of the waiter ahead; zero when unknown. Waiters cap their
	// sleep by it.
	Wait time.Duration

	// SharedHeld is, when an Acquire or AcquireFair of a SharedStore is
	// refused, whether the refusal was by holders of a shared key, so that
	// the store recorded the caller as a waiting writer (see the package
	// documentation): the Locker then withdraws the record, with Release,
	// when its wait ends without a grant. Other stores leave it false.
	SharedHeld bool
}

// Notifier is implemented by stores that signal releases, so that a waiter
// wakes as soon as the holder lets go instead of polling.
type Notifier interface {
	// NotifyRelease registers interest in the releases of key until stop
	// is called; stop must be called. token is the waiter's: a store that
	// queues waiters in order may signal only the waiter whose turn came.
	// The channel receives after each release; sends never block, so
	// several releases may arrive as one signal. Signals can be lost (a
	// dropped connection) or spurious, so waiters still poll as a
	// fallback. A nil channel means the store cannot notify right now.
	// A store may leave unsignalled a release of a key that no caller was
	// refused (by Acquire or AcquireFair) while the grant stood, and may
	// forget a refusal once the holder's remaining TTL it answered (Wait)
	// has passed by some margin: a waiter subscribes after a refusal and
	// tries again within Wait, so nobody waits for such a release, and an
	// uncontended lock pays for no signal.
	NotifyRelease(key, token string) (released <-chan struct{}, stop func())
}

// WaitReporter is implemented by stores that remember, per grant, whether
// another token was refused one of its keys. The Locker of a process that
// passes a hot key among its own requests gives it back to the store, and
// holds back long enough for other processes' waiters to take it even by
// polling, when the store reports that one was refused (see
// reqlock.WithHandoff). Without a report, the Locker relies on release
// signals (Notifier) to bring those waiters in during a short head start,
// or, on a store without either, on its own refusals.
type WaitReporter interface {
	// ReleaseWaited is Release, and also reports whether an Acquire (or
	// AcquireFair) of another token was refused one of keys while token's
	// grant stood. The report serves fairness, never safety: it may be
	// spurious, or miss a refusal whose record was lost; it is false
	// with an error, whatever the outcome.
	ReleaseWaited(ctx context.Context, keys []string, token string, keep time.Duration) (waited bool, err error)
}

// FairStore is implemented by stores that keep a FIFO queue of waiters per
// key, for fair mode (see reqlock.WithFairness).
type FairStore interface {
	// AcquireFair is one attempt of a fair waiter, in one atomic step: it
	// drops waiters whose lease has passed, queues token at the tail when
	// it is not queued yet, renews token's lease to lease from now, and
	// sets key to token for at least ttl only when key is free and token
	// heads the queue (or the queue is empty). A grant takes token out of
	// the queue; its fence follows the same rules as Acquire's, so fences
	// grow across fair and plain grants. With lease zero the call only
	// tries: token does not join the queue, and the grant needs a free key
	// and an empty queue. A key that already holds token is granted again,
	// as in Acquire.
	AcquireFair(ctx context.Context, key, token string, ttl, lease time.Duration) (FairGrant, error)

	// LeaveFair takes token out of key's queue; a token not queued is not
	// an error. When token headed the queue and key is free, the waiters
	// are signalled as if key had been released.
	LeaveFair(ctx context.Context, key, token string) error
}

// FairGrant is the outcome of one AcquireFair.
type FairGrant struct {
	Grant

	// Ahead is, on a refusal, how many waiters are queued ahead of the
	// token: zero when it heads the queue, -1 when it is not queued.
	Ahead int
}

// WriterWindow is how long a refusal of an exclusive Acquire by a key's
// shared holders keeps new holders out of the key, unless its token is
// granted the key or withdraws (see the package documentation). A waiting
// writer retries within it: the Locker caps the sleeps of its exclusive
// waiters on a SharedStore at half of it.
const WriterWindow = time.Second

// SharedStore is implemented by stores that grant a key to several holders
// at once: any number (limit 0, shared) or at most limit. See the package
// documentation for the rules every method keeps.
type SharedStore interface {
	// AcquireShared makes token a holder of key for at least ttl when the
	// key is not held exclusively, fewer than limit (limit 0: any number)
	// hold it under whatever limits, and no writer waits;
	// otherwise it changes nothing and returns a Grant with OK false. A
	// granted Grant has one fence.
	AcquireShared(ctx context.Context, key, token string, limit int, ttl time.Duration) (Grant, error)

	// ReleaseShared ends token's place among key's holders: it frees it
	// and signals the key's waiters, or, with keep positive, leaves it
	// held until keep has passed. It returns an error wrapping ErrNotHeld
	// when token does not hold key.
	ReleaseShared(ctx context.Context, key, token string, keep time.Duration) error

	// RefreshShared resets the TTL of token's place among key's holders to
	// ttl; when token does not hold key, it changes nothing and returns
	// an error wrapping ErrNotHeld.
	RefreshShared(ctx context.Context, key, token string, ttl time.Duration) error
}

// RecordStore is implemented by stores that keep idempotency records beside
// the locks. See Idempotency records in the package documentation for the
// rules every method keeps.
type RecordStore interface {
	// ClaimRecord is Acquire of the single key for token (ttl, fence;
	// Release and Refresh of the Store end and extend the claim; a key
	// already claimed by token is granted again, as in Acquire), unless
	// key holds a finished record: then it claims nothing and returns a
	// copy of the record, with a Grant whose OK is false.
	ClaimRecord(ctx context.Context, key, token string, ttl time.Duration) (Grant, *Record, error)

	// FinishRecord replaces token's claim on key by rec, kept for
	// retention, and signals the key's waiters as a Release does. It
	// returns an error wrapping ErrNotHeld, changing nothing, when token
	// does not hold the claim (it expired, was released, or is another's),
	// and nil, changing nothing, when key already holds the record token
	// finished. A record or retention out of the store's Bounds is refused
	// with ErrInvalid before the store acts.
	FinishRecord(ctx context.Context, key, token string, rec Record, retention time.Duration) error
}

// Record is a finished request's recorded answer.
type Record struct {
	// Fingerprint identifies the request that the record answers; opaque
	// to the store.
	Fingerprint string

	// Response is the recorded answer, in the caller's encoding; opaque
	// to the store.
	Response []byte

	// Fence is the fence of the claim the record finished, as the caller
	// set it.
	Fence int64
}

// Size is the size of r that Bounds.MaxRecordBytes bounds: the bytes of its
// fingerprint and response.
func (r Record) Size() int { return len(r.Fingerprint) + len(r.Response) }

// Bounds are the keys and durations a store honours. The zero value is no
// bound at all.
type Bounds struct {
	// MaxKeyBytes is the length in bytes of the longest key the store
	// accepts, the Locker's key prefix included; zero means no limit. A
	// call whose keys together exceed what the backend takes in one
	// request is refused with ErrInvalid too.
	MaxKeyBytes int

	// MinTTL and MaxTTL bound every duration the store is asked to keep
	// something for: the ttl of Acquire, Refresh and AcquireFair, a
	// positive keep of Release and a fair lease. Zero MaxTTL means no
	// upper bound. Within the range, the store keeps a key for at least
	// the duration asked (a store may keep it longer, such as up to a
	// lease granularity, and says so in its documentation); a grant's
	// validity never outlives what the backend keeps.
	MinTTL, MaxTTL time.Duration

	// MaxRecordBytes is the largest Record.Size a RecordStore keeps; zero
	// means no limit.
	MaxRecordBytes int

	// MaxRetention is the longest retention of a record a RecordStore
	// keeps; zero means no upper bound. A retention is also at least
	// MinTTL.
	MaxRetention time.Duration

	// Reason says what sets the bounds, for the messages that refuse an
	// argument or a route, such as "the ZooKeeper session timeout
	// (session=10s)".
	Reason string
}

// CheckTTL returns an error wrapping ErrInvalid, naming the range and
// b.Reason, when d is out of b's TTL range.
func (b Bounds) CheckTTL(what string, d time.Duration) error {
	if d >= max(b.MinTTL, 1) && (b.MaxTTL == 0 || d <= b.MaxTTL) {
		return nil
	}
	return fmt.Errorf("%w: %s %v is out of the store's range %s", ErrInvalid, what, d, b.ttlRange())
}

// CheckKey returns an error wrapping ErrInvalid when key is longer than
// b.MaxKeyBytes. The message gives the key's length and a short prefix of
// it, never the whole key.
func (b Bounds) CheckKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", ErrInvalid)
	case b.MaxKeyBytes > 0 && len(key) > b.MaxKeyBytes:
		return fmt.Errorf("%w: key %s of %d bytes is longer than the store's limit of %d bytes%s",
			ErrInvalid, KeyForMessage(key), len(key), b.MaxKeyBytes, b.because())
	}
	return nil
}

// CheckRecord returns an error wrapping ErrInvalid, naming the limit and
// b.Reason, when rec is larger than b.MaxRecordBytes or retention is out of
// the range [max(b.MinTTL, 1ns), b.MaxRetention].
func (b Bounds) CheckRecord(rec Record, retention time.Duration) error {
	if b.MaxRecordBytes > 0 && rec.Size() > b.MaxRecordBytes {
		return fmt.Errorf("%w: record of %d bytes is larger than the store's limit of %d bytes%s",
			ErrInvalid, rec.Size(), b.MaxRecordBytes, b.because())
	}
	if retention >= max(b.MinTTL, 1) && (b.MaxRetention == 0 || retention <= b.MaxRetention) {
		return nil
	}
	hi := "no upper bound"
	if b.MaxRetention > 0 {
		hi = b.MaxRetention.String()
	}
	return fmt.Errorf("%w: retention %v is out of the store's range [%v, %s]%s",
		ErrInvalid, retention, max(b.MinTTL, 1), hi, b.because())
}

// KeyForMessage returns key quoted for an error message or a log line:
// whole when short, otherwise its first 64 bytes followed by "...".
func KeyForMessage(key string) string {
	const maxShown = 64
	if len(key) <= maxShown {
		return fmt.Sprintf("%q", key)
	}
	cut := maxShown
	for cut > maxShown-utf8.UTFMax && !utf8.RuneStart(key[cut]) {
		cut-- // not in the middle of a character
	}
	return fmt.Sprintf("%q...", key[:cut])
}

// ttlRange describes b's TTL range, with its reason.
func (b Bounds) ttlRange() string {
	hi := "no upper bound"
	if b.MaxTTL > 0 {
		hi = b.MaxTTL.String()
	}
	return fmt.Sprintf("[%v, %s]%s", max(b.MinTTL, 1), hi, b.because())
}

func (b Bounds) because() string {
	if b.Reason == "" {
		return ""
	}
	return ", set by " + b.Reason
}

// Bounded is implemented by stores that honour a bounded range of keys or
// TTLs. The Locker resolves it once, in reqlock.New; a Store that does not
// implement it promises every non-empty key and every positive duration.
type Bounded interface {
	// Bounds returns the range the store honours. It is fixed for the
	// store's lifetime.
	Bounds() Bounds
}
