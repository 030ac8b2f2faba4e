package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"strings"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// fairDropLimit is the most dead waiters one AcquireFair drops, so that a
// queue full of dead entries cannot make one call slow; the next calls drop
// the rest.
const fairDropLimit = 64

var (
	//go:embed fair_acquire.lua
	fairAcquireSrc string
	//go:embed fair_leave.lua
	fairLeaveSrc string

	fairAcquireScript = newScript(withLib(fairAcquireSrc))
	fairLeaveScript   = newScript(fairLeaveSrc)
)

// AcquireFair is one attempt of a fair waiter (see stores.FairStore and
// reqlock.WithFairness), in one script and one round trip.
//
// Next to the lock key and its fence key, a key in fair use has two sorted
// sets in the same Cluster slot (named like the fence key, with the suffixes
// ":fair:queue" and ":fair:lease"): the queue, each token scored by its
// arrival ticket (server time in microseconds, kept increasing within the
// queue), and the leases, each token scored by its lease deadline (server
// time in milliseconds). The script renews the caller's lease if it is
// queued, drops waiters whose lease has passed (at most 64 per call, the
// earliest first; a queue entry without a lease is dropped too), and grants
// with SET NX PX only when the queue is empty or the caller heads it. A grant
// leaves the queue and issues the fence exactly as Acquire does, from the
// same fence key. Otherwise the caller joins the tail when lease is not zero,
// and both sets get a TTL of at least twice the lease (never shortened), so
// an abandoned queue disappears by itself. When the script dropped dead
// waiters and the key is free, it publishes on the lock key's channel like a
// release, so the new head's NotifyRelease wakes it at once.
//
// A refusal returns a FairGrant with OK false, the caller's place in the
// queue as Ahead, and, as Wait, the holder's remaining TTL, or, when
// the key is free but another waiter heads the queue, that waiter's
// remaining lease. It returns the client's error as is,
// an error wrapping stores.ErrInvalid for an empty key, a non-positive ttl,
// a negative lease or a token that starts like a record's value, and
// ctx.Err() without acting when ctx has ended.
func (s *Store) AcquireFair(ctx context.Context, key, token string, ttl, lease time.Duration) (stores.FairGrant, error) {
	if err := args.CheckAcquireFair(ctx, key, ttl, lease); err != nil {
		return stores.FairGrant{}, err
	}
	if err := checkGrantToken(token); err != nil {
		return stores.FairGrant{}, err
	}
	call := &scriptCall{store: s, script: fairAcquireScript,
		keys: []string{key, fenceKey(key), fairQueueKey(key), fairLeaseKey(key), waitingKey(key), abandonKey(key, token),
			writerMarkKey(key, token), writersKey(key)},
		args: []any{token, milliseconds(ttl), s.fenceRetention.Milliseconds(), milliseconds(lease), fairDropLimit,
			stores.FenceStride, writerWindowMS},
		undo: undoFair, undoKeys: []string{key}, undoToken: token, ttl: ttl}
	r, err := call.run(ctx)
	if err != nil {
		return stores.FairGrant{}, err
	}
	reply := r.Ints
	switch {
	case len(reply) == 2 && reply[0] == 1:
		return stores.FairGrant{Grant: stores.Grant{OK: true, Fences: reply[1:]}}, nil
	case len(reply) == 4 && reply[0] == 0:
		return stores.FairGrant{
			Grant: stores.Grant{Wait: holderTTL(reply[1]), SharedHeld: reply[3] == 1},
			Ahead: int(reply[2]),
		}, nil
	}
	return stores.FairGrant{}, fmt.Errorf("%w: fair acquire %q answered %v", ErrUnexpectedReply, key, reply)
}

// LeaveFair takes token out of key's fair queue and lease set. When token
// headed the queue and the key is free, it publishes on the lock key's
// channel like a release, so the next waiter wakes at once. A token that is
// not queued is not an error. It returns the client's error as is, and
// ctx.Err() without acting when ctx has ended.
func (s *Store) LeaveFair(ctx context.Context, key, token string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := s.run(ctx, fairLeaveScript, []string{key, fairQueueKey(key), fairLeaseKey(key)}, token)
	return err
}

// waitingKey names the key that marks key waited for, in the slot of key
// (see fenceKey): a refused acquire sets it, and a release publishes only
// when it deletes it (see lib.lua).
func waitingKey(key string) string { return siblingKey(key, ":waiting") }

// fairQueueKey names key's fair queue, in the slot of key (see fenceKey).
func fairQueueKey(key string) string { return siblingKey(key, ":fair:queue") }

// fairLeaseKey names key's fair lease set, in the slot of key (see fenceKey).
func fairLeaseKey(key string) string { return siblingKey(key, ":fair:lease") }

// siblingKey names a key that lives next to key, in key's Cluster slot
// wherever fenceKey's is: the same rules, with suffix for ":fence".
func siblingKey(key, suffix string) string {
	if hasHashTag(key) || strings.IndexByte(key, '}') >= 0 {
		return key + suffix
	}
	return "{" + key + "}" + suffix
}
