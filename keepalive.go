package reqlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Watchdog timing. A renewal is due once a third of the TTL has passed since
// the lock was granted or last renewed; after a failed renewal the watchdog
// retries every tenth of the TTL, but never more often than minRetryInterval,
// until a renewal succeeds or the lock's validity runs out.
const (
	minRenewInterval = time.Millisecond
	minRetryInterval = 5 * time.Millisecond
)

// lifetime is a lock's keep-alive side, as etcd's Session is beside its
// Mutex: the contexts that end when the lock can no longer be trusted (see
// NewContext and KeepAlive), the timer that ends them when the lock's
// validity runs out, and the watchdog that renews it. Its zero value has
// none of them; the first context starts the timer.
//
// Invariants, under mu: cause is set once, when the lock is lost or
// released, and every context registered before or after ends with it; the
// timer and the watchdog never outlive the lock's release.
type lifetime struct {
	mu      sync.Mutex
	first   context.CancelCauseFunc // the first context's end
	more    []context.CancelCauseFunc
	watched bool      // in the Locker's expiries, since the first context
	cause   error     // why the contexts ended; nil while the lock is trusted
	lost    bool      // cause is a loss, not the release
	lastErr error     // the last renewal's failure, nil after a success
	wd      *watchdog // the latest watchdog started, running or not
	node    heldLocks // the context node of NewContext's first call

	// Owned by the Locker's expiries, under its mutex.
	heapAt int       // index in the expiries' heap while watched
	until  time.Time // the validity the expiries wait for
}

// watchdog renews one lock until its context ends.
type watchdog struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when run has returned
}

// context returns a context derived from parent that ends with the lock.
func (lt *lifetime) context(l *Lock, parent context.Context) context.Context {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	ctx, _ := lt.contextLocked(l, parent)
	return ctx
}

// contextLocked is context, with lt.mu held; it also returns the context's
// cancel.
func (lt *lifetime) contextLocked(l *Lock, parent context.Context) (context.Context, context.CancelCauseFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	if cause := lt.cause; cause != nil {
		cancel(cause)
		return ctx, cancel
	}
	if lt.first == nil {
		lt.first = cancel
	} else {
		lt.more = append(lt.more, cancel)
	}
	if !lt.watched {
		lt.watched = true
		for _, h := range l.holds {
			h.g.watchedBy(l)
		}
		l.locker.expiries.watch(l, l.ValidUntil())
	}
	return ctx, cancel
}

// unwatchGrants takes l, whose contexts have ended, off its grants'
// watchers.
func (l *Lock) unwatchGrants() {
	for _, h := range l.holds {
		h.g.unwatchedBy(l)
	}
}

// rewatch watches l anew for its current validity, which a refresh of one
// of its grants moved earlier, unless its contexts have ended. lt.mu is
// held throughout, so that a lock that ends meanwhile is never watched
// again (endLife unwatches it after setting cause).
func (lt *lifetime) rewatch(l *Lock) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if lt.watched && lt.cause == nil {
		l.locker.expiries.watch(l, l.ValidUntil())
	}
}

// checkValidity runs when the validity the expiries waited for has
// passed: it reports the new validity when a renewal moved it on, and
// otherwise loses the lock.
func (l *Lock) checkValidity() (until time.Time, valid bool) {
	if until := l.ValidUntil(); time.Now().Before(until) {
		return until, true
	}
	lt := &l.life
	lt.mu.Lock()
	lastErr := lt.lastErr
	lt.mu.Unlock()
	cause := fmt.Errorf("%w: the validity of %q ran out without a renewal", ErrLockLost, l.keys[0])
	if lastErr != nil {
		cause = fmt.Errorf("%w: the validity of %q ran out; renewals failed: %w", ErrLockLost, l.keys[0], lastErr)
	}
	l.lose(cause)
	return time.Time{}, false
}

// refreshed records a renewal's outcome: a success sets the validity timer
// to the new validity, a grant found gone loses the lock.
func (lt *lifetime) refreshed(l *Lock, err error) {
	switch {
	case err == nil:
		lt.mu.Lock()
		lt.lastErr = nil
		lt.mu.Unlock()
		// A longer validity needs no new watch (the timer finds it when it
		// fires) and a shorter one was watched by the grant; watching now
		// saves the timer an early wake-up.
		lt.rewatch(l)
	case isNotHeld(err) && !l.Released():
		l.lose(fmt.Errorf("%w: renewal found %q no longer held: %w", ErrLockLost, l.keys[0], err))
	default:
		lt.mu.Lock()
		lt.lastErr = err
		lt.mu.Unlock()
	}
}

