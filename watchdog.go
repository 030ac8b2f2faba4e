package reqlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
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

// keepAlive is a Lock's watchdog state. Its zero value has no watchdog.
type keepAlive struct {
	mu      sync.Mutex
	wd      *watchdog // the latest watchdog started, running or not
	stopped bool      // Release has begun: no watchdog may start any more
}

// watchdog renews one lock until its context ends, the lock is lost, or
// Release stops it.
type watchdog struct {
	ctx    context.Context // the keep-alive context the first caller got
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when run has returned
	lost   atomic.Bool   // set by run before it cancels ctx with the loss
}

// KeepAlive starts a watchdog that renews the lock with its TTL while ctx
// lives, and returns a context derived from ctx that ends when the lock can
// no longer be trusted. Do the work that needs the lock on that context.
// Lost reports a loss after the fact.
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
//     ErrStore).
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
// happens after Release. There is no other way to stop it: call KeepAlive
// with a context that ends, or call Release.
//
// At most one watchdog runs per lock. While one runs, KeepAlive starts no
// other: it returns a context derived from ctx that also ends, with the same
// cause, when the running watchdog's context ends (this may happen on another
// goroutine an instant later). Once the running watchdog's context has ended
// because its ctx ended, a later call starts a new watchdog. On a lock that
// was lost under a watchdog, or released, KeepAlive returns a context that has
// already ended with that cause.
//
// KeepAlive renews on any TTL, but a renewal round trip must fit well within
// a third of it: keep the TTL at tens of milliseconds or more.
func (l *Lock) KeepAlive(ctx context.Context) context.Context {
	if l.view != nil {
		// A view keeps each lock behind it alive, and its context ends
		// when any of them is lost or released, or the view is released.
		// The watchdogs stay bound to ctx alone: the locks a view borrows
		// outlive its release.
		if l.Released() {
			ended, cancel := context.WithCancelCause(ctx)
			cancel(l.releasedCause())
			return ended
		}
		for _, p := range l.view.parts() {
			ctx = p.KeepAlive(ctx)
		}
		viewCtx, end := context.WithCancelCause(ctx)
		if !l.addViewEnd(end) {
			end(l.releasedCause()) // released meanwhile
		}
		return viewCtx
	}
	k := &l.keepAlive
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped || l.isFinal() {
		ended, cancel := context.WithCancelCause(ctx)
		cancel(l.releasedCause())
		return ended
	}
	if wd := k.wd; wd != nil {
		if wd.ctx.Err() == nil {
			return followContext(ctx, wd.ctx)
		}
		<-wd.done // its context has ended: it is returning, if not gone
		if wd.lost.Load() {
			ended, cancel := context.WithCancelCause(ctx)
			cancel(context.Cause(wd.ctx))
			return ended
		}
		// That watchdog ended with its ctx: start a new one below.
	}
	wctx, cancel := context.WithCancelCause(ctx)
	wd := &watchdog{ctx: wctx, cancel: cancel, done: make(chan struct{})}
	k.wd = wd
	go wd.run(l)
	return wctx
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
// watchdog (see KeepAlive) gave the lock up, or nil when no watchdog has
// found it lost. It reports the loss as soon as the keep-alive context has
// ended with it. Once Release has returned, the answer is final.
func (l *Lock) Lost() error {
	if l.view != nil {
		for _, p := range l.view.parts() {
			if err := p.Lost(); err != nil {
				return err
			}
		}
		return nil
	}
	k := &l.keepAlive
	k.mu.Lock()
	wd := k.wd
	k.mu.Unlock()
	if wd == nil {
		return nil
	}
	if wd.lost.Load() {
		// Set before the context was cancelled with the loss, so a caller
		// that saw the context end sees it too.
		return context.Cause(wd.ctx)
	}
	return nil
}

// stopWatchdog keeps any further watchdog from starting, then ends a running
// one and waits until it has finished: it renews no more, and its goroutine
// is returning. Release calls it first.
func (l *Lock) stopWatchdog() {
	k := &l.keepAlive
	k.mu.Lock()
	k.stopped = true
	wd := k.wd
	k.mu.Unlock()
	if wd == nil {
		return
	}
	wd.cancel(l.releasedCause()) // no effect when the lock was already lost
	<-wd.done
}

func (l *Lock) releasedCause() error {
	return fmt.Errorf("%w: %q was released", ErrNotHeld, l.key)
}

// run renews the lock on timers until w.ctx ends or the lock is lost.
func (w *watchdog) run(l *Lock) {
	defer close(w.done)
	timer := time.NewTimer(renewDelay(l))
	defer timer.Stop()
	var failure error // the last renewal error since the last success
	for {
		select {
		case <-w.ctx.Done():
			return
		case <-timer.C:
		}
		remaining := time.Until(l.ValidUntil())
		if failure != nil && remaining <= 0 {
			w.lose(l, fmt.Errorf("%w: renewals of %q failed until its validity ran out: %w", ErrLockLost, l.key, failure))
			return
		}
		err := w.renew(l, remaining)
		if w.ctx.Err() != nil {
			// ctx ended or Release stopped us, maybe mid-call: not a loss.
			return
		}
		switch {
		case err == nil:
			failure = nil
			timer.Reset(renewDelay(l))
		case errors.Is(err, ErrNotHeld):
			w.lose(l, fmt.Errorf("%w: renewal found %q no longer held: %w", ErrLockLost, l.key, err))
			return
		default:
			failure = err
			remaining = time.Until(l.ValidUntil())
			if remaining <= 0 {
				w.lose(l, fmt.Errorf("%w: renewals of %q failed until its validity ran out: %w", ErrLockLost, l.key, err))
				return
			}
			timer.Reset(min(retryInterval(l.TTL()), remaining))
		}
	}
}

// renew refreshes the lock with its TTL, bounded by a third of the TTL and by
// the lock's remaining validity (when any is left).
func (w *watchdog) renew(l *Lock, remaining time.Duration) error {
	timeout := renewInterval(l.TTL())
	if remaining > 0 {
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

// lose marks the lock lost, cancels the keep-alive context with cause and
// logs the loss.
func (w *watchdog) lose(l *Lock, cause error) {
	w.lost.Store(true) // before cancel: whoever sees ctx end sees the loss
	l.markNotHeld()
	w.cancel(cause)
	if m := l.locker.metrics; m != nil {
		m.Lost(l.label)
	}
	l.locker.logger.Warn("reqlock: lock lost while its holder was working; its keep-alive context is cancelled",
		slog.String("key", l.key), slog.Int64("fence", l.fence), slog.Duration("ttl", l.TTL()),
		slog.Any("reason", cause))
}

func renewInterval(ttl time.Duration) time.Duration {
	return max(ttl/3, minRenewInterval)
}

func retryInterval(ttl time.Duration) time.Duration {
	return min(max(ttl/10, minRetryInterval), renewInterval(ttl))
}

// renewDelay is the time until the next renewal is due: a third of the TTL
// after the lock was granted or last renewed, which is when two thirds of the
// TTL remain before ValidUntil. It is never longer than a third of the TTL,
// nor shorter than minRenewInterval, so the watchdog never spins.
func renewDelay(l *Lock) time.Duration {
	ttl := l.TTL()
	interval := renewInterval(ttl)
	due := time.Until(l.ValidUntil()) - (ttl - interval)
	return min(max(due, minRenewInterval), interval)
}
