package redisstore

import (
	"context"
	"time"
)

const (
	// subscribeTimeout bounds one SUBSCRIBE or UNSUBSCRIBE call. A call
	// that fails is not retried by this package: the Driver keeps the
	// channel in its own set and subscribes it again when it reconnects.
	subscribeTimeout = time.Second

	// subscribeBatch is the most channels sent in one SUBSCRIBE or
	// UNSUBSCRIBE command.
	subscribeBatch = 512
)

// notifier is the state of a Store's release notifications. Its fields are
// guarded by Store.mu.
type notifier struct {
	// subs holds the subscribers of each key that has at least one.
	subs map[string]map[chan struct{}]struct{}
	// dirty holds the keys whose subscriber set became empty or non-empty
	// since the dispatcher last reconciled the Redis subscription.
	dirty map[string]struct{}

	pubsub PubSub        // nil until the first NotifyRelease
	kick   chan struct{} // buffer 1: dirty has keys to reconcile
	done   chan struct{} // closed by Close to stop the dispatcher
	exited chan struct{} // closed when the dispatcher has returned

	closed bool // Close was called
	broken bool // the client cannot notify: Subscribe failed, or the pub/sub closed under us
}

// NotifyRelease registers interest in releases of key until stop is called,
// as stores.Notifier describes (every subscriber of key is signalled). The channel (buffer 1) receives a
// signal for each message published on the channel named key, which Release
// publishes in the same script that deletes the lock when a caller was
// refused the lock meanwhile (see the package documentation); sends never block, so
// several releases may arrive as one signal. stop removes the subscription;
// it may be called more than once and from any goroutine, and no signal is
// sent to the channel after it returns. The channel is never closed.
//
// The first call opens the Store's pub/sub connection and starts its
// dispatcher goroutine (see Release notification in the package
// documentation). NotifyRelease never waits for Redis: the SUBSCRIBE is
// sent by the dispatcher, so a release published before it reaches Redis is
// not signalled. NotifyRelease returns a nil channel and a no-op stop after
// Close, and when the client cannot subscribe.
func (s *Store) NotifyRelease(key, _ string) (released <-chan struct{}, stop func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := &s.notify
	if n.closed || n.broken {
		return nil, func() {}
	}
	if n.pubsub == nil && !s.startLocked() {
		return nil, func() {}
	}
	ch := make(chan struct{}, 1)
	set := n.subs[key]
	if set == nil {
		set = make(map[chan struct{}]struct{}, 1)
		n.subs[key] = set
		s.markDirtyLocked(key)
	}
	set[ch] = struct{}{}
	return ch, func() { s.unsubscribe(key, ch) }
}

// unsubscribe removes ch from the subscribers of key.
func (s *Store) unsubscribe(key string, ch chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := &s.notify
	set := n.subs[key]
	if _, ok := set[ch]; !ok {
		return // stopped before
	}
	delete(set, ch)
	if len(set) == 0 {
		delete(n.subs, key)
		s.markDirtyLocked(key)
	}
}

// markDirtyLocked records that key's subscription must be reconciled and
// wakes the dispatcher. The caller holds s.mu.
func (s *Store) markDirtyLocked(key string) {
	n := &s.notify
	if n.pubsub == nil || n.closed {
		return // no dispatcher (any more) to reconcile
	}
	n.dirty[key] = struct{}{}
	select {
	case n.kick <- struct{}{}:
	default: // a kick is already pending
	}
}

// startLocked creates the pub/sub and starts the dispatcher. It reports
// false, and marks notifications broken, when the client cannot subscribe.
// The caller holds s.mu.
func (s *Store) startLocked() bool {
	ps := s.driver.PubSub(s.signal, s.markBroken)
	if ps == nil {
		s.notify.broken = true
		return false
	}
	n := &s.notify
	n.pubsub = ps
	n.subs = make(map[string]map[chan struct{}]struct{})
	n.dirty = make(map[string]struct{})
	n.kick = make(chan struct{}, 1)
	n.done = make(chan struct{})
	n.exited = make(chan struct{})
	go s.dispatch(ps, n.kick, n.done, n.exited)
	return true
}

// markBroken records that the pub/sub stopped receiving for good, though
// not by Close (the client was closed, say): from now on waiters poll.
func (s *Store) markBroken() {
	s.mu.Lock()
	s.notify.broken = true
	s.mu.Unlock()
}

// dispatch is the Store's one notification goroutine: when kicked, it
// brings the Redis subscription in line with the keys that have
// subscribers. All SUBSCRIBE and UNSUBSCRIBE calls are made here, one at a
// time, so they reach Redis in the order of the decisions. The Driver's
// pub/sub hands each message to signal.
func (s *Store) dispatch(ps PubSub, kick, done <-chan struct{}, exited chan<- struct{}) {
	defer close(exited)
	// sent holds the channels this goroutine last asked Redis to subscribe.
	sent := make(map[string]struct{})
	for {
		select {
		case <-done:
			return
		case <-kick:
			s.reconcile(ps, sent)
		}
	}
}

// signal wakes every subscriber of key without blocking.
func (s *Store) signal(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.notify.subs[key] {
		select {
		case ch <- struct{}{}:
		default: // a signal is already pending
		}
	}
}

// reconcile subscribes the dirty keys that have subscribers and are not in
// sent, and unsubscribes those that have none and are in sent. A key that
// changes again meanwhile is marked dirty with a new kick, so the last state
// always gets reconciled.
func (s *Store) reconcile(ps PubSub, sent map[string]struct{}) {
	var add, drop []string
	s.mu.Lock()
	n := &s.notify
	for key := range n.dirty {
		_, want := n.subs[key]
		_, have := sent[key]
		switch {
		case want && !have:
			add = append(add, key)
			sent[key] = struct{}{}
		case !want && have:
			drop = append(drop, key)
			delete(sent, key)
		}
	}
	clear(n.dirty)
	s.mu.Unlock()

	// An error is not retried: the Driver has recorded the change in its
	// own channel set (go-redis's Subscribe adds before it writes,
	// Unsubscribe removes), and a failed write makes it reconnect and
	// resubscribe from that set.
	// Until then the waiters' fallback poll covers the key.
	for batch := range chunks(add) {
		ctx, cancel := context.WithTimeout(context.Background(), subscribeTimeout)
		_ = ps.Subscribe(ctx, batch...)
		cancel()
	}
	for batch := range chunks(drop) {
		ctx, cancel := context.WithTimeout(context.Background(), subscribeTimeout)
		_ = ps.Unsubscribe(ctx, batch...)
		cancel()
	}
}

// chunks yields keys in slices of at most subscribeBatch; none when keys is
// empty (an UNSUBSCRIBE without channels would drop them all).
func chunks(keys []string) func(yield func([]string) bool) {
	return func(yield func([]string) bool) {
		for len(keys) > 0 {
			n := min(len(keys), subscribeBatch)
			if !yield(keys[:n]) {
				return
			}
			keys = keys[n:]
		}
	}
}
