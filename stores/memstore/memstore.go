// Package memstore is a reqlock.Store that keeps locks in the memory of one
// process. Use it for a single instance, tests and development; processes do
// not see each other's locks.
//
// Fences come from one counter shared by all keys, so they grow per key and
// across keys, and no per-key state outlives a lock. Expired locks are freed
// without a background goroutine: a min-heap orders locks by expiry, and every
// operation first drops the expired ones from its top, so memory stays bounded
// by the live locks however many distinct keys pass through.
//
// # Release notification
//
// Store implements reqlock.ReleaseNotifier, so a Locker's waiters wake as
// soon as a lock is released instead of polling. Release signals every
// subscriber of the key before it returns, and so does the freeing of an
// expired lock. Expired locks are only freed when an operation (of any key)
// runs, so a waiter on a lock that expires without further traffic still
// wakes by its own timer, which the Locker caps by the holder's remaining
// TTL. Subscriptions live in a map that holds only keys with a live
// subscriber; no goroutine is involved.
//
// # Several keys
//
// Store implements reqlock.MultiStore and reqlock.KeepReleaser. AcquireAll,
// ReleaseAll and RefreshAll act on all their keys under one hold of the
// store's mutex, so a refused AcquireAll or RefreshAll changes nothing; each
// key of a grant takes its own fence from the shared counter. A release that
// keeps the key (ReleaseKeep, or ReleaseAll with a positive keep) only sets
// its TTL and signals nothing, since the key stays held; the kept lock's
// expiry then signals like any other.
package memstore

import (
	"container/heap"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/storeargs"
)

// Store is an in-memory reqlock.Store, and a reqlock.ReleaseNotifier,
// reqlock.FairStore, reqlock.MultiStore and reqlock.KeepReleaser. It is safe
// for concurrent use. The zero value is not usable; call New.
type Store struct {
	mu      sync.Mutex
	entries map[string]*entry
	expiry  expiryHeap
	fence   int64 // last fence issued, for any key

	// subs holds the release subscribers of each key that has at least
	// one; subsPeak is the largest len(subs) since the map was last
	// reallocated, to shrink it after a flood of keys.
	subs     map[string]map[chan struct{}]struct{}
	subsPeak int

	fair map[string]*fairQueue // fair-mode queues by key; see fair.go
}

// args checks the arguments of Store's methods; its errors start "memstore:".
const args storeargs.Checker = "memstore"

var (
	_ reqlock.Store           = (*Store)(nil)
	_ reqlock.ReleaseNotifier = (*Store)(nil)
)

type entry struct {
	key       string
	token     string
	expiresAt time.Time
	index     int // position in Store.expiry
}

// New returns an empty Store.
func New() *Store {
	return &Store{
		entries: make(map[string]*entry),
		subs:    make(map[string]map[chan struct{}]struct{}),
	}
}

// NotifyRelease registers interest in releases of key until stop is called,
// as reqlock.ReleaseNotifier describes. The channel (buffer 1) receives after
// each Release of key and after an expired lock of key is freed; sends never
// block, so several releases may arrive as one signal. stop removes the
// subscription; it may be called more than once and from any goroutine, and
// no signal is sent to the channel after it returns. The channel is never
// closed.
func (s *Store) NotifyRelease(key string) (released <-chan struct{}, stop func()) {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	set := s.subs[key]
	if set == nil {
		set = make(map[chan struct{}]struct{}, 1)
		s.subs[key] = set
		s.subsPeak = max(s.subsPeak, len(s.subs))
	}
	set[ch] = struct{}{}
	s.mu.Unlock()
	return ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		set := s.subs[key]
		if _, ok := set[ch]; !ok {
			return // stopped before
		}
		delete(set, ch)
		if len(set) == 0 {
			delete(s.subs, key)
			s.compactSubs()
		}
	}
}

// signal wakes every subscriber of key without blocking. The caller holds
// s.mu.
func (s *Store) signal(key string) {
	for ch := range s.subs[key] {
		select {
		case ch <- struct{}{}:
		default: // a signal is already pending
		}
	}
}

// compactSubs reallocates the subscription map once it has shrunk to a
// quarter of its peak, since a map never returns its memory on its own.
// The caller holds s.mu.
func (s *Store) compactSubs() {
	if s.subsPeak <= minCompact || len(s.subs) >= s.subsPeak/4 {
		return
	}
	subs := make(map[string]map[chan struct{}]struct{}, len(s.subs))
	for k, set := range s.subs {
		subs[k] = set
	}
	s.subs = subs
	s.subsPeak = len(subs)
}

