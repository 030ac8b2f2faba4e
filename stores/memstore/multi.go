package memstore

import (
	"container/heap"
	"context"
	"fmt"
	"time"

	"github.com/reqlock/reqlock"
)

var (
	_ reqlock.MultiStore   = (*Store)(nil)
	_ reqlock.KeepReleaser = (*Store)(nil)
)

// AcquireAll sets every key to token for ttl if none of them is held or
// all the held ones have expired, under one hold of the store's mutex, and
// issues each key a fence from the shared counter, as Acquire does: one step
// per key, in the order of keys. When a key is held it sets nothing and
// returns a MultiGrant with OK false, Held the index of the first held key
// and HolderTTL its remaining TTL. keys must be distinct and sorted.
//
// It returns ctx.Err() without acting when ctx has ended, and an error
// wrapping reqlock.ErrInvalid for no keys, a duplicate or unsorted key, or a
// non-positive ttl.
func (s *Store) AcquireAll(ctx context.Context, keys []string, token string, ttl time.Duration) (reqlock.MultiGrant, error) {
	if err := args.CheckAcquireAll(ctx, keys, ttl); err != nil {
		return reqlock.MultiGrant{}, err
	}
	now := s.lockSwept()
	defer s.mu.Unlock()
	for i, key := range keys {
		if e, held := s.heldByOther(key, token); held {
			return reqlock.MultiGrant{Held: i, HolderTTL: e.expiresAt.Sub(now)}, nil
		}
	}
	fences := make([]int64, len(keys))
	for i, key := range keys {
		fences[i] = s.grantLocked(now, key, token, ttl)
	}
	return reqlock.MultiGrant{OK: true, Fences: fences}, nil
}

// ReleaseAll ends the grant on every key that holds token, under one hold of
// the store's mutex, and raises the fence counter to lastFences[i] when that
// is higher. With keep zero or negative it deletes the key and signals its
// release subscribers, as Release does; with keep positive it sets the key's
// TTL to keep instead and signals nothing, since the key stays held (its
// expiry signals, as every expiry does). It returns an error wrapping
// reqlock.ErrNotHeld, naming the keys, when some keys were absent, expired
// or held another token, after ending the grant on the others.
//
// It returns ctx.Err() without acting when ctx has ended, and an error
// wrapping reqlock.ErrInvalid for no keys, a duplicate or unsorted key, or
// len(lastFences) != len(keys).
func (s *Store) ReleaseAll(ctx context.Context, keys []string, token string, lastFences []int64, keep time.Duration) error {
	if err := args.CheckReleaseAll(ctx, keys, lastFences); err != nil {
		return err
	}
	now := s.lockSwept()
	defer s.mu.Unlock()
	var notHeld []string
	for i, key := range keys {
		if !s.releaseLocked(now, key, token, lastFences[i], keep) {
			notHeld = append(notHeld, key)
		}
	}
	if len(notHeld) > 0 {
		return fmt.Errorf("%w: %d of %d keys: %q", reqlock.ErrNotHeld, len(notHeld), len(keys), notHeld)
	}
	return nil
}

// ReleaseKeep sets the TTL of key to keep if key holds token, and raises the
// fence counter to lastFence when that is higher, as Release does. It
// signals nothing: the key stays held until it expires (and its expiry
// signals, as every expiry does). A keep of zero or less releases the key at
// once, exactly as Release. It returns an error wrapping reqlock.ErrNotHeld
// when key is absent, expired or holds another token, and ctx.Err() without
// acting when ctx has ended.
func (s *Store) ReleaseKeep(ctx context.Context, key, token string, lastFence int64, keep time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	now := s.lockSwept()
	defer s.mu.Unlock()
	if !s.releaseLocked(now, key, token, lastFence, keep) {
		return fmt.Errorf("%w: %q", reqlock.ErrNotHeld, key)
	}
	return nil
}

// releaseLocked ends token's grant on key, as ReleaseAll describes, and
// reports whether key held token; when it did not, nothing changes. The
// caller holds s.mu and has swept expired locks.
func (s *Store) releaseLocked(now time.Time, key, token string, lastFence int64, keep time.Duration) bool {
	e, ok := s.entries[key]
	if !ok || e.token != token {
		return false
	}
	s.fence = max(s.fence, lastFence)
	if keep > 0 {
		e.expiresAt = now.Add(keep)
		heap.Fix(&s.expiry, e.index)
		return true
	}
	delete(s.entries, key)
	heap.Remove(&s.expiry, e.index)
	s.signal(key)
	return true
}

// RefreshAll resets the TTL of every key to ttl if each holds token, under
// one hold of the store's mutex; when one does not, it changes nothing and
// returns an error wrapping reqlock.ErrNotHeld that names the first such key.
// It returns ctx.Err() without acting when ctx has ended, and an error
// wrapping reqlock.ErrInvalid for no keys, a duplicate or unsorted key, or a
// non-positive ttl.
func (s *Store) RefreshAll(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	if err := args.CheckAcquireAll(ctx, keys, ttl); err != nil {
		return err
	}
	now := s.lockSwept()
	defer s.mu.Unlock()
	for _, key := range keys {
		if e, ok := s.entries[key]; !ok || e.token != token {
			return fmt.Errorf("%w: %q (none of the %d keys refreshed)", reqlock.ErrNotHeld, key, len(keys))
		}
	}
	for _, key := range keys {
		e := s.entries[key]
		e.expiresAt = now.Add(ttl)
		heap.Fix(&s.expiry, e.index)
	}
	return nil
}
