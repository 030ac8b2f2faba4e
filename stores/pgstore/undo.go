package pgstore

import (
	"context"
	"errors"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// debt is an acquire the Store must undo: its caller left, or it may still
// apply, and what it granted, or may grant, must not outlive it.
type debt struct {
	keys  []string
	token string
	ttl   time.Duration

	// shared: the acquire was an AcquireShared of keys[0], undone by a
	// ReleaseShared.
	shared bool

	// sess carried a statement that may still apply; end is true until
	// the session has been seen ended.
	sess session
	end  bool

	// since is when a grant, if any, had been made at the latest: the
	// release is owed until since+ttl, when such a grant has expired.
	since time.Time
}

// settle tries once to settle d: it ends the session that carried the
// acquire, when the acquire may still apply, then releases its keys,
// owner-checked. It reports true once d is settled: the release landed
// (or found the keys held by no grant of the token), or a grant it could
// have made has expired.
func (s *Store) settle(ctx context.Context, d *debt) bool {
	if d.end {
		err := s.endSession(ctx, d.sess)
		if err != nil && !errors.Is(err, errCannotEnd) {
			return false
		}
		// Ended, or not ours to end: the release goes ahead either way.
		d.end = false
		d.since = time.Now()
	}
	if time.Since(d.since) >= d.ttl {
		return true
	}
	var err error
	if d.shared {
		err = s.releaseShared(ctx, d.keys[0], d.token, 0)
	} else {
		err = s.release(ctx, d.keys, d.token, 0)
	}
	return err == nil || errors.Is(err, stores.ErrNotHeld) || errors.Is(err, stores.ErrInvalid)
}

// owe queues the undo of an acquire of keys by token whose caller left.
func (s *Store) owe(keys []string, token string, ttl time.Duration, a attempt, shared bool) {
	s.undo.Add(s.debtOf(keys, token, ttl, a, shared))
}

// debtOf returns the undo of an acquire of keys by token that left a: its
// session must end first when its statement may still apply.
func (s *Store) debtOf(keys []string, token string, ttl time.Duration, a attempt, shared bool) *debt {
	s.abandoned.Add(1)
	return &debt{keys: keys, token: token, ttl: ttl, shared: shared, sess: a.sess, end: a.unknown && a.sess.endable, since: time.Now()}
}
