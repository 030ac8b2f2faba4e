package redlockstore

// Gate returns the node the acquisitions of key try first.
func (s *Store) Gate(key string) int { return s.gate(key) }

// TokenStates returns how many tokens the Store keeps a state for.
func (s *Store) TokenStates() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.tokens)
}

// NotifyNode returns the node that carries key's release signals.
func (s *Store) NotifyNode(key string) int {
	return s.rank(key)[1]
}
