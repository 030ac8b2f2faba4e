package redlockstore

// Gate returns the node the acquisitions of key try first.
func (s *Store) Gate(key string) int { return s.gate(key) }
