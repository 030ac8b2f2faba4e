package reqlock

import (
	"errors"
	"fmt"

	"github.com/reqlock/reqlock/stores"
)

// Sentinel errors. Every error a Locker or Lock returns matches one of them
// with errors.Is; OutcomeOf sorts them into outcomes.
var (
	// ErrHeld means the key is held by another owner. A try-once Obtain
	// returns it alone; a wait that ended while the key was held, by a
	// request of this process or of another, joins it with ErrWaitEnded.
	ErrHeld = errors.New("reqlock: lock held by another owner")

	// ErrWaitEnded means the caller's wait ended before the lock was
	// obtained: the wait limit or the context's deadline passed, or the
	// context was cancelled. It is always joined with the context's error,
	// so errors.Is(err, context.DeadlineExceeded) or
	// errors.Is(err, context.Canceled) tells which. Without ErrHeld it
	// means a store call was still unanswered when the wait ended, with no
	// sign that the key was held: the store did not answer in time.
	ErrWaitEnded = errors.New("reqlock: wait for lock ended")

	// ErrStore means the store failed or timed out. The store's own error
	// is wrapped alongside it.
	ErrStore = errors.New("reqlock: store failed")

	// ErrNotHeld means a release or refresh found that the key no longer
	// holds the caller's token: the lock expired, was taken over or was
	// already released. It is stores.ErrNotHeld.
	ErrNotHeld = stores.ErrNotHeld

	// ErrInvalid means an argument is invalid, such as an empty key, a
	// non-positive TTL, or keys the store cannot lock together. It is
	// stores.ErrInvalid.
	ErrInvalid = stores.ErrInvalid

	// ErrLockLost is the cause with which a lock's contexts (NewContext,
	// KeepAlive) end when the lock can no longer be trusted: a renewal
	// found another owner's token or none, or the lock's validity ran out
	// without a renewal that succeeded.
	ErrLockLost = errors.New("reqlock: lock lost")
)

func waitEnded(sawHeld bool, ctxErr error) error {
	if sawHeld {
		return errors.Join(ErrWaitEnded, ErrHeld, ctxErr)
	}
	return errors.Join(ErrWaitEnded, ctxErr)
}

// wrapStoreError marks a store's error as a store failure, unless it is nil
// or one of the errors the store contract names.
func wrapStoreError(err error) error {
	if err == nil || errors.Is(err, ErrStore) || errors.Is(err, ErrNotHeld) || errors.Is(err, ErrInvalid) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrStore, err)
}
