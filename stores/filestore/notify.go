//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package filestore

import (
	"path/filepath"
	"sync"
)

// subscribers holds the release subscriptions of a Store's keys. The
// Store's own releases and expiries signal them, under the key's entry
// lock, so they arrive in release order. Where the platform can watch a
// file (Linux: inotify), the subscriptions of a key also watch its file,
// and a release by another Store or process of a grant that this Store's
// waiters marked (see ring) signals them too.
type subscribers struct {
	dir     string
	mu      sync.Mutex
	closed  bool
	byKey   map[string]map[chan struct{}]struct{} // only keys with a subscriber
	watches *watcher                              // other processes' releases; nil until the first watch
}

// NotifyRelease signals on the returned channel after each release (or
// expiry) of key by this Store, and, on Linux, after each release of key by
// another Store or process whose grant refused a caller of this Store (see
// ReleaseWaited), until stop is called. The channel holds one signal;
// sends never block. After Close it returns a nil channel.
func (s *Store) NotifyRelease(key, _ string) (<-chan struct{}, func()) {
	return s.subs.add(key)
}

// add subscribes to key.
func (b *subscribers) add(key string) (<-chan struct{}, func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, func() {}
	}
	ch := make(chan struct{}, 1)
	if b.byKey == nil {
		b.byKey = make(map[string]map[chan struct{}]struct{})
	}
	set := b.byKey[key]
	if set == nil {
		set = make(map[chan struct{}]struct{})
		b.byKey[key] = set
		b.watchLocked(key)
	}
	set[ch] = struct{}{}
	return ch, sync.OnceFunc(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if set := b.byKey[key]; set != nil {
			delete(set, ch)
			if len(set) == 0 {
				delete(b.byKey, key)
				if b.watches != nil {
					b.watches.unwatch(key)
				}
			}
		}
	})
}

// watchLocked watches key's file for other processes' releases, when the
// platform can. A key whose file cannot be watched (it does not exist yet,
// or the watches ran out) goes without: its waiters poll. The caller holds
// b.mu.
func (b *subscribers) watchLocked(key string) {
	if b.watches == nil {
		b.watches = newWatcher(b.signal)
		if b.watches == nil {
			return
		}
	}
	b.watches.watch(key, filepath.Join(b.dir, fileName(key)))
}

// signal wakes every subscriber of key.
func (b *subscribers) signal(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for ch := range b.byKey[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// close ends every subscription, and the watches.
func (b *subscribers) close() {
	b.mu.Lock()
	b.closed = true
	b.byKey = nil
	w := b.watches
	b.mu.Unlock()
	if w != nil {
		w.close()
	}
}
