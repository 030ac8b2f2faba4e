package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// abandonedCleanupTimeout bounds each try of the clean-up after an acquire
// whose caller left before its script returned.
const abandonedCleanupTimeout = 2 * time.Second

// abandonMarkMargin is how much longer than the acquisition's TTL its
// abandon mark lasts: a late copy of the acquire that arrives within the
// TTL plus this margin of the undo grants nothing. Later than that, it would
// hold the key for its TTL with no owner.
const abandonMarkMargin = time.Minute

// cleanUp undoes what the call may have granted: each try bounded by
// abandonedCleanupTimeout, tried again with a backoff until one lands, the
// TTL the call asked for has passed (the grant, if any, has expired), the
// Store is closed, or the clean-up cannot succeed (an invalid argument, a
// closed client).
func (c *scriptCall) cleanUp() {
	deadline := time.Now().Add(c.ttl)
	backoff := 50 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), abandonedCleanupTimeout)
		err := c.undo(c, ctx)
		cancel()
		if err == nil || errors.Is(err, stores.ErrInvalid) || c.store.driver.Closed(err) ||
			c.store.closed() || time.Now().Add(backoff).After(deadline) {
			return
		}
		time.Sleep(backoff) // between tries of a clean-up that found Redis unreachable
		backoff = min(2*backoff, time.Second)
	}
}

// undoRelease marks the call's acquisition abandoned, so that a late copy
// of it grants nothing, then releases the keys it may have granted,
// owner-checked.
func undoRelease(c *scriptCall, ctx context.Context) error {
	if err := c.store.markAbandoned(ctx, c); err != nil {
		return err
	}
	return landed(c.store.Release(ctx, c.undoKeys, c.undoToken, 0))
}

// undoFair marks the fair call's acquisition abandoned, releases the key it
// may have granted and takes the token out of the queue it may have joined.
func undoFair(c *scriptCall, ctx context.Context) error {
	if err := c.store.markAbandoned(ctx, c); err != nil {
		return err
	}
	if c.err != nil || c.granted() {
		if err := landed(c.store.Release(ctx, c.undoKeys, c.undoToken, 0)); err != nil {
			return err
		}
	}
	return c.store.LeaveFair(ctx, c.undoKeys[0], c.undoToken)
}

// landed is err, or nil when err says the keys no longer hold the token:
// the release has nothing left to do.
func landed(err error) error {
	if errors.Is(err, stores.ErrNotHeld) {
		return nil
	}
	return err
}

// markAbandoned marks c's acquisition abandoned for its TTL and
// abandonMarkMargin (see refuse_abandoned in lib.lua).
func (s *Store) markAbandoned(ctx context.Context, c *scriptCall) error {
	keep := milliseconds(c.ttl) + abandonMarkMargin.Milliseconds()
	_, err := s.run(ctx, markAbandonedScript, []string{abandonKey(c.undoKeys[0], c.undoToken)}, keep)
	return err
}
