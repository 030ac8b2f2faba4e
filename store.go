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
