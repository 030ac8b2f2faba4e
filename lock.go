package reqlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Lock is a granted lock. Its methods are safe for concurrent use.
type Lock struct {
	locker   *Locker
	key      string
	storeKey string
	token    string
	fence    int64
	ttl      time.Duration

	queue   *keyQueue // the key's local queue
	turnGen uint64    // this lock's turn in queue
	chain   *chain    // the store grant, shared along local handoffs

	mu         sync.Mutex
	validUntil time.Time
	released   bool
	notHeld    bool // a refresh or the watchdog found the grant gone

	keepAlive keepAlive // the watchdog KeepAlive starts; see watchdog.go
}

// Key returns the key as the caller named it, without the Locker's prefix.
func (l *Lock) Key() string { return l.key }

// StoreKey returns the key as stored: the Locker's prefix followed by Key.
func (l *Lock) StoreKey() string { return l.storeKey }

// Token returns the random 128-bit token that identifies this grant.
func (l *Lock) Token() string { return l.token }

// Fence returns the fencing token of this grant: larger than every fence
// issued for the same key before. Pass it with each write to the protected
// resource, and have the resource reject a write whose fence is lower than
// one it already accepted.
func (l *Lock) Fence() int64 { return l.fence }

// TTL returns the lease time the lock was granted or last refreshed with.
func (l *Lock) TTL() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ttl
}

// ValidUntil returns the time until which the lock is surely held: the start
// of the attempt that obtained (or last refreshed) it, plus the TTL, minus a
// margin for clock drift. It says nothing once the lock is released.
func (l *Lock) ValidUntil() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.validUntil
}

// Validity returns how long the lock remains surely held, or zero once its
// validity has run out or it was released.
func (l *Lock) Validity() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return 0
	}
	return max(time.Until(l.validUntil), 0)
}

// Refresh resets the lock's TTL to ttl, or to its current TTL when ttl is
// zero, if the key still holds this lock's token.
//
// Errors: ErrNotHeld when the lock expired, was taken over or was released;
// ErrStore when the store failed; ErrInvalid for a negative ttl.
func (l *Lock) Refresh(ctx context.Context, ttl time.Duration) error {
	if ttl < 0 {
		return fmt.Errorf("%w: ttl %v is negative", ErrInvalid, ttl)
	}
	l.mu.Lock()
	released := l.released
	if ttl == 0 {
		ttl = l.ttl
	}
	l.mu.Unlock()
	if released {
		return fmt.Errorf("%w: %q was released", ErrNotHeld, l.key)
	}
	start := time.Now()
	if err := l.locker.store.Refresh(ctx, l.storeKey, l.token, ttl); err != nil {
		if isNotHeld(err) {
			l.markNotHeld()
			return err
		}
		return wrapStoreError(err)
	}
	validUntil := start.Add(ttl - clockDrift(ttl))
	l.mu.Lock()
	l.ttl = ttl
	l.validUntil = validUntil
	l.mu.Unlock()
	if l.queue != nil {
		l.locker.local.setLease(l.queue, l.turnGen, validUntil)
	}
	return nil
}

// Release lets go of the lock. When another request of this process waits
// for the key and the Locker's handoff bounds allow, the still-held grant
// passes to it without a store round trip; otherwise the lock is deleted in
// the store if the key still holds this lock's token. The store call runs on
// a context that ctx's cancellation cannot end, bounded by the Locker's
// release timeout, so a cancelled request still releases its lock.
//
// Release first stops the lock's watchdog (see KeepAlive), if any, and waits
// until it has finished; the keep-alive context then ends.
//
// Errors: ErrNotHeld when the lock had expired, was taken over or was
// already released; ErrStore when the store failed (the lock then expires
// with its TTL).
func (l *Lock) Release(ctx context.Context) error {
	l.stopWatchdog()
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return fmt.Errorf("%w: %q was already released", ErrNotHeld, l.key)
	}
	l.released = true
	validUntil, notHeld := l.validUntil, l.notHeld
	l.mu.Unlock()
	return l.locker.releaseLock(ctx, l, validUntil, notHeld)
}

func isNotHeld(err error) bool { return err != nil && errors.Is(err, ErrNotHeld) }

type lockContextKey struct{}

// NewContext returns a copy of ctx that carries lock.
func NewContext(ctx context.Context, lock *Lock) context.Context {
	return context.WithValue(ctx, lockContextKey{}, lock)
}

// FromContext returns the lock that ctx carries, if any. A handler behind the
// lock middleware finds its lock here.
func FromContext(ctx context.Context) (*Lock, bool) {
	lock, ok := ctx.Value(lockContextKey{}).(*Lock)
	return lock, ok && lock != nil
}

// Released reports whether Release was called on the lock.
func (l *Lock) Released() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.released
}

// markNotHeld records that the store no longer holds this grant, so that
// Release never hands it to a local waiter.
func (l *Lock) markNotHeld() {
	l.mu.Lock()
	l.notHeld = true
	l.mu.Unlock()
}
