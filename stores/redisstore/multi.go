package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
)

var (
	//go:embed acquire_all.lua
	acquireAllSrc string
	//go:embed release_all.lua
	releaseAllSrc string
	//go:embed refresh_all.lua
	refreshAllSrc string

	acquireAllScript = redis.NewScript(withFenceLib(acquireAllSrc))
	releaseAllScript = redis.NewScript(withFenceLib(releaseAllSrc))
	refreshAllScript = redis.NewScript(refreshAllSrc)
)

var (
	_ reqlock.MultiStore   = (*Store)(nil)
	_ reqlock.KeepReleaser = (*Store)(nil)
)

// AcquireAll sets every key to token for ttl if none of them is held, and
// issues each key's next fence, in one script and one round trip: the fence
// of each key comes from its own fence key, exactly as Acquire issues it.
// When a key is held it sets nothing and returns a MultiGrant with OK false,
// Held the index of the first held key and HolderTTL its remaining TTL.
//
// keys must be distinct and sorted. With a *redis.ClusterClient they must all
// hash to one slot (see Redis Cluster in the package documentation); AcquireAll
// checks that before it sends anything.
//
// It returns an error wrapping reqlock.ErrInvalid for no keys, a duplicate
// or unsorted key, or a non-positive ttl; one wrapping ErrCrossSlot, and so
// reqlock.ErrInvalid, when the keys span Cluster slots (or Ring shards); the
// client's error as is; and ctx.Err() without acting when ctx has ended.
func (s *Store) AcquireAll(ctx context.Context, keys []string, token string, ttl time.Duration) (reqlock.MultiGrant, error) {
	if err := args.CheckAcquireAll(ctx, keys, ttl); err != nil {
		return reqlock.MultiGrant{}, err
	}
	if err := s.checkColocated(keys, true); err != nil {
		return reqlock.MultiGrant{}, err
	}
	scriptKeys := withFenceKeys(keys)
	reply, err := untilCancelled(ctx, func(ctx context.Context) ([]int64, error) {
		return acquireAllScript.Run(ctx, s.client, scriptKeys,
			token, milliseconds(ttl), s.fenceRetention.Milliseconds()).Int64Slice()
	}, func(reply []int64, err error) {
		if err != nil || (len(reply) > 0 && reply[0] == 1) {
			ctx, cancel := cleanupContext()
			defer cancel()
			_ = s.ReleaseAll(ctx, keys, token, make([]int64, len(keys)), 0)
		}
	})
	if err != nil {
		return reqlock.MultiGrant{}, mapCrossSlot(err, keys, true)
	}
	switch {
	case len(reply) == len(keys)+1 && reply[0] == 1:
		return reqlock.MultiGrant{OK: true, Fences: reply[1:]}, nil
	case len(reply) == 3 && reply[0] == 0 && reply[1] >= 0 && reply[1] < int64(len(keys)):
		return reqlock.MultiGrant{Held: int(reply[1]), HolderTTL: holderTTL(reply[2])}, nil
	}
	return reqlock.MultiGrant{}, fmt.Errorf("%w: acquire all %q answered %v", ErrUnexpectedReply, keys, reply)
}

// ReleaseAll ends the grant on every key that holds token, in one script and
// one round trip. With keep zero or negative it deletes the key and
// publishes the release on the channel named like the key, as Release does;
// with keep positive it sets the key's TTL to keep instead and publishes
// nothing, since the key stays held (see ReleaseKeep). Either way it raises
// the key's fence key to lastFences[i] when that is higher, as Release does.
//
// It returns an error wrapping reqlock.ErrNotHeld, naming the keys, when some
// keys were absent or held another token, after ending the grant on the
// others. A key overwritten with another type than a string (another
// program's data), or whose fence key was, counts as not held and is left as
// it is; the others are still released. keys must be distinct and sorted
// and, with a *redis.ClusterClient, in one slot. It returns an error wrapping
// reqlock.ErrInvalid for no keys, a duplicate or unsorted key, or
// len(lastFences) != len(keys); one wrapping ErrCrossSlot, and so
// reqlock.ErrInvalid, when the keys span Cluster slots (or Ring shards); the
// client's error as is; and ctx.Err() without acting when ctx has ended.
func (s *Store) ReleaseAll(ctx context.Context, keys []string, token string, lastFences []int64, keep time.Duration) error {
	if err := args.CheckReleaseAll(ctx, keys, lastFences); err != nil {
		return err
	}
	if err := s.checkColocated(keys, true); err != nil {
		return err
	}
	notHeld, err := s.releaseAll(ctx, keys, token, lastFences, keep)
	if err != nil {
		return mapCrossSlot(err, keys, true)
	}
	if len(notHeld) > 0 {
		return fmt.Errorf("%w: %d of %d keys: %q", reqlock.ErrNotHeld, len(notHeld), len(keys), notHeld)
	}
	return nil
}

