package reqlock

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/reqlock/reqlock/internal/localqueue"
	"github.com/reqlock/reqlock/stores"
)

// Defaults of a Locker, written in one place.
const (
	defaultKeyPrefix      = "reqlock:"
	defaultReleaseTimeout = 2 * time.Second
	defaultHandoffCount   = 16
	defaultHandoffTime    = 50 * time.Millisecond
)

// Locker obtains locks from a store. It is safe for concurrent use and is
// meant to be shared by every route of a service.
//
// Requests of one process that want the same key queue locally, in arrival
// order, and only the first of them talks to the store. When the holder lets
// go while others of its process wait, the Locker may hand the still-held
// grant to the next of them without a store round trip (see WithHandoff).
// A waiter sleeps on a timer, and wakes early when the store signals a
// release (stores that implement stores.Notifier).
type Locker struct {
	store          stores.Store
	notifier       stores.Notifier     // nil when the store cannot signal releases
	waits          stores.WaitReporter // nil when the store does not report waiters
	sharedStore    stores.SharedStore  // nil when the store has no shared grants
	records        stores.RecordStore  // nil when the store keeps no idempotency records
	bounds         stores.Bounds       // the keys and TTLs the store honours
	fair           *fairMode           // nil unless WithFairness
	prefix         string
	backoffInitial time.Duration
	backoffMax     time.Duration
	releaseTimeout time.Duration
	handoffCount   int
	handoffTime    time.Duration
	logger         *slog.Logger
	metrics        Metrics // nil unless WithMetrics
	queues         *localqueue.Queues
	plain          attempter // plain attempts on the store
	claims         attempter // claims of record keys (see ClaimRecord); nil without records
	expiries       expiries  // the validity of every lock with a context

	breakerFailures int           // WithBreaker; 0: off
	breakerProbe    time.Duration // WithBreaker
	breaker         *breaker      // nil when off
	outage          OutageMetrics // metrics, when they implement it
	pending         pendingSet    // releases to retry
}

// Option configures a Locker. An option given a value that means nothing
// makes New fail, naming the option.
type Option func(*Locker) error

// WithKeyPrefix sets the prefix of every stored key; it must not be empty.
// Default "reqlock:".
func WithKeyPrefix(prefix string) Option {
	return func(l *Locker) error {
		if prefix == "" {
			return errors.New("WithKeyPrefix: the prefix is empty; every key needs a prefix that sets it apart")
		}
		l.prefix = prefix
		return nil
	}
}

// WithBackoff sets how waiters space their attempts: the first sleep is
// initial, and each next one twice the last, up to max, each randomised by
// ±50% and cut short when the store signals a release or the holder's lease
// ends. While the key changes hands between a waiter's attempts (a hot key),
// a waiter that no release signal wakes, or whose store reports waiters
// (stores.WaitReporter), sleeps at most the shorter of max and 10ms, so
// that it finds the key free while another process holds back for it (see
// WithHandoff). Default 5ms and 200ms.
func WithBackoff(initial, max time.Duration) Option {
	return func(l *Locker) error {
		if initial <= 0 || max < initial {
			return fmt.Errorf("WithBackoff: initial %v must be positive and max %v at least initial", initial, max)
		}
		l.backoffInitial, l.backoffMax = initial, max
		return nil
	}
}

// WithReleaseTimeout bounds each store call that no wait bounds: a release,
// which runs on a context that the caller's cancellation cannot end, and the
// one attempt of an Obtain that does not wait (wait 0), which fails when
// the store has not answered by then as a wait that ended with the store
// unanswered does: ErrWaitEnded without ErrHeld, OutcomeStoreError (503 in
// the middleware). Default 2s.
func WithReleaseTimeout(d time.Duration) Option {
	return func(l *Locker) error {
		if d <= 0 {
			return fmt.Errorf("WithReleaseTimeout: %v is not positive", d)
		}
		l.releaseTimeout = d
		return nil
	}
}

