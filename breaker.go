package reqlock

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

// Breaker defaults (see WithBreaker).
const (
	defaultBreakerFailures = 5
	defaultBreakerProbe    = 500 * time.Millisecond
)

// WithBreaker tunes the Locker's circuit breaker. After failures store
// failures in a row, the breaker opens: the Locker counts the store down,
// and every Obtain answers ErrStoreDown at once, without a store call,
// until probeAfter has passed. Then one request at a time probes the store
// (the others are still refused); the first probe the store answers closes
// the breaker, and one that fails opens it for probeAfter again. A probe's
// store call is bounded by the longer of probeAfter and the release timeout
// (and by its wait): a probe the store leaves unanswered that long fails,
// and its request answers a store error. So the
// Locker serves again within probeAfter (plus a probe's round trip) of the
// store's return.
//
// A store failure is an acquire that failed with a store error, or whose
// call was still unanswered when the Locker's wait bound ended with no sign
// that the key was held. A held key, a request whose own context ended,
// and arguments the store refused are never failures: only a store that
// answers nothing, or errors, opens the breaker. Releases and refreshes do
// not count. A release while the breaker counts the store down is not sent:
// it returns ErrStoreDown and is retried in the background, at once when
// the breaker closes (see WithPendingReleases). Refreshes are never
// refused.
//
// The Locker logs one line when the breaker opens ("store down", ERROR) and
// one when it closes again ("store back", INFO, with the outage's length
// and the count of requests refused meanwhile); StoreHealth reports the
// state. failures zero turns the breaker off: every request then calls the
// store. Default 5 and 500ms; probeAfter must be positive when failures is.
func WithBreaker(failures int, probeAfter time.Duration) Option {
	return func(l *Locker) error {
		if failures < 0 || (failures > 0 && probeAfter <= 0) {
			return fmt.Errorf("WithBreaker: failures %d must not be negative, and probeAfter %v positive", failures, probeAfter)
		}
		l.breakerFailures, l.breakerProbe = failures, probeAfter
		return nil
	}
}

// StoreHealth is what a Locker's breaker knows of its store (see
// WithBreaker).
type StoreHealth struct {
	// Down reports that the breaker counts the store down: requests are
	// refused with ErrStoreDown, but for one probe at a time.
	Down bool
	// Since is when the store was last counted down, or back (zero before
	// the first outage).
	Since time.Time
	// NextProbe is, while Down, when the next probe is due; in the past
	// while a probe is due or running.
	NextProbe time.Time
	// Rejected counts the requests refused with ErrStoreDown during the
	// current outage, or the last one.
	Rejected int64
	// Outages counts the times the store was counted down since the
	// Locker was made.
	Outages uint64
}

// StoreHealth reports the state of the Locker's breaker; the zero
// StoreHealth when the breaker is off.
func (l *Locker) StoreHealth() StoreHealth {
	b := l.breaker
	if b == nil {
		return StoreHealth{}
	}
	b.stateMu.Lock()
	defer b.stateMu.Unlock()
	return StoreHealth{Down: b.down.Load(), Since: b.since, NextProbe: time.Unix(0, b.nextProbe.Load()),
		Rejected: b.rejected.Load(), Outages: b.outages}
}

// breaker wraps a gobreaker two-step breaker so that the healthy path costs
// one atomic load: while no failure has been seen since the last success,
// calls are neither admitted nor reported through gobreaker (whose every
// call takes its mutex and allocates a callback).
type breaker struct {
	cb        *gobreaker.TwoStepCircuitBreaker[struct{}]
	locker    *Locker
	probe     time.Duration
	suspect   atomic.Bool  // a failure was seen, or the breaker is not closed: report to cb
	down      atomic.Bool  // open or half-open
	nextProbe atomic.Int64 // unix nanoseconds: when the open state ends
	rejected  atomic.Int64 // requests refused during the current outage

	mu sync.Mutex // orders suspect's updates with cb's counts; taken before cb's

	stateMu sync.Mutex // guards since and outages, and orders down's updates with them; taken inside cb's mutex
	since   time.Time
	outages uint64
}

// errExcluded marks an attempt's outcome that says nothing of the store's
// health (a held key's wait that ended, a caller that left).
var errExcluded = errors.New("reqlock: outcome not counted by the breaker")

