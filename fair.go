package reqlock

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// Defaults and bounds of fair mode.
const (
	// DefaultFairLease is how long a fair waiter keeps its place in the
	// store's queue without renewing it, unless FairOptions.Lease says
	// otherwise.
	DefaultFairLease = 2 * time.Second
	// MinFairLease is the shortest lease FairOptions accepts: waiters poll
	// at least every Lease/3, and a lease much shorter than scheduling
	// delays would make live waiters lose their place.
	MinFairLease = 30 * time.Millisecond
)

// FairStore is implemented by stores that keep a FIFO queue of waiters per
// key for fair mode (see WithFairness). Keys arrive with the Locker's prefix
// applied, as for Store. Tokens are the random tokens the Locker grants
// with; each identifies one contender.
type FairStore interface {
	// AcquireFair is one attempt of a fair waiter, in one atomic step: it
	// removes waiters whose lease has passed, enqueues token at the tail
	// when it is not queued yet, renews token's lease to lease from now,
	// and sets key to token with the given TTL only when key is free and
	// token heads the queue (or the queue is empty). A grant takes token
	// out of the queue and issues a fence from the same counter as
	// Acquire, so fences grow across fair and ordinary grants.
	//
	// With lease zero the call only tries: token does not join the queue,
	// and the grant needs a free key and an empty queue.
	//
	// A refusal is not an error: it returns a FairGrant with OK false,
	// whose HolderTTL is how long nothing is expected to change: the
	// holder's remaining TTL, or, when key is free but another waiter
	// heads the queue, that waiter's remaining lease; zero when unknown.
	// Its Ahead says where token stands in the queue.
	AcquireFair(ctx context.Context, key, token string, ttl, lease time.Duration) (FairGrant, error)

	// LeaveFair takes token out of key's queue. Leaving a queue that does
	// not hold token is not an error. When token headed the queue and key
	// is free, the store signals the waiters as if key had been released
	// (stores that implement ReleaseNotifier), so the next one need not
	// wait for its next poll.
	LeaveFair(ctx context.Context, key, token string) error
}

// FairGrant is the outcome of one FairStore.AcquireFair attempt.
type FairGrant struct {
	Grant

	// Ahead is, on a refusal, how many waiters are queued ahead of the
	// token: zero when it heads the queue, -1 when it is not queued (a
	// try with lease zero). Waiters whose lease has passed count until an
	// attempt drops them. Zero on a grant.
	Ahead int
}

// FairOptions configures fair mode (see WithFairness).
type FairOptions struct {
	// Lease is how long a waiter keeps its place in the store's queue
	// without renewing it: a waiter that died stops blocking the queue
	// about this long after its last attempt. Waiters renew it with every
	// attempt, at least every Lease/3. Default DefaultFairLease; at least
	// MinFairLease.
	Lease time.Duration
}

// WithFairness turns on fair mode: the store keeps a FIFO queue of the
// contending processes per key and grants a free key only to the head of
// that queue, so that processes are served in the order they came, and a
// waiter whose process died blocks the queue for a bounded time only. New
// returns an error wrapping ErrInvalid when the store does not implement
// FairStore or opts.Lease is below MinFairLease.
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
// Each queue entry carries a lease (opts.Lease, default DefaultFairLease).
// A contender renews it with every attempt, and attempts at least every
// Lease/3 (the backoff sleep is capped at Lease/3; a release still wakes it
// at once through ReleaseNotifier). A process that dies stops renewing: once
// its lease has passed, the next attempt of any other waiter removes it, and
// the store signals that removal like a release, so the new head attempts at
// once. A dead waiter at the head of the queue therefore blocks the key for
// at most Lease after its last attempt plus one poll interval (Lease/3) of
// the waiters behind it, plus a few round trips. A live waiter stalled for
// longer than its lease (a long GC pause) may be dropped the same way; its
// next attempt joins the queue again, at the tail. A waiter whose wait ends
// (its deadline passes or its context is cancelled) leaves the queue before
// Obtain returns (FairStore.LeaveFair, on a context that the caller's
// cancellation cannot end, bounded by the release timeout and the lease);
// if that call fails, the lease removes it.
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
// A fair grant issues its fence from the same counter as Store.Acquire, so
// fences grow across fair and ordinary grants of a key. Fairness holds among
// fair Lockers: a Locker without fair mode on the same key space ignores the
// queue and may take a free key ahead of it.
func WithFairness(opts FairOptions) Option {
	return func(l *Locker) { l.fair = &fairness{lease: opts.Lease} }
}

// fairness is a fair Locker's state; immutable after New.
type fairness struct {
	store FairStore
	lease time.Duration
}

// Fair reports whether the Locker runs in fair mode (WithFairness).
func (l *Locker) Fair() bool { return l.fair != nil }

// withFairness completes New: it validates fair mode when it was asked for
// and returns the Locker, or nil and an error wrapping ErrInvalid.
func (l *Locker) withFairness() (*Locker, error) {
	if l.fair == nil {
		return l, nil
	}
	fs, ok := l.store.(FairStore)
	if !ok {
		return nil, fmt.Errorf("%w: fair mode needs a store that implements reqlock.FairStore; %T does not",
			ErrInvalid, l.store)
	}
	if l.fair.lease == 0 {
		l.fair.lease = DefaultFairLease
	}
	if l.fair.lease < MinFairLease {
		return nil, fmt.Errorf("%w: fair lease %v is below %v", ErrInvalid, l.fair.lease, MinFairLease)
	}
	l.fair.store = fs
	l.handoffCount = 0 // see WithFairness
	return l, nil
}

// fairPoll caps a fair waiter's next sleep: by the store's hint when it is
// known, and always by lease/3, so that the waiter renews its lease in time.
func (l *Locker) fairPoll(hint time.Duration) time.Duration {
	limit := l.fair.lease / 3
	if hint > 0 && hint < limit {
		return hint
	}
	return limit
}

// leaveFair takes token out of the store's queue on a context that ctx's
// cancellation cannot end, bounded by the release timeout and the lease
// (after the lease the store drops the token anyway). A failure is logged:
// the token's place lapses with its lease.
func (l *Locker) leaveFair(ctx context.Context, storeKey, token string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(l.releaseTimeout, l.fair.lease))
	defer cancel()
	if err := l.fair.store.LeaveFair(ctx, storeKey, token); err != nil {
		l.logger.Warn("reqlock: leaving the fair queue failed; the waiter's place lapses with its lease",
			slog.String("key", storeKey), slog.Duration("lease", l.fair.lease), slog.Any("error", err))
	}
}