// WithHandoff bounds local handoff: a grant is passed from local holder to
// local waiter at most count times, and not after maxTime since the store
// granted it; then it goes back to the store, so that other processes get
// their turn. Count zero turns handoff off. Default 16 and 50ms; count below
// stores.FenceStride.
//
// When the grant goes back while this process still has waiters, the next
// of them holds back before it contends: for two round trips of the
// release, which a waiter of another process that the release signal woke
// needs to reach the store; or, for waiters that may be polling, for twice
// the hot-key poll of WithBackoff (20ms by default) plus those round trips,
// a courtesy, so that they find the key free. A process gives the courtesy
// once per turn: when it has had the key for five hot-key polls (50ms by
// default) since it got it from another owner or held back last, across
// handoff chains, and another owner wants it. A store that reports waiters
// (stores.WaitReporter) says when one does: the grant refused one. On a
// store that neither signals releases nor reports waiters, the process
// counts the key wanted for a second after the store last refused it, and
// holds back once a second for owners it cannot know of. Holding back
// costs nothing while another owner takes the key meanwhile; in fair mode
// the store's queue orders the processes instead.
func WithHandoff(count int, maxTime time.Duration) Option {
	return func(l *Locker) error {
		if count < 0 || count >= stores.FenceStride || maxTime < 0 {
			return fmt.Errorf("WithHandoff: count %d (0 to %d) or time %v (not negative) out of range",
				count, stores.FenceStride-1, maxTime)
		}
		l.handoffCount, l.handoffTime = count, maxTime
		return nil
	}
}

// WithLogger sets where the Locker logs what it cannot return: a lock lost
// while its holder worked, and one line each when the store goes down and
// comes back (see WithBreaker); failed releases, retried in the background,
// at Debug only. Default slog.Default().
func WithLogger(logger *slog.Logger) Option {
	return func(l *Locker) error {
		if logger == nil {
			return errors.New("WithLogger: the logger is nil")
		}
		l.logger = logger
		return nil
	}
}

// WithMetrics makes the Locker report its events to m. Default: none.
func WithMetrics(m Metrics) Option {
	return func(l *Locker) error {
		if m == nil {
			return errors.New("WithMetrics: the metrics are nil")
		}
		l.metrics = m
		return nil
	}
}

// New returns a Locker over store. It returns an error wrapping ErrInvalid,
// naming the problem, when store is nil or an option is invalid.
func New(store stores.Store, opts ...Option) (*Locker, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalid)
	}
	l := &Locker{
		store:          store,
		prefix:         defaultKeyPrefix,
		backoffInitial: defaultBackoffInitial,
		backoffMax:     defaultBackoffMax,
		releaseTimeout: defaultReleaseTimeout,
		handoffCount:   defaultHandoffCount,
		handoffTime:    defaultHandoffTime,
		logger:         slog.Default(),
		queues:         localqueue.New(),

		breakerFailures: defaultBreakerFailures,
		breakerProbe:    defaultBreakerProbe,
	}
	l.pending = pendingSet{l: l, max: defaultMaxPending, stop: make(chan struct{}), kick: make(chan struct{}, 1)}
	for _, opt := range opts {
		if err := opt(l); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	l.notifier, _ = store.(stores.Notifier)
	l.waits, _ = store.(stores.WaitReporter)
	if b, ok := store.(stores.Bounded); ok {
		l.bounds = b.Bounds()
	}
	if err := l.checkKeyLen(len(l.prefix) + 1); err != nil {
		return nil, fmt.Errorf("%w (WithKeyPrefix %q)", err, l.prefix)
	}
	l.sharedStore, _ = store.(stores.SharedStore)
	plain := plainAttempts{store: store}
	if l.sharedStore != nil {
		plain.writerCap = stores.WriterWindow / 2
	}
	l.plain = plain
	if l.records, _ = store.(stores.RecordStore); l.records != nil {
		l.claims = plainAttempts{store: recordOps{Store: store, records: l.records}}
	}
	l.outage, _ = l.metrics.(OutageMetrics)
	if l.breakerFailures > 0 {
		l.breaker = newBreaker(l, l.breakerFailures, l.breakerProbe)
	}
	if l.fair != nil {
		fs, ok := store.(stores.FairStore)
		if !ok {
			return nil, fmt.Errorf("%w: WithFairness: fair mode needs a store that implements stores.FairStore; %T does not",
				ErrInvalid, store)
		}
		l.fair.store = fs
		if err := l.CheckTTL(l.fair.lease); err != nil {
			return nil, fmt.Errorf("WithFairness: the lease: %w", err)
		}
		l.handoffCount = 0 // see WithFairness
	}
	return l, nil
}

