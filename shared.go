package reqlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// mode is how an Obtain holds its keys: exclusively (the zero mode), or as
// one of a key's holders, shared (limit 0) or one of at most limit.
type mode struct {
	shared bool
	limit  int
}

// String describes m for error messages.
func (m mode) String() string {
	switch {
	case !m.shared:
		return "exclusively"
	case m.limit == 0:
		return "shared"
	}
	return fmt.Sprintf("with a limit of %d", m.limit)
}

// sharedOps is a stores.Store over one key of a stores.SharedStore that acts
// as one of the key's holders under limit: Acquire is AcquireShared,
// Release ReleaseShared, Refresh RefreshShared. A shared or limited grant
// acts through it, so that it is renewed, released, retried when the
// release fails and cleaned up after an unknown outcome as an exclusive
// grant is.
type sharedOps struct {
	store stores.SharedStore
	limit int
}

var _ stores.Store = (*sharedOps)(nil)

// Acquire is AcquireShared of keys[0], the only key of a shared grant.
func (o *sharedOps) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	return o.store.AcquireShared(ctx, keys[0], token, o.limit, ttl)
}

// Release is ReleaseShared of keys[0].
func (o *sharedOps) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	return o.store.ReleaseShared(ctx, keys[0], token, keep)
}

// Refresh is RefreshShared of keys[0].
func (o *sharedOps) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	return o.store.RefreshShared(ctx, keys[0], token, ttl)
}

// ObtainShared acquires key shared for ttl: its holder runs alongside the
// other shared holders of key, in every process, and never with an
// exclusive one (Obtain). Each shared lock is a grant of its own: its own
// token, TTL, renewals (Refresh, KeepAlive, the watchdog of the lock's
// contexts) and release, and its own fence, drawn from the key's one
// sequence: above every earlier exclusive grant's, below every later one's.
//
// Writers go first: once an exclusive Obtain has been refused by the shared
// holders, the store refuses new ones (for stores.WriterWindow from each of
// the writer's refusals) until the writer has had the key, so a stream of
// readers does not starve it. An exclusive Obtain that ends without the key
// after such a refusal (a try-once, a wait that ended, a cancellation)
// withdraws its claim before it returns (in the background when the store
// may be failing), so new readers come in at once.
//
// It waits, retries and fails as Obtain does, with these differences:
// shared locks do not queue in this process and are never handed on
// locally (each asks the store); fair mode (WithFairness) does not order
// them. A request whose context holds key (see NewContext) exclusively, or
// shared, takes a hold on that lock instead, with no store call; one that
// holds key with a limit is refused with ErrInvalid, as an exclusive Obtain
// of a key the request holds shared is. On a store that does not implement
// stores.SharedStore it returns an error wrapping ErrInvalid (see
// CheckShared).
func (l *Locker) ObtainShared(ctx context.Context, key string, ttl, wait time.Duration) (*Lock, error) {
	return l.obtainMode(ctx, key, mode{shared: true}, ttl, wait)
}

// ObtainLimited acquires one of at most limit places on key for ttl: never
// more than limit unexpired holders of key run at once, across every
// process of the store, and never with an exclusive holder of key. Each
// place is a grant of its own, with its own token, TTL, renewals, release
// and fence, as in ObtainShared; a holder that dies frees its place when
// its own TTL has passed. A caller gets a place while fewer than its own
// limit hold the key, whatever limits they hold it under, so a limit
// changed in a rolling deployment takes effect at once for the callers
// that use the new one: never more hold the key than the largest limit
// among its holders.
//
// It waits, retries and fails as ObtainShared does; limit below 1 is
// refused with ErrInvalid. When all places are taken and the wait ends,
// the error wraps ErrHeld, as for a held key.
func (l *Locker) ObtainLimited(ctx context.Context, key string, limit int, ttl, wait time.Duration) (*Lock, error) {
	if limit < 1 {
		return nil, fmt.Errorf("%w: limit %d is below 1", ErrInvalid, limit)
	}
	return l.obtainMode(ctx, key, mode{shared: true, limit: limit}, ttl, wait)
}

// CheckShared returns an error wrapping ErrInvalid, naming the store, when
// the Locker's store cannot grant a key shared or with a limit (it does not
// implement stores.SharedStore). ObtainShared and ObtainLimited refuse
// then; the middleware checks shared and limited routes with it at
// start-up.
func (l *Locker) CheckShared() error {
	if l.sharedStore == nil {
		return fmt.Errorf("%w: shared and limited locks need a store that implements stores.SharedStore; %T does not",
			ErrInvalid, l.store)
	}
	return nil
}

// obtainMode is ObtainShared and ObtainLimited: Obtain of one key in mode m.
func (l *Locker) obtainMode(ctx context.Context, key string, m mode, ttl, wait time.Duration) (*Lock, error) {
	return l.obtainReported(ctx, []string{key}, m, ttl, wait)
}

// acquireShared obtains a grant of keys (one key) in mode m, shared or
// limited, from the store: no local queue, no handoff.
func (l *Locker) acquireShared(ctx context.Context, label string, keys []string, m mode, ttl, wait time.Duration) (hold, error) {
	if l.breaker != nil && l.breaker.rejecting() {
		return hold{}, l.breaker.downError()
	}
	g := l.newGrant(keys)
	g.shared = &sharedOps{store: l.sharedStore, limit: m.limit}
	bound := wait
	if wait == 0 {
		bound = l.releaseTimeout // as in acquire
	}
	outer := ctx
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	if err := l.contend(outer, ctx, g, nil, ttl, wait, heldSeen{joined: time.Now()}); err != nil {
		return hold{}, storeSilent(outer, err)
	}
	g.beginEpoch(label, ttl)
	return hold{g: g}, nil
}

// mode returns the mode of g's holders.
func (g *grant) mode() mode {
	if g.shared == nil {
		return mode{}
	}
	return mode{shared: true, limit: g.shared.limit}
}

// reentrant reports whether a request that holds a key through a grant in
// mode held may take it again in mode m by a hold on that grant: an
// exclusive grant serves every mode, a shared or limited one only its own.
func reentrant(held, m mode) bool {
	return !held.shared || held == m
}

// withdrawWriter withdraws the waiting-writer records the store keeps for
// token on keys after refusals by shared holders (see stores.SharedStore),
// when the exclusive wait that made them ends without a grant, so that new
// readers come in at once rather than after stores.WriterWindow: a Release
// of the token, which holds nothing, on a context the caller's
// cancellation cannot end, bounded by the release timeout; in the
// background when the store may be failing, so that it holds up no answer.
// ErrNotHeld is the answer expected; a failure is logged at Debug: the
// records lapse after stores.WriterWindow.
func (l *Locker) withdrawWriter(ctx context.Context, keys []string, token string, background bool) {
	withdraw := func(ctx context.Context) {
		err := l.release(ctx, l.store, keys, token, 0)
		if err != nil && !errors.Is(err, ErrNotHeld) {
			l.logger.Debug("reqlock: withdrawing a waiting writer failed; its record lapses after stores.WriterWindow",
				slog.String("key", keys[0]), slog.Any("error", err))
		}
	}
	if background {
		go withdraw(context.WithoutCancel(ctx))
		return
	}
	withdraw(context.WithoutCancel(ctx))
}
