//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package filestore

import "sync"

// subscribers holds the release subscriptions of a Store's keys. Signals
// are sent by the Store's own releases and expiries, under the key's entry
// lock, so they arrive in release order; releases made by other processes
// or other Stores are not signalled (their waiters poll, as
// stores.Notifier allows).
type subscribers struct {
	mu     sync.Mutex
	closed bool
	byKey  map[string]map[chan struct{}]struct{} // only keys with a subscriber
}

// NotifyRelease signals on the returned channel after each release (or
// expiry) of key by this Store, until stop is called. Releases by other
// processes and other Stores are not signalled. The channel holds one
// signal; sends never block. After Close it returns a nil channel.
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
	}
	set[ch] = struct{}{}
	return ch, sync.OnceFunc(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if set := b.byKey[key]; set != nil {
			delete(set, ch)
			if len(set) == 0 {
				delete(b.byKey, key)
			}
		}
	})
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

// close ends every subscription.
func (b *subscribers) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.byKey = nil
}