// MustNew is like New but panics on an invalid configuration. Use it at
// start-up only.
func MustNew(store stores.Store, opts ...Option) *Locker {
	l, err := New(store, opts...)
	if err != nil {
		panic(err)
	}
	return l
}

// Bounds returns the keys and TTLs the Locker's store honours (see
// stores.Bounded); the zero Bounds when the store states none.
func (l *Locker) Bounds() stores.Bounds { return l.bounds }

// CheckTTL returns an error wrapping ErrInvalid, naming the store, its range
// and what sets it, when the store cannot honour ttl (see stores.Bounded).
// Obtain and Refresh refuse such a TTL; the middleware checks each route's
// TTL with it at start-up.
func (l *Locker) CheckTTL(ttl time.Duration) error {
	if err := l.bounds.CheckTTL("ttl", ttl); err != nil {
		return fmt.Errorf("%w (store %T)", err, l.store)
	}
	return nil
}

// CheckKeyLen returns an error wrapping ErrInvalid, naming the store and its
// limit, when a key of n bytes (without the Locker's prefix) is longer than
// the store accepts. Obtain refuses such a key; the middleware checks each
// route's longest key with it at start-up.
func (l *Locker) CheckKeyLen(n int) error {
	return l.checkKeyLen(len(l.prefix) + n)
}

// checkKeyLen checks a stored key's length, prefix included.
func (l *Locker) checkKeyLen(n int) error {
	if limit := l.bounds.MaxKeyBytes; limit > 0 && n > limit {
		return fmt.Errorf("%w: a key of %d bytes with its prefix is longer than the limit of %d bytes of store %T%s",
			ErrInvalid, n, limit, l.store, reasonSuffix(l.bounds))
	}
	return nil
}

// checkArgs refuses keys and a TTL that the store cannot honour, before any
// store call. It allocates nothing when they are in bounds.
func (l *Locker) checkArgs(keys []string, ttl time.Duration) error {
	if limit := l.bounds.MaxKeyBytes; limit > 0 {
		for _, k := range keys {
			if len(l.prefix)+len(k) > limit {
				return fmt.Errorf("%w: key %s of %d bytes with its prefix is longer than the limit of %d bytes of store %T%s",
					ErrInvalid, stores.KeyForMessage(k), len(l.prefix)+len(k), limit, l.store, reasonSuffix(l.bounds))
			}
		}
	}
	if ttl < l.bounds.MinTTL || (l.bounds.MaxTTL > 0 && ttl > l.bounds.MaxTTL) {
		return l.CheckTTL(ttl)
	}
	return nil
}

// reasonSuffix is ", set by " and b.Reason, or nothing.
func reasonSuffix(b stores.Bounds) string {
	if b.Reason == "" {
		return ""
	}
	return ", set by " + b.Reason
}

// Logger returns the logger the Locker reports to.
func (l *Locker) Logger() *slog.Logger { return l.logger }

// Metrics returns the Metrics the Locker reports to, or nil.
func (l *Locker) Metrics() Metrics { return l.metrics }

// Obtain acquires the lock on key for ttl: ObtainAll with one key.
func (l *Locker) Obtain(ctx context.Context, key string, ttl, wait time.Duration) (*Lock, error) {
	return l.ObtainAll(ctx, []string{key}, ttl, wait)
}

