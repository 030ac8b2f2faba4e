package reqlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/reqlock/reqlock/internal/localqueue"
	"github.com/reqlock/reqlock/stores"
)

// attempter is how the acquire loop asks the store for keys: plainly, or in
// fair mode through the store's queue (see fair.go).
type attempter interface {
	// attempt is one try; ahead is the caller's place in the store's
	// queue (0 at its head or without a queue).
	attempt(ctx context.Context, keys []string, token string, ttl time.Duration) (g stores.Grant, ahead int, err error)
	// sleepCap caps the next sleep, given the store's hint.
	sleepCap(hint time.Duration) time.Duration
	// leave ends the caller's wait in the store, when it has one: at once,
	// or in the background when the store may be failing.
	leave(ctx context.Context, keys []string, token string, background bool)
}

// plainAttempts take keys whenever they are free. On a stores.SharedStore,
// writerCap caps the sleeps of an exclusive waiter, so that it retries
// within the stores.WriterWindow its refusal by shared holders opened (a
// wait that ends without the key withdraws it: see Locker.withdrawWriter).
type plainAttempts struct {
	store     stores.Store
	writerCap time.Duration
}

func (p plainAttempts) attempt(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, int, error) {
	g, err := p.store.Acquire(ctx, keys, token, ttl)
	return g, 0, err
}

func (p plainAttempts) sleepCap(hint time.Duration) time.Duration {
	if p.writerCap > 0 && (hint <= 0 || hint > p.writerCap) {
		return p.writerCap
	}
	return hint
}

func (plainAttempts) leave(context.Context, []string, string, bool) {}

// attempter returns the strategy for a wait on g's keys: a shared or
// limited grant's own, a claim's (see ClaimRecord), fair mode's for a
// single key that waits, plain otherwise.
func (l *Locker) attempter(g *grant, wait time.Duration) attempter {
	if g.claim {
		return l.claims
	}
	if g.shared != nil {
		return plainAttempts{store: g.shared}
	}
	if l.fair != nil && len(g.keys) == 1 {
		return l.fair.attempts(l, wait)
	}
	return l.plain
}