// lose ends the lock's contexts with cause, once, and logs and counts the
// loss.
func (l *Lock) lose(cause error) {
	lt := &l.life
	lt.mu.Lock()
	if lt.cause != nil {
		lt.mu.Unlock()
		return
	}
	lt.cause, lt.lost = cause, true
	ends := lt.takeEndsLocked()
	watched := lt.watched
	lt.mu.Unlock()
	if watched {
		l.locker.expiries.unwatch(l)
		l.unwatchGrants()
	}
	// Counted and logged before the contexts end, so that whoever sees a
	// context end sees the loss reported.
	if m := l.locker.metrics; m != nil && !l.isClaim() {
		m.Lost(l.label)
	}
	l.locker.logger.Warn("reqlock: lock lost while its holder was working; its contexts are cancelled",
		slog.String("key", l.keys[0]), slog.Int64("fence", l.fences[0]), slog.Duration("ttl", l.TTL()),
		slog.Any("reason", cause))
	ends.call(cause)
}

// endLife ends the lock's contexts with cause (unless a loss ended them
// first), stops watching its validity, and stops the watchdog and waits until it has
// finished. Release calls it first.
func (l *Lock) endLife(cause error) {
	lt := &l.life
	lt.mu.Lock()
	if lt.cause == nil {
		lt.cause = cause
	}
	ends := lt.takeEndsLocked()
	wd, watched := lt.wd, lt.watched
	lt.mu.Unlock()
	if watched {
		l.locker.expiries.unwatch(l)
		l.unwatchGrants()
	}
	ends.call(cause)
	if wd != nil {
		wd.cancel(cause)
		<-wd.done
	}
}

// contextEnds are the registered ends of a lock's contexts.
type contextEnds struct {
	first context.CancelCauseFunc
	more  []context.CancelCauseFunc
}

// call ends every context with cause.
func (e contextEnds) call(cause error) {
	if e.first != nil {
		e.first(cause)
	}
	for _, end := range e.more {
		end(cause)
	}
}

// takeEndsLocked returns the registered context ends, forgetting them. The
// caller holds lt.mu, and then calls unwatch.
func (lt *lifetime) takeEndsLocked() contextEnds {
	ends := contextEnds{lt.first, lt.more}
	lt.first, lt.more = nil, nil
	return ends
}