// ObtainAll acquires every one of keys as one lock, for ttl: all of them or
// none. The keys are sorted and de-duplicated first, so two requests whose
// key sets overlap never wait for each other in a cycle; one attempt never
// holds some keys while it waits for others, and never leaves a partial
// grant behind. The lock has a fence per key (Lock.FenceOf).
//
// With wait zero it tries once. Otherwise it retries with exponential
// backoff and jitter, sleeping on a timer between attempts (never longer
// than the holder's remaining TTL, and waking early when the store signals a
// release), until the lock is granted, wait has passed, or ctx ends,
// whichever comes first. Each store call is bounded by the same deadline, so
// a stalled store cannot hold the caller past its wait.
//
// Keys go through their local queues: the requests of this process that want
// a key wait for it in arrival order, and only the first talks to the store
// (see Locker). A request for several keys takes the turn of each key in
// their sorted order, then contends for all of them at once; so requests for
// one key and for several share the keys fairly within a process, and a
// request for several is never starved by a stream of requests for one. A
// grant of several keys is never handed on locally: it goes back to the
// store, and each key's next waiter contends.
//
// Errors (see OutcomeOf for how they sort):
//   - ErrHeld: tried once and a key is held by another owner;
//   - ErrWaitEnded joined with ctx's error, and with ErrHeld when the key
//     was seen held, by this request or by the ones ahead of it in the
//     local queue (without ErrHeld, a store call was still unanswered when
//     the wait ended; unless ctx itself ended, the error then matches
//     ErrStore too). After a local holder's release that the store
//     confirmed, the key counts as held only until the store has left the
//     next call unanswered for longer than the request waited behind that
//     holder (and 50ms): then the store is silent, not the key busy;
//   - ErrStore: the store failed; store failures are not retried. Also a
//     wait that ended with a store call unanswered and no sign that the
//     key was held, and the error of a request of this process that was
//     queued behind one that met a store failure on the key: it answers at
//     once, without calling the store itself;
//   - ErrStoreDown (matching ErrStore): refused at once, without a store
//     call, while the breaker counts the store down (see WithBreaker);
//   - ErrInvalid: no keys, an empty key, a non-positive TTL, a negative
//     wait, a key or TTL out of the store's bounds (see CheckTTL and
//     CheckKeyLen), or keys the store refuses to lock together;
//   - ErrLockLost (with ErrNotHeld): ctx carries this request's own lock on
//     a key, and that lock was lost.
//
// When the store may have granted the lock but ObtainAll cannot use it (ctx
// ended, or the store call failed after it may have run), the grant is
// released in the background, owner-checked, bounded by the release timeout,
// and retried while the store fails (see WithPendingReleases).
//
// Reentrancy: keys that a lock in ctx already holds (see NewContext; the
// middleware puts each request's lock there) are not waited for: the lock
// returned takes a hold on that lock's grant, with its fence, and only the
// other keys are acquired. A grant is released in the store when its last
// hold ends. gin's *gin.Context is a context.Context that does not reach
// its request's context; behind ginlock's middleware, ObtainAll(c, ...)
// uses the request's context, as if called with c.Request.Context().
func (l *Locker) ObtainAll(ctx context.Context, keys []string, ttl, wait time.Duration) (*Lock, error) {
	return l.obtainReported(ctx, keys, mode{}, ttl, wait)
}

// obtainReported is obtain on the request's context, with the outcome
// reported to the breaker's and the Locker's metrics.
func (l *Locker) obtainReported(ctx context.Context, keys []string, m mode, ttl, wait time.Duration) (*Lock, error) {
	ctx = requestContext(ctx)
	start := time.Now()
	label := labelOf(ctx)
	lock, err := l.obtain(ctx, label, keys, m, ttl, wait)
	if err != nil && l.breaker != nil && errors.Is(err, ErrStoreDown) {
		l.breaker.rejected.Add(1)
		if l.outage != nil {
			l.outage.RejectedStoreDown(label)
		}
	}
	if l.metrics != nil {
		l.metrics.Obtained(label, OutcomeOf(ctx, err), time.Since(start))
	}
	return lock, err
}

// obtain is ObtainAll of keys in mode m: exclusive, or for a single key
// shared or limited.
func (l *Locker) obtain(ctx context.Context, label string, keys []string, m mode, ttl, wait time.Duration) (*Lock, error) {
	switch {
	case len(keys) == 0:
		return nil, fmt.Errorf("%w: no keys", ErrInvalid)
	case slices.Contains(keys, ""):
		return nil, fmt.Errorf("%w: empty key", ErrInvalid)
	case ttl <= 0:
		return nil, fmt.Errorf("%w: ttl %v is not positive", ErrInvalid, ttl)
	case wait < 0:
		return nil, fmt.Errorf("%w: wait %v is negative", ErrInvalid, wait)
	}
	if err := l.checkArgs(keys, ttl); err != nil {
		return nil, err
	}
	if m.shared {
		if err := l.CheckShared(); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		if cause := context.Cause(ctx); errors.Is(cause, ErrLockLost) {
			// The context of a lock this request holds ended with it.
			return nil, fmt.Errorf("%w: the request's lock was lost: %w", ErrNotHeld, cause)
		}
		return nil, errors.Join(ErrWaitEnded, err)
	}
	if len(keys) > 1 {
		keys = slices.Compact(slices.Sorted(slices.Values(keys)))
	}
	var holds []hold
	rest := keys
	if holdsLocks(ctx) {
		var err error
		if holds, rest, err = l.reenter(ctx, keys, m); err != nil {
			return nil, err
		}
	}
	if len(rest) > 0 {
		var (
			h   hold
			err error
		)
		if m.shared {
			h, err = l.acquireShared(ctx, label, rest, m, ttl, wait)
		} else {
			h, err = l.acquire(ctx, label, rest, ttl, wait)
		}
		if err != nil {
			l.dropAll(ctx, holds)
			return nil, err
		}
		switch {
		case len(holds) == 0 && len(keys) == 1:
			return l.newKeyLock(label, keys[0], h), nil
		case len(holds) == 0:
			return l.newLock(label, keys, []hold{h}), nil
		}
		holds = append([]hold{h}, holds...)
	}
	return l.newLock(label, keys, holds), nil
}

