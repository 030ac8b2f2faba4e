package redlockstore

// NotifyRelease registers interest in releases of key until stop is called,
// as stores.Notifier describes, through the key's notify node: every node
// publishes the releases it makes, and the waiter listens on the node that
// ranks second for the key (the first is its gate), one pub/sub connection
// per node for all keys. It returns a nil channel after Close and when that
// client cannot subscribe.
func (s *Store) NotifyRelease(key, token string) (<-chan struct{}, func()) {
	return s.notify[s.notifyNode(key)].NotifyRelease(key, token)
}

// notifyNode returns the node whose release signals a waiter for key
// listens to: the second of the key's ranking, or when it is skipped the
// next that is not (the gate last).
func (s *Store) notifyNode(key string) int {
	order := s.rank(key)
	for _, i := range append(order[1:], order[0]) {
		if !s.skipped(i) {
			return i
		}
	}
	return order[1]
}
