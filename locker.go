package reqlock

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Defaults of a Locker, written in one place.
const (
	// DefaultKeyPrefix is put in front of every key a Locker stores.
	DefaultKeyPrefix = "reqlock:"
	// DefaultReleaseTimeout bounds every release, which runs on a context
	// that the caller's cancellation cannot end.
	DefaultReleaseTimeout = 2 * time.Second
	// DefaultHandoffCount and DefaultHandoffTime bound a chain of local
	// handoffs of one grant: see WithHandoff.
	DefaultHandoffCount = 16
	DefaultHandoffTime  = 50 * time.Millisecond
	// MaxHandoffCount caps WithHandoff's count, so that handoff fences
	// (the grant's fence plus one per handoff) stay below the next grant's.
	MaxHandoffCount = 1000
)

// Locker obtains locks from a Store. It is safe for concurrent use and is
// meant to be shared by every route of a service.
//
// Requests of one process that want the same key queue locally, in arrival
// order, and only the first of them talks to the store. When the holder lets
// go while others of its process wait, the Locker may hand the still-held
// grant to the next of them without a store round trip (see WithHandoff).
// A waiter sleeps on a timer, and wakes early when the store signals a
// release (stores that implement ReleaseNotifier).
type Locker struct {
	store          Store
	notifier       ReleaseNotifier // nil when the store cannot signal releases
	prefix         string
	backoff        Backoff
	releaseTimeout time.Duration
	handoffCount   int
	handoffTime    time.Duration
	logger         *slog.Logger
	local          *localQueues
	fair           *fairness // nil unless WithFairness; see fair.go
	metrics        Metrics   // nil unless WithMetrics
}

// Option configures a Locker.
type Option func(*Locker)

// WithKeyPrefix sets the prefix of every stored key; it must not be empty.
// Default "reqlock:".
func WithKeyPrefix(prefix string) Option { return func(l *Locker) { l.prefix = prefix } }

// WithBackoff sets how waiters space their attempts. Zero fields take the
// values of DefaultBackoff.
func WithBackoff(b Backoff) Option { return func(l *Locker) { l.backoff = b } }

// WithReleaseTimeout bounds each release. Default DefaultReleaseTimeout.
func WithReleaseTimeout(d time.Duration) Option { return func(l *Locker) { l.releaseTimeout = d } }

// WithHandoff bounds local handoff: a grant is passed from local holder to
// local waiter at most count times, and not after maxTime since the store
// granted it; then it goes back to the store, so that other processes get
// their turn. Count zero disables handoff. Defaults DefaultHandoffCount and
// DefaultHandoffTime; count at most MaxHandoffCount.
func WithHandoff(count int, maxTime time.Duration) Option {
	return func(l *Locker) { l.handoffCount, l.handoffTime = count, maxTime }
}

// WithLogger sets where the Locker logs failures it cannot return, such as a
// failed release of an abandoned grant. Default slog.Default().
func WithLogger(logger *slog.Logger) Option { return func(l *Locker) { l.logger = logger } }

// New returns a Locker over store. It returns an error wrapping ErrInvalid
// when store is nil or an option is invalid.
func New(store Store, opts ...Option) (*Locker, error) {
	l := &Locker{
		store:          store,
		prefix:         DefaultKeyPrefix,
		releaseTimeout: DefaultReleaseTimeout,
		handoffCount:   DefaultHandoffCount,
		handoffTime:    DefaultHandoffTime,
		local:          newLocalQueues(),
	}
	for _, opt := range opts {
		opt(l)
	}
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalid)
	}
	if l.prefix == "" {
		return nil, fmt.Errorf("%w: key prefix is empty; every key needs a prefix that sets it apart", ErrInvalid)
	}
	l.backoff = l.backoff.withDefaults()
	if err := l.backoff.validate(); err != nil {
		return nil, err
	}
	if l.releaseTimeout <= 0 {
		return nil, fmt.Errorf("%w: release timeout %v is not positive", ErrInvalid, l.releaseTimeout)
	}
	if l.handoffCount < 0 || l.handoffCount > MaxHandoffCount || l.handoffTime < 0 {
		return nil, fmt.Errorf("%w: handoff count %d (0 to %d) or time %v (not negative) out of range",
			ErrInvalid, l.handoffCount, MaxHandoffCount, l.handoffTime)
	}
	if l.logger == nil {
		l.logger = slog.Default()
	}
	l.notifier, _ = store.(ReleaseNotifier)
	return l.withFairness()
}

