package mysqlstore

// Retries returns how many attempts the Store made again after losing to
// row lock contention.
func (s *Store) Retries() int64 { return s.retries.Load() }
