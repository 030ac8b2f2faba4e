package redlockstore

import (
	"fmt"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// Limits of TTLs.
const (
	// MinTTL is the shortest TTL (and keep) a Store accepts: a grant takes
	// a round trip to a quorum, each node call is bounded by a third of
	// the TTL, and the validity left is the TTL less that (Redlock's ttl >
	// 2×RTT + drift); below a few milliseconds nothing is ever granted.
	MinTTL = 10 * time.Millisecond

	// MaxMaxTTL is the longest max TTL WithMaxTTL accepts: a node
	// restarted empty stays out of quorums that long.
	MaxMaxTTL = 365 * 24 * time.Hour

	// MaxKeyBytes is the longest key a Store accepts: every call sends
	// each key twice (the key and its fence key) to every node, and Redis
	// keeps a key and a channel of that name.
	MaxKeyBytes = 1 << 20

	// maxCallKeyBytes bounds the keys of one call together, far below
	// Redis's query buffer limit (1 GB by default).
	maxCallKeyBytes = 16 << 20
)

var _ stores.Bounded = (*Store)(nil)

// Bounds returns the keys and TTLs the Store honours: keys up to
// MaxKeyBytes, TTLs from MinTTL to the max TTL (WithMaxTTL).
func (s *Store) Bounds() stores.Bounds {
	return stores.Bounds{
		MaxKeyBytes: MaxKeyBytes,
		MinTTL:      MinTTL,
		MaxTTL:      s.maxTTL,
		Reason: fmt.Sprintf("Redlock (a TTL must exceed the round trips of a grant plus the clock drift allowance; "+
			"the max TTL %v is how long a node restarted empty stays out of quorums, max_ttl)", s.maxTTL),
	}
}

// checkKeys refuses keys longer than MaxKeyBytes, or too long together.
func (s *Store) checkKeys(keys []string) error {
	b, total := s.Bounds(), 0
	for _, k := range keys {
		if err := b.CheckKey(k); err != nil {
			return fmt.Errorf("redlockstore: %w", err)
		}
		total += len(k)
	}
	if total > maxCallKeyBytes {
		return fmt.Errorf("%w: redlockstore: %d keys of %d bytes together, above the limit of %d bytes per call",
			stores.ErrInvalid, len(keys), total, maxCallKeyBytes)
	}
	return nil
}

// checkArgs refuses keys out of Bounds (see checkKeys) and a duration d
// (what: "ttl" or "keep") out of Bounds.
func (s *Store) checkArgs(keys []string, what string, d time.Duration) error {
	if err := s.Bounds().CheckTTL(what, d); err != nil {
		return fmt.Errorf("redlockstore: %w", err)
	}
	return s.checkKeys(keys)
}
