package redlockstore

import (
	"context"
	"fmt"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// Release ends token's lock on every node it reaches, owner-checked, and
// waits for every node's answer (each bounded by the node timeout) or for
// ctx to end. With keep zero or negative it deletes the keys, and every
// node publishes their release; with keep positive it sets their TTL to
// keep (plus the drift allowance) and publishes nothing.
//
// A Refresh of the token that runs meanwhile starts no more calls, and
// Release closes the token (see closeAttempt) on every node where a call
// of a Refresh is in flight or was lost, with keep positive on every node,
// so that no renewal or re-take of the token lands after it: those nodes
// keep a tombstone for the max TTL (for keep, on the others). An uncontended
// lock pays nothing for this.
//
// It returns an error wrapping stores.ErrNotHeld, naming the keys, when
// more nodes than a quorum allows answered that a key did not hold token
// (after ending the lock on the others); one wrapping ErrNoQuorum, naming
// the failed nodes, when too few nodes answered to tell; one wrapping
// stores.ErrInvalid for no keys, an empty, duplicate, unsorted or too long
// key, or a positive keep out of Bounds; and ctx.Err() when ctx ends first
// (the calls go on, bounded by the node timeout).
func (s *Store) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	if err := args.CheckRelease(ctx, keys); err != nil {
		return err
	}
	if keep > 0 {
		if err := s.checkArgs(keys, "keep", keep); err != nil {
			return err
		}
	} else if err := s.checkKeys(keys); err != nil {
		return err
	}
	s.forgetRefusal(token)
	tombs := s.endToken(token, keep)
	if err := s.awaitLanded(ctx, token); err != nil {
		return err
	}
	if keep <= 0 {
		// A late grant of a kept lock keeps its TTL: deleting it would
		// signal waiters while the kept keys stay held.
		s.markReleased(token)
	}
	replies := s.releaseOn(ctx, keys, token, keep, s.all(), s.nodeTimeout, tombs)
	released := make([]int, len(keys))
	answered := 0
	var failed []reply
	for range s.nodes {
		select {
		case r := <-replies:
			if r.err == nil && len(r.vals) != len(keys) {
				r.err = fmt.Errorf("%w: release %s answered %v", ErrUnexpectedReply, keysForMessage(keys), r.vals)
			}
			if r.err != nil {
				failed = append(failed, r)
				continue
			}
			answered++
			for k, v := range r.vals {
				if v == 1 {
					released[k]++
				}
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var notHeld []string
	unknown := false
	for k, key := range keys {
		switch {
		case released[k] >= s.quorum:
		case answered-released[k] > len(s.nodes)-s.quorum:
			notHeld = append(notHeld, key)
		default:
			unknown = true
		}
	}
	if len(notHeld) > 0 {
		return fmt.Errorf("%w: %d of %d keys: %s", stores.ErrNotHeld, len(notHeld), len(keys), keysForMessage(notHeld))
	}
	if unknown {
		return s.noQuorum("release "+keysForMessage(keys), answered, failed, false)
	}
	return nil
}

// tombstone is what a release leaves on a node to close attempts of its
// token: the attempt closed (with every earlier one), and for how long.
type tombstone struct {
	attempt int64
	ttl     time.Duration
}

// tombstoneTTL is how long a tombstone closes an attempt: a call of it that
// reaches its node later than that after its undo or release is not
// stopped. The max TTL, as for the quarantine, plus the drift allowance and
// the cleanup timeout.
func (s *Store) tombstoneTTL() time.Duration {
	return s.maxTTL + s.drift(s.maxTTL) + cleanupTimeout
}

// endToken records that token's lock is being released, so that no Refresh
// call of it starts any more, and returns the tombstones the release must
// leave: on the nodes where a Refresh call is in flight or was lost, and
// with keep positive on every node (for as long as the keys are kept, so
// that no renewal extends them), closing every attempt of the token.
func (s *Store) endToken(token string, keep time.Duration) map[int]tombstone {
	tombs := make(map[int]tombstone)
	if keep > 0 {
		for i := range s.nodes {
			tombs[i] = tombstone{attempt: closeAll, ttl: keep + s.drift(keep)}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.tokens[token]
	if st == nil {
		return tombs
	}
	st.ended = true
	for i := range st.writing {
		tombs[i] = tombstone{attempt: closeAll, ttl: s.tombstoneTTL()}
	}
	for i := range st.uncertain {
		tombs[i] = tombstone{attempt: closeAll, ttl: s.tombstoneTTL()}
	}
	st.uncertain = nil
	s.dropIdleLocked(token, st)
	return tombs
}

// markReleased tells the late replies of token's acquire that the lock is
// released.
func (s *Store) markReleased(token string) {
	s.mu.Lock()
	if st := s.tokens[token]; st != nil {
		st.state = tokenFree
	}
	s.mu.Unlock()
}

// releaseOn sends the release script to the nodes of indexes, each call
// bounded by timeout, leaving the tombstones of tombs (by node). Every node
// publishes the releases of the keys it deletes.
func (s *Store) releaseOn(ctx context.Context, keys []string, token string, keep time.Duration, indexes []int,
	timeout time.Duration, tombs map[int]tombstone) <-chan reply {
	var keepMS int64
	if keep > 0 {
		keepMS = milliseconds(keep + s.drift(keep))
	}
	return s.fanOut(ctx, timeout, indexes, func(ctx context.Context, i int) ([]int64, error) {
		t := tombs[i]
		return releaseScript.Run(ctx, s.nodes[i].client, keys, token, keepMS, 1, t.attempt, milliseconds(t.ttl)).Int64Slice()
	})
}