// acquire obtains a grant of keys, none of which ctx's locks hold: a single
// key through its local queue (from a handoff or the store), several keys
// from the store.
func (l *Locker) acquire(ctx context.Context, label string, keys []string, ttl, wait time.Duration) (hold, error) {
	if l.breaker != nil && l.breaker.rejecting() {
		return hold{}, l.breaker.downError() // before queueing: nobody calls the store
	}
	joined := time.Now()
	g := l.newGrant(keys)
	// The wait bounds every store call of the attempt; a try-once attempt
	// gets the release timeout, so that a stalled store cannot hold it
	// for as long as the client library's own timeouts and retries.
	bound := wait
	if wait == 0 {
		bound = l.releaseTimeout
	}
	outer := ctx
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	if len(keys) > 1 {
		turns, seen, err := l.joinAll(outer, ctx, g.keys, wait)
		if err != nil {
			return hold{}, storeSilent(outer, err)
		}
		seen.joined = joined
		if err := l.contend(outer, ctx, g, turns, ttl, wait, seen); err != nil {
			err = storeSilent(outer, err)
			passOn(turns, err)
			return hold{}, err
		}
		g.beginEpoch(label, ttl)
		g.holdTurns(turns)
		return hold{g: g}, nil
	}
	turn, err := l.queues.Join(ctx, g.keys[0], wait > 0, l.backoffMax, true)
	switch {
	case errors.Is(err, localqueue.ErrBusy):
		return hold{}, ErrHeld // another request of this process has the key
	case err != nil:
		// The wait ended in the queue: behind a key seen held, a
		// timeout; behind a store call that never answered, a store
		// failure.
		l.giveUp(turn)
		if turn.Failed != nil {
			return hold{}, sharedOrLeft(outer, turn.AfterHeld, turn.Failed)
		}
		return hold{}, storeSilent(outer, waitEnded(turn.AfterHeld, err))
	case turn.Failed != nil:
		// The request ahead met a store failure on the key: answer it
		// now, as every waiter behind does, rather than call the store
		// in turn.
		turn.PassFailed(turn.Failed)
		return hold{}, sharedOrLeft(outer, turn.AfterHeld, turn.Failed)
	}
	if turn.Yield > 0 && !sleepFor(ctx, turn.Yield) {
		if !turn.FreedAt.IsZero() {
			turn.PassFreed(0, false)
		} else {
			turn.Pass(0, true)
		}
		return hold{}, waitEnded(true, ctx.Err())
	}
	if turn.Handoff != nil {
		h, err := l.takeHandoff(ctx, label, turn, ttl)
		if h.g != nil || err != nil {
			return h, err
		}
		// The handed-off grant was lost: contend for a new one.
	}
	// A request that queued behind a local holder, or behind a contender
	// that saw the key held, has seen the key held: if its wait ends in its
	// first store call, that is a timeout, not a store that never answered.
	// After a release the store confirmed, the key was free since: only a
	// store call unanswered for a short while still counts it held.
	g.oneTurn[0] = turn
	seen := heldSeen{held: turn.AfterHeld && turn.FreedAt.IsZero(), joined: joined, freedAt: turn.FreedAt}
	if err := l.contend(outer, ctx, g, g.oneTurn[:], ttl, wait, seen); err != nil {
		err = storeSilent(outer, err)
		passOn(g.oneTurn[:], err)
		return hold{}, err
	}
	g.beginEpoch(label, ttl)
	g.holdTurn(turn)
	return hold{g: g}, nil
}