// KeepAlive starts a watchdog that renews the lock with its TTL while ctx
// lives, and returns a context derived from ctx that ends when the lock can
// no longer be trusted, as NewContext's does. Do the work that needs the
// lock on that context. Lost reports a loss after the fact.
//
// A renewal is due once a third of the TTL has passed since the lock was
// granted or last renewed (by the watchdog or by Refresh). Each renewal is
// bounded by the shorter of a third of the TTL and the lock's remaining
// validity, so a stalled store cannot hold it past the validity.
//
// The lock is lost, and the returned context is cancelled with a cause that
// wraps ErrLockLost, when
//   - a renewal finds the key gone or holding another token (the cause also
//     wraps ErrNotHeld), or
//   - renewals keep failing (the store errors or stalls) until the lock's
//     validity (ValidUntil) has run out; they are retried every tenth of the
//     TTL, but no more often than every 5ms, until then (the cause also wraps
//     the last failure, an ErrStore).
//
// The loss is logged once, at WARN, on the Locker's logger, with the key,
// fence and reason. Test for it with
//
//	errors.Is(context.Cause(ctx), reqlock.ErrLockLost)
//
// The returned context also ends when ctx ends (with ctx's cause; the lock is
// then still held until Release or its TTL) and when the lock is released
// (with a cause wrapping ErrNotHeld, not ErrLockLost). The watchdog never
// outlives any of the three: its goroutine returns as soon as ctx ends or the
// lock is lost, and Release stops it, cancelling a renewal in flight, and
// waits until it has finished before it releases the lock, so no renewal
// happens after Release.
//
// At most one watchdog runs per lock. While one runs, KeepAlive starts no
// other: it returns a context derived from ctx that also ends, with the same
// cause, when the running watchdog's context ends. Once the running
// watchdog's context has ended because its ctx ended, a later call starts a
// new watchdog. On a lock that was lost or released, KeepAlive returns a
// context that has already ended with that cause.
//
// KeepAlive renews on any TTL, but a renewal round trip must fit well within
// a third of it: keep the TTL at tens of milliseconds or more.
func (l *Lock) KeepAlive(ctx context.Context) context.Context {
	lt := &l.life
	for {
		lt.mu.Lock()
		if cause := lt.cause; cause != nil {
			lt.mu.Unlock()
			ended, cancel := context.WithCancelCause(ctx)
			cancel(cause)
			return ended
		}
		wd := lt.wd
		if wd != nil && wd.ctx.Err() == nil {
			lt.mu.Unlock()
			return followContext(ctx, wd.ctx)
		}
		if wd != nil && !isClosed(wd.done) {
			// Its context has ended and it is returning: wait, outside
			// the mutex, which a renewal in flight still needs.
			lt.mu.Unlock()
			<-wd.done
			continue
		}
		wctx, cancel := lt.contextLocked(l, ctx)
		wd = &watchdog{ctx: wctx, cancel: cancel, done: make(chan struct{})}
		lt.wd = wd
		lt.mu.Unlock()
		go wd.run(l)
		return wctx
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// followContext returns a context derived from ctx that also ends, with the
// same cause, when leader ends.
func followContext(ctx, leader context.Context) context.Context {
	follower, cancel := context.WithCancelCause(ctx)
	// leader ends at the latest when the lock is released, so the
	// registration never outlives the lock.
	context.AfterFunc(leader, func() { cancel(context.Cause(leader)) })
	return follower
}

// Lost returns the cause, wrapping ErrLockLost, with which the lock's
// contexts ended when it could no longer be trusted (see NewContext and
// KeepAlive), or nil while no loss was found. Once Release has returned,
// the answer is final.
func (l *Lock) Lost() error {
	lt := &l.life
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if lt.lost {
		return lt.cause
	}
	return nil
}

// run renews the lock on timers until w.ctx ends, which it also does when
// the lock is lost or released.
func (w *watchdog) run(l *Lock) {
	defer close(w.done)
	timer := time.NewTimer(renewDelay(l))
	defer timer.Stop()
	for {
		select {
		case <-w.ctx.Done():
			return
		case <-timer.C:
		}
		err := w.renew(l)
		if w.ctx.Err() != nil {
			// ctx ended, the lock was lost, or Release stopped us, maybe
			// mid-call.
			return
		}
		switch {
		case err == nil:
			timer.Reset(renewDelay(l))
		case isNotHeld(err):
			return // Refresh lost the lock
		default:
			// The lifetime's timer loses the lock when the validity runs
			// out; until then, retry.
			timer.Reset(retryInterval(l.TTL()))
		}
	}
}

// renew refreshes the lock with its TTL, bounded by a third of the TTL and by
// the lock's remaining validity (when any is left).
func (w *watchdog) renew(l *Lock) error {
	timeout := renewInterval(l.TTL())
	if remaining := time.Until(l.ValidUntil()); remaining > 0 {
		timeout = min(timeout, remaining)
	} else {
		// The validity ran out before a renewal was even due (a long
		// pause): one short try, which succeeds only if nobody took the
		// key meanwhile, since renewals are owner-checked.
		timeout = min(timeout, retryInterval(l.TTL()))
	}
	ctx, cancel := context.WithTimeout(w.ctx, timeout)
	defer cancel()
	return l.Refresh(ctx, 0)
}

func renewInterval(ttl time.Duration) time.Duration {
	return max(ttl/3, minRenewInterval)
}

func retryInterval(ttl time.Duration) time.Duration {
	return min(max(ttl/10, minRetryInterval), renewInterval(ttl))
}

// renewDelay is the time until the next renewal is due: a third of the TTL
// after the lock was granted or last renewed, which is when two thirds of the
// TTL remain before ValidUntil. The TTL is the one a renewal confirms (see
// grant.trustedTTL). It is never longer than a third of the TTL,
// nor shorter than minRenewInterval, so the watchdog never spins.
func renewDelay(l *Lock) time.Duration {
	ttl := l.trustedTTL()
	interval := renewInterval(ttl)
	due := time.Until(l.ValidUntil()) - (ttl - interval)
	return min(max(due, minRenewInterval), interval)
}

func isNotHeld(err error) bool { return err != nil && errors.Is(err, ErrNotHeld) }