// Acquire sets key to token for ttl if key is absent or expired, issuing the
// next fence. When key is held it returns a Grant with OK false and the
// holder's remaining TTL. It returns ctx.Err() without acting when ctx has
// ended, and an error wrapping reqlock.ErrInvalid for a non-positive ttl.
func (s *Store) Acquire(ctx context.Context, key, token string, ttl time.Duration) (reqlock.Grant, error) {
	if err := ctx.Err(); err != nil {
		return reqlock.Grant{}, err
	}
	if err := args.CheckTTL(ttl); err != nil {
		return reqlock.Grant{}, err
	}
	now := s.lockSwept()
	defer s.mu.Unlock()
	if e, held := s.heldByOther(key, token); held {
		return reqlock.Grant{HolderTTL: e.expiresAt.Sub(now)}, nil
	}
	return reqlock.Grant{OK: true, Fence: s.grantLocked(now, key, token, ttl)}, nil
}

// heldByOther returns the entry of key when another token than token holds
// it. A key that holds token itself counts as free: a token serves one
// acquisition, so that entry was set by this same call, tried before (a
// client retry after a lost reply), and granting it again is what the
// caller asked for. The caller holds s.mu and has swept expired locks.
func (s *Store) heldByOther(key, token string) (*entry, bool) {
	e, ok := s.entries[key]
	if !ok || e.token == token {
		return nil, false
	}
	return e, true
}

// grantLocked sets key, free or already holding token, to token for ttl and
// returns its fence, the next of the shared counter. The caller holds s.mu
// and has swept expired locks.
func (s *Store) grantLocked(now time.Time, key, token string, ttl time.Duration) int64 {
	if e, ok := s.entries[key]; ok {
		e.expiresAt = now.Add(ttl)
		heap.Fix(&s.expiry, e.index)
	} else {
		e := &entry{key: key, token: token, expiresAt: now.Add(ttl)}
		s.entries[key] = e
		heap.Push(&s.expiry, e)
	}
	s.fence += fenceStep
	return s.fence
}

// Release deletes key if it holds token, raises the fence counter to
// lastFence when that is higher, and signals the key's release subscribers
// (see NotifyRelease). It returns an error wrapping
// reqlock.ErrNotHeld when key is absent, expired or holds another token, and
// ctx.Err() without acting when ctx has ended.
func (s *Store) Release(ctx context.Context, key, token string, lastFence int64) error {
	return s.ReleaseKeep(ctx, key, token, lastFence, 0)
}

// Refresh resets the TTL of key to ttl if key holds token. It returns an
// error wrapping reqlock.ErrNotHeld when key is absent, expired or holds
// another token, one wrapping reqlock.ErrInvalid for a non-positive ttl, and
// ctx.Err() without acting when ctx has ended.
func (s *Store) Refresh(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := args.CheckTTL(ttl); err != nil {
		return err
	}
	now := s.lockSwept()
	defer s.mu.Unlock()
	e, ok := s.entries[key]
	if !ok || e.token != token {
		return fmt.Errorf("%w: %q", reqlock.ErrNotHeld, key)
	}
	e.expiresAt = now.Add(ttl)
	heap.Fix(&s.expiry, e.index)
	return nil
}

// Len returns the number of live locks, after freeing the expired ones.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweep(time.Now())
	return len(s.entries)
}

// minCompact is the heap capacity below which sweep never compacts.
const minCompact = 1024

// lockSwept takes s.mu, frees the locks that expired by now (see sweep) and
// returns now. The caller unlocks s.mu.
func (s *Store) lockSwept() time.Time {
	s.mu.Lock()
	now := time.Now()
	s.sweep(now)
	return now
}

// sweep frees every lock that expired by now and signals the release
// subscribers of its key. After a flood of keys has drained it also
// reallocates the heap and the map, which never shrink on their own. The
// caller holds s.mu.
func (s *Store) sweep(now time.Time) {
	for len(s.expiry) > 0 && !now.Before(s.expiry[0].expiresAt) {
		e := heap.Pop(&s.expiry).(*entry)
		delete(s.entries, e.key)
		s.signal(e.key)
	}
	if c := cap(s.expiry); c > minCompact && len(s.expiry) < c/4 {
		s.expiry = append(make(expiryHeap, 0, 2*len(s.expiry)), s.expiry...)
		entries := make(map[string]*entry, len(s.entries))
		for k, e := range s.entries {
			entries[k] = e
		}
		s.entries = entries
	}
}

// expiryHeap is a min-heap of entries by expiry; each entry knows its index.
type expiryHeap []*entry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].expiresAt.Before(h[j].expiresAt) }

func (h expiryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

func (h *expiryHeap) Push(x any) {
	e := x.(*entry)
	e.index = len(*h)
	*h = append(*h, e)
}

func (h *expiryHeap) Pop() any {
	old := *h
	n := len(old) - 1
	e := old[n]
	old[n] = nil // let the entry be collected
	e.index = -1
	*h = old[:n]
	return e
}

// fenceStep is how far each grant moves the fence counter: past every fence
// a Locker may issue by handing the grant on locally (at most
// reqlock.MaxHandoffCount), so that the next grant exceeds them even when
// the last holder never released and the store never learned them.
const fenceStep = reqlock.MaxHandoffCount + 1
