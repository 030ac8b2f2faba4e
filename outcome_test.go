package reqlock_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/reqlock/reqlock"
)

func TestOutcomeOf(t *testing.T) {
	live := context.Background()
	pastDeadline, cancel := context.WithTimeout(live, 0)
	defer cancel()
	cancelled, cancel := context.WithCancel(live)
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want reqlock.Outcome
	}{
		{"granted", live, nil, reqlock.OutcomeAcquired},
		{"try once on a held key", live, reqlock.ErrHeld, reqlock.OutcomeTimeout},
		{"wait limit while the key was held", live,
			errors.Join(reqlock.ErrWaitEnded, reqlock.ErrHeld, context.DeadlineExceeded), reqlock.OutcomeTimeout},
		{"the caller's own deadline", pastDeadline,
			errors.Join(reqlock.ErrWaitEnded, context.DeadlineExceeded), reqlock.OutcomeTimeout},
		{"wait limit before the store answered", live,
			errors.Join(reqlock.ErrWaitEnded, context.DeadlineExceeded), reqlock.OutcomeStoreError},
		{"client left while the key was held", cancelled,
			errors.Join(reqlock.ErrWaitEnded, reqlock.ErrHeld, context.Canceled), reqlock.OutcomeCanceled},
		{"client left before the store answered", cancelled,
			errors.Join(reqlock.ErrWaitEnded, context.Canceled), reqlock.OutcomeCanceled},
		{"store failure", live, fmt.Errorf("%w: %w", reqlock.ErrStore, io.ErrUnexpectedEOF), reqlock.OutcomeStoreError},
		{"invalid arguments", live, fmt.Errorf("%w: empty key", reqlock.ErrInvalid), reqlock.OutcomeInvalid},
		{"keys the store refuses together", live,
			fmt.Errorf("%w: %w", reqlock.ErrInvalid, errors.New("cross slot")), reqlock.OutcomeInvalid},
		{"own lock lost", live, fmt.Errorf("%w: %w", reqlock.ErrLockLost, reqlock.ErrNotHeld), reqlock.OutcomeLost},
		{"own lock lost, context ended", cancelled,
			errors.Join(reqlock.ErrWaitEnded, context.Canceled, reqlock.ErrLockLost), reqlock.OutcomeLost},
		{"an error of no kind reqlock returns", live, errors.New("something else"), reqlock.OutcomeInvalid},
	} {
		if got := reqlock.OutcomeOf(tc.ctx, tc.err); got != tc.want {
			t.Errorf("%s: OutcomeOf(%v) = %q, want %q", tc.name, tc.err, got, tc.want)
		}
	}
}

// TestOutcomeNames: the outcomes are metric label values and middleware
// answers; their names are part of the API.
func TestOutcomeNames(t *testing.T) {
	for o, want := range map[reqlock.Outcome]string{
		reqlock.OutcomeAcquired:   "acquired",
		reqlock.OutcomeTimeout:    "timeout",
		reqlock.OutcomeCanceled:   "canceled",
		reqlock.OutcomeStoreError: "store_error",
		reqlock.OutcomeBadKey:     "bad_key",
		reqlock.OutcomeInvalid:    "invalid",
		reqlock.OutcomeLost:       "lock_lost",
	} {
		if string(o) != want {
			t.Errorf("outcome %q, want %q", o, want)
		}
	}
}
