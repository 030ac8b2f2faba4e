package redlockstore

import (
	"context"
	"fmt"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// Refresh resets the TTL of token's lock on every node that still holds
// every key, and succeeds once a quorum did so within ttl. A node that lost
// the keys (restarted empty, or missed the grant) takes them again where
// they are free, when some node still held the lock, before Refresh
// returns (a re-take left in the background could land after the lock's
// Release). Refresh waits for every node's answer, each bounded by the node
// timeout, so that a refusal right after it sees the new TTL everywhere.
//
// It returns an error wrapping stores.ErrNotHeld when more nodes than a
// quorum allows answered that a key holds another token, or that the keys
// are gone on every node (nothing is re-taken then, so nothing changed);
// one wrapping ErrNoQuorum, naming the failed nodes, when too few nodes
// answered or they did not within ttl; one wrapping stores.ErrInvalid for
// no keys, an empty, duplicate or unsorted key, or a ttl not positive or
// above the max TTL; and ctx.Err() when ctx ends first. A refresh that
// fails may have renewed the lock on some nodes.
func (s *Store) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return err
	}
	if err := s.checkTTL("ttl", ttl); err != nil {
		return err
	}
	start := time.Now()
	timeout := s.callTimeout(ttl)
	scriptKeys := append(append(make([]string, 0, len(keys)+1), keys...), MarkerKey)
	ttlMS := milliseconds(ttl + s.drift(ttl))
	run := func(ctx context.Context, indexes []int, retake int) <-chan reply {
		return s.fanOut(ctx, timeout, indexes, func(ctx context.Context, i int) ([]int64, error) {
			return refreshScript.Run(ctx, s.nodes[i].client, scriptKeys, token, ttlMS, retake, s.maxTTL.Milliseconds()).Int64Slice()
		})
	}

	replies := run(ctx, s.all(), 0)
	var refreshed, absent, other, failed []reply
	for range s.nodes {
		select {
		case r := <-replies:
			switch {
			case r.err != nil:
				failed = append(failed, r)
			case len(r.vals) == 1 && r.vals[0] == 0:
				refreshed = append(refreshed, r)
			case len(r.vals) == 1 && r.vals[0] == 2:
				absent = append(absent, r)
			case len(r.vals) == 2 && r.vals[0] == 1 && r.vals[1] >= 1 && r.vals[1] <= int64(len(keys)):
				other = append(other, r)
			default:
				r.err = fmt.Errorf("%w: refresh %q answered %v", ErrUnexpectedReply, keys, r.vals)
				failed = append(failed, r)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}

	if len(refreshed) > 0 && len(absent) > 0 {
		indexes := make([]int, len(absent))
		for i, r := range absent {
			indexes[i] = r.node
		}
		{
			retaken := run(ctx, indexes, 1)
			for range indexes {
				select {
				case r := <-retaken:
					if r.err == nil && len(r.vals) == 1 && r.vals[0] == 0 {
						refreshed = append(refreshed, r)
					} else if r.err != nil {
						failed = append(failed, r)
					}
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
	}

	switch {
	case len(refreshed) >= s.quorum:
		if elapsed := time.Since(start); elapsed >= ttl {
			return fmt.Errorf("%w: refresh %q: a quorum renewed after %v, not within the TTL %v", ErrNoQuorum, keys, elapsed, ttl)
		}
		return nil
	case len(other) > len(s.nodes)-s.quorum:
		return fmt.Errorf("%w: %q is held by another token on %d of %d nodes", stores.ErrNotHeld, keys[other[0].vals[1]-1], len(other), len(s.nodes))
	case len(refreshed) == 0 && len(other)+len(absent) > len(s.nodes)-s.quorum:
		return fmt.Errorf("%w: %q: not held on %d of %d nodes", stores.ErrNotHeld, keys, len(other)+len(absent), len(s.nodes))
	}
	return s.noQuorum(fmt.Sprintf("refresh %q", keys), len(refreshed)+len(other)+len(absent), failed, false)
}