// MustNew is like New but panics on an invalid configuration. Use it at
// start-up only.
func MustNew(store Store, opts ...Option) *Locker {
	l, err := New(store, opts...)
	if err != nil {
		panic(err)
	}
	return l
}

// Logger returns the logger the Locker reports to.
func (l *Locker) Logger() *slog.Logger { return l.logger }

// Obtain acquires the lock on key for ttl.
//
// With wait zero it tries once. Otherwise it retries with exponential backoff
// and jitter, sleeping on a timer between attempts (never longer than the
// holder's remaining TTL), until the lock is granted, wait has passed, or ctx
// ends, whichever comes first. Each store call is bounded by the same
// deadline, so a stalled store cannot hold the caller past its wait.
//
// Errors:
//   - ErrHeld: tried once and the key is held by another owner;
//   - ErrWaitEnded joined with ctx's error, and with ErrHeld when an attempt
//     saw the key held (without ErrHeld, the store never answered in time);
//   - ErrStore: the store failed; Obtain does not retry store failures;
//   - ErrInvalid: empty key, non-positive TTL or negative wait.
//
// When the store may have granted the lock but Obtain cannot use it (ctx
// ended, or the store call failed after it may have run), Obtain releases
// that grant in the background, bounded by the release timeout, so nothing
// is left until its TTL.
//
// Reentrancy: when ctx carries a lock of this Locker that holds key (see
// NewContext; the middleware puts each request's lock there), Obtain does
// not wait for itself. It returns at once a view of that lock, with the same
// fence, and takes a hold on it: the key is released in the store only when
// the outermost hold (the held lock's own, or the last view's) is released.
func (l *Locker) Obtain(ctx context.Context, key string, ttl, wait time.Duration) (*Lock, error) {
	start := time.Now()
	lock, err := l.obtain(ctx, key, ttl, wait)
	l.observe(ctx, start, lock, err)
	return lock, err
}

func (l *Locker) obtain(ctx context.Context, key string, ttl, wait time.Duration) (*Lock, error) {
	if key == "" {
		return nil, fmt.Errorf("%w: empty key", ErrInvalid)
	}
	if err := checkTimes(ttl, wait); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(ErrWaitEnded, err)
	}
	if holdsLocks(ctx) {
		held, err := l.reenter(ctx, l.prefix+key)
		if err != nil {
			return nil, err
		}
		if held != nil {
			return l.newView([]string{key}, []*Lock{held}, nil), nil
		}
	}
	return l.obtainOne(ctx, key, ttl, wait)
}

func checkTimes(ttl, wait time.Duration) error {
	switch {
	case ttl <= 0:
		return fmt.Errorf("%w: ttl %v is not positive", ErrInvalid, ttl)
	case wait < 0:
		return fmt.Errorf("%w: wait %v is negative", ErrInvalid, wait)
	}
	return nil
}

// observe reports an Obtain's outcome to the Locker's Metrics, and labels
// the lock it made.
func (l *Locker) observe(ctx context.Context, start time.Time, lock *Lock, err error) {
	if l.metrics == nil {
		return
	}
	label := LabelFrom(ctx)
	if lock != nil {
		for _, p := range lock.realLocks() {
			if p.label == "" {
				p.label = label
			}
		}
	}
	l.metrics.Obtained(label, resultOf(ctx, err), time.Since(start))
}

