package redlockstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// reply is one node's answer to a script.
type reply struct {
	node   int
	vals   []int64
	err    error
	unsent bool // the call never reached the node (see neverSent)
}

// unreachable reports whether the call never reached the node.
func (r reply) unreachable() bool { return r.unsent }

// unmark returns the error of a node call without the stores.ErrUnreachable
// that its Driver wraps in a call that cannot have reached the node (no
// connection could be dialled, or none came free in time, on every attempt
// it made), and whether it was there: whether an operation reached the
// store is the Store's to say, over all its nodes (see noQuorum). A
// Driver wraps it as fmt.Errorf("%w: %w", stores.ErrUnreachable, err).
func unmark(err error) (error, bool) {
	if !errors.Is(err, stores.ErrUnreachable) {
		return err, false
	}
	if m, ok := err.(interface{ Unwrap() []error }); ok {
		var rest []error
		for _, e := range m.Unwrap() {
			if e != stores.ErrUnreachable {
				rest = append(rest, e)
			}
		}
		if len(rest) == 1 {
			return rest[0], true
		}
		return errors.Join(rest...), true
	}
	return err, true
}

// eval runs script on node i and returns its array of integers.
func (s *Store) eval(ctx context.Context, i int, script *redisstore.Script, keys []string, args ...any) ([]int64, error) {
	r, err := s.nodes[i].driver.Eval(ctx, script, keys, args)
	if err != nil {
		return nil, err
	}
	if r.Ints == nil {
		return nil, fmt.Errorf("%w: %d, want an array", ErrUnexpectedReply, r.Int)
	}
	return r.Ints, nil
}

// fanOut runs call on every node in indexes at once, each bounded by
// timeout (and ctx's deadline) but not by ctx's cancellation, and returns
// the channel their replies arrive on; it has room for all of them, so a
// call never blocks on a reader that left. The calls are counted and their
// failures reported. A skipped node is not called: its reply, at once, is
// a failure wrapping ErrNodeSkipped that never reached the node; after
// Close began, every reply is ErrClosed, at once.
func (s *Store) fanOut(ctx context.Context, timeout time.Duration, indexes []int,
	call func(ctx context.Context, i int) ([]int64, error)) <-chan reply {
	out := make(chan reply, len(indexes))
	s.fanOutInto(ctx, timeout, indexes, call, out)
	return out
}

// fanOutInto is fanOut with the replies sent on out, which must have room
// for them.
func (s *Store) fanOutInto(ctx context.Context, timeout time.Duration, indexes []int,
	call func(ctx context.Context, i int) ([]int64, error), out chan<- reply) {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	base := context.WithoutCancel(ctx)
	send := make([]int, 0, len(indexes))
	for _, i := range indexes {
		if s.skipped(i) {
			s.nodes[i].notSent.Add(1)
			out <- reply{node: i, err: fmt.Errorf("%w (%s)", ErrNodeSkipped, s.nodes[i].name), unsent: true}
			continue
		}
		send = append(send, i)
	}
	if len(send) > 0 && !s.track(len(send)) {
		for _, i := range send {
			out <- reply{node: i, err: ErrClosed, unsent: true}
		}
		return
	}
	for _, i := range send {
		go func() {
			defer s.wg.Done()
			cctx, cancel := context.WithDeadline(base, deadline)
			start := time.Now()
			s.nodes[i].calls.Add(1)
			// A stalled call's reply comes at once: the client may not
			// notice the cancellation before the deadline (a read from a
			// frozen server waits for it). Its outcome is unknown, as a
			// timeout's is.
			var replied atomic.Bool
			unwatch := s.watchStall(i, start, deadline, func() {
				cancel()
				replied.Store(true)
				out <- reply{node: i, err: fmt.Errorf("%w after %v", errStalled, time.Since(start).Round(time.Millisecond))}
			})
			vals, err := call(cctx, i)
			err, unsent := unmark(err)
			took := time.Since(start)
			if unwatch() && err != nil {
				err = fmt.Errorf("%w after %v: %w", errStalled, took.Round(time.Millisecond), err)
			}
			cancel()
			if err == nil && len(vals) == 2 && vals[0] == -1 {
				err = fmt.Errorf("%w for %v more", ErrQuarantined, time.Duration(vals[1])*time.Millisecond)
				s.nodes[i].quarantines.Add(1)
			}
			s.count(i, err)
			s.health(i, err, took, timeout)
			if !replied.Load() {
				out <- reply{node: i, vals: vals, err: err, unsent: unsent}
			}
		}()
	}
}

