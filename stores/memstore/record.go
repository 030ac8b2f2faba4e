package memstore

import (
	"bytes"
	"container/heap"
	"context"
	"fmt"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// ClaimRecord is Acquire of key for token, as stores.RecordStore describes,
// under one hold of the store's mutex, unless key holds a finished record:
// it then returns a copy of it with a Grant whose OK is false. A claim is an
// exclusive lock of key (Release and Refresh act on it); a record is an
// entry of key of its own, which no lock operation grants, releases or
// refreshes, freed at the end of its retention by the expiry heap.
//
// It returns ctx.Err() without acting when ctx has ended, and an error
// wrapping stores.ErrInvalid for an empty key or a non-positive ttl.
func (s *Store) ClaimRecord(ctx context.Context, key, token string, ttl time.Duration) (stores.Grant, *stores.Record, error) {
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return stores.Grant{}, nil, err
	}
	if err := args.CheckTTL(ttl); err != nil {
		return stores.Grant{}, nil, err
	}
	now := s.lockSwept()
	defer s.mu.Unlock()
	if e, ok := s.entries[key]; ok && e.kind == record {
		return stores.Grant{}, copyRecord(e.rec), nil
	}
	if e, held := s.heldByOther(key, token); held {
		return stores.Grant{Wait: e.expiresAt.Sub(now)}, nil, nil
	}
	if wait, held := s.sharedHeld(now, key, token); held {
		return stores.Grant{Wait: wait, SharedHeld: true}, nil, nil
	}
	return stores.Grant{OK: true, Fences: []int64{s.grantLocked(now, key, token, ttl)}}, nil, nil
}

// FinishRecord replaces token's claim on key by a copy of rec, kept for
// retention, and signals key's release subscribers, as stores.RecordStore
// describes, under one hold of the store's mutex. It returns an error
// wrapping stores.ErrNotHeld, changing nothing, when key does not hold
// token's claim, and nil, changing nothing, when key already holds the
// record token finished (a retry).
//
// It returns ctx.Err() without acting when ctx has ended, and an error
// wrapping stores.ErrInvalid for an empty key or a non-positive retention.
// Records have no size limit but memory.
func (s *Store) FinishRecord(ctx context.Context, key, token string, rec stores.Record, retention time.Duration) error {
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	if err := args.CheckRecord(stores.Bounds{}, rec, retention); err != nil {
		return err
	}
	now := s.lockSwept()
	defer s.mu.Unlock()
	e, ok := s.entries[key]
	switch {
	case ok && e.kind == record && e.token == token:
		return nil // a retry of this finish
	case !ok || e.kind != exclusive || e.token != token:
		return fmt.Errorf("%w: %q does not hold the token's claim", stores.ErrNotHeld, key)
	}
	e.kind, e.rec = record, copyRecord(&rec)
	e.expiresAt = now.Add(retention)
	heap.Fix(&s.expiry, e.index)
	s.signal(key)
	return nil
}

// copyRecord returns a copy of r that shares no memory with it.
func copyRecord(r *stores.Record) *stores.Record {
	c := *r
	c.Response = bytes.Clone(r.Response)
	if c.Response == nil {
		c.Response = []byte{}
	}
	return &c
}