// joinAll takes the local turn of every key (as stored, sorted), one after
// the other in that order, so that requests for overlapping keys of this
// process queue in arrival order without waiting for each other in a
// cycle. It reports what it saw of the keys being held on the way (see
// heldSeen; the caller sets joined). When a turn cannot be had, it gives
// back those it took.
func (l *Locker) joinAll(outer, ctx context.Context, storeKeys []string, wait time.Duration) ([]localqueue.Turn, heldSeen, error) {
	turns := make([]localqueue.Turn, 0, len(storeKeys))
	giveBack := func(afterHeld bool) {
		for _, t := range turns {
			t.Pass(0, afterHeld)
		}
	}
	var heldBefore bool // a key seen held while waiting
	var seen heldSeen
	var yield time.Duration
	for i, k := range storeKeys {
		turn, err := l.queues.Join(ctx, k, wait > 0, l.backoffMax, false)
		switch {
		case errors.Is(err, localqueue.ErrBusy):
			giveBack(false)
			return nil, heldSeen{}, ErrHeld
		case err != nil:
			l.giveUp(turn)
			if turn.Failed != nil {
				// The failure is k's: the other keys' waiters contend.
				giveBack(heldBefore)
				return nil, heldSeen{}, sharedOrLeft(outer, heldBefore || turn.AfterHeld, turn.Failed)
			}
			held := heldBefore || turn.AfterHeld
			giveBack(held)
			return nil, heldSeen{}, waitEnded(held, err)
		case turn.Failed != nil:
			// Shared on k's turn only: the other keys' waiters did not
			// meet it, and contend.
			turn.PassFailed(turn.Failed)
			giveBack(heldBefore)
			return nil, heldSeen{}, sharedOrLeft(outer, heldBefore || turn.AfterHeld, turn.Failed)
		}
		if i < len(storeKeys)-1 {
			// Its waiters wait for the next keys too, which may be held.
			turn.WaitsElsewhere()
		}
		turns = append(turns, turn)
		heldBefore = heldBefore || turn.AfterHeld
		seen.held = seen.held || (turn.AfterHeld && turn.FreedAt.IsZero())
		if turn.FreedAt.After(seen.freedAt) {
			seen.freedAt = turn.FreedAt // the latest release: the shortest silence
		}
		yield = max(yield, turn.Yield)
	}
	if yield > 0 && !sleepFor(ctx, yield) {
		giveBack(true)
		return nil, heldSeen{}, waitEnded(true, ctx.Err())
	}
	return turns, seen, nil
}

// takeHandoff takes the grant a local holder handed on with turn, capping
// its validity to ttl and renewing it first when less than half of ttl is
// left. It returns no grant and no error when the grant turned out lost: the
// caller then contends anew with turn.
func (l *Locker) takeHandoff(ctx context.Context, label string, turn localqueue.Turn, ttl time.Duration) (hold, error) {
	g := turn.Handoff.(*grant)
	epoch := g.adopt(turn, label, ttl)
	if l.metrics != nil {
		l.metrics.HandedOff(label)
	}
	if err := ctx.Err(); err != nil {
		_ = g.drop(ctx, epoch) // to the next waiter, or back to the store
		return hold{}, waitEnded(true, err)
	}
	if time.Until(g.ValidUntil()) >= ttl/2 {
		return hold{g: g, epoch: epoch}, nil
	}
	err := g.refresh(ctx, epoch, ttl)
	switch {
	case err == nil:
		return hold{g: g, epoch: epoch}, nil
	case errors.Is(err, ErrNotHeld):
		g.abandon()
		return hold{}, nil
	}
	_ = g.drop(ctx, epoch)
	if cerr := ctx.Err(); cerr != nil {
		return hold{}, waitEnded(true, cerr)
	}
	return hold{}, err
}

// giveUp hands on a turn this request will not use: a held grant through
// its normal end, a turn to contend to the next waiter.
func (l *Locker) giveUp(turn localqueue.Turn) {
	switch {
	case turn.Failed != nil:
		turn.PassFailed(turn.Failed)
		return
	case turn.Handoff == nil && !turn.FreedAt.IsZero():
		turn.PassFreed(turn.Yield, false)
		return
	case turn.Handoff == nil:
		turn.Pass(turn.Yield, turn.AfterHeld)
		return
	}
	g := turn.Handoff.(*grant)
	epoch := g.adopt(turn, "", g.holderTTL())
	_ = g.drop(context.Background(), epoch)
}