// obtainOne obtains a single key that ctx's locks do not hold: through the
// key's local queue, then from a local handoff or the store.
func (l *Locker) obtainOne(ctx context.Context, key string, ttl, wait time.Duration) (*Lock, error) {
	storeKey := l.prefix + key
	q, w, gen, busy := l.local.join(storeKey, wait > 0)
	if busy {
		return nil, ErrHeld // another request of this process has the key
	}
	if wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
	var sawHeld bool // queued behind a local holder
	if w != nil {
		t, err := l.awaitTurn(ctx, q, w)
		if err != nil {
			return nil, err
		}
		gen, sawHeld = t.gen, t.afterHold || t.handoff != nil
		if t.yield > 0 && !sleepFor(ctx, t.yield) {
			l.local.pass(q, gen, 0, sawHeld)
			return nil, waitEnded(true, ctx.Err())
		}
		if t.handoff != nil {
			lock, err := l.takeHandoff(ctx, key, q, t, ttl)
			if lock != nil || err != nil {
				return lock, err
			}
			// The handed-off grant was lost: contend for a new one.
		}
	}
	// A request that queued behind a local holder has seen the key held: if
	// its wait ends during its first store call, that is a timeout (423),
	// not a store that never answered (503).
	lock, err := l.contend(ctx, key, storeKey, ttl, wait, sawHeld)
	if err != nil {
		// A contender that saw the key held passes that on: the next
		// waiter, whose wait went by in the queue, has seen it held too.
		l.local.pass(q, gen, 0, errors.Is(err, ErrHeld))
		return nil, err
	}
	lock.queue, lock.turnGen = q, gen
	l.local.setLease(q, gen, lock.ValidUntil())
	return lock, nil
}

// awaitTurn waits in q until w is given the key's turn or ctx ends. A waiter
// at the head of q also wakes when the holder's lease ends, and then takes
// the turn itself.
func (l *Locker) awaitTurn(ctx context.Context, q *keyQueue, w *waiter) (turn, error) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		t, took, next := l.local.checkLease(q, w, l.backoff.Max)
		if took {
			return t, nil
		}
		timer.Reset(next)
		select {
		case t := <-w.turn:
			return t, nil
		case <-timer.C:
			continue
		case <-ctx.Done():
		}
		if !l.local.leave(q, w) {
			// The turn came as the wait ended: pass it on.
			l.passOn(q, <-w.turn)
		}
		return turn{}, waitEnded(true, ctx.Err())
	}
}

// passOn hands a turn this request will not use to the next waiter; a held
// grant goes back through the normal release path.
func (l *Locker) passOn(q *keyQueue, t turn) {
	if t.handoff == nil {
		l.local.pass(q, t.gen, t.yield, t.afterHold)
		return
	}
	_ = l.releaseChain(context.Background(), q, t.gen, t.handoff.chain, t.handoff.validUntil, 0)
}

// takeHandoff turns a handed-off grant into this request's Lock, refreshing
// the lease first when less than half of ttl is left. It returns a nil Lock
// and nil error when the grant turned out lost, so the caller contends anew.
func (l *Locker) takeHandoff(ctx context.Context, key string, q *keyQueue, t turn, ttl time.Duration) (*Lock, error) {
	h := t.handoff
	lock := &Lock{
		locker:     l,
		key:        key,
		storeKey:   h.chain.storeKey,
		token:      h.chain.token,
		fence:      h.fence,
		ttl:        ttl,
		start:      time.Now(),
		validUntil: h.validUntil,
		queue:      q,
		turnGen:    t.gen,
		chain:      h.chain,
	}
	if l.metrics != nil {
		l.metrics.HandedOff(LabelFrom(ctx))
	}
	if ctx.Err() != nil {
		l.passOn(q, t)
		return nil, waitEnded(true, ctx.Err())
	}
	if time.Until(h.validUntil) >= ttl/2 {
		return lock, nil
	}
	err := lock.Refresh(ctx, ttl)
	switch {
	case err == nil:
		return lock, nil
	case errors.Is(err, ErrNotHeld):
		return nil, nil
	}
	l.passOn(q, t)
	if cerr := ctx.Err(); cerr != nil {
		return nil, waitEnded(true, cerr)
	}
	return nil, err
}

