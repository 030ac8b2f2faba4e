package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

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

// Pauses between the tries of an undo that got no answer.
const (
	undoPauseMin = 50 * time.Millisecond
	undoPauseMax = time.Second
)

// flight is what an acquire leaves in flight: the leases of the last
// transaction it sent, whose outcome is unknown when no answer came (every
// earlier one was answered). Only the acquire's goroutine, and then its
// undo on the same goroutine, use it.
type flight struct {
	leases []clientv3.LeaseID
}

// sending records the leases of a transaction about to be sent.
func (f *flight) sending(leases ...clientv3.LeaseID) {
	f.leases = slices.DeleteFunc(leases, func(id clientv3.LeaseID) bool { return id == clientv3.NoLease })
}

// detached runs op, an acquire, and returns its error, or as soon as ctx
// ends an error wrapping stores.ErrAbandoned and ctx.Err(). op runs on a
// context that ctx's cancellation does not end, bounded by the request
// timeout: gRPC would stop waiting for the answer at once, but etcd may
// still apply the transaction, so a release sent then could overtake it.
// When op finishes after the caller left, undo ends what it may have
// granted (unless it never reached etcd), on a context that Close ends.
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
		undo(s.bg)
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

// undo ends what an abandoned acquire of keys by token may have granted
// or, when fair, queued, and makes sure that its last transaction, should
// etcd apply it later (a request held up in a paused member, say), changes
// nothing. One transaction, with no condition, does it all: it puts an
// abandon mark of token on each lease of the transaction in flight, and
// deletes every holder key that holds token (and token's queue key). Every
// acquire transaction compares that its token has no mark. So, whatever
// the order in which etcd applies the two: a grant applied before the
// undo is deleted by it; one applied after fails its comparison while the
// lease lives, its mark living exactly as long; and once the lease is
// gone, its put on the lease fails. The marks cost an abandoned acquire
// one transaction, and every acquire one comparison, no round trip.
//
// Without an answer, the undo tries again, pausing between tries, until
// it gets one, until fl's leases can have expired (after which the
// transaction in flight cannot land), or until ctx ends, when Close
// revokes every lease of the Store instead.
func (s *Store) undo(ctx context.Context, keys []string, token string, fair bool, fl *flight) {
	if len(fl.leases) == 0 {
		return // no transaction was sent
	}
	until := s.leases.latestExpiry(fl.leases)
	pause := undoPauseMin
	for {
		reqCtx, cancel := context.WithTimeout(ctx, s.timeout)
		err := s.undoTxn(reqCtx, keys, token, fair, fl.leases)
		cancel()
		if err == nil || !time.Now().Before(until) || !sleepCtx(ctx, pause) {
			return
		}
		pause = min(2*pause, undoPauseMax)
	}
}

// undoTxn is one try of undo: the marks on leases and the deletes, in one
// transaction. A lease etcd no longer knows fails the transaction: the
// leases still alive are then found and marked alone.
func (s *Store) undoTxn(ctx context.Context, keys []string, token string, fair bool, leases []clientv3.LeaseID) error {
	for {
		ops := make([]clientv3.Op, 0, len(leases)+len(keys)+1)
		for _, id := range leases {
			ops = append(ops, clientv3.OpPut(s.abandonedKey(token, id), "", clientv3.WithLease(id)))
		}
		for _, k := range keys {
			h := holderKey(s.dir(k))
			ops = append(ops, clientv3.OpTxn(heldBy(h, token), []clientv3.Op{clientv3.OpDelete(h)}, nil))
		}
		if fair {
			ops = append(ops, clientv3.OpDelete(queueDir(s.dir(keys[0]))+token))
		}
		_, err := s.kv.Txn(ctx).Then(ops...).Commit()
		if !errors.Is(err, rpctypes.ErrLeaseNotFound) || len(leases) == 0 {
			return err
		}
		alive, err := s.leases.alive(ctx, leases)
		if err != nil {
			return err
		}
		if len(alive) == len(leases) {
			// Each was alive a moment ago: one expired meanwhile.
			alive, err = s.leases.alive(ctx, leases)
			if err != nil || len(alive) == len(leases) {
				return errors.Join(err, fmt.Errorf("%w: undo: a lease was not found, then every lease was", ErrUnexpectedReply))
			}
		}
		leases = alive
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
