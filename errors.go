package reqlock

import (
	"context"
	"errors"
	"fmt"
	"time"

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
	// sign that the key was held: the store did not answer in time; when
	// the Locker's wait limit ended it (not the context's own deadline or
	// cancellation), the error matches ErrStore too.
	ErrWaitEnded = errors.New("reqlock: wait for lock ended")

	// ErrStore means the store failed or timed out. The store's own error
	// is wrapped alongside it. A wait that ended with a store call still
	// unanswered and no sign that the key was held (see ErrWaitEnded)
	// matches it too, and so does the error of a request whose turn came
	// behind a request of this process that met a store failure on the key:
	// such waiters answer at once, without a store call of their own.
	ErrStore = errors.New("reqlock: store failed")

	// ErrStoreDown means the Locker refused the request without a store
	// call: its breaker counts the store down (see WithBreaker). It matches
	// ErrStore, so OutcomeOf gives OutcomeStoreError. The error returned is
	// a *StoreDownError, which says when the next probe of the store is due.
	ErrStoreDown = fmt.Errorf("%w: the store is known down", ErrStore)

	// ErrNotHeld means a release or refresh found that the key no longer
	// holds the caller's token: the lock expired, was taken over or was
	// already released. It is stores.ErrNotHeld.
	ErrNotHeld = stores.ErrNotHeld

	// ErrInvalid means an argument is invalid, such as an empty key, a
	// non-positive TTL, or keys the store cannot lock together. It is
	// stores.ErrInvalid.
	ErrInvalid = stores.ErrInvalid

	// ErrRecordInProgress means a ClaimRecord found the record key claimed
	// by another request, which had not finished when the wait ended (or,
	// with no wait, at once). It is joined with ErrHeld and, for a wait
	// that ran out, with ErrWaitEnded and the context's error; the
	// middleware answers it 409 Conflict.
	ErrRecordInProgress = errors.New("reqlock: idempotency record in progress: another request with the key still runs")

	// ErrLockLost is the cause with which a lock's contexts (NewContext,
	// KeepAlive) end when the lock can no longer be trusted: a renewal
	// found another owner's token or none, or the lock's validity ran out
	// without a renewal that succeeded.
	ErrLockLost = errors.New("reqlock: lock lost")
)

// StoreDownError is the error of a request that the Locker refused while its
// breaker counts the store down. It matches ErrStoreDown and ErrStore.
type StoreDownError struct {
	// NextProbe is when the breaker lets the next request probe the store;
	// in the past when a probe is due or running.
	NextProbe time.Time
}

// Error names the error and when the next probe is due.
func (e *StoreDownError) Error() string {
	return fmt.Sprintf("%v; next probe in %v", ErrStoreDown, max(time.Until(e.NextProbe), 0).Round(time.Millisecond))
}

// Unwrap returns ErrStoreDown.
func (e *StoreDownError) Unwrap() error { return ErrStoreDown }

// errStoreSilent joins the error of a wait that ended, with no sign that the
// key was held, while a store call was unanswered: the store did not answer
// in time.
var errStoreSilent = fmt.Errorf("%w: the store did not answer within the wait", ErrStore)

// storeSilent adds errStoreSilent to err, an error of an attempt on the
// caller's context outer, when err is a wait that ended by the Locker's own
// bound with no sign that the key was held: the caller's context neither
// ended nor reached its deadline.
func storeSilent(outer context.Context, err error) error {
	if err == nil || outer.Err() != nil || deadlinePassed(outer) || !errors.Is(err, ErrWaitEnded) ||
		errors.Is(err, ErrHeld) || errors.Is(err, ErrStore) {
		return err
	}
	return errors.Join(err, errStoreSilent)
}

// sharedFailure is the error of a request whose turn came with the store
// failure failed of the request ahead of it on key.
func sharedFailure(failed error) error {
	if errors.Is(failed, ErrStoreDown) {
		return failed
	}
	return fmt.Errorf("%w: the request ahead on the key met a store failure: %w", ErrStore, failed)
}

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