// contend obtains key from the store for the request that has the key's
// turn in this process. In fair mode (see WithFairness) it waits in the
// store's queue instead: each attempt renews its place there, sleeps are
// capped so that it renews in time, and it leaves the queue when its wait
// ends.
//
// queued reports that the request waited in the local queue behind a
// holder, so the key was seen held.
func (l *Locker) contend(ctx context.Context, key, storeKey string, ttl, wait time.Duration, queued bool) (*Lock, error) {
	token := newToken()
	var lease time.Duration // fair mode's place in the store's queue; zero: none
	if l.fair != nil && wait > 0 {
		lease = l.fair.lease
	}
	var ahead int // fair mode: waiters ahead of token in the store's queue
	acquire := func() (Grant, error) {
		if l.fair != nil {
			g, err := l.fair.store.AcquireFair(ctx, storeKey, token, ttl, lease)
			ahead = g.Ahead
			return g.Grant, err
		}
		return l.store.Acquire(ctx, storeKey, token, ttl)
	}
	leave := func() {
		if lease > 0 {
			l.leaveFair(ctx, storeKey, token) // the queue moves on at once
		}
	}
	var (
		schedule *backoffSchedule
		sawHeld  = queued
		released <-chan struct{}
		stop     func()
	)
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	for {
		attemptStart := time.Now()
		grant, err := acquire()
		if err != nil || (grant.OK && ctx.Err() != nil) {
			// The store may have granted the lock although we got no
			// answer, or after we stopped listening: release it rather
			// than leave it to its TTL. In the background, bounded by the
			// release timeout, so a stalled store delays no answer.
			go l.releaseAbandoned(storeKey, token)
		}
		if cerr := ctx.Err(); cerr != nil {
			if err != nil && lease > 0 {
				// The attempt never answered (the store stalls, or the
				// caller left mid-call): do not hold up the answer for it.
				go l.leaveFair(context.WithoutCancel(ctx), storeKey, token)
			} else {
				leave()
			}
			return nil, waitEnded(sawHeld || (err == nil && !grant.OK), cerr)
		}
		switch {
		case err != nil:
			if lease > 0 {
				// The store is failing: do not hold up the answer for it.
				go l.leaveFair(context.WithoutCancel(ctx), storeKey, token)
			}
			return nil, wrapStoreError(err)
		case grant.OK:
			c := &chain{storeKey: storeKey, token: token, baseFence: grant.Fence, lastFence: grant.Fence, started: attemptStart}
			lock := l.newLock(key, storeKey, token, grant.Fence, ttl, attemptStart)
			lock.chain = c
			return lock, nil
		case wait == 0:
			return nil, ErrHeld
		}
		sawHeld = true
		if stop == nil && l.notifier != nil {
			released, stop = l.notifier.NotifyRelease(storeKey)
			if released != nil && ahead == 0 {
				// A release just before we subscribed would go unseen. In
				// fair mode only the queue's head could have used it.
				continue
			}
		}
		if schedule == nil {
			schedule = newBackoffSchedule(l.backoff)
		}
		sleepCap := grant.HolderTTL
		if lease > 0 {
			sleepCap = l.fairPoll(sleepCap)
		}
		if !schedule.sleep(ctx, sleepCap, released) {
			leave()
			return nil, waitEnded(true, ctx.Err())
		}
	}
}

// releaseLock lets go of a Lock: to the next local waiter while the grant's
// handoff bounds allow, else back to the store.
// With keep positive (HoldAtLeast) the key is left to expire after keep,
// and the next local waiter only gets the turn to contend for it.
func (l *Locker) releaseLock(ctx context.Context, lock *Lock, validUntil time.Time, notHeld bool, keep time.Duration) error {
	if notHeld || keep > 0 {
		// A grant known to be gone is never handed on: the waiter would
		// work beside whoever holds the key now. One held on for keep is
		// not either: nobody may have it before keep is up.
		validUntil = time.Time{}
	}
	return l.releaseChain(ctx, lock.queue, lock.turnGen, lock.chain, validUntil, keep)
}

