package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
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

// flight is what an acquire may leave behind: the leases of every
// transaction it sent, on which it may have put keys, and the last of
// which may be in flight still. Only the acquire's goroutine uses it, and
// then hands it to its undo.
type flight struct {
	leases []clientv3.LeaseID
}

// sending records the leases of a transaction about to be sent.
func (f *flight) sending(leases ...clientv3.LeaseID) {
	for _, id := range leases {
		if id != clientv3.NoLease && !slices.Contains(f.leases, id) {
			f.leases = append(f.leases, id)
		}
	}
}

// detached runs op, an acquire, and returns its error, or as soon as ctx
// ends an error wrapping stores.ErrAbandoned and ctx.Err(). op runs on a
// context that ctx's cancellation does not end, bounded by the request
// timeout: gRPC would stop waiting for the answer at once, but etcd may
// still apply the transaction, so a release sent then could overtake it.
// When op finishes after the caller left, the Store queues the undo of
// what it may have granted (unless it never reached etcd): see undoQueue.
// So it does when op itself ran out of the request timeout with a
// transaction in flight, and its error then wraps stores.ErrAbandoned too:
// a release by the caller could be overtaken as well.
func (s *Store) detached(ctx context.Context, op func(context.Context) error, undo func() *pendingUndo) error {
	s.lifeMu.RLock()
	if s.closed {
		s.lifeMu.RUnlock()
		return ErrClosed
	}
	s.cleanupWait.Add(1)
	s.lifeMu.RUnlock()
	opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	// run runs op, queues its undo when it timed out in flight, and
	// reports whether it may have changed something not yet undone.
	run := func() (mayHaveChanged bool, err error) {
		err = op(opCtx)
		timedOut := opCtx.Err() != nil
		cancel()
		if errors.Is(err, stores.ErrUnreachable) || errors.Is(err, stores.ErrInvalid) {
			return false, err // it changed nothing
		}
		if err != nil && timedOut {
			s.undos.add(undo())
			return false, fmt.Errorf("%w: %w", stores.ErrAbandoned, err)
		}
		return true, err
	}
	if ctx.Done() == nil {
		defer s.cleanupWait.Done()
		_, err := run()
		return err
	}
	var state atomic.Int32
	done := make(chan error, 1)
	go func() {
		defer s.cleanupWait.Done()
		mayHaveChanged, err := run()
		if state.CompareAndSwap(callRunning, callReturned) {
			done <- err
			return
		}
		if mayHaveChanged {
			s.undos.add(undo())
		}
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
// request never left, or stores.ErrInvalid when etcd or its client refused
// it before acting: too large, or too many operations for the cluster's
// --max-txn-ops. Any other error leaves the outcome unknown.
func (s *Store) failed(what string, keys []string, err error) error {
	switch {
	case unreachable(err):
		return fmt.Errorf("%w: etcdstore: %s %s: %w", stores.ErrUnreachable, what, keysForMessage(keys), err)
	case tooLarge(err):
		return fmt.Errorf("%w: etcdstore: %s %s: the request is too large (check the cluster's --max-request-bytes, WithMaxRequestBytes): %w",
			stores.ErrInvalid, what, keysForMessage(keys), err)
	case errors.Is(err, rpctypes.ErrTooManyOps):
		return fmt.Errorf("%w: etcdstore: %s %s: too many operations in one transaction for the cluster's --max-txn-ops (%d keys need %d at most): %w",
			stores.ErrInvalid, what, keysForMessage(keys), len(keys), 2*len(keys)+1, err)
	}
	return fmt.Errorf("etcdstore: %s %s: %w", what, keysForMessage(keys), err)
}

// failedAfterChange wraps the error of a request about keys that a call
// sent after an earlier request of the call changed something (a fair
// attempt that queued its token): whatever the request's error, the call's
// outcome is not "nothing changed", so it wraps neither
// stores.ErrUnreachable nor stores.ErrInvalid.
func failedAfterChange(what string, keys []string, err error) error {
	const msg = "etcdstore: %s %s: an earlier request of the call changed the keys, then: "
	if errors.Is(err, stores.ErrUnreachable) || errors.Is(err, stores.ErrInvalid) {
		return fmt.Errorf(msg+"%v", what, keysForMessage(keys), err)
	}
	return fmt.Errorf(msg+"%w", what, keysForMessage(keys), err)
}

// tooLarge reports whether err says that a request was refused for its
// size before it was acted on: by etcd (--max-request-bytes), or by the
// client before sending it (its MaxCallSendMsgSize). gRPC's "received
// message larger than max" is not: on the client's side it refuses a
// reply, after etcd acted.
func tooLarge(err error) bool {
	if errors.Is(err, rpctypes.ErrRequestTooLarge) {
		return true
	}
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.ResourceExhausted && strings.Contains(st.Message(), "trying to send message larger than max")
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
