package reqlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// view is a reentrant Lock: the holds one Obtain or ObtainAll took on locks
// that its request already held (borrowed), plus the lock it obtained for
// the keys none of them held (owned, nil when there were none).
type view struct {
	keys  []string // sorted, without the Locker's prefix
	locks []*Lock  // every real lock behind the view: the borrowed, then owned
	owned *Lock    // a real lock released with the view, or nil
}

// parts returns every real lock behind the view.
func (v *view) parts() []*Lock { return v.locks }

// newView returns a Lock for keys held by borrowed, on each of which it has
// taken a view hold, and by owned.
func (l *Locker) newView(keys []string, borrowed []*Lock, owned *Lock) *Lock {
	v := &view{keys: keys, locks: borrowed, owned: owned}
	if owned != nil {
		v.locks = append(borrowed, owned)
	}
	lock := &Lock{locker: l, key: keys[0], storeKey: l.prefix + keys[0], view: v}
	lock.fence, _ = v.fenceOf(keys[0])
	for _, p := range v.parts() {
		if p.holds(lock.storeKey) {
			lock.token = p.token
		}
	}
	return lock
}

// fenceOf returns the fence of key, when key is one of the view's: the
// locks behind it may hold other keys too.
func (v *view) fenceOf(key string) (int64, bool) {
	if _, ok := slices.BinarySearch(v.keys, key); !ok {
		return 0, false
	}
	for _, p := range v.parts() {
		if f, ok := p.FenceOf(key); ok {
			return f, true
		}
	}
	return 0, false
}

func (v *view) ttl() time.Duration {
	var ttl time.Duration
	for i, p := range v.parts() {
		if t := p.TTL(); i == 0 || t < ttl {
			ttl = t
		}
	}
	return ttl
}

func (v *view) validUntil() time.Time {
	var until time.Time
	for i, p := range v.parts() {
		if t := p.ValidUntil(); i == 0 || t.Before(until) {
			until = t
		}
	}
	return until
}

func (v *view) refresh(ctx context.Context, ttl time.Duration) error {
	var errs []error
	for _, p := range v.parts() {
		errs = append(errs, p.Refresh(ctx, ttl))
	}
	return errors.Join(errs...)
}

// release ends the view's holds; a lock whose last hold that was is
// released in the store.
func (v *view) release(ctx context.Context) error {
	var errs []error
	for _, p := range v.locks {
		if p == v.owned {
			errs = append(errs, p.Release(ctx))
		} else {
			errs = append(errs, p.leave(ctx))
		}
	}
	return errors.Join(errs...)
}

// enter takes a view hold on a real lock, unless it is already on its way
// to the store (released with no view left, or gone).
func (l *Lock) enter() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.final || l.notHeld || (l.released && l.views == 0) {
		return false
	}
	l.views++
	return true
}

// leave ends one view hold, releasing the lock when it was the last hold.
func (l *Lock) leave(ctx context.Context) error {
	l.mu.Lock()
	l.views--
	last := l.views == 0 && l.released
	l.mu.Unlock()
	if !last {
		return nil
	}
	return l.finish(ctx)
}

// addViewEnd registers end to be called when the view l is released, and
// reports false, registering nothing, when it was released already.
func (l *Lock) addViewEnd(end context.CancelCauseFunc) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return false
	}
	l.viewEnds = append(l.viewEnds, end)
	return true
}

// holds reports whether the real lock l holds storeKey.
func (l *Lock) holds(storeKey string) bool {
	if l.multi != nil {
		return l.multi.holds(storeKey)
	}
	return l.storeKey == storeKey
}

// reenter looks in the locks ctx carries (see NewContext) for a live lock
// of this Locker that holds storeKey, and takes a view hold on it.
//
// A lock whose validity has run out (a handler that outlived its TTL
// without the watchdog) is renewed first, owner-checked, so that a view is
// never handed out while another owner holds the key; that costs a round
// trip only in this case. When the request's own lock on the key is known
// lost, or the renewal finds it gone, reenter returns an error wrapping
// ErrLockLost and ErrNotHeld instead of letting the request wait for its
// own key.
func (l *Locker) reenter(ctx context.Context, storeKey string) (*Lock, error) {
	h, _ := ctx.Value(lockContextKey{}).(*heldLocks)
	for ; h != nil; h = h.outer() {
		candidates := []*Lock{h.lock}
		if h.lock.view != nil {
			candidates = h.lock.view.parts()
		}
		for _, c := range candidates {
			if c.locker != l || !c.holds(storeKey) {
				continue
			}
			if err := c.checkHeld(ctx); err != nil {
				return nil, err
			}
			if c.enter() {
				return c, nil
			}
		}
	}
	return nil, nil
}

// checkHeld reports an error when the real lock c is known lost, or when its
// validity has run out and a renewal finds it gone. A lock already on its
// way to the store is not checked: enter refuses it.
func (c *Lock) checkHeld(ctx context.Context) error {
	c.mu.Lock()
	final, notHeld, expired := c.final, c.notHeld, !time.Now().Before(c.validUntil)
	c.mu.Unlock()
	switch {
	case final:
		return nil
	case notHeld:
		return fmt.Errorf("%w: %w: the request's own lock on %q was lost", ErrLockLost, ErrNotHeld, c.key)
	case !expired:
		return nil
	}
	err := c.Refresh(ctx, 0)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNotHeld):
		return fmt.Errorf("%w: the request's own lock on %q expired and was lost: %w", ErrLockLost, c.key, err)
	}
	return err
}

// holdsLocks reports whether ctx carries any lock (see NewContext).
func holdsLocks(ctx context.Context) bool {
	h, _ := ctx.Value(lockContextKey{}).(*heldLocks)
	return h != nil
}

// leaveAll ends the view holds taken on locks.
func leaveAll(ctx context.Context, locks []*Lock) {
	for _, p := range locks {
		_ = p.leave(ctx)
	}
}

// realLocks returns the real locks behind l: l itself, or a view's parts.
func (l *Lock) realLocks() []*Lock {
	if l.view != nil {
		return l.view.parts()
	}
	return []*Lock{l}
}