// contend obtains g's keys from the store for a request that has their turn
// in this process: one attempt, then, while wait allows and the
// keys are held, a sleep (woken by a release signal of the key that held it
// up, capped by its holder's TTL) and another attempt.
//
// seen tells whether the key was already seen held, by the request ahead
// in the local queue: a wait that ends with a store call unanswered is then
// a timeout, not a store that never answered.
//
// A request that got its turn behind a local contender inherits what that
// contender found (sawHeld, or not: a store that never answered), and its
// wait, spent in the queue, ending in or before its first store call is
// classed by that: a timeout behind a held key, a store failure behind an
// unanswered store, whose outage the whole queue then reports.
//
// turns are the keys' local turns, in the order of keys: a refusal records
// on the held key's turn that another owner wants it, and a grant after a
// refusal or a courtesy that the turn of this process on the keys begins
// (see Locker.yieldAfter).
//
// A waiter that no release signal will wake (the store has no Notifier, or
// gave no channel), or whose store reports waiters to holders, which then
// hold back for it whether or not a signal reaches it, polls the key at
// least every hotPoll while the key changes hands between its attempts, or
// its local queue knows that another owner wants it (and for hotFor polls
// after), so that it finds the key free while a holder of another process
// holds back for it (see Locker.yieldAfter).
//
// outer is the caller's context, ctx the one bounded by the wait: the
// breaker (see WithBreaker) admits each attempt, and counts its outcome.
func (l *Locker) contend(outer, ctx context.Context, g *grant, turns []localqueue.Turn, ttl, wait time.Duration, seen heldSeen) error {
	if err := ctx.Err(); err != nil {
		// The wait went by in the local queue: calling the store on the
		// ended context would only fail at once.
		return waitEnded(seen.by(time.Now()), err)
	}
	keys, token := g.keys, g.token
	strategy := l.attempter(g, wait)
	var (
		schedule  *backoffSchedule
		released  <-chan struct{}
		stop      func()
		refused   bool
		watched   = -1 // the index of the key whose releases wake us
		marked    = -1 // the index of the key last recorded as contended
		lastWait  time.Duration
		lastAt    time.Time // when the attempt that answered lastWait began
		hotUntil  time.Time // until when the key counts as changing hands
		attempted bool      // an attempt was made
		writer    bool      // refused by shared holders: the store records a waiting writer
	)
	// giveUp ends the wait without a grant: it leaves the store's queue
	// and withdraws the waiting-writer record of a refusal by shared
	// holders (in the background when the store may be failing).
	giveUp := func(background bool) {
		strategy.leave(ctx, keys, token, background)
		if writer {
			l.withdrawWriter(ctx, keys, token, background)
		}
	}
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	for _, t := range turns {
		if time.Since(t.Contention().RefusedAt) < contendedFor {
			// Processes take turns on the key: it changes hands.
			hotUntil = time.Now().Add(hotFor * l.hotPoll())
		}
	}
	for {
		var (
			done  func(error)
			probe bool
		)
		if l.breaker != nil {
			d, p, derr := l.breaker.allow()
			if derr != nil {
				if attempted { // the waiter may be in the store's queue
					giveUp(true)
				}
				return derr
			}
			done, probe = d, p
		}
		start := time.Now()
		var (
			grant stores.Grant
			ahead int
			err   error
		)
		if probe {
			grant, ahead, err = l.probeAttempt(ctx, strategy, keys, token, ttl)
		} else {
			grant, ahead, err = strategy.attempt(ctx, keys, token, ttl)
		}
		attempted = true
		if l.breaker != nil {
			l.breaker.report(done, breakerOutcome(outer, ctx, err, seen.by(time.Now())))
		}
		if errors.Is(err, errRecorded) {
			return err // a claim found the key's finished record
		}
		if mayHaveGranted(err) || (grant.OK && ctx.Err() != nil) {
			// The store may have granted the keys although we got no
			// answer, or after we stopped listening: release them rather
			// than leave them to their TTL. In the background, bounded by
			// the release timeout, so a stalled store delays no answer.
			go l.releaseAbandoned(g.store(), keys, token, ttl)
		}
		cerr := ctx.Err()
		if cerr == nil && err != nil && deadlinePassed(ctx) {
			// go-redis times the call out by the context's deadline itself,
			// a moment before the context reports it: the wait ended.
			cerr = context.DeadlineExceeded
		}
		writer = writer || (err == nil && !grant.OK && grant.SharedHeld && g.shared == nil)
		if cerr != nil {
			giveUp(err != nil)
			return waitEnded(seen.by(time.Now()) || (err == nil && !grant.OK), cerr)
		}
		switch {
		case errors.Is(err, ErrInvalid):
			// The store refused the keys before acting (Redis Cluster keys
			// in different slots, say): a configuration mistake, not an
			// outage, so never a reason to run unlocked.
			if writer {
				l.withdrawWriter(ctx, keys, token, false)
			}
			return err
		case err != nil:
			giveUp(true)
			return wrapStoreError(err)
		case grant.OK:
			if len(grant.Fences) != len(keys) {
				go l.releaseAbandoned(g.store(), keys, token, ttl)
				return wrapStoreError(errors.New("the store granted a wrong number of fences"))
			}
			g.granted(grant.Fences, ttl, start)
			for _, t := range turns {
				if refused || t.Courtesy {
					t.TurnBegan() // after another owner's turn, or a courtesy
				}
			}
			return nil
		case wait == 0:
			if writer {
				l.withdrawWriter(ctx, keys, token, false)
			}
			return ErrHeld
		}
		seen.held, refused = true, true
		if grant.Held >= 0 && grant.Held < len(turns) && grant.Held != marked {
			// Another owner holds the key: this process is not alone on it.
			turns[grant.Held].Refused()
			marked = grant.Held
		}
		if l.notifier != nil && grant.Held >= 0 && grant.Held < len(keys) && grant.Held != watched {
			// Wake on a release of the key that is held now: the first
			// one, or another once that one was released.
			if stop != nil {
				stop()
			}
			released, stop = l.notifier.NotifyRelease(keys[grant.Held], token)
			watched = grant.Held
			if released != nil && ahead == 0 {
				// A release just before we subscribed would go unseen. In
				// fair mode only the queue's head could have used it.
				continue
			}
		}
		if schedule == nil {
			schedule = newBackoffSchedule(l.backoffInitial, l.backoffMax)
		}
		limit := strategy.sleepCap(grant.Wait)
		if released == nil || l.waits != nil {
			if changedHands(lastWait, lastAt, grant.Wait, start) {
				hotUntil = start.Add(hotFor * l.hotPoll())
			}
			if start.Before(hotUntil) && (limit <= 0 || limit > l.hotPoll()) {
				limit = l.hotPoll()
			}
			lastWait, lastAt = grant.Wait, start
		}
		if !schedule.sleep(ctx, limit, released) {
			giveUp(false)
			return waitEnded(true, ctx.Err())
		}
	}
}

