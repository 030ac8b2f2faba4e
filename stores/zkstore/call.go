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

// call runs fn, a sequence of ZooKeeper requests, and returns its result,
// or ctx's error as soon as ctx ends: go-zookeeper's requests take no
// context, and wait out a lost connection until it comes back or the
// session expires (go-zookeeper/zk#83). fn goes on in the background, and
// when its caller has left, undo (unless nil) runs with fn's result once fn
// returns, never before, or an owner-checked clean-up could reach the
// server ahead of the request it undoes; the error then wraps
// stores.ErrAbandoned. A call made while the connection has no session
// fails at once with stores.ErrUnreachable: nothing is sent. Close waits
// for fn and undo.
func call[T any](ctx context.Context, s *Store, fn func() (T, error), undo func(T, error)) (T, error) {
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
	var state atomic.Int32
	done := make(chan result, 1)
	s.inFlight.Add(1)
	started := s.goTracked(func() {
		defer s.inFlight.Add(-1)
		v, err := fn()
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
		return r.v, wrapErr(r.err)
	case <-ctx.Done():
		if state.CompareAndSwap(callRunning, callAbandoned) {
			if undo != nil {
				return zero, fmt.Errorf("zkstore: call abandoned, its effect undone: %w", errors.Join(stores.ErrAbandoned, ctx.Err()))
			}
			return zero, ctx.Err()
		}
		r := <-done // it returned as ctx ended
		return r.v, wrapErr(r.err)
	}
}

// wrapErr gives an error of go-zookeeper the package's prefix, keeping it
// testable with errors.Is; the package's own errors pass as they are.
func wrapErr(err error) error {
	switch {
	case err == nil || errors.Is(err, stores.ErrNotHeld) || errors.Is(err, stores.ErrInvalid) ||
		errors.Is(err, ErrFenceRange) || errors.Is(err, ErrClosed):
		return err
	case errors.Is(err, zk.ErrNoServer):
		return fmt.Errorf("%w: zkstore: %w", stores.ErrUnreachable, err)
	}
	return fmt.Errorf("zkstore: %w", err)
}
