package reqlock

import (
	"context"
	"time"
)

// Store is the shared backend that holds locks. Implementations must be safe
// for concurrent use. The stores/storetest package holds the conformance
// suite every Store must pass.
//
// Keys and tokens arrive as given: the Locker has already applied its key
// prefix. A Store returns ErrNotHeld from Release and Refresh when the key
// does not hold the token; any other error is a store failure, which the
// Locker wraps with ErrStore.
//
// A token serves one acquisition, so an acquire that finds a key already
// holding its token was tried before by this same call (a client retry after
// a lost reply): it grants the key again, with a fresh fence and TTL, rather
// than report it held. Every acquire returns once its context ends, by
// deadline or by cancellation, even when the backend has not answered; a
// call it leaves in flight must not leave a grant behind: the store releases
// it, owner-checked, once the call returns.
type Store interface {
	// Acquire sets key to token with the given TTL only if key is absent,
	// and in the same atomic step issues a fencing token for the grant.
	// A held key is not an error: it returns a Grant with OK false.
	Acquire(ctx context.Context, key, token string, ttl time.Duration) (Grant, error)

	// Release deletes key if it still holds token, else returns ErrNotHeld.
	// lastFence is the highest fence used under this grant: the grant's own,
	// or a higher one the Locker issued on a local handoff. The store's next
	// fence for key must exceed it.
	Release(ctx context.Context, key, token string, lastFence int64) error

	// Refresh resets the TTL of key if it still holds token, else returns
	// ErrNotHeld.
	Refresh(ctx context.Context, key, token string, ttl time.Duration) error
}

// Grant is the outcome of one Store.Acquire attempt.
type Grant struct {
	// OK reports whether the lock was granted.
	OK bool

	// Fence is the fencing token of the grant: larger than every fence
	// issued for the same key before. Zero when OK is false.
	Fence int64

	// HolderTTL is the remaining TTL of the current holder when OK is
	// false, or zero when the store does not know it.
	HolderTTL time.Duration
}

// ReleaseNotifier is implemented by stores that signal releases, so that a
// waiter wakes as soon as the holder lets go instead of polling. The Locker
// uses it when the store implements it.
type ReleaseNotifier interface {
	// NotifyRelease registers interest in releases of key (as stored, with
	// the Locker's prefix) until stop is called; stop must be called. The
	// channel receives after each release of key; sends never block, so
	// several releases may arrive as one signal. Signals can be lost (a
	// dropped connection) or spurious, so a waiter still polls as a
	// fallback. A nil channel means the store cannot notify right now.
	NotifyRelease(key string) (released <-chan struct{}, stop func())
}

// MultiStore is implemented by stores that lock several keys in one atomic
// step. Locker.ObtainAll uses it when the store implements it; otherwise it
// takes the keys one by one in their canonical order and gives back every
// key it took when one is held.
//
// Keys arrive distinct, sorted, with the Locker's prefix applied. Every key
// of one call shares the token.
type MultiStore interface {
	// AcquireAll sets every key to token with the given TTL only if none of
	// them is held, and in the same atomic step issues a fencing token per
	// key. It never leaves a partial grant: either every key is set or none.
	// Held keys are not an error: the grant then has OK false.
	AcquireAll(ctx context.Context, keys []string, token string, ttl time.Duration) (MultiGrant, error)

	// ReleaseAll ends the grant on every key that still holds token: it
	// deletes the key, or, when keep is positive, leaves it to expire after
	// keep (see KeepReleaser). lastFences[i] is the highest fence used under
	// the grant for keys[i]; the store's next fence for the key must exceed
	// it. It returns ErrNotHeld when some key no longer held token, after
	// releasing the others.
	ReleaseAll(ctx context.Context, keys []string, token string, lastFences []int64, keep time.Duration) error

	// RefreshAll resets the TTL of every key if each still holds token;
	// when one does not, it changes nothing and returns ErrNotHeld.
	RefreshAll(ctx context.Context, keys []string, token string, ttl time.Duration) error
}

// MultiGrant is the outcome of one MultiStore.AcquireAll attempt.
type MultiGrant struct {
	// OK reports whether every key was granted.
	OK bool

	// Fences holds the fencing token of each key, in the order of the keys
	// asked for. Nil when OK is false.
	Fences []int64

	// Held is the index of a key held by another owner when OK is false.
	Held int

	// HolderTTL is the remaining TTL of that key's holder when OK is false,
	// or zero when the store does not know it.
	HolderTTL time.Duration
}

// KeepReleaser is implemented by stores that can end a grant by leaving the
// key to expire instead of deleting it: the hold-at-least release (see
// Lock.HoldAtLeast). The Locker uses it when the store implements it and
// falls back to Refresh otherwise.
type KeepReleaser interface {
	// ReleaseKeep sets the TTL of key to keep if it still holds token, else
	// returns ErrNotHeld. Like Release it records lastFence: the store's
	// next fence for key must exceed it. No waiter is signalled, since the
	// key stays held until it expires.
	ReleaseKeep(ctx context.Context, key, token string, lastFence int64, keep time.Duration) error
}
