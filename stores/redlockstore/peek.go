package redlockstore

import "github.com/reqlock/reqlock/stores/internal/redlockpeek"

// The shared tests' view of a Store (see package redlockpeek).
func init() {
	redlockpeek.Gate = func(s any, key string) int { return s.(*Store).gate(key) }
	redlockpeek.NotifyNode = func(s any, key string) int { return s.(*Store).rank(key)[1] }
	redlockpeek.TokenStates = func(s any) int {
		st := s.(*Store)
		st.mu.Lock()
		defer st.mu.Unlock()
		return len(st.tokens)
	}
}
