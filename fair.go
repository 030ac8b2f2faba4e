package reqlock

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// Bounds of fair mode.
const (
	// minFairLease is the shortest lease WithFairness accepts: waiters poll
	// at least every lease/3, and a lease much shorter than scheduling
	// delays would make live waiters lose their place.
	minFairLease = 30 * time.Millisecond
)

// WithFairness turns on fair mode: the store keeps a FIFO queue of the
// contending processes per key and grants a free key only to the head of
// that queue, so that processes are served in the order they came, and a
// waiter whose process died blocks the queue for a bounded time only. lease
// is how long a waiter keeps its place without renewing it (2s suits most
// services; at least 30ms). New returns an error wrapping ErrInvalid when the
// store does not implement stores.FairStore or lease is below 30ms. Fair mode
// applies to locks of one key; a lock of several keys takes them whenever
// they are all free.
//
// By default a Locker is fair only inside its process: requests of one
// process queue locally in arrival order, but the store grants a free key to
// whichever process asks first, so a process can be overtaken again and
// again by faster ones.
//
// # What is queued
//
// Only the head of a process's local queue contends with the store, so the
// store's queue holds at most one entry per process and key: the token of
// that process's current contender. When it is granted, the next local
// waiter becomes the contender and joins the store's queue at the tail,
// behind the processes that were already waiting. Under sustained contention
// processes thus take turns round-robin, and requests inside a process keep
// their local FIFO order. It is not a global FIFO of every request of the
// fleet: that would need every waiting request to talk to the store, which
// the one-contender-per-process design avoids.
//
// # Liveness
//
// Each queue entry carries the lease. A contender renews it with every
// attempt, and attempts at least every lease/3 (the backoff sleep is capped
// at lease/3; a release still wakes it at once through stores.Notifier). A process that dies stops renewing: once
// its lease has passed, the next attempt of any other waiter removes it, and
// the store signals that removal like a release, so the new head attempts at
// once. A dead waiter at the head of the queue therefore blocks the key for
// at most lease after its last attempt plus one poll interval (lease/3) of
// the waiters behind it, plus a few round trips. A live waiter stalled for
// longer than its lease (a long GC pause) may be dropped the same way; its
// next attempt joins the queue again, at the tail. A waiter whose wait ends
// (its deadline passes or its context is cancelled) leaves the queue before
// Obtain returns (stores.FairStore.LeaveFair, on a context that the caller's
// cancellation cannot end, bounded by the release timeout and the lease; in
// the background when its last attempt went unanswered); if that call fails,
// the lease removes it.
//
// # Local handoff
//
// Fair mode turns local handoff off (it sets the handoff count to zero,
// whatever WithHandoff says): handing a held lock to the next local waiter
// would let it pass waiters of other processes that queued before it. Each
// grant therefore goes back to the store and costs a release and a fair
// acquire, so fair mode has lower throughput on hot keys; and each release
// wakes the contender of every waiting process, of which only the queue's
// head can be granted. Handing off only
// while the store's queue is empty would need the queue's state at release
// time, which costs the round trip that handoff exists to save.
//
// # Try once, fences, mixed Lockers
//
// A try-once Obtain (wait zero) does not join the queue: it is granted only
// when the key is free and nobody waits in the store's queue, and otherwise
// returns ErrHeld. In fair mode ErrHeld (alone, or joined with ErrWaitEnded)
// also covers a free key that waiters ahead of the caller are about to take.
//
// A fair grant issues its fence by the same rule as a plain one, so
// fences grow across fair and ordinary grants of a key. Fairness holds among
// fair Lockers: a Locker without fair mode on the same key space ignores the
// queue and may take a free key ahead of it.
func WithFairness(lease time.Duration) Option {
	return func(l *Locker) error {
		if lease < minFairLease {
			return fmt.Errorf("WithFairness: lease %v is below %v", lease, minFairLease)
		}
		l.fair = &fairMode{lease: lease}
		return nil
	}
}

// fairMode is a fair Locker's state; immutable after New.
type fairMode struct {
	store stores.FairStore
	lease time.Duration
}

// attempts returns the acquire strategy of one fair waiter: with a wait it
// joins the store's queue; a try-once caller (wait zero) only tries.
func (f *fairMode) attempts(l *Locker, wait time.Duration) attempter {
	a := fairAttempts{locker: l, mode: f}
	if wait > 0 {
		a.lease = f.lease
	}
	return a
}

// fairAttempts is the acquire strategy of fair mode.
type fairAttempts struct {
	locker *Locker
	mode   *fairMode
	lease  time.Duration // the waiter's place in the store's queue; zero: none
}

func (a fairAttempts) attempt(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, int, error) {
	g, err := a.mode.store.AcquireFair(ctx, keys[0], token, ttl, a.lease)
	return g.Grant, g.Ahead, err
}

// sleepCap caps a fair waiter's next sleep: by the store's hint when it is
// known, and always by lease/3, so that the waiter renews its lease in time.
func (a fairAttempts) sleepCap(hint time.Duration) time.Duration {
	if a.lease == 0 {
		return hint
	}
	limit := a.lease / 3
	if hint > 0 && hint < limit {
		return hint
	}
	return limit
}

// leave takes the waiter out of the store's queue on a context that ctx's
// cancellation cannot end, bounded by the release timeout and the lease
// (after the lease the store drops the token anyway); in the background
// when the store may be failing, so that it holds up no answer. A failure
// is logged at Debug (an outage is logged once, see WithBreaker): the
// waiter's place lapses with its lease.
func (a fairAttempts) leave(ctx context.Context, keys []string, token string, background bool) {
	if a.lease == 0 {
		return
	}
	leave := func(ctx context.Context) {
		l := a.locker
		ctx, cancel := context.WithTimeout(ctx, min(l.releaseTimeout, a.lease))
		defer cancel()
		if err := a.mode.store.LeaveFair(ctx, keys[0], token); err != nil {
			l.logger.Debug("reqlock: leaving the fair queue failed; the waiter's place lapses with its lease",
				slog.String("key", keys[0]), slog.Duration("lease", a.lease), slog.Any("error", err))
		}
	}
	if background {
		go leave(context.WithoutCancel(ctx))
		return
	}
	leave(context.WithoutCancel(ctx))
}
