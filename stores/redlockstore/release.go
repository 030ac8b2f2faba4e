package redlockstore

import (
	"context"
	"fmt"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// Release ends token's lock on every node it reaches, owner-checked, and
// waits for every node's answer (each bounded by the node timeout) or for
// ctx to end. With keep zero or negative it deletes the keys, and the
// notify node publishes their release; with keep positive it sets their TTL
// to keep (plus the drift allowance) and publishes nothing.
//
// It returns an error wrapping stores.ErrNotHeld, naming the keys, when
// more nodes than a quorum allows answered that a key did not hold token
// (after ending the lock on the others); one wrapping ErrNoQuorum, naming
// the failed nodes, when too few nodes answered to tell; one wrapping
// stores.ErrInvalid for no keys, an empty, duplicate or unsorted key, or a
// keep above the max TTL; and ctx.Err() when ctx ends first (the calls go
// on, bounded by the node timeout).
func (s *Store) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	if err := args.CheckRelease(ctx, keys); err != nil {
		return err
	}
	if err := s.checkTTL("keep", keep); err != nil {
		return err
	}
	s.forgetRefusal(token)
	if err := s.awaitLanded(ctx, token); err != nil {
		return err
	}
	if keep <= 0 {
		// A late grant of a kept lock keeps its TTL: deleting it would
		// signal waiters while the kept keys stay held.
		s.markReleased(token)
	}
	replies := s.releaseOn(ctx, keys, token, keep, s.all(), s.nodeTimeout)
	released := make([]int, len(keys))
	answered := 0
	var failed []reply
	for range s.nodes {
		select {
		case r := <-replies:
			if r.err == nil && len(r.vals) != len(keys) {
				r.err = fmt.Errorf("%w: release %q answered %v", ErrUnexpectedReply, keys, r.vals)
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
		return fmt.Errorf("%w: %d of %d keys: %q", stores.ErrNotHeld, len(notHeld), len(keys), notHeld)
	}
	if unknown {
		return s.noQuorum(fmt.Sprintf("release %q", keys), answered, failed, false)
	}
	return nil
}

// releaseOn sends the release script to the nodes of indexes, each call
// bounded by timeout; only the notify node publishes.
func (s *Store) releaseOn(ctx context.Context, keys []string, token string, keep time.Duration, indexes []int, timeout time.Duration) <-chan reply {
	var keepMS int64
	if keep > 0 {
		keepMS = milliseconds(keep + s.drift(keep))
	}
	return s.fanOut(ctx, timeout, indexes, func(ctx context.Context, i int) ([]int64, error) {
		publish := 0
		if i == 0 {
			publish = 1
		}
		return releaseScript.Run(ctx, s.nodes[i].client, keys, token, keepMS, publish).Int64Slice()
	})
}