// count records the outcome of a call of node i (its sending is counted
// as it is sent: a stalled call's reply comes before it ends).
func (s *Store) count(i int, err error) {
	n := s.nodes[i]
	n.failing.Store(err != nil)
	if err != nil {
		n.failures.Add(1)
		if s.onFailure != nil {
			s.onFailure(n.name, err)
		}
	}
}

// all returns the indexes of every node.
func (s *Store) all() []int {
	out := make([]int, len(s.nodes))
	for i := range out {
		out[i] = i
	}
	return out
}

// noQuorum returns the error of an operation that too few nodes answered:
// it wraps ErrNoQuorum and every node's error, and stores.ErrUnreachable
// when unreachable says no node may have changed.
func (s *Store) noQuorum(op string, ok int, failed []reply, unreachable bool) error {
	return s.noQuorumOf(op, ok, s.quorum, failed, unreachable)
}

// noQuorumOf is noQuorum of an operation that needed q nodes.
func (s *Store) noQuorumOf(op string, ok, q int, failed []reply, unreachable bool) error {
	errs := make([]error, 0, len(failed))
	for _, r := range failed {
		errs = append(errs, &NodeError{Node: s.nodes[r.node].name, Err: r.err})
	}
	err := fmt.Errorf("%w: %s: %d of %d nodes answered, quorum %d: %w",
		ErrNoQuorum, op, ok, len(s.nodes), q, errors.Join(errs...))
	if unreachable {
		return fmt.Errorf("%w: %w", stores.ErrUnreachable, err)
	}
	return err
}

// Bounds of the grace a Release or a Refresh gives the nodes still out once
// a quorum decided it (see linger).
const (
	minGrace = 5 * time.Millisecond
	maxGrace = 50 * time.Millisecond
)

// linger waits, once a quorum decided an operation, for the replies of the
// nodes still out (true in flying) for a short grace: twice the slowest
// answer so far, within [minGrace, maxGrace]. Nodes whose last call failed
// (frozen, partitioned) or that are skipped are not waited for. Each reply
// that comes is handed to handle and cleared from flying; it returns how
// many came. On a healthy cluster every node answers within the grace, so
// the operation returns with every node done, not a minority still
// holding (or not yet renewing) the keys for a moment; a stalled minority
// costs nothing.
func (s *Store) linger(ctx context.Context, replies <-chan reply, flying []bool, slowest time.Duration, handle func(reply)) int {
	waiting := func() bool {
		for i, f := range flying {
			if f && !s.nodes[i].failing.Load() && !s.skipped(i) {
				return true
			}
		}
		return false
	}
	if !waiting() {
		return 0
	}
	timer := time.NewTimer(min(max(2*slowest, minGrace), maxGrace))
	defer timer.Stop()
	got := 0
	for waiting() {
		select {
		case r := <-replies:
			flying[r.node] = false
			got++
			handle(r)
		case <-timer.C:
			return got
		case <-ctx.Done():
			return got
		}
	}
	return got
}

// callTimeout bounds each node call of an operation with TTL ttl.
func (s *Store) callTimeout(ttl time.Duration) time.Duration {
	return min(s.nodeTimeout, max(ttl/3, time.Millisecond))
}
