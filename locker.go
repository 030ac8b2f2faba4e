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
)

// Locker obtains locks from a Store. It is safe for concurrent use, holds no
// per-request state, and is meant to be shared by every route of a service.
type Locker struct {
	store          Store
	prefix         string
	backoff        Backoff
	releaseTimeout time.Duration
	logger         *slog.Logger
}

// Option configures a Locker.
type Option func(*Locker)

// WithKeyPrefix sets the prefix of every stored key. Default "reqlock:".
func WithKeyPrefix(prefix string) Option { return func(l *Locker) { l.prefix = prefix } }

// WithBackoff sets how waiters space their attempts. Zero fields take the
// values of DefaultBackoff.
func WithBackoff(b Backoff) Option { return func(l *Locker) { l.backoff = b } }

// WithReleaseTimeout bounds each release. Default DefaultReleaseTimeout.
func WithReleaseTimeout(d time.Duration) Option { return func(l *Locker) { l.releaseTimeout = d } }

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
	}
	for _, opt := range opts {
		opt(l)
	}
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalid)
	}
	l.backoff = l.backoff.withDefaults()
	if err := l.backoff.validate(); err != nil {
		return nil, err
	}
	if l.releaseTimeout <= 0 {
		return nil, fmt.Errorf("%w: release timeout %v is not positive", ErrInvalid, l.releaseTimeout)
	}
	if l.logger == nil {
		l.logger = slog.Default()
	}
	return l, nil
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
// When ctx ends while the store may already have granted the lock, Obtain
// releases that grant before it returns, so nothing is left until its TTL.
func (l *Locker) Obtain(ctx context.Context, key string, ttl, wait time.Duration) (*Lock, error) {
	switch {
	case key == "":
		return nil, fmt.Errorf("%w: empty key", ErrInvalid)
	case ttl <= 0:
		return nil, fmt.Errorf("%w: ttl %v is not positive", ErrInvalid, ttl)
	case wait < 0:
		return nil, fmt.Errorf("%w: wait %v is negative", ErrInvalid, wait)
	}
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(ErrWaitEnded, err)
	}
	storeKey := l.prefix + key
	token := newToken()
	if wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}

	var (
		schedule *backoffSchedule
		sawHeld  bool
	)
	for {
		attemptStart := time.Now()
		grant, err := l.store.Acquire(ctx, storeKey, token, ttl)
		if cerr := ctx.Err(); cerr != nil {
			// The store may have granted the lock after we stopped
			// listening: release it rather than leave it to its TTL.
			if err != nil || grant.OK {
				l.releaseAbandoned(storeKey, token)
			}
			return nil, waitEnded(sawHeld || (err == nil && !grant.OK), cerr)
		}
		switch {
		case err != nil:
			return nil, wrapStoreError(err)
		case grant.OK:
			return l.newLock(key, storeKey, token, grant.Fence, ttl, attemptStart), nil
		case wait == 0:
			return nil, ErrHeld
		}
		sawHeld = true
		if schedule == nil {
			schedule = newBackoffSchedule(l.backoff)
		}
		if !schedule.sleep(ctx, grant.HolderTTL) {
			return nil, waitEnded(true, ctx.Err())
		}
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
