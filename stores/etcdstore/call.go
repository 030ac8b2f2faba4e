package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/reqlock/reqlock/stores"
)

// States of a detached call.
const (
	callRunning int32 = iota
	callReturned
	callAbandoned
)

// detached runs op, an acquire, and returns its error, or as soon as ctx
// ends an error wrapping stores.ErrAbandoned and ctx.Err(). op runs on a
// context that ctx's cancellation does not end, bounded by the request
// timeout: gRPC would stop waiting for the answer at once, but etcd may
// still apply the transaction, so a release sent then could overtake it.
// When op finishes after the caller left, undo releases what it may have
// granted (unless it never reached etcd), on a context of its own.
func (s *Store) detached(ctx context.Context, op func(context.Context) error, undo func(context.Context)) error {
	s.lifeMu.RLock()
	if s.closed {
		s.lifeMu.RUnlock()
		return ErrClosed
	}
	s.cleanupWait.Add(1)
	s.lifeMu.RUnlock()
	opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	if ctx.Done() == nil {
		defer s.cleanupWait.Done()
		defer cancel()
		return op(opCtx)
	}
	var state atomic.Int32
	done := make(chan error, 1)
	go func() {
		defer s.cleanupWait.Done()
		err := op(opCtx)
		cancel()
		if state.CompareAndSwap(callRunning, callReturned) {
			done <- err
			return
		}
		if errors.Is(err, stores.ErrUnreachable) || errors.Is(err, stores.ErrInvalid) {
			return // it changed nothing
		}
		undoCtx, cancelUndo := context.WithTimeout(context.Background(), s.timeout)
		defer cancelUndo()
		undo(undoCtx)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		if state.CompareAndSwap(callRunning, callAbandoned) {
			return fmt.Errorf("%w: %w", stores.ErrAbandoned, ctx.Err())
		}
		return <-done // it returned as ctx ended
	}
}

// failed wraps the error of a request about keys with the package prefix,
// and with stores.ErrUnreachable when no member could be dialled, so the
// request never left.
func (s *Store) failed(what string, keys []string, err error) error {
	if unreachable(err) {
		return fmt.Errorf("%w: etcdstore: %s %q: %w", stores.ErrUnreachable, what, keys, err)
	}
	return fmt.Errorf("etcdstore: %s %q: %w", what, keys, err)
}

// unreachable reports whether err says that gRPC found no connection to
// any member: it failed the request before sending it (the Store's
// requests do not wait for a connection). A request that broke on a
// connection that was up, or that a member refused, may have been applied.
func unreachable(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return false
	}
	msg := st.Message()
	return strings.Contains(msg, "while dialing") || strings.Contains(msg, "no address available") ||
		strings.Contains(msg, "no connection available")
}
