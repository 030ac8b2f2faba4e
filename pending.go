package reqlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// Pending release defaults (see WithPendingReleases).
const (
	defaultMaxPending = 1024
	// pendingRetryMin and pendingRetryMax bound the backoff between the
	// retries of a store that keeps failing: the keys are free within
	// pendingRetryMax plus a round trip of the store's return.
	pendingRetryMin = 25 * time.Millisecond
	pendingRetryMax = 250 * time.Millisecond
	// pendingCallMax bounds each retry's store call (and the release
	// timeout, when shorter), so that a retry sent into a frozen store
	// does not hold up the next one for long.
	pendingCallMax = time.Second
	// defaultCloseBound bounds Close when its context has no deadline.
	defaultCloseBound = 5 * time.Second
)

// WithPendingReleases bounds the Locker's set of pending releases: releases
// that failed for a store reason (the store errored or did not answer; not
// ErrNotHeld), retried in the background so that a short outage does not
// leave a key locked for the rest of its TTL. This covers Lock.Release, the
// release of a hold-at-least lock (which keeps the keys until the time is
// up), and the releases of grants that a failed or abandoned Obtain may have
// left.
//
// One goroutine per Locker, running only while releases are pending, retries
// them owner-checked (the store's Release only deletes keys that still hold
// the grant's token), oldest first, with a backoff from 25ms up to 250ms
// while the store fails, so that the keys are free within about 250ms plus
// a round trip of the store's return (at once when the breaker sees the
// store back, see WithBreaker). A release leaves the set when it
// succeeds, when the store says the keys no longer hold its token, or when
// the grant's TTL, as last asked of the store, has passed (the store has let
// the keys go). A renewal whose reply was lost and that reaches the store
// later still sets the keys' TTL: such keys expire with it.
//
// When the set holds max releases, those whose TTL has passed leave it,
// and if none has, the oldest is dropped to make room (its keys expire with
// their TTL). Zero turns the retries off: a failed release
// then leaves its keys to their TTL. Metrics that implement OutageMetrics
// see each release enter and leave the set. Close tries the pending
// releases once more. Default 1024.
func WithPendingReleases(max int) Option {
	return func(l *Locker) error {
		if max < 0 {
			return fmt.Errorf("WithPendingReleases: %d is negative", max)
		}
		l.pending.max = max
		return nil
	}
}

// pendingRelease is a release to retry.
type pendingRelease struct {
	store     stores.Store // what releases the keys (see grant.store)
	keys      []string     // as stored
	token     string
	keepUntil time.Time // hold-at-least: the keys stay held until then
	expires   time.Time // the store lets the keys go by then at the latest
}

// pendingSet is a Locker's set of pending releases and its goroutine.
type pendingSet struct {
	l   *Locker
	max int

	mu      sync.Mutex
	items   []*pendingRelease // oldest first
	running bool              // the goroutine runs
	exited  chan struct{}     // closed when the running goroutine returns
	stop    chan struct{}     // closed by Close
	kick    chan struct{}     // buffer 1: retry now (the store is back)
	closed  bool
}

// retryNow cuts the goroutine's backoff short: the breaker saw the store
// answer again.
func (p *pendingSet) retryNow() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// pendingLen reports how many releases are pending.
func (l *Locker) pendingLen() int {
	p := &l.pending
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.items)
}

// event reports a pending release's event to the Locker's metrics.
func (p *pendingSet) event(e PendingEvent) {
	if m, ok := p.l.metrics.(OutageMetrics); ok {
		m.PendingRelease(e)
	}
}

// add retries r in the background, when the set is on and the Locker not
// closed. It reports whether r was taken.
func (p *pendingSet) add(r *pendingRelease) bool {
	if p.max == 0 {
		return false
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.event(PendingDropped)
		return false
	}
	dropped, expired := false, 0
	if len(p.items) >= p.max {
		// The goroutine checks only the oldest: first make room of the
		// releases whose keys the store has let go already.
		now := time.Now()
		live := p.items[:0]
		for _, it := range p.items {
			if now.Before(it.expires) {
				live = append(live, it)
			}
		}
		expired = len(p.items) - len(live)
		clear(p.items[len(live):])
		p.items = live
	}
	if len(p.items) >= p.max {
		p.items[0] = nil
		p.items = p.items[1:]
		dropped = true
	}
	p.items = append(p.items, r)
	if !p.running {
		p.running = true
		p.exited = make(chan struct{})
		go p.run(p.exited)
	}
	p.mu.Unlock()
	for range expired {
		p.event(PendingExpired)
	}
	if dropped {
		p.event(PendingDropped)
	}
	p.event(PendingQueued)
	return true
}

// remove takes r out of the set; false when it was dropped meanwhile.
func (p *pendingSet) remove(r *pendingRelease) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, it := range p.items {
		if it == r {
			p.items = append(p.items[:i], p.items[i+1:]...)
			return true
		}
	}
	return false
}

