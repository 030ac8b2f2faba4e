package reqlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Lock is a granted lock on one or several keys. Its methods are safe for
// concurrent use.
//
// A lock holds its keys through grants of the store: normally the one grant
// it obtained; when it was obtained within a request that already held some
// of its keys (see Locker.ObtainAll on reentrancy), also holds on the grants
// of those locks. Releasing the lock ends its holds, and each grant is
// released in the store when its last hold ends.
type Lock struct {
	locker   *Locker
	keys     []string // sorted, without the Locker's prefix
	fences   []int64  // the fence of each key
	holds    []hold   // the grants behind the keys: its own first, then shared ones
	label    string   // the metrics label of the Obtain that made it
	mu       sync.Mutex
	released bool
	life     lifetime // the contexts that end with the lock, and its watchdog
}

// hold is a lock's hold on a grant, as the holder of one epoch.
type hold struct {
	g     *grant
	epoch int
}

// keyLock is a lock of one key with the storage of its slices, so that it
// takes one allocation, or none beside its grant (see grant.first).
type keyLock struct {
	lock  Lock
	key   [1]string
	fence [1]int64
	hold  [1]hold
}

// init makes k.lock the lock on key, held through h.
func (k *keyLock) init(l *Locker, label, key string, h hold) *Lock {
	k.key[0], k.hold[0] = key, h
	lock := &k.lock
	lock.keys, lock.fences, lock.holds = k.key[:], k.fence[:], k.hold[:]
	lock.locker, lock.label = l, label
	lock.fences[0], _ = h.g.fenceOf(l.prefix+key, h.epoch)
	return lock
}

// newKeyLock returns the lock on key held through h, a grant acquired for
// it alone. A grant fresh from the store (epoch 0) holds the storage of its
// first lock, so that the request's grant and lock are one allocation.
func (l *Locker) newKeyLock(label, key string, h hold) *Lock {
	if h.epoch == 0 {
		return h.g.first.init(l, label, key, h)
	}
	return new(keyLock).init(l, label, key, h)
}

// newLock returns the lock on keys (sorted, without the prefix; copied)
// held through holds.
func (l *Locker) newLock(label string, keys []string, holds []hold) *Lock {
	if len(keys) == 1 && len(holds) == 1 {
		return new(keyLock).init(l, label, keys[0], holds[0])
	}
	// A copy, so that the caller's keys never escape: Obtain's slice of one
	// key stays on its stack.
	lock := &Lock{keys: slices.Clone(keys), fences: make([]int64, len(keys)), holds: holds}
	lock.locker, lock.label = l, label
	for i, k := range keys {
		lock.fences[i], _ = lock.holdOf(l.prefix + k)
	}
	return lock
}

// holdOf returns the fence of storeKey and the hold that holds it.
func (l *Lock) holdOf(storeKey string) (int64, hold) {
	for _, h := range l.holds {
		if f, ok := h.g.fenceOf(storeKey, h.epoch); ok {
			return f, h
		}
	}
	return 0, hold{}
}

// Key returns the first of Keys.
func (l *Lock) Key() string { return l.keys[0] }

// Keys returns the lock's keys, without the Locker's prefix, sorted.
func (l *Lock) Keys() []string { return slices.Clone(l.keys) }

// Token returns the random 128-bit token of the grant that holds Key.
func (l *Lock) Token() string {
	_, h := l.holdOf(l.locker.prefix + l.keys[0])
	return h.g.token
}

// Fence returns the fencing token of Key: larger than every fence issued for
// the key before. Pass it with each write to the protected resource, and
// have the resource reject a write whose fence is lower than one it already
// accepted. FenceOf gives each key's.
func (l *Lock) Fence() int64 { return l.fences[0] }

// FenceOf returns the fencing token of key (as in Keys), and false when the
// lock does not hold key.
func (l *Lock) FenceOf(key string) (int64, bool) {
	if i, ok := slices.BinarySearch(l.keys, key); ok {
		return l.fences[i], true
	}
	return 0, false
}

// TTL returns the lease time the lock was granted or last refreshed with;
// for a lock on several grants, the shortest.
func (l *Lock) TTL() time.Duration {
	var ttl time.Duration
	for i, h := range l.holds {
		if t := h.g.holderTTL(); i == 0 || t < ttl {
			ttl = t
		}
	}
	return ttl
}

