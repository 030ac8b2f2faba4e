package reqlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Lock is a granted lock on one key, or on several keys held together (see
// Locker.ObtainAll). Its methods are safe for concurrent use.
//
// A Lock obtained again within the same request (see Locker.Obtain on
// reentrancy) is a view of the locks that hold its keys: releasing the view
// ends its holds, and each key is released in the store when its outermost
// hold ends.
type Lock struct {
	locker   *Locker
	key      string
	storeKey string
	token    string
	fence    int64
	ttl      time.Duration
	label    string    // the Metrics label of the Obtain that made it
	start    time.Time // when the attempt that granted it began

	multi *multiKeys // several keys granted together; nil for one key
	view  *view      // set on a reentrant view; see reentry.go

	queue   *keyQueue // the key's local queue
	turnGen uint64    // this lock's turn in queue
	chain   *chain    // the store grant, shared along local handoffs

	mu         sync.Mutex
	validUntil time.Time
	released   bool                      // Release was called
	views      int                       // live reentrant views holding this lock
	final      bool                      // released in the store (or handed on)
	minHold    time.Duration             // see HoldAtLeast
	notHeld    bool                      // a refresh or the watchdog found the grant gone
	viewEnds   []context.CancelCauseFunc // a view's keep-alive contexts; its Release ends them

	keepAlive keepAlive // the watchdog KeepAlive starts; see watchdog.go
}

// Key returns the key as the caller named it, without the Locker's prefix.
// On a lock of several keys it returns the first of Keys.
func (l *Lock) Key() string { return l.key }

// Keys returns the lock's keys, without the Locker's prefix, sorted.
func (l *Lock) Keys() []string {
	switch {
	case l.view != nil:
		return append([]string(nil), l.view.keys...)
	case l.multi != nil:
		return append([]string(nil), l.multi.keys...)
	}
	return []string{l.key}
}

// StoreKey returns the key as stored: the Locker's prefix followed by Key.
func (l *Lock) StoreKey() string { return l.storeKey }

// Token returns the random 128-bit token that identifies this grant.
func (l *Lock) Token() string { return l.token }

// Fence returns the fencing token of this grant: larger than every fence
// issued for the same key before. Pass it with each write to the protected
// resource, and have the resource reject a write whose fence is lower than
// one it already accepted. On a lock of several keys it is the fence of Key;
// FenceOf gives each key's.
func (l *Lock) Fence() int64 { return l.fence }

// FenceOf returns the fencing token of key (as in Keys), and false when the
// lock does not hold key.
func (l *Lock) FenceOf(key string) (int64, bool) {
	switch {
	case l.view != nil:
		return l.view.fenceOf(key)
	case l.multi != nil:
		return l.multi.fenceOf(key)
	case key == l.key:
		return l.fence, true
	}
	return 0, false
}

// TTL returns the lease time the lock was granted or last refreshed with.
func (l *Lock) TTL() time.Duration {
	if l.view != nil {
		return l.view.ttl()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ttl
}

// ValidUntil returns the time until which the lock is surely held: the start
// of the attempt that obtained (or last refreshed) it, plus the TTL, minus a
// margin for clock drift. It says nothing once the lock is released.
func (l *Lock) ValidUntil() time.Time {
	if l.view != nil {
		return l.view.validUntil()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.validUntil
}

// Validity returns how long the lock remains surely held, or zero once its
// validity has run out or it was released.
func (l *Lock) Validity() time.Duration {
	if l.view != nil {
		if l.Released() {
			return 0
		}
		return max(time.Until(l.view.validUntil()), 0)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.final {
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
	if l.view != nil {
		if l.Released() {
			return fmt.Errorf("%w: %q was released", ErrNotHeld, l.key)
		}
		return l.view.refresh(ctx, ttl)
	}
	l.mu.Lock()
	final := l.final
	if ttl == 0 {
		ttl = l.ttl
	}
	l.mu.Unlock()
	if final {
		return fmt.Errorf("%w: %q was released", ErrNotHeld, l.key)
	}
	start := time.Now()
	if err := l.refreshStore(ctx, ttl); err != nil {
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

// Release lets go of the lock. On a lock that reentrant views still hold
// (see Locker.Obtain), the key stays locked until the last of them is
// released, and only that release reaches the store. When another request of this process waits
// for the key and the Locker's handoff bounds allow, the still-held grant
// passes to it without a store round trip; otherwise the lock is deleted in
// the store if the key still holds this lock's token. The store call runs on
// a context that ctx's cancellation cannot end, bounded by the Locker's
// release timeout, so a cancelled request still releases its lock.
//
// Release first stops the lock's watchdog (see KeepAlive), if any, and waits
// until it has finished; the keep-alive context then ends.
//
// With HoldAtLeast, a release sooner than that leaves the key locked until
// the time is up: its TTL is shortened to what remains, and no local waiter
// gets it sooner.
//
// Errors: ErrNotHeld when the lock had expired, was taken over or was
// already released; ErrStore when the store failed (the lock then expires
// with its TTL).
func (l *Lock) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return fmt.Errorf("%w: %q was already released", ErrNotHeld, l.key)
	}
	l.released = true
	last := l.view == nil && l.views == 0
	ends := l.viewEnds
	l.viewEnds = nil
	l.mu.Unlock()
	if l.view != nil {
		for _, end := range ends {
			end(l.releasedCause())
		}
		return l.view.release(ctx)
	}
	if !last {
		return nil // a reentrant view still holds it; its release finishes
	}
	return l.finish(ctx)
}

// finish releases the lock in the store once its own hold and every view's
// have ended.
func (l *Lock) finish(ctx context.Context) error {
	l.stopWatchdog()
	l.mu.Lock()
	if l.final {
		l.mu.Unlock()
		return nil
	}
	l.final = true
	validUntil, notHeld, minHold := l.validUntil, l.notHeld, l.minHold
	l.mu.Unlock()
	if m := l.locker.metrics; m != nil {
		m.Held(l.label, time.Since(l.start))
	}
	keep := time.Until(l.start.Add(minHold))
	if minHold <= 0 || keep <= 0 {
		keep = 0
	}
	if l.multi != nil {
		return l.locker.releaseMulti(ctx, l, keep)
	}
	return l.locker.releaseLock(ctx, l, validUntil, notHeld, keep)
}

// HoldAtLeast makes the key stay locked for at least d after the lock was
// granted (counted from the start of the attempt that obtained it, like
// ValidUntil), even when it is released sooner: Release then shortens the key's
// TTL to what remains of d instead of deleting it, and no local waiter gets
// the key sooner. It guards against a double submit: a second request for
// the same key within d finds it held. Of several calls the longest wins;
// d of zero or less changes nothing. Call it before Release.
func (l *Lock) HoldAtLeast(d time.Duration) {
	if l.view != nil {
		for _, p := range l.view.parts() {
			p.HoldAtLeast(d)
		}
		return
	}
	l.mu.Lock()
	l.minHold = max(l.minHold, d)
	l.mu.Unlock()
}

func isNotHeld(err error) bool { return err != nil && errors.Is(err, ErrNotHeld) }

type lockContextKey struct{}

// heldLocks is a context that carries a lock; its parent may carry more.
// Being the context itself, it costs one allocation per lock, like
// context.WithValue.
type heldLocks struct {
	context.Context
	lock *Lock
}

// Value returns h itself for lockContextKey, and asks the parent otherwise.
func (h *heldLocks) Value(key any) any {
	if _, ok := key.(lockContextKey); ok {
		return h
	}
	return h.Context.Value(key)
}

// outer returns the next context up the chain that carries a lock, or nil.
func (h *heldLocks) outer() *heldLocks {
	o, _ := h.Context.Value(lockContextKey{}).(*heldLocks)
	return o
}

// NewContext returns a copy of ctx that carries lock, in addition to the
// locks ctx already carries. Locker.Obtain and ObtainAll on that context (or
// one derived from it) find the keys these locks hold and take a reentrant
// hold on them instead of waiting for themselves.
func NewContext(ctx context.Context, lock *Lock) context.Context {
	if lock == nil {
		return ctx
	}
	return &heldLocks{Context: ctx, lock: lock}
}

// FromContext returns the innermost lock that ctx carries, if any. A handler
// behind the lock middleware finds its lock here.
func FromContext(ctx context.Context) (*Lock, bool) {
	h, _ := ctx.Value(lockContextKey{}).(*heldLocks)
	if h == nil {
		return nil, false
	}
	return h.lock, true
}

// Released reports whether Release was called on the lock. The key may
// still be locked: by a reentrant view, or for HoldAtLeast.
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

// isFinal reports whether the lock was released in the store.
func (l *Lock) isFinal() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.final
}
