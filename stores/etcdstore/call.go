package etcdstore

import (
	"cmp"
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

// maxBackgroundReleases bounds the releases that go on after their caller
// left (each a goroutine and up to maxAttemptsInFlight copies in flight).
const maxBackgroundReleases = 16

// goOn runs op, a release, on a context that ctx's cancellation does not
// end, bounded by the request timeout, and returns its error, or as soon as
// ctx ends an error wrapping ctx.Err() (the outcome is unknown). A release
// is idempotent and owner-checked, so it may land after its caller left:
// it goes on until etcd answers it, so that a key whose holder's release
// was caught by a leader change is free as soon as the new leader answers,
// and not only at its TTL. Up to maxBackgroundReleases go on at once, each
// for up to the request timeout; beyond that number, op is cancelled as
// its caller leaves. Either way, unless op was settled meanwhile, overflow
// (when not nil) hands it to the undo queue, which sends it until etcd
// answers.
func (s *Store) goOn(ctx context.Context, what string, keys []string, op func(context.Context) error, overflow func()) error {
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
		s.backgroundReleases.Add(-1)
		if overflow != nil && !releaseSettled(err) {
			overflow() // etcd answered none in time: the undo queue goes on
		}
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	if s.backgroundReleases.Add(1) > maxBackgroundReleases {
		s.backgroundReleases.Add(-1)
		cancel()
		err := <-done // at once: op ends with opCtx
		if releaseSettled(err) {
			return err
		}
		if overflow == nil {
			return fmt.Errorf("etcdstore: %s %s: the caller left before etcd answered, and %d releases go on already: it was given up: %w",
				what, keysForMessage(keys), maxBackgroundReleases, ctx.Err())
		}
		overflow()
		return fmt.Errorf("etcdstore: %s %s: the caller left before etcd answered, and %d releases go on already: the undo queue sends it: %w",
			what, keysForMessage(keys), maxBackgroundReleases, ctx.Err())
	}
	if !state.CompareAndSwap(callRunning, callAbandoned) {
		s.backgroundReleases.Add(-1)
		return <-done // it returned as ctx ended
	}
	return fmt.Errorf("etcdstore: %s %s: the caller left before etcd answered; it goes on for up to %v: %w", what, keysForMessage(keys), s.timeout, ctx.Err())
}

// releaseSettled reports whether a release that ended with err needs no
// more sending: it landed, found nothing to release, was refused, or the
// Store closed.
func releaseSettled(err error) bool {
	return err == nil || errors.Is(err, stores.ErrNotHeld) || errors.Is(err, stores.ErrInvalid) || errors.Is(err, ErrClosed)
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

// attemptTimeout is how long an idempotent step of a call (a lease grant,
// a release, a refresh, an undo) waits for etcd's answer before it sends
// the step again: a request that a follower forwarded to a leader that
// died meanwhile is never answered (etcd drops it; the follower waits for
// its own request timeout, seven seconds by default), while a copy sent
// once the new leader is elected (about 1.5s after the kill with etcd's
// default election timeout) is answered at once. The earlier copies of a
// grant, a release or a refresh keep waiting, and the first answer wins;
// an undo's try is cancelled for the next (see undoQueue.run).
const attemptTimeout = 250 * time.Millisecond

// Pauses before an idempotent step is sent again after etcd answered it
// with a transient failure (no leader yet, say).
const (
	retryPauseMin = 25 * time.Millisecond
	retryPauseMax = 200 * time.Millisecond
)

// maxAttemptsInFlight bounds the copies of one step that wait for etcd at
// once: with attemptTimeout, they cover the first two seconds.
const maxAttemptsInFlight = 8

// attemptBound is the shortest time a step waits for an answer before it
// is sent again: attemptTimeout, or the request timeout when shorter.
func (s *Store) attemptBound() time.Duration { return min(attemptTimeout, s.timeout) }

// copyBound is the time a step waits for an answer before it is sent
// again: the attempt bound, or twice the latest round trip when longer, so
// that a distant but healthy cluster gets each step once.
func (s *Store) copyBound() time.Duration { return s.rtt.bound(s.attemptBound()) }

// roundTrip is the round trip of the latest request etcd answered, which
// the lease pool, resend and the undo queue measure and share.
type roundTrip struct{ d atomic.Int64 }

// observe records the round trip of a request answered after d, at most
// twice base: one stuck request leaves the bound at most 4 times base.
func (r *roundTrip) observe(d, base time.Duration) { r.d.Store(int64(min(d, 2*base))) }

// bound is base, or twice the latest round trip when longer.
func (r *roundTrip) bound(base time.Duration) time.Duration {
	return max(base, 2*time.Duration(r.d.Load()))
}

// transient reports whether err is a failure of a request that etcd may
// answer if it is sent again soon: no leader, a leader change, a request
// timed out inside etcd, a member stopping, a connection that broke. A
// request that no member could be sent (unreachable) is not: it fails at
// once, so that an outage is a fast failure.
func transient(err error) bool {
	if err == nil || unreachable(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable
	}
	st, ok := status.FromError(err)
	if !ok {
		return strings.Contains(err.Error(), "proposal dropped")
	}
	return st.Code() == codes.Unavailable || strings.Contains(st.Message(), "proposal dropped")
}

// resend runs send, a transaction that etcd may apply more than once with
// no other effect than once (each copy compares the same owner and
// sequence), until an answer settles it or ctx ends, and returns the
// answers it got. A copy that etcd has not answered within copyBound is
// joined by another, and so on every copyBound; the earlier copies go
// on waiting, so that a slow answer still counts, up to
// maxAttemptsInFlight of them, after which the oldest is given up for the
// next. A copy that failed transiently is sent again after a short pause.
// An answer that ok accepts settles it at once. Any other answer settles
// it once the copies in flight have answered too, or ctx has ended: an
// earlier copy may have been applied (and the later one refused because
// of it), which the earlier one's answer tells. With no answer, resend
// returns an error that leaves the outcome unknown when a copy may have
// reached etcd, and the error of a copy that reached no member (see
// unreachable) when none did.
func (s *Store) resend(ctx context.Context, send func(context.Context) (*clientv3.TxnResponse, error), ok func(*clientv3.TxnResponse) bool) ([]*clientv3.TxnResponse, error) {
	answers, _, err := s.resendUnsure(ctx, send, ok)
	return answers, err
}

// resendUnsure is resend, and also returns, with refusals only, the error
// of a copy whose outcome is unknown (it may have been applied before the
// copies that were refused).
func (s *Store) resendUnsure(ctx context.Context, send func(context.Context) (*clientv3.TxnResponse, error), ok func(*clientv3.TxnResponse) bool) ([]*clientv3.TxnResponse, error, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the copies still in flight
	type result struct {
		copy int
		resp *clientv3.TxnResponse
		err  error
	}
	var (
		results  = make(chan result, maxAttemptsInFlight+1)
		inFlight []int                          // the copies waiting, oldest first
		cancels  = map[int]context.CancelFunc{} // of the copies waiting
		copies   int
		answers  []*clientv3.TxnResponse
		sentErr  error // of a copy that may have reached etcd
		bound    = s.copyBound()
		pause    = retryPauseMin
		timer    = time.NewTimer(bound)
	)
	defer timer.Stop()
	start := func() {
		if len(inFlight) == maxAttemptsInFlight {
			// The oldest is given up; only an answer of it still counts.
			cancels[inFlight[0]]()
			delete(cancels, inFlight[0])
			inFlight = inFlight[1:]
			sentErr = cmp.Or(sentErr, errUnanswered)
		}
		n := copies
		copies++
		copyCtx, cancelCopy := context.WithCancel(ctx)
		inFlight, cancels[n] = append(inFlight, n), cancelCopy
		go func() {
			sent := time.Now()
			resp, err := send(copyCtx)
			if err == nil {
				s.rtt.observe(time.Since(sent), s.attemptBound())
			}
			select {
			case results <- result{n, resp, err}:
			case <-ctx.Done(): // resend returned
			}
		}()
	}
	start()
	for {
		select {
		case r := <-results:
			if cancelCopy, waiting := cancels[r.copy]; waiting {
				cancelCopy()
				delete(cancels, r.copy)
				inFlight = slices.DeleteFunc(inFlight, func(n int) bool { return n == r.copy })
			} else if r.err != nil {
				continue // given up, and no answer
			}
			switch {
			case r.err == nil && ok(r.resp):
				return []*clientv3.TxnResponse{r.resp}, nil, nil
			case r.err == nil:
				answers = append(answers, r.resp)
			case unreachable(r.err):
				if len(inFlight) == 0 && len(answers) == 0 {
					if sentErr != nil {
						return nil, nil, sentErr
					}
					return nil, nil, r.err
				}
			case transient(r.err):
				sentErr = r.err
				if len(inFlight) == 0 && len(answers) == 0 {
					timer.Reset(pause) // then a copy, and the bound again
					pause = min(2*pause, retryPauseMax)
				}
			default: // refused before acting, or ctx ended
				if len(inFlight) == 0 && len(answers) == 0 {
					return nil, nil, r.err
				}
				sentErr = cmp.Or(sentErr, r.err)
			}
			if len(inFlight) == 0 && len(answers) > 0 {
				return answers, sentErr, nil
			}
		case <-timer.C:
			if len(answers) > 0 {
				continue // no more copies: wait for those in flight
			}
			start()
			timer.Reset(bound)
		case <-ctx.Done():
			if len(answers) > 0 {
				return answers, sentErr, nil
			}
			return nil, nil, errors.Join(ctx.Err(), sentErr)
		}
	}
}

// errUnanswered is the outcome of a copy of a request that etcd did not
// answer before it was given up: unknown.
var errUnanswered = errors.New("etcdstore: a copy of the request was not answered")