// trustedTTL is the shortest validity a renewal of the lock confirms (see
// grant.trustedTTL).
func (l *Lock) trustedTTL() time.Duration {
	var ttl time.Duration
	for i, h := range l.holds {
		if t := h.g.trustedTTL(); i == 0 || t < ttl {
			ttl = t
		}
	}
	return ttl
}

// ValidUntil returns the time until which the lock is surely held: the start
// of the store call that set its TTL (the acquire, or the last renewal that
// succeeded) plus that TTL, minus a margin for clock drift. After a renewal
// whose outcome is unknown it is the earlier of the two possible ends. It
// says nothing once the lock is released.
func (l *Lock) ValidUntil() time.Time {
	var until time.Time
	for i, h := range l.holds {
		if t := h.g.ValidUntil(); i == 0 || t.Before(until) {
			until = t
		}
	}
	return until
}

// Refresh resets the lock's TTL to ttl, or to its current TTL when ttl is
// zero, if its keys still hold the lock's token. A refresh whose outcome is
// unknown (ErrStore) leaves the lock's validity at the earlier of the two
// possible ends, and the lock is not handed on nor re-entered until a
// refresh succeeds.
//
// Errors: ErrNotHeld when the lock expired, was taken over or was released
// (then the lock is lost: its contexts end with ErrLockLost); ErrStore when
// the store failed; ErrInvalid for a negative ttl or one out of the
// store's bounds (see Locker.CheckTTL).
func (l *Lock) Refresh(ctx context.Context, ttl time.Duration) error {
	if ttl < 0 {
		return fmt.Errorf("%w: ttl %v is negative", ErrInvalid, ttl)
	}
	if ttl > 0 {
		if err := l.locker.CheckTTL(ttl); err != nil {
			return err
		}
	}
	if l.Released() {
		return fmt.Errorf("%w: %q was released", ErrNotHeld, l.keys[0])
	}
	var errs []error
	for _, h := range l.holds {
		if err := h.g.refresh(ctx, h.epoch, ttl); err != nil {
			errs = append(errs, err)
		}
	}
	err := errors.Join(errs...)
	l.life.refreshed(l, err)
	return err
}

// Release lets go of the lock. When another request of this process waits
// for its key and the Locker's handoff bounds allow, the still-held grant
// passes to it without a store round trip; otherwise the keys are deleted in
// the store if they still hold the lock's token. The store call runs on a
// context that ctx's cancellation cannot end, bounded by the Locker's
// release timeout, so a cancelled request still releases its lock. A grant
// that reentrant locks still hold is released when the last of them is.
//
// Release first stops the lock's watchdog (see KeepAlive), if any, and waits
// until it has finished; the lock's contexts then end.
//
// With HoldAtLeast, a release sooner than that leaves the keys locked until
// the time is up: their TTL is shortened to what remains, and no local
// waiter gets them sooner.
//
// Errors: ErrNotHeld when the lock had expired, was taken over or was
// already released; ErrStore when the store failed, or ErrStoreDown when
// the breaker counts the store down and the store was not called: the
// Locker then retries the release in the background until the keys are
// free or expire (see WithPendingReleases), and the local waiters for the
// keys answer the store error at once.
func (l *Lock) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return fmt.Errorf("%w: %q was already released", ErrNotHeld, l.keys[0])
	}
	l.released = true
	l.mu.Unlock()
	l.endLife(errReleased)
	var errs []error
	for _, h := range l.holds {
		if err := h.g.drop(ctx, h.epoch); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Released reports whether Release was called on the lock. Its keys may
// still be locked: by a reentrant lock, or for HoldAtLeast.
func (l *Lock) Released() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.released
}

// HoldAtLeast makes the keys stay locked for at least d after the lock was
// granted, even when it is released sooner: Release then shortens the keys'
// TTL to what remains of d instead of deleting them, and no local waiter
// gets them sooner. It guards against a double submit: a second request for
// the same key within d finds it held. Of several calls the longest wins; d
// of zero or less changes nothing. Call it before Release. The keys are kept
// at most the store's MaxTTL after the release (see Locker.Bounds), and at
// least its MinTTL.
func (l *Lock) HoldAtLeast(d time.Duration) {
	for _, h := range l.holds {
		h.g.holdAtLeast(h.epoch, d)
	}
}

// errReleased is the cause with which a lock's contexts end at its release.
var errReleased = fmt.Errorf("%w: the lock was released", ErrNotHeld)
