package memstore

import (
	"container/heap"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/reqlock/reqlock/internal/storeargs"
	"github.com/reqlock/reqlock/stores"
)

// Store is an in-memory stores.Store, stores.Notifier, stores.FairStore,
// stores.SharedStore and stores.RecordStore.
// It is safe for concurrent use. The zero value is not usable; call New.
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

	shared  map[string]*sharedKey        // keys held shared; see shared.go
	writers map[string]map[string]*entry // writers refused by holders, by key and token
}

// args checks the arguments of Store's methods; its errors start "memstore:".
const args storeargs.Checker = "memstore"

var (
	_ stores.Store       = (*Store)(nil)
	_ stores.Notifier    = (*Store)(nil)
	_ stores.FairStore   = (*Store)(nil)
	_ stores.SharedStore = (*Store)(nil)
	_ stores.RecordStore = (*Store)(nil)
)

type entry struct {
	key       string
	token     string
	expiresAt time.Time
	index     int            // position in Store.expiry
	kind      uint8          // exclusive, holder, writerWait or record; see shared.go
	rec       *stores.Record // the finished record, for kind record
}

// New returns an empty Store.
func New() *Store {
	return &Store{
		entries: make(map[string]*entry),
		subs:    make(map[string]map[chan struct{}]struct{}),
	}
}

// Acquire sets every key to token for ttl when none is held by another
// token (an expired lock counts as free), under one hold of the store's
// mutex, and issues each key the next fence of the shared counter. When a key
// is held it sets nothing and returns a Grant with OK false, Held the index
// of the first held key and Wait its remaining TTL. A key that already holds
// token is granted again (see stores.Store).
//
// It returns ctx.Err() without acting when ctx has ended, and an error
// wrapping stores.ErrInvalid for no keys, an empty, duplicate or unsorted
// key, or a non-positive ttl.
func (s *Store) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return stores.Grant{}, err
	}
	now := s.lockSwept()
	defer s.mu.Unlock()
	for i, key := range keys {
		if e, held := s.heldByOther(key, token); held {
			return stores.Grant{Held: i, Wait: e.expiresAt.Sub(now)}, nil
		}
		if wait, held := s.sharedHeld(now, key, token); held {
			return stores.Grant{Held: i, Wait: wait, SharedHeld: true}, nil
		}
	}
	fences := make([]int64, len(keys))
	for i, key := range keys {
		fences[i] = s.grantLocked(now, key, token, ttl)
	}
	return stores.Grant{OK: true, Fences: fences}, nil
}

// heldByOther returns the entry of key when another token than token holds
// it. A key that holds token itself counts as free: a token serves one
// acquisition, so that entry was set by this same call, tried before (a
// client retry after a lost reply), and granting it again is what the
// caller asked for. The caller holds s.mu and has swept expired locks.
func (s *Store) heldByOther(key, token string) (*entry, bool) {
	e, ok := s.entries[key]
	if !ok || (e.token == token && e.kind == exclusive) {
		return nil, false
	}
	return e, true // a record holds its key against every token
}

// grantLocked sets key, free or already holding token, to token for ttl,
// ends token's wait as a writer recorded on it, and returns its fence: the
// shared counter, moved on by stores.FenceStride. The caller holds s.mu and
// has swept expired locks and checked that key has no shared holders.
func (s *Store) grantLocked(now time.Time, key, token string, ttl time.Duration) int64 {
	s.dropWriter(key, token, false)
	if e, ok := s.entries[key]; ok {
		e.expiresAt = now.Add(ttl)
		heap.Fix(&s.expiry, e.index)
	} else {
		e := &entry{key: key, token: token, expiresAt: now.Add(ttl)}
		s.entries[key] = e
		heap.Push(&s.expiry, e)
	}
	return s.nextFence()
}

// Release ends token's grant on every key that holds it, under one hold of
// the store's mutex. With keep zero or negative it deletes the key and
// signals its release subscribers (see NotifyRelease); with keep positive it
// sets the key's TTL to keep instead and signals nothing, since the key stays
// held (its expiry then signals, as every expiry does). It also withdraws
// token's waiting-writer record on each key (see stores.SharedStore). It
// returns an error wrapping stores.ErrNotHeld, naming the keys, when some
// keys were absent, expired or held another token, after ending the grant
// on the others.
//
// It returns ctx.Err() without acting when ctx has ended, and an error
// wrapping stores.ErrInvalid for no keys or an empty, duplicate or unsorted
// key.
func (s *Store) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	if err := args.CheckRelease(ctx, keys); err != nil {
		return err
	}
	now := s.lockSwept()
	defer s.mu.Unlock()
	var notHeld []string
	for _, key := range keys {
		if !s.releaseLocked(now, key, token, keep) {
			notHeld = append(notHeld, key)
		}
	}
	if len(notHeld) > 0 {
		return fmt.Errorf("%w: %d of %d keys: %q", stores.ErrNotHeld, len(notHeld), len(keys), notHeld)
	}
	return nil
}

// releaseLocked ends token's grant on key, as Release describes, and reports
// whether key held token; when it did not, nothing changes. The caller holds
// s.mu and has swept expired locks.
func (s *Store) releaseLocked(now time.Time, key, token string, keep time.Duration) bool {
	s.dropWriter(key, token, true)
	e, ok := s.entries[key]
	if !ok || e.token != token || e.kind != exclusive {
		return false
	}
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

// Refresh resets the TTL of every key to ttl if each holds token, under one
// hold of the store's mutex; when one does not, it changes nothing and
// returns an error wrapping stores.ErrNotHeld that names the first such key.
// It returns ctx.Err() without acting when ctx has ended, and an error
// wrapping stores.ErrInvalid for no keys, an empty, duplicate or unsorted
// key, or a non-positive ttl.
func (s *Store) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return err
	}
	now := s.lockSwept()
	defer s.mu.Unlock()
	for _, key := range keys {
		if e, ok := s.entries[key]; !ok || e.token != token || e.kind != exclusive {
			return fmt.Errorf("%w: %q (none of the %d keys refreshed)", stores.ErrNotHeld, key, len(keys))
		}
	}
	for _, key := range keys {
		e := s.entries[key]
		e.expiresAt = now.Add(ttl)
		heap.Fix(&s.expiry, e.index)
	}
	return nil
}

// Len returns the number of live exclusive locks (claims included), shared
// holders and records, after freeing the expired ones.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweep(time.Now())
	n := len(s.entries)
	for _, k := range s.shared {
		n += len(k.holders)
	}
	return n
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
		switch e.kind {
		case exclusive, record:
			delete(s.entries, e.key)
			s.signal(e.key)
		case holder:
			s.dropHolder(e)
		case writerWait:
			s.forgetWriter(e)
		}
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
