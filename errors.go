package reqlock

import "errors"

// Sentinel errors. Every error a Locker or Lock returns matches one of them
// with errors.Is.
var (
	// ErrHeld means the key is held by another owner. A try-once Obtain
	// returns it alone; a wait that ended while the key was held joins it
	// with ErrWaitEnded.
	ErrHeld = errors.New("reqlock: lock held by another owner")

	// ErrWaitEnded means the caller's wait ended before the lock was
	// obtained: the wait limit or the context's deadline passed, or the
	// context was cancelled. It is always joined with the context's error,
	// so errors.Is(err, context.DeadlineExceeded) or
	// errors.Is(err, context.Canceled) tells which.
	ErrWaitEnded = errors.New("reqlock: wait for lock ended")

	// ErrStore means the store failed or timed out. The store's own error
	// is wrapped alongside it.
	ErrStore = errors.New("reqlock: store failed")

	// ErrNotHeld means a release or refresh found that the key no longer
	// holds the caller's token: the lock expired, was taken over, or was
	// already released.
	ErrNotHeld = errors.New("reqlock: lock not held")

	// ErrInvalid means an argument is invalid, such as an empty key or a
	// non-positive TTL.
	ErrInvalid = errors.New("reqlock: invalid argument")
)

// ErrLockLost is the cause with which a lock's keep-alive context is
// cancelled when the lock is lost: a renewal found another owner's token, or
// renewals kept failing until the lock's validity ran out.
var ErrLockLost = errors.New("reqlock: lock lost")
