package memstore

import (
	"container/heap"
	"context"
	"fmt"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// The kinds of entry in Store.expiry.
const (
	exclusive  uint8 = iota // a plain or fair grant, in Store.entries
	holder                  // one holder of a shared key, in Store.shared
	writerWait              // a writer refused by holders, in Store.writers
	record                  // a finished idempotency record, in Store.entries
)

// sharedKey is the holders of one key held shared, each admitted under its
// own limit. A key has one only while somebody holds it; it is guarded by
// Store.mu.
type sharedKey struct {
	holders map[string]*entry // by token
}

// longest returns the longest remaining TTL among k's holders.
func (k *sharedKey) longest(now time.Time) time.Duration {
	var d time.Duration
	for _, e := range k.holders {
		d = max(d, e.expiresAt.Sub(now))
	}
	return d
}

// soonest returns the shortest remaining TTL among k's holders.
func (k *sharedKey) soonest(now time.Time) time.Duration {
	d := time.Duration(-1)
	for _, e := range k.holders {
		if left := e.expiresAt.Sub(now); d < 0 || left < d {
			d = left
		}
	}
	return max(d, 0)
}

// AcquireShared makes token a holder of key for ttl, as stores.SharedStore
// describes, under one hold of the store's mutex, and issues it the next
// fence of the counter exclusive grants share. A refusal's Wait is the
// exclusive holder's remaining TTL, the longest remaining window among the
// waiting writers, or the soonest expiry among the holders of a key that
// has limit holders or more.
//
// It returns ctx.Err() without acting when ctx has ended, and an error
// wrapping stores.ErrInvalid for an empty key, a negative limit or a
// non-positive ttl.
func (s *Store) AcquireShared(ctx context.Context, key, token string, limit int, ttl time.Duration) (stores.Grant, error) {
	if err := args.CheckShared(ctx, key, limit); err != nil {
		return stores.Grant{}, err
	}
	if err := args.CheckTTL(ttl); err != nil {
		return stores.Grant{}, err
	}
	now := s.lockSwept()
	defer s.mu.Unlock()
	if e, ok := s.entries[key]; ok {
		return stores.Grant{Wait: e.expiresAt.Sub(now)}, nil
	}
	k := s.shared[key]
	if k != nil {
		if e, ok := k.holders[token]; ok {
			// A retry of this token's own grant: granted again.
			e.expiresAt = now.Add(ttl)
			heap.Fix(&s.expiry, e.index)
			return stores.Grant{OK: true, Fences: []int64{s.nextFence()}}, nil
		}
	}
	if ws := s.writers[key]; len(ws) > 0 {
		var wait time.Duration
		for _, w := range ws {
			wait = max(wait, w.expiresAt.Sub(now))
		}
		return stores.Grant{Wait: wait}, nil
	}
	if k != nil && limit > 0 && len(k.holders) >= limit {
		return stores.Grant{Wait: k.soonest(now)}, nil
	}
	if k == nil {
		k = &sharedKey{holders: make(map[string]*entry, 1)}
		if s.shared == nil {
			s.shared = make(map[string]*sharedKey)
		}
		s.shared[key] = k
	}
	e := &entry{key: key, token: token, expiresAt: now.Add(ttl), kind: holder}
	k.holders[token] = e
	heap.Push(&s.expiry, e)
	return stores.Grant{OK: true, Fences: []int64{s.nextFence()}}, nil
}

// ReleaseShared ends token's place among key's holders, as
// stores.SharedStore describes, and signals key's release subscribers when
// it frees it. It returns an error wrapping stores.ErrNotHeld when token
// does not hold key, ctx.Err() without acting when ctx has ended, and an
// error wrapping stores.ErrInvalid for an empty key.
func (s *Store) ReleaseShared(ctx context.Context, key, token string, keep time.Duration) error {
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	now := s.lockSwept()
	defer s.mu.Unlock()
	e := s.holderOf(key, token)
	if e == nil {
		return fmt.Errorf("%w: %q is not held shared by the token", stores.ErrNotHeld, key)
	}
	if keep > 0 {
		e.expiresAt = now.Add(keep)
		heap.Fix(&s.expiry, e.index)
		return nil
	}
	heap.Remove(&s.expiry, e.index)
	s.dropHolder(e)
	return nil
}

// RefreshShared resets the TTL of token's place among key's holders to ttl.
// It returns an error wrapping stores.ErrNotHeld, changing nothing, when
// token does not hold key, ctx.Err() without acting when ctx has ended, and
// an error wrapping stores.ErrInvalid for an empty key or a non-positive
// ttl.
func (s *Store) RefreshShared(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	if err := args.CheckTTL(ttl); err != nil {
		return err
	}
	now := s.lockSwept()
	defer s.mu.Unlock()
	e := s.holderOf(key, token)
	if e == nil {
		return fmt.Errorf("%w: %q is not held shared by the token", stores.ErrNotHeld, key)
	}
	e.expiresAt = now.Add(ttl)
	heap.Fix(&s.expiry, e.index)
	return nil
}

// Holders returns how many tokens hold key shared, after freeing the
// expired ones, for tests and diagnostics.
func (s *Store) Holders(key string) int {
	s.lockSwept()
	defer s.mu.Unlock()
	if k := s.shared[key]; k != nil {
		return len(k.holders)
	}
	return 0
}

// holderOf returns token's entry among key's holders, or nil. The caller
// holds s.mu.
func (s *Store) holderOf(key, token string) *entry {
	if k := s.shared[key]; k != nil {
		return k.holders[token]
	}
	return nil
}

// dropHolder takes e, a holder already out of the expiry heap, off its
// key's holders and signals the key's release subscribers. The caller
// holds s.mu.
func (s *Store) dropHolder(e *entry) {
	k := s.shared[e.key]
	delete(k.holders, e.token)
	if len(k.holders) == 0 {
		delete(s.shared, e.key)
	}
	s.signal(e.key)
}

// sharedHeld reports whether key has holders, and if so the longest
// remaining TTL among them; it then records token as a waiting writer on
// key for stores.WriterWindow (see stores.SharedStore): the caller is an
// exclusive acquire of token refused by them. The caller holds s.mu and
// has swept.
func (s *Store) sharedHeld(now time.Time, key, token string) (time.Duration, bool) {
	k := s.shared[key]
	if k == nil {
		return 0, false
	}
	until := now.Add(stores.WriterWindow)
	if w, ok := s.writers[key][token]; ok {
		w.expiresAt = until
		heap.Fix(&s.expiry, w.index)
	} else {
		w := &entry{key: key, token: token, expiresAt: until, kind: writerWait}
		if s.writers == nil {
			s.writers = make(map[string]map[string]*entry)
		}
		if s.writers[key] == nil {
			s.writers[key] = make(map[string]*entry, 1)
		}
		s.writers[key][token] = w
		heap.Push(&s.expiry, w)
	}
	return k.longest(now), true
}

// dropWriter ends token's waiting-writer record on key, if any, and
// reports whether there was one: an exclusive grant of token ends its
// wait, and so does its withdrawal (Release). When the last writer of key
// withdraws, key's release subscribers are signalled, so refused readers
// come in at once. The caller holds s.mu.
func (s *Store) dropWriter(key, token string, withdrawn bool) bool {
	ws := s.writers[key]
	w, ok := ws[token]
	if !ok {
		return false
	}
	heap.Remove(&s.expiry, w.index)
	s.forgetWriter(w)
	if withdrawn && s.writers[key] == nil {
		s.signal(key)
	}
	return true
}

// forgetWriter takes w, a writer record already out of the expiry heap, off
// its key's writers. The caller holds s.mu.
func (s *Store) forgetWriter(w *entry) {
	ws := s.writers[w.key]
	delete(ws, w.token)
	if len(ws) == 0 {
		delete(s.writers, w.key)
	}
}

// nextFence moves the fence counter on by stores.FenceStride and returns
// it. The caller holds s.mu.
func (s *Store) nextFence() int64 {
	s.fence += stores.FenceStride
	return s.fence
}