// run retries the pending releases, oldest first, until none is left or
// the Locker is closed. While the store fails, it backs off without trying
// the others: one call tells whether the store is back.
func (p *pendingSet) run(exited chan struct{}) {
	defer close(exited)
	var timer *time.Timer
	delay := pendingRetryMin
	for {
		p.mu.Lock()
		if p.closed || len(p.items) == 0 {
			p.running = false
			p.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return
		}
		r := p.items[0]
		stop := p.stop
		p.mu.Unlock()
		// While the breaker counts the store down and no probe is due,
		// no call: the breaker's closing kicks the set (retryNow). Close
		// still tries each release once.
		storeDown := p.l.breaker != nil && p.l.breaker.rejecting()
		if !storeDown {
			if ev, done := p.try(context.Background(), r); done {
				if p.remove(r) {
					p.event(ev)
				}
				delay = pendingRetryMin
				continue
			}
		}
		if timer == nil {
			timer = time.NewTimer(delay)
		} else {
			timer.Reset(delay)
		}
		select {
		case <-timer.C:
			delay = min(2*delay, pendingRetryMax)
		case <-p.kick:
			timer.Stop()
			delay = pendingRetryMin
		case <-stop:
		}
	}
}

// try releases r once, on ctx bounded by the retry's call bound. It reports
// how r leaves the set, and false when it stays (the store failed).
func (p *pendingSet) try(ctx context.Context, r *pendingRelease) (PendingEvent, bool) {
	now := time.Now()
	if !now.Before(r.expires) {
		return PendingExpired, true
	}
	var keep time.Duration
	if left := r.keepUntil.Sub(now); left > 0 {
		keep = p.l.clampKeep(left)
	}
	ctx, cancel := context.WithTimeout(ctx, min(p.l.releaseTimeout, pendingCallMax))
	defer cancel()
	err := r.store.Release(ctx, r.keys, r.token, keep)
	switch {
	case err == nil:
		return PendingReleased, true
	case errors.Is(err, stores.ErrNotHeld):
		return PendingNotHeld, true
	case errors.Is(err, stores.ErrInvalid):
		p.l.logger.Debug("reqlock: the store refused a pending release", slog.Any("error", err))
		return PendingDropped, true
	}
	if !time.Now().Before(r.expires) {
		return PendingExpired, true
	}
	return "", false
}

// close stops the goroutine, waits for it within ctx, then tries every
// pending release once more within ctx. It returns how many it could not
// release. Only the first call does anything.
func (p *pendingSet) close(ctx context.Context) (failed int) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return 0
	}
	p.closed = true
	close(p.stop)
	running, exited := p.running, p.exited
	p.mu.Unlock()
	if running {
		select {
		case <-exited:
		case <-ctx.Done():
		}
	}
	p.mu.Lock()
	items := p.items
	p.items = nil
	p.mu.Unlock()
	for _, r := range items {
		if ctx.Err() != nil {
			failed++
			p.event(PendingUnreleased)
			continue
		}
		ev, done := p.try(ctx, r)
		if !done {
			failed++
			ev = PendingUnreleased
		}
		p.event(ev)
	}
	return failed
}

// Close ends the Locker's background work: it stops retrying pending
// releases (see WithPendingReleases) and tries each of them once more
// within ctx, or within 5s when ctx has no deadline. It returns an error
// matching ErrStore, naming how many, when some could not be released (their
// keys expire with their TTL). Close is for shutdown: Obtain still works
// after it, but a release that fails afterwards is not retried. Calls after
// the first return nil.
func (l *Locker) Close(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultCloseBound)
		defer cancel()
	}
	if n := l.pending.close(ctx); n > 0 {
		return fmt.Errorf("%w: %d pending releases could not be released; their keys expire with their TTL", ErrStore, n)
	}
	return nil
}

// clampKeep brings a hold-at-least keep within the store's bounds.
func (l *Locker) clampKeep(keep time.Duration) time.Duration {
	b := l.bounds
	keep = max(keep, b.MinTTL)
	if b.MaxTTL > 0 {
		keep = min(keep, b.MaxTTL)
	}
	return keep
}

// retryRelease puts a release that failed with err into the pending set,
// when err is a store failure. expires is when the store lets the keys go at
// the latest.
func (l *Locker) retryRelease(err error, store stores.Store, storeKeys []string, token string, keepUntil, expires time.Time) {
	if err == nil || errors.Is(err, ErrNotHeld) || errors.Is(err, ErrInvalid) || !time.Now().Before(expires) {
		return
	}
	if !l.pending.add(&pendingRelease{store: store, keys: storeKeys, token: token, keepUntil: keepUntil, expires: expires}) {
		l.logger.Debug("reqlock: release failed and is not retried; the keys expire with their TTL",
			slog.String("key", stores.KeyForMessage(storeKeys[0])), slog.Any("error", err))
	}
}
