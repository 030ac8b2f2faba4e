package memstore

// NotifyRelease registers interest in releases of key until stop is called,
// as stores.Notifier describes; every subscriber of key is signalled. The channel (buffer 1) receives after
// each Release of key and after an expired lock of key is freed; sends never
// block, so several releases may arrive as one signal. stop removes the
// subscription; it may be called more than once and from any goroutine, and
// no signal is sent to the channel after it returns. The channel is never
// closed.
func (s *Store) NotifyRelease(key, _ string) (released <-chan struct{}, stop func()) {
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
