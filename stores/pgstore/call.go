package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reqlock/reqlock/stores"
)

// SQLSTATE codes of a transaction that PostgreSQL rolled back and that can
// be run again: it changed nothing.
const (
	serializationFailure = "40001"
	deadlockDetected     = "40P01"
)

// programLimitExceeded is the SQLSTATE of a statement beyond a limit of the
// server, such as an index entry too large: it changed nothing.
const programLimitExceeded = "54000"

// retryPause bounds the random pause before running a rolled-back
// transaction again.
const retryPause = 5 * time.Millisecond

// retrying runs call until it returns anything but a serialization failure
// or a deadlock, pausing a random moment between runs, or until ctx ends.
func retrying[T any](ctx context.Context, call func(context.Context) (T, error)) (T, error) {
	for {
		v, err := call(ctx)
		if err == nil || !isRetryable(err) {
			return v, err
		}
		timer := time.NewTimer(time.Duration(1 + rand.Int64N(int64(retryPause))))
		select {
		case <-ctx.Done():
			timer.Stop()
			return v, err
		case <-timer.C:
		}
	}
}

// isRetryable reports whether err is a rolled-back transaction worth running
// again.
func isRetryable(err error) bool {
	code := sqlState(err)
	return code == serializationFailure || code == deadlockDetected
}

// sqlState returns the SQLSTATE of a server error, or "".
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// States of a detached call.
const (
	callRunning int32 = iota
	callReturned
	callAbandoned
)

// detached runs an acquire call and returns its outcome, or, as soon as ctx
// ends, an error wrapping stores.ErrAbandoned and ctx's error. The call runs
// on a context of its own, bounded by abandonTimeout rather than by ctx: a
// statement cut off by its context may still commit on the server after the
// client gave up on it, and a release sent then could overtake it. So the
// call goes on once its caller left, and when it returns, undo releases what
// it granted, or may have granted (it failed after reaching the server).
func (s *Store) detached(ctx context.Context, call func(context.Context) (stores.Grant, error),
	undo func(context.Context)) (stores.Grant, error) {
	if ctx.Done() == nil { // never ends
		g, err := call(ctx)
		return g, classify(err)
	}
	type result struct {
		g   stores.Grant
		err error
	}
	var state atomic.Int32
	done := make(chan result, 1)
	s.background.Add(1)
	go func() {
		defer s.background.Done()
		own, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonTimeout)
		g, err := call(own)
		cancel()
		err = classify(err)
		if state.CompareAndSwap(callRunning, callReturned) {
			done <- result{g, err}
			return
		}
		// The caller left: undo in its stead what may have been granted.
		// Nothing changed when the server was unreachable or refused the
		// arguments.
		if g.OK || (err != nil && !errors.Is(err, stores.ErrUnreachable) && !errors.Is(err, stores.ErrInvalid)) {
			undoCtx, cancel := context.WithTimeout(context.Background(), abandonTimeout)
			defer cancel()
			undo(undoCtx)
		}
	}()
	select {
	case r := <-done:
		return r.g, r.err
	case <-ctx.Done():
		if state.CompareAndSwap(callRunning, callAbandoned) {
			return stores.Grant{}, fmt.Errorf("%w: %w", stores.ErrAbandoned, ctx.Err())
		}
		r := <-done // it returned as ctx ended
		return r.g, r.err
	}
}

// endedErr returns err, wrapping ctx's error when ctx ended (pgx ends a
// statement with its context, and the outcome is then unknown), and with
// stores.ErrUnreachable or stores.ErrInvalid as classify does.
func endedErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w: %w", cerr, err)
	}
	return classify(err)
}

// classify wraps err with stores.ErrUnreachable when the call never
// reached the server: no connection could be made. Such a call changed
// nothing. It wraps err with stores.ErrInvalid when the server refused the
// arguments as beyond one of its limits (SQLSTATE 54000,
// program_limit_exceeded, such as a key too long for the primary key's
// btree on a server whose pages are smaller than Bounds assumed): the
// statement, and its implicit transaction, changed nothing either.
func classify(err error) error {
	if err == nil || errors.Is(err, stores.ErrUnreachable) || errors.Is(err, stores.ErrInvalid) {
		return err
	}
	if sqlState(err) == programLimitExceeded {
		return fmt.Errorf("%w: pgstore: %w", stores.ErrInvalid, err)
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return fmt.Errorf("%w: pgstore: %w", stores.ErrUnreachable, err)
	}
	return err
}
