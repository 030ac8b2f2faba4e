//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package filestore

import (
	"path/filepath"
	"sync"
)

// notifier holds the release subscriptions of a Store's keys. The
// Store's own releases and expiries signal them, under the key's entry
// lock, so they arrive in release order. Where the platform can watch a
// file (Linux: inotify), the subscriptions of a key also watch its file,
// and a release by another Store or process of a grant that this Store's
// waiters marked (see ring) signals them too.
type notifier struct {
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
	return s.notify.subscribe(key)
}

// subscribe subscribes to key.
func (n *notifier) subscribe(key string) (<-chan struct{}, func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, func() {}
	}
	ch := make(chan struct{}, 1)
	if n.byKey == nil {
		n.byKey = make(map[string]map[chan struct{}]struct{})
	}
	set := n.byKey[key]
	if set == nil {
		set = make(map[chan struct{}]struct{})
		n.byKey[key] = set
		n.watchLocked(key)
	}
	set[ch] = struct{}{}
	return ch, sync.OnceFunc(func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if set := n.byKey[key]; set != nil {
			delete(set, ch)
			if len(set) == 0 {
				delete(n.byKey, key)
				if n.watches != nil {
					n.watches.unwatch(key)
				}
			}
		}
	})
}

// watchLocked watches key's file for other processes' releases, when the
// platform can. A key whose file cannot be watched (it does not exist yet,
// or the watches ran out) goes without: its waiters poll. The caller holds
// n.mu.
func (n *notifier) watchLocked(key string) {
	if n.watches == nil {
		n.watches = newWatcher(n.signal)
		if n.watches == nil {
			return
		}
	}
	n.watches.watch(key, filepath.Join(n.dir, fileName(key)))
}

// signal wakes every subscriber of key.
func (n *notifier) signal(key string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for ch := range n.byKey[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// close ends every subscription, and the watches.
func (n *notifier) close() {
	n.mu.Lock()
	n.closed = true
	n.byKey = nil
	w := n.watches
	n.mu.Unlock()
	if w != nil {
		w.close()
	}
}
