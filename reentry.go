package reqlock

import (
	"context"
	"fmt"

	"github.com/reqlock/reqlock/internal/ctxkeys"
)

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
// locks ctx already carries, and that ends when the lock can no longer be
// trusted. Locker.Obtain and ObtainAll on that context (or one derived from
// it) find the keys these locks hold and take a reentrant hold on them
// instead of waiting for themselves; FromContext returns the lock.
//
// The context ends, with a cause wrapping ErrLockLost, when the lock's
// validity (ValidUntil) runs out without a renewal that succeeded, or a
// renewal finds the lock gone; the loss is then logged and counted. It also
// ends, with a cause wrapping ErrNotHeld, when the lock is released, and
// when ctx ends. Do the lock's work on it: a database or HTTP call under it
// stops when the lock is no longer held. The middleware gives each handler
// such a context.
func NewContext(ctx context.Context, lock *Lock) context.Context {
	if lock == nil {
		return ctx
	}
	lt := &lock.life
	lt.mu.Lock()
	defer lt.mu.Unlock()
	c, _ := lt.contextLocked(lock, ctx)
	if lt.node.lock == nil {
		// The first context of the lock, which is usually the only one:
		// its node is part of the lock's own allocation.
		lt.node = heldLocks{Context: c, lock: lock}
		return &lt.node
	}
	return &heldLocks{Context: c, lock: lock}
}

// FromContext returns the innermost lock that ctx carries, if any. A handler
// behind the lock middleware finds its lock here, also from gin's
// *gin.Context (see Locker.ObtainAll).
func FromContext(ctx context.Context) (*Lock, bool) {
	h := heldLocksOf(requestContext(ctx))
	if h == nil {
		return nil, false
	}
	return h.lock, true
}

// holdsLocks reports whether ctx carries any lock.
func holdsLocks(ctx context.Context) bool { return heldLocksOf(ctx) != nil }

// heldLocksOf returns the innermost context node that carries a lock, or
// nil.
func heldLocksOf(ctx context.Context) *heldLocks {
	h, _ := ctx.Value(lockContextKey{}).(*heldLocks)
	return h
}

// requestContext returns the request context a router's context stands
// for, when ctx is such a context (see ctxkeys.RequestContext) and carries
// no lock itself; ctx otherwise.
func requestContext(ctx context.Context) context.Context {
	if _, ok := ctx.Value(lockContextKey{}).(*heldLocks); ok {
		return ctx
	}
	if rc, ok := ctx.Value(ctxkeys.RequestContext).(context.Context); ok && rc != nil {
		return rc
	}
	return ctx
}

// reenter takes a hold on the grant of each lock of this Locker in ctx that
// holds one of keys (sorted), and returns those holds and the keys none of
// them holds.
//
// A grant whose validity has run out or is not confirmed (a handler that
// outlived its TTL without the watchdog, or a renewal whose outcome is
// unknown) is renewed first, owner-checked, so that a hold is never taken
// while another owner may hold the key; that costs a round trip only in this
// case. When the request's own lock on a key is known lost, or the renewal
// finds it gone, reenter returns an error wrapping ErrLockLost and
// ErrNotHeld instead of letting the request wait for its own key.
func (l *Locker) reenter(ctx context.Context, keys []string, m mode) (holds []hold, rest []string, err error) {
	defer func() {
		if err != nil {
			l.dropAll(ctx, holds)
		}
	}()
	for _, k := range keys {
		sk := l.prefix + k
		covered := false
		for _, h := range holds {
			if _, ok := h.g.fenceOf(sk, h.epoch); ok {
				covered = true
			}
		}
		if covered {
			continue
		}
		h, err := l.reenterKey(ctx, sk, m)
		if err != nil {
			return holds, nil, err
		}
		if h.g == nil {
			rest = append(rest, k)
			continue
		}
		holds = append(holds, h)
	}
	return holds, rest, nil
}

// reenterKey takes a hold on the grant of the innermost lock in ctx that
// holds storeKey, if any.
func (l *Locker) reenterKey(ctx context.Context, storeKey string, m mode) (hold, error) {
	for c := heldLocksOf(ctx); c != nil; c = c.outer() {
		if c.lock.locker != l || c.lock.Released() {
			// Another Locker's, or on its way out: a lock whose Release
			// has begun holds its keys for nobody.
			continue
		}
		_, h := c.lock.holdOf(storeKey)
		if h.g == nil {
			continue
		}
		if held := h.g.mode(); !reentrant(held, m) {
			// Taking the key in m would wait for the request's own
			// holders, or let it write while it reads.
			return hold{}, fmt.Errorf("%w: the request holds %q %v and cannot take it %v inside that lock",
				ErrInvalid, storeKey, held, m)
		}
		lost, renew := h.g.check(h.epoch)
		if lost {
			return hold{}, fmt.Errorf("%w: %w: the request's own lock on %q was lost", ErrLockLost, ErrNotHeld, storeKey)
		}
		if renew {
			err := h.g.refresh(ctx, h.epoch, 0)
			c.lock.life.refreshed(c.lock, err) // a grant found gone loses the lock
			if err != nil {
				if isNotHeld(err) {
					return hold{}, fmt.Errorf("%w: the request's own lock on %q expired and was lost: %w", ErrLockLost, storeKey, err)
				}
				return hold{}, err
			}
		}
		if h.g.enter(h.epoch) {
			return h, nil
		}
	}
	return hold{}, nil
}
