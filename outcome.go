package reqlock

import (
	"context"
	"errors"
)

// Outcome is how an attempt to obtain a lock ended: the one classification
// that the middleware maps to an HTTP status and package metrics to a label.
type Outcome string

// Outcomes of an attempt to obtain a lock.
const (
	// OutcomeAcquired: the lock was obtained.
	OutcomeAcquired Outcome = "acquired"
	// OutcomeTimeout: a key stayed held until the wait or the caller's own
	// deadline ran out, or a try-once attempt found it held.
	OutcomeTimeout Outcome = "timeout"
	// OutcomeCanceled: the caller cancelled (the client left) while waiting.
	OutcomeCanceled Outcome = "canceled"
	// OutcomeStoreError: the store failed, or did not answer before the wait
	// ended with no sign that the key was held.
	OutcomeStoreError Outcome = "store_error"
	// OutcomeBadKey: no key could be derived from the request (the
	// middleware reports it; the core never does).
	OutcomeBadKey Outcome = "bad_key"
	// OutcomeInvalid: invalid arguments or configuration, such as keys the
	// store cannot lock together; no retry helps, and it is never a reason
	// to run without the lock.
	OutcomeInvalid Outcome = "invalid"
	// OutcomeLost: the request's own lock on a key it asked for again was
	// lost.
	OutcomeLost Outcome = "lock_lost"
)

// OutcomeOf classifies an error of Obtain or ObtainAll; ctx is the context
// the caller passed. Only an error from the store, or a store call still
// unanswered when the wait ended with no sign that the key was held, is a
// store error: a wait that ended while the key was held, by anyone, is a
// timeout, and so is a wait that the caller's own deadline cut short.
func OutcomeOf(ctx context.Context, err error) Outcome {
	switch {
	case err == nil:
		return OutcomeAcquired
	case errors.Is(err, ErrLockLost):
		return OutcomeLost
	case errors.Is(err, ErrInvalid):
		return OutcomeInvalid
	case errors.Is(err, ErrStore):
		return OutcomeStoreError
	case errors.Is(err, context.Canceled):
		return OutcomeCanceled
	case errors.Is(err, ErrHeld), errors.Is(err, ErrWaitEnded) && ctx.Err() != nil:
		return OutcomeTimeout
	case errors.Is(err, ErrWaitEnded):
		return OutcomeStoreError // the wait limit ran out before the store answered
	}
	return OutcomeInvalid
}
