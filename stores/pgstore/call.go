package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reqlock/reqlock/internal/undoqueue"
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

// attempt is what an acquire's statement leaves behind, for its undo.
type attempt struct {
	sess    session // of the connection that carried the statement
	unknown bool    // the statement may still apply: no reply came, and the connection is gone
	maybe   bool    // the statement returned a reply the Store could not read: it may have granted
}

// result is the outcome of one acquire.
type result struct {
	g   stores.Grant
	a   attempt
	err error
	own error // the error of the statement's own context, when it ended
}

// detached runs an acquire call on a context of its own, bounded by the
// call limit rather than by ctx, and returns its outcome; or, as soon as
// ctx ends, an error wrapping stores.ErrAbandoned and ctx's error, and the
// call goes on. A statement cut off by its context may still apply on the
// server after the client gave up on it (pgx closes the connection; the
// server runs what it has received, or receives late), so neither the
// caller nor a release sent at once can undo it. Instead, when the caller
// has left, or the call's outcome is unknown, the Store owes the undo (see
// owe): it ends the session that carried the statement, so that nothing of
// it can apply any more, then releases the keys, owner-checked.
//
// It returns ErrClosed once Close has begun; Close waits for every call.
//
// shared says the call is an AcquireShared, whose undo is a ReleaseShared.
func (s *Store) detached(ctx context.Context, keys []string, token string, ttl time.Duration,
	call func(context.Context, *attempt) (stores.Grant, error), shared bool) (stores.Grant, error) {
	if !s.begin() {
		return stores.Grant{}, ErrClosed
	}
	run := func(ctx context.Context) result {
		own, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.callLimit)
		defer cancel()
		var r result
		r.g, r.err = call(own, &r.a)
		r.err = classify(r.err)
		r.own = own.Err()
		return r
	}
	if ctx.Done() == nil { // never ends
		defer s.background.Done()
		return s.answer(ctx, run(ctx), keys, token, ttl, shared)
	}
	var state atomic.Int32
	done := make(chan result, 1)
	go func() {
		defer s.background.Done()
		r := run(ctx)
		if state.CompareAndSwap(callRunning, callReturned) {
			done <- r
			return
		}
		// The caller left: undo in its stead what may have been granted.
		if r.g.OK || r.a.maybe || r.a.unknown {
			s.owe(keys, token, ttl, r.a, shared)
		}
	}()
	select {
	case r := <-done:
		return s.answer(ctx, r, keys, token, ttl, shared)
	case <-ctx.Done():
		if state.CompareAndSwap(callRunning, callAbandoned) {
			return stores.Grant{}, fmt.Errorf("%w: %w", stores.ErrAbandoned, ctx.Err())
		}
		return s.answer(ctx, <-done, keys, token, ttl, shared) // it returned as ctx ended
	}
}

// answer returns r to a caller that waited for it. An outcome the statement
// may still change is the Store's to undo, as for a caller that left, and
// the error then wraps stores.ErrAbandoned, so that the caller does not
// release the keys itself (a release sent at once could land before the
// statement). The Store undoes it while the caller waits, until ctx ends,
// so that the statement cannot apply after the call returned; what is left
// then goes on in the background.
func (s *Store) answer(ctx context.Context, r result, keys []string, token string, ttl time.Duration, shared bool) (stores.Grant, error) {
	if !r.a.unknown {
		return r.g, r.err
	}
	cause := fmt.Errorf("pgstore: connection lost with the outcome unknown: %w", r.err)
	if r.own != nil {
		cause = fmt.Errorf("pgstore: no answer within the call limit %v: %w", s.callLimit, r.own)
	}
	d := s.debtOf(keys, token, ttl, r.a, shared)
	if undoqueue.SettleNow(ctx, d, s.settle, s.callLimit) {
		return stores.Grant{}, fmt.Errorf("%w: %w; the store ended the session that carried it and released the keys", stores.ErrAbandoned, cause)
	}
	s.undo.Add(d)
	return stores.Grant{}, fmt.Errorf("%w: %w; the store undoes it", stores.ErrAbandoned, cause)
}

// settled classifies err, the error of an acquire's statement on conn, into
// a: the statement may still apply when no reply came and the connection is
// gone, and it may have granted when it returned a reply the Store could
// not read. A server's error reply rolled the statement (and its implicit
// transaction) back, and an error pgx raised before it sent anything
// changed nothing.
func settled(a *attempt, err error, connClosed bool) {
	var pgErr *pgconn.PgError
	switch {
	case err == nil, errors.As(err, &pgErr), pgconn.SafeToRetry(err):
		a.unknown, a.maybe = false, false
	case connClosed:
		a.unknown, a.maybe = true, false
	default:
		a.unknown, a.maybe = false, true
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