// errFailure reports a store failure to gobreaker.
var errFailure = errors.New("reqlock: store failure")

func newBreaker(l *Locker, failures int, probe time.Duration) *breaker {
	b := &breaker{locker: l, probe: probe}
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        "reqlock",
		MaxRequests: 1, // one probe at a time; the first that succeeds closes
		Timeout:     probe,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= uint32(failures)
		},
		IsSuccessful:  func(err error) bool { return err == nil },
		IsExcluded:    func(err error) bool { return errors.Is(err, errExcluded) },
		OnStateChange: b.changed,
	})
	return b
}

// changed runs under gobreaker's mutex at each change of state.
func (b *breaker) changed(_ string, from, to gobreaker.State) {
	now := time.Now()
	switch to {
	case gobreaker.StateOpen:
		b.nextProbe.Store(now.Add(b.probe).UnixNano())
		if from != gobreaker.StateClosed {
			return // a probe failed: still down
		}
		b.stateMu.Lock() // down with since and outages: StoreHealth reads them as one
		b.down.Store(true)
		b.rejected.Store(0)
		b.since = now
		b.outages++
		b.stateMu.Unlock()
		b.locker.logger.Error("reqlock: store down; requests answer ErrStoreDown (503) at once while one at a time probes it",
			slog.String("store", fmt.Sprintf("%T", b.locker.store)), slog.Duration("probe_every", b.probe))
		if m, ok := b.locker.metrics.(OutageMetrics); ok {
			m.StoreDown()
		}
	case gobreaker.StateClosed:
		b.stateMu.Lock()
		b.down.Store(false)
		down := now.Sub(b.since)
		b.since = now
		b.stateMu.Unlock()
		rejected := b.rejected.Load()
		b.locker.logger.Info("reqlock: store back",
			slog.String("store", fmt.Sprintf("%T", b.locker.store)), slog.Duration("down_for", down), slog.Int64("rejected", rejected))
		if m, ok := b.locker.metrics.(OutageMetrics); ok {
			m.StoreBack(down, rejected)
		}
		b.locker.pending.retryNow()
	}
}

// rejecting reports whether a request should be refused before it queues:
// the store is down and no probe is due yet.
func (b *breaker) rejecting() bool {
	return b.down.Load() && time.Now().UnixNano() < b.nextProbe.Load()
}

// downError returns the error of a refused request.
func (b *breaker) downError() error {
	return &StoreDownError{NextProbe: time.Unix(0, b.nextProbe.Load())}
}

// allow admits one store call. It returns the function to report the
// call's outcome with (see breakerOutcome), nil on the healthy path, or an
// error wrapping ErrStoreDown when the call must not be made. probe reports
// that the call is the probe of a store counted down: the caller bounds it
// (see probeBound), since every other request is refused until it ends.
func (b *breaker) allow() (done func(error), probe bool, err error) {
	if !b.suspect.Load() {
		return nil, false, nil
	}
	done, err = b.cb.Allow()
	if err != nil {
		return nil, false, b.downError()
	}
	return done, b.down.Load(), nil
}

// probeBound bounds a probe's store call: long enough for a store that
// answers, short enough that a probe lost in a frozen or cut connection
// keeps the other requests refused no longer than about a probe period
// (or a release), whatever the prober's own wait.
func (l *Locker) probeBound() time.Duration {
	return max(l.breakerProbe, l.releaseTimeout)
}

// report reports the outcome of a call that allow admitted with done.
func (b *breaker) report(done func(error), outcome error) {
	switch {
	case done != nil:
		b.mu.Lock()
		done(outcome)
		if outcome == nil && b.cb.State() == gobreaker.StateClosed && b.cb.Counts().ConsecutiveFailures == 0 {
			b.suspect.Store(false)
		}
		b.mu.Unlock()
	case outcome != nil && !errors.Is(outcome, errExcluded):
		// The first failure after a healthy run: count it, and report
		// every call from now on until one succeeds.
		b.mu.Lock()
		b.suspect.Store(true)
		if d, err := b.cb.Allow(); err == nil {
			d(outcome)
		}
		b.mu.Unlock()
	}
}