// releaseChain hands the chain's grant to the next local waiter when one
// waits, the lease is still valid and the bounds allow; otherwise it releases
// the grant in the store, reporting the highest fence issued under it, and
// gives the next waiter the turn to contend.
func (l *Locker) releaseChain(ctx context.Context, q *keyQueue, gen uint64, c *chain, validUntil time.Time, keep time.Duration) error {
	var waiting bool
	if l.handoffCount > 0 {
		var handed bool
		handed, waiting = l.local.handOff(q, gen, func() (handoff, bool) {
			if c.handoffs >= l.handoffCount || time.Since(c.started) >= l.handoffTime || !time.Now().Before(validUntil) {
				return handoff{}, false
			}
			c.handoffs++
			c.lastFence++
			return handoff{chain: c, fence: c.lastFence, validUntil: validUntil}, true
		})
		if handed {
			return nil
		}
	}
	var lastFence int64
	if c.lastFence > c.baseFence {
		lastFence = c.lastFence
	}
	start := time.Now()
	var err error
	if keep > 0 {
		err = l.releaseKeep(ctx, c.storeKey, c.token, lastFence, keep)
	} else {
		err = l.release(ctx, c.storeKey, c.token, lastFence)
	}
	var yield time.Duration
	if waiting && keep <= 0 {
		// The bounds cut the chain while this process still has waiters:
		// other processes' waiters, woken by the release, need about a round
		// trip to reach the store. Without this head start the next local
		// waiter, already awake, would win nearly every time.
		yield = max(2*time.Since(start), minYield)
	}
	l.local.pass(q, gen, yield, true)
	return err
}

// minYield is the shortest head start a cut chain gives other processes.
const minYield = 100 * time.Microsecond

// sleepFor sleeps for d on a timer, or until ctx ends: then it reports false.
func sleepFor(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (l *Locker) newLock(key, storeKey, token string, fence int64, ttl time.Duration, start time.Time) *Lock {
	return &Lock{
		locker:     l,
		key:        key,
		storeKey:   storeKey,
		token:      token,
		fence:      fence,
		ttl:        ttl,
		start:      start,
		validUntil: start.Add(ttl - clockDrift(ttl)),
	}
}

// releaseAbandoned releases a grant nobody will use. A token that was never
// granted answers ErrNotHeld, which is the expected case and not logged.
func (l *Locker) releaseAbandoned(storeKey, token string) {
	err := l.release(context.Background(), storeKey, token, 0)
	if err != nil && !errors.Is(err, ErrNotHeld) {
		l.logger.Warn("reqlock: release of abandoned grant failed; it will expire with its TTL",
			slog.String("key", storeKey), slog.Any("error", err))
	}
}

// release runs on a context the caller's cancellation cannot end, bounded by
// the Locker's release timeout.
func (l *Locker) release(ctx context.Context, storeKey, token string, lastFence int64) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.releaseTimeout)
	defer cancel()
	err := l.store.Release(ctx, storeKey, token, lastFence)
	if err != nil && !errors.Is(err, ErrNotHeld) {
		return wrapStoreError(err)
	}
	return err
}

// releaseKeep leaves a grant to expire after keep, like release otherwise.
func (l *Locker) releaseKeep(ctx context.Context, storeKey, token string, lastFence int64, keep time.Duration) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.releaseTimeout)
	defer cancel()
	err := l.releaseKey(ctx, storeKey, token, lastFence, keep)
	if err != nil && !errors.Is(err, ErrNotHeld) {
		return wrapStoreError(err)
	}
	return err
}

func waitEnded(sawHeld bool, ctxErr error) error {
	if sawHeld {
		return errors.Join(ErrWaitEnded, ErrHeld, ctxErr)
	}
	return errors.Join(ErrWaitEnded, ctxErr)
}

func wrapStoreError(err error) error {
	if errors.Is(err, ErrStore) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrStore, err)
}

// clockDrift is the margin a lock's validity keeps for clock drift between
// this process and the store: 1% of the TTL plus 2ms, as Redlock does.
func clockDrift(ttl time.Duration) time.Duration {
	return ttl/100 + 2*time.Millisecond
}

// newToken returns a random 128-bit token, base64url-encoded.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails since Go 1.24
	return base64.RawURLEncoding.EncodeToString(b[:])
}