// sharedOrLeft is the error of a request, on the caller's context outer,
// whose turn came with failed, the store failure of the request ahead:
// that failure, unless the caller's own context ended (it left, or its
// deadline passed): then its wait ended, as afterHeld says, and the
// failure, met by another request, is not this one's to report.
func sharedOrLeft(outer context.Context, afterHeld bool, failed error) error {
	cerr := outer.Err()
	if cerr == nil && deadlinePassed(outer) {
		cerr = context.DeadlineExceeded
	}
	if cerr != nil {
		return waitEnded(afterHeld, cerr)
	}
	return sharedFailure(failed)
}

// dropAll ends the holds of a lock that will not be made.
func (l *Locker) dropAll(ctx context.Context, holds []hold) {
	for _, h := range holds {
		_ = h.g.drop(ctx, h.epoch)
	}
}

// releaseAbandoned releases a grant nobody will use, asked for ttl, bounded
// by the release timeout, and retries it in the background while the store
// fails (see WithPendingReleases). A token that was never granted answers
// ErrNotHeld, which is the expected case.
func (l *Locker) releaseAbandoned(store stores.Store, storeKeys []string, token string, ttl time.Duration) {
	expires := time.Now().Add(ttl)
	err := l.release(context.Background(), store, storeKeys, token, 0)
	l.retryRelease(err, store, storeKeys, token, time.Time{}, expires)
}

// passOn gives turns, whose owner failed to obtain their keys with err, to
// their next waiters: with the store failure, when err is one, so that they
// answer it at once; else as the right to contend, after a key seen held
// when err says so.
func passOn(turns []localqueue.Turn, err error) {
	var shared error
	switch {
	case errors.Is(err, ErrStoreDown):
		shared = err
	case errors.Is(err, errStoreSilent):
		shared = errStoreSilent
	case errors.Is(err, ErrStore):
		shared = err
	}
	if shared != nil {
		for _, t := range turns {
			t.PassFailed(shared)
		}
		return
	}
	held := errors.Is(err, ErrHeld)
	for _, t := range turns {
		t.Pass(0, held)
	}
}

// release runs on a context the caller's cancellation cannot end, bounded by
// the Locker's release timeout. While the breaker counts the store down, it
// answers ErrStoreDown without a store call: the caller hands the release
// to the pending set.
func (l *Locker) release(ctx context.Context, store stores.Store, storeKeys []string, token string, keep time.Duration) error {
	if l.breaker != nil && l.breaker.rejecting() {
		return l.breaker.downError()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.releaseTimeout)
	defer cancel()
	return wrapStoreError(store.Release(ctx, storeKeys, token, keep))
}

// releaseWaited is release, reporting also whether the store refused
// another token the keys while the grant stood; false when the store does
// not tell (see stores.WaitReporter).
func (l *Locker) releaseWaited(ctx context.Context, storeKeys []string, token string, keep time.Duration) (bool, error) {
	if l.waits == nil {
		return false, l.release(ctx, l.store, storeKeys, token, keep)
	}
	if l.breaker != nil && l.breaker.rejecting() {
		return false, l.breaker.downError()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.releaseTimeout)
	defer cancel()
	waited, err := l.waits.ReleaseWaited(ctx, storeKeys, token, keep)
	return waited, wrapStoreError(err)
}

// clockDrift is the margin a lock's validity keeps for clock drift between
// this process and the store: 1% of the TTL plus 2ms, as Redlock does.
func clockDrift(ttl time.Duration) time.Duration {
	return ttl/100 + 2*time.Millisecond
}

// newToken returns a random 128-bit token, base64url-encoded.
func newToken() string {
	var b [tokenLen]byte
	fillToken(&b)
	return string(b[:])
}

// tokenLen is the length of a token: 128 bits in unpadded base64.
const tokenLen = 22

// fillToken fills b with a random 128-bit token, base64url-encoded.
func fillToken(b *[tokenLen]byte) {
	var r [16]byte
	_, _ = rand.Read(r[:]) // crypto/rand.Read never fails since Go 1.24
	base64.RawURLEncoding.Encode(b[:], r[:])
}