// ReleaseKeep sets the TTL of key to keep if key holds token, and raises the
// fence key to lastFence when that is higher, as Release does, in one script
// and one round trip. It publishes nothing: the key stays held until it
// expires, and an expiry publishes nothing either. A keep of zero or less
// releases the key at once, exactly as Release. It returns an error wrapping
// reqlock.ErrNotHeld when key is absent or holds another token, or, with
// keep positive, when key or its fence key holds another type than a string
// (left as it is, as ReleaseAll does); the client's error as is; and
// ctx.Err() without acting when ctx has ended.
func (s *Store) ReleaseKeep(ctx context.Context, key, token string, lastFence int64, keep time.Duration) error {
	if keep <= 0 {
		return s.Release(ctx, key, token, lastFence)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	notHeld, err := s.releaseAll(ctx, []string{key}, token, []int64{lastFence}, keep)
	if err != nil {
		return err
	}
	if len(notHeld) > 0 {
		return fmt.Errorf("%w: %q", reqlock.ErrNotHeld, key)
	}
	return nil
}

// releaseAll runs release_all.lua and returns the keys that did not hold
// token, in the order of keys.
func (s *Store) releaseAll(ctx context.Context, keys []string, token string, lastFences []int64, keep time.Duration) (notHeld []string, err error) {
	var keepMS int64
	if keep > 0 {
		keepMS = milliseconds(keep)
	}
	argv := make([]any, 0, 3+len(lastFences))
	argv = append(argv, token, keepMS, milliseconds(s.fenceRetention))
	for _, f := range lastFences {
		argv = append(argv, f)
	}
	reply, err := releaseAllScript.Run(ctx, s.client, withFenceKeys(keys), argv...).Int64Slice()
	if err != nil {
		return nil, err
	}
	if len(reply) != len(keys) {
		return nil, fmt.Errorf("%w: release all %q answered %v", ErrUnexpectedReply, keys, reply)
	}
	for i, r := range reply {
		if r != 1 {
			notHeld = append(notHeld, keys[i])
		}
	}
	return notHeld, nil
}

// RefreshAll resets the TTL of every key to ttl if each holds token, in one
// script and one round trip; when one does not, it changes nothing and
// returns an error wrapping reqlock.ErrNotHeld that names the first such key.
// A key overwritten with another type than a string counts as not held.
// keys must be distinct and sorted and, with a *redis.ClusterClient, in one
// slot. It returns an error wrapping reqlock.ErrInvalid for no keys, a
// duplicate or unsorted key, or a non-positive ttl; one wrapping ErrCrossSlot,
// and so reqlock.ErrInvalid, when the keys span Cluster slots (or Ring
// shards); the client's error as is; and ctx.Err() without acting when ctx
// has ended.
func (s *Store) RefreshAll(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	if err := args.CheckAcquireAll(ctx, keys, ttl); err != nil {
		return err
	}
	if err := s.checkColocated(keys, false); err != nil {
		return err
	}
	n, err := refreshAllScript.Run(ctx, s.client, keys, token, milliseconds(ttl)).Int64()
	if err != nil {
		return mapCrossSlot(err, keys, false)
	}
	switch {
	case n == 0:
		return nil
	case n >= 1 && n <= int64(len(keys)):
		return fmt.Errorf("%w: %q (none of the %d keys refreshed)", reqlock.ErrNotHeld, keys[n-1], len(keys))
	}
	return fmt.Errorf("%w: refresh all %q answered %d", ErrUnexpectedReply, keys, n)
}

// withFenceKeys returns keys followed by their fence keys, as the multi-key
// scripts take them.
func withFenceKeys(keys []string) []string {
	all := make([]string, len(keys), 2*len(keys))
	copy(all, keys)
	for _, k := range keys {
		all = append(all, fenceKey(k))
	}
	return all
}
