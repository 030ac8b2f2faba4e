package memstore

import (
	"context"
	"slices"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// fairQueue is one key's queue of fair waiters, in arrival order. A key has
// one only while somebody waits; it is guarded by Store.mu.
type fairQueue struct {
	waiters []fairWaiter
}

type fairWaiter struct {
	token    string
	deadline time.Time // end of the waiter's lease
}

// AcquireFair is one attempt of a fair waiter, as reqlock.FairStore
// describes: it renews token's lease when token is queued, drops waiters
// whose lease has passed, and grants key only when it is free and the queue
// is empty or headed by token; otherwise token joins the tail when lease is
// not zero. When it dropped waiters and key is free it signals key's release
// subscribers, so the new head wakes at once. A refusal's Wait is the
// holder's remaining TTL, or when key is free the head's remaining lease,
// and its Ahead the number of waiters queued before token (-1: not queued).
//
// A queue lives only while somebody waits in it. One whose waiters all
// stopped without LeaveFair (which a Locker always calls) is dropped by the
// next AcquireFair or LeaveFair of its key.
//
// It returns ctx.Err() without acting when ctx has ended, and an error
// wrapping stores.ErrInvalid for an empty key, a non-positive ttl or a negative lease.
func (s *Store) AcquireFair(ctx context.Context, key, token string, ttl, lease time.Duration) (stores.FairGrant, error) {
	if err := args.CheckAcquireFair(ctx, key, ttl, lease); err != nil {
		return stores.FairGrant{}, err
	}
	now := s.lockSwept()
	defer s.mu.Unlock()
	q := s.fair[key]
	if q == nil {
		q = &fairQueue{}
	}
	if i := q.index(token); i >= 0 && lease > 0 {
		q.waiters[i].deadline = now.Add(lease) // heartbeat before the drop
	}
	dropped := q.dropExpired(now)
	var (
		grant      stores.FairGrant
		holderWait time.Duration
	)
	e, held := s.heldByOther(key, token)
	if held {
		holderWait = e.expiresAt.Sub(now)
	} else {
		holderWait, held = s.sharedHeld(now, key, token)
		grant.SharedHeld = held
	}
	pos := q.index(token)
	switch {
	case !held && s.entries[key] != nil:
		// A retry of this token's own grant (see heldByOther): grant it
		// again, whoever queued meanwhile.
		grant.OK, grant.Fences = true, []int64{s.grantLocked(now, key, token, ttl)}
	case !held && (len(q.waiters) == 0 || pos == 0):
		if pos == 0 {
			q.waiters = q.waiters[1:]
		}
		grant.OK, grant.Fences = true, []int64{s.grantLocked(now, key, token, ttl)}
	case lease > 0 && pos < 0:
		q.waiters = append(q.waiters, fairWaiter{token: token, deadline: now.Add(lease)})
		pos = len(q.waiters) - 1
	}
	if !grant.OK {
		grant.Ahead = pos
	}
	switch {
	case grant.OK:
	case held:
		grant.Wait = holderWait
	default:
		if dropped {
			s.signal(key)
		}
		if len(q.waiters) > 0 && q.waiters[0].token != token {
			grant.Wait = q.waiters[0].deadline.Sub(now)
		}
	}
	s.storeQueue(key, q)
	return grant, nil
}

// LeaveFair takes token out of key's fair queue. When token headed it and key
// is free, it signals key's release subscribers so the next waiter wakes at
// once. A token that is not queued is not an error. It returns ctx.Err()
// without acting when ctx has ended.
func (s *Store) LeaveFair(ctx context.Context, key, token string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	now := s.lockSwept()
	defer s.mu.Unlock()
	q := s.fair[key]
	if q == nil {
		return nil
	}
	q.dropExpired(now)
	if i := q.index(token); i >= 0 {
		q.waiters = slices.Delete(q.waiters, i, i+1)
		if _, held := s.entries[key]; i == 0 && !held {
			s.signal(key)
		}
	}
	s.storeQueue(key, q)
	return nil
}

// FairWaiters returns the tokens queued for key in fair mode, head first, for
// tests and diagnostics. Waiters whose lease has passed but that no call has
// dropped yet are included.
func (s *Store) FairWaiters(key string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.fair[key]
	if q == nil {
		return nil
	}
	tokens := make([]string, len(q.waiters))
	for i, w := range q.waiters {
		tokens[i] = w.token
	}
	return tokens
}

// storeQueue keeps q as key's queue, or drops it when empty. The caller
// holds s.mu.
func (s *Store) storeQueue(key string, q *fairQueue) {
	if len(q.waiters) == 0 {
		delete(s.fair, key)
		return
	}
	if s.fair == nil {
		s.fair = make(map[string]*fairQueue)
	}
	s.fair[key] = q
}

// index returns the position of token in q, or -1.
func (q *fairQueue) index(token string) int {
	return slices.IndexFunc(q.waiters, func(w fairWaiter) bool { return w.token == token })
}

// dropExpired removes the waiters whose lease ended before now and reports
// whether there were any.
func (q *fairQueue) dropExpired(now time.Time) bool {
	n := len(q.waiters)
	q.waiters = slices.DeleteFunc(q.waiters, func(w fairWaiter) bool { return w.deadline.Before(now) })
	return len(q.waiters) < n
}
