package redlockstore

import (
	"context"
	"time"

	"github.com/reqlock/reqlock/stores"
)

var _ stores.SharedStore = (*Store)(nil)

// grantKind tells the operations that serve both a plain lock from a
// shared place of limit limit.
type grantKind struct {
	shared bool
	limit  int
}

// plain is the kind of Acquire, Release and Refresh.
var plain = grantKind{}

// flag is b as a script argument.
func flag(b bool) int {
	if b {
		return 1
	}
	return 0
}

// quorumOf returns how many nodes a grant of kind needs: a majority for a
// plain lock, a reader (limit 0) and a limit of 1; every node for a limit
// of 2 or more (see Shared and limited grants in the package
// documentation: with a majority, N/2+1 nodes each, more than the limit
// could hold).
func (s *Store) quorumOf(kind grantKind) int {
	if kind.shared && kind.limit >= 2 {
		return len(s.nodes)
	}
	return s.quorum
}

// AcquireShared makes token a holder of key for ttl, as stores.SharedStore
// describes, on every node it reaches: each node admits it under the rules
// of the contract applied to that node's holders (see shared_acquire.lua),
// and the place is granted once the nodes of its quorum admitted it within
// the TTL: a majority for limit 0 or 1, every node for a larger limit (see
// Shared and limited grants in the package documentation). The rest is
// Acquire's: the gate, the fence (the largest its quorum issued, stored on
// that quorum), the undo of a place that missed its quorum on the nodes
// that admitted it, the refusal's Wait (how long until enough refusing
// nodes let go), and the errors, with an error wrapping stores.ErrInvalid
// for an empty or too long key, a negative limit or a ttl out of Bounds.
func (s *Store) AcquireShared(ctx context.Context, key, token string, limit int, ttl time.Duration) (stores.Grant, error) {
	if err := args.CheckShared(ctx, key, limit); err != nil {
		return stores.Grant{}, err
	}
	keys := []string{key}
	if err := s.checkArgs(keys, "ttl", ttl); err != nil {
		return stores.Grant{}, err
	}
	return s.acquire(ctx, keys, token, ttl, grantKind{shared: true, limit: limit})
}

// ReleaseShared ends token's place among key's holders on every node, as
// Release ends a lock (with keep positive, each node keeps the place for
// keep plus the drift allowance), and publishes each freed place. It returns
// an error wrapping stores.ErrNotHeld when more nodes than a quorum allows
// answered that token holds no place there; Release's other errors
// otherwise.
func (s *Store) ReleaseShared(ctx context.Context, key, token string, keep time.Duration) error {
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	keys := []string{key}
	if keep > 0 {
		if err := s.checkArgs(keys, "keep", keep); err != nil {
			return err
		}
	} else if err := s.checkKeys(keys); err != nil {
		return err
	}
	return s.release(ctx, keys, token, keep, grantKind{shared: true})
}

// RefreshShared resets the TTL of token's place among key's holders on
// every node that still has it, and succeeds once the place's quorum (of
// the limit it was granted under, as the nodes tell) did so within ttl. A
// node that lost the place does not take it again. Its errors are
// Refresh's.
func (s *Store) RefreshShared(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	keys := []string{key}
	if err := s.checkArgs(keys, "ttl", ttl); err != nil {
		return err
	}
	return s.refresh(ctx, keys, token, ttl, grantKind{shared: true})
}
