package zkstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/go-zookeeper/zk"

	"github.com/reqlock/reqlock/stores"
)

// States of a call.
const (
	callRunning int32 = iota
	callReturned
	callAbandoned
)

// detached runs fn, a sequence of ZooKeeper requests, and returns its result,
// or ctx's error as soon as ctx ends: go-zookeeper's requests take no
// context, and wait out a lost connection until it comes back or the
// session expires (go-zookeeper/zk#83). fn goes on in the background, and
// when its caller has left, undo (unless nil) runs with fn's result once fn
// returns, never before, or an owner-checked clean-up could reach the
// server ahead of the request it undoes; the error then wraps
// stores.ErrAbandoned. A call made while the connection has no session
// fails at once with stores.ErrUnreachable: nothing is sent. fn notes its
// writes in the effects it is given: a failure wraps stores.ErrUnreachable
// only while none of them may have been applied. Close waits for fn and
// undo.
func detached[T any](ctx context.Context, s *Store, fn func(e *effects) (T, error), undo func(T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	if s.isClosed() {
		return zero, ErrClosed
	}
	if st := s.conn.State(); st != zk.StateHasSession {
		return zero, fmt.Errorf("%w: %w (connection state %v)", stores.ErrUnreachable, errNoSession, st)
	}
	type result struct {
		v   T
		err error
	}
	var (
		state atomic.Int32
		e     effects
	)
	done := make(chan result, 1)
	s.inFlight.Add(1)
	started := s.goTracked(func() {
		defer s.inFlight.Add(-1)
		var v T
		err := s.ensureRoot(&e)
		if err == nil {
			v, err = fn(&e)
		}
		if state.CompareAndSwap(callRunning, callReturned) {
			done <- result{v, err}
			return
		}
		if undo != nil {
			undo(v, err)
		}
	})
	if !started {
		s.inFlight.Add(-1)
		return zero, ErrClosed
	}
	select {
	case r := <-done:
		return r.v, wrapErr(r.err, &e)
	case <-ctx.Done():
		if state.CompareAndSwap(callRunning, callAbandoned) {
			if undo != nil {
				return zero, fmt.Errorf("zkstore: call abandoned, its effect undone: %w", errors.Join(stores.ErrAbandoned, ctx.Err()))
			}
			return zero, ctx.Err()
		}
		r := <-done // it returned as ctx ended
		return r.v, wrapErr(r.err, &e)
	}
}

// effects records whether the writes of one call may have changed anything
// on the server. A call whose later request could not be sent (no server
// reachable) has an unknown outcome, not "nothing changed", once an earlier
// write of it may have been applied, such as a fair waiter's queue node.
// A nil *effects records nothing (clean-ups whose errors go nowhere).
type effects struct{ maybe atomic.Bool }

// note records the outcome of one write request, and returns err.
func (e *effects) note(err error) error {
	if e != nil && !notApplied(err) {
		e.maybe.Store(true)
	}
	return err
}

// applied reports whether a write of the call may have been applied.
func (e *effects) applied() bool { return e != nil && e.maybe.Load() }

// notApplied reports whether a write request that returned err certainly
// changed nothing: it was never sent, or the server refused it (a
// transaction is refused whole). A success, a lost connection or any other
// error may have been applied.
func notApplied(err error) bool {
	if err == nil {
		return false
	}
	for _, refused := range []error{zk.ErrNoServer, errTooLarge, zk.ErrNoNode, zk.ErrNodeExists, zk.ErrBadVersion,
		zk.ErrNotEmpty, zk.ErrNoAuth, zk.ErrInvalidACL, zk.ErrBadArguments, zk.ErrNoChildrenForEphemerals} {
		if errors.Is(err, refused) {
			return true
		}
	}
	return false
}

// wrapErr gives an error of go-zookeeper the package's prefix, keeping it
// testable with errors.Is; the package's own errors pass as they are. A
// request that could not be sent makes the call's failure wrap
// stores.ErrUnreachable only when no write of the call, per e, may have
// been applied.
func wrapErr(err error, e *effects) error {
	switch {
	case err == nil || errors.Is(err, stores.ErrNotHeld) || errors.Is(err, stores.ErrInvalid) ||
		errors.Is(err, ErrFenceRange) || errors.Is(err, ErrClosed):
		return err
	case errors.Is(err, zk.ErrNoServer) && !e.applied():
		return fmt.Errorf("%w: zkstore: %w", stores.ErrUnreachable, err)
	case errors.Is(err, zk.ErrNoServer):
		return fmt.Errorf("zkstore: after a write that may have been applied: %w", err)
	}
	return fmt.Errorf("zkstore: %w", err)
}