// heldSeen is what a request knows, before its store calls, of its keys
// being held.
type heldSeen struct {
	held    bool      // seen held, and not confirmed free since
	joined  time.Time // when the request began to wait
	freedAt time.Time // when a release the store confirmed freed a key; zero if none
}

// by reports whether a wait that ends at now, with a store call unanswered,
// ended on a held key: seen held, or behind a holder whose release freed
// the key so shortly before that the store's silence says nothing yet (see
// localqueue.SeenHeld).
func (s heldSeen) by(now time.Time) bool {
	return s.held || (!s.freedAt.IsZero() && localqueue.SeenHeld(s.joined, s.freedAt, now))
}

// probeAttempt is the attempt of the breaker's probe, bounded by
// probeBound as well as by ctx. A probe the store left unanswered that long
// is a store failure of the request, not the end of its wait.
func (l *Locker) probeAttempt(ctx context.Context, strategy attempter, keys []string, token string, ttl time.Duration) (stores.Grant, int, error) {
	bound := l.probeBound()
	pctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	g, ahead, err := strategy.attempt(pctx, keys, token, ttl)
	if err != nil && ctx.Err() == nil && !deadlinePassed(ctx) && (pctx.Err() != nil || deadlinePassed(pctx)) {
		return g, ahead, fmt.Errorf("%w: the breaker's probe got no answer within %v: %w", ErrStore, bound, err)
	}
	return g, ahead, err
}

// changedHands reports whether a refusal at at, whose holder keeps the key
// for wait more, may be by another grant than the refusal at lastAt (zero
// when none) with lastWait: the holder's remaining TTL did not shrink with
// the time in between (a new grant, or a renewal), or is unknown.
func changedHands(lastWait time.Duration, lastAt time.Time, wait time.Duration, at time.Time) bool {
	if wait <= 0 {
		return true
	}
	return !lastAt.IsZero() && wait > lastWait-at.Sub(lastAt)/2
}

// breakerOutcome classes an attempt's outcome for the breaker: nil when the
// store answered, errFailure when it failed or ran out the wait bound with
// no sign that the key was held, errExcluded when it says nothing of the
// store (the caller left, its own deadline passed, or a wait on a held key
// ended mid-call).
func breakerOutcome(outer, ctx context.Context, err error, sawHeld bool) error {
	switch {
	case err == nil || errors.Is(err, ErrInvalid) || errors.Is(err, ErrNotHeld) || errors.Is(err, errRecorded):
		return nil
	case outer.Err() != nil || deadlinePassed(outer):
		return errExcluded
	case ctx.Err() != nil || deadlinePassed(ctx):
		if sawHeld {
			return errExcluded
		}
	}
	return errFailure
}

// deadlinePassed reports whether ctx has a deadline and it has passed.
func deadlinePassed(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// mayHaveGranted reports whether a failed attempt may have left a grant
// for the Locker to release: a store refuses invalid arguments before it
// acts, a call that never reached it changed nothing, and a store that
// abandoned a call in flight cleans up after it itself.
func mayHaveGranted(err error) bool {
	return err != nil && !errors.Is(err, ErrInvalid) && !errors.Is(err, stores.ErrUnreachable) &&
		!errors.Is(err, stores.ErrAbandoned)
}
