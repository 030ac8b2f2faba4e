package redlockstore

import (
	"context"
	"fmt"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// Release ends token's lock on every node it reaches, owner-checked. It
// waits until the answers decide the outcome (each call bounded by the node
// timeout) or ctx ends, then gives the nodes still out a short grace
// (twice the slowest answer, 5 to 50 ms; none to a node whose last call
// failed): on a healthy cluster every node has released when it returns,
// and a frozen minority costs little. What is still out then settles in the
// background (the Store owes the release where it fails). With keep zero or negative it deletes the keys, and every
// node publishes their release; with keep positive it sets their TTL to
// keep (plus the drift allowance) and publishes nothing.
//
// A Refresh of the token that runs or starts meanwhile starts no more
// calls, and Release closes the token (see Late calls in the package
// documentation) on every node where a call of a Refresh is in flight or
// was lost, with keep positive on every node, so that no renewal or
// re-take of the token lands after it: those nodes keep a tombstone for the
// max TTL (for keep, on the others). An uncontended lock pays nothing for
// this.
//
// It returns an error wrapping stores.ErrNotHeld, naming the keys, when
// more nodes than a quorum allows answered that a key did not hold token
// (after ending the lock on the others); one wrapping ErrNoQuorum, naming
// the failed nodes, when too few nodes answered to tell; one wrapping
// stores.ErrInvalid for no keys, an empty, duplicate, unsorted or too long
// key, or a positive keep out of Bounds; and ctx.Err() when ctx ends first
// (the calls go on, bounded by the node timeout). The Store owes, and sends
// again, the release on every node whose call failed, whatever it returned
// (see Clean-up in the package documentation).
//
// A key that does not hold token withdraws token's waiting-writer record
// there, if it has one (see Acquire).
func (s *Store) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	if err := args.CheckRelease(ctx, keys); err != nil {
		return err
	}
	if keep > 0 {
		if err := s.checkArgs(keys, "keep", keep); err != nil {
			return err
		}
	} else if err := s.checkKeys(keys); err != nil {
		return err
	}
	return s.release(ctx, keys, token, keep, plain)
}

// release is Release of a plain lock or of a shared place (kind), with
// checked arguments.
func (s *Store) release(ctx context.Context, keys []string, token string, keep time.Duration, kind grantKind) error {
	s.forgetRefusal(token)
	tombs, st := s.endToken(token, keep)
	inFlight := false // the calls outlive the Release: the token stays ended until they are in
	defer func() {
		if !inFlight {
			s.endRelease(token, st)
		}
	}()
	// What the Store owes when a node's call fails: the same release, of
	// every attempt so far (not of a later reuse of the token).
	owed := owedRelease{keys: keys, token: token, shared: kind.shared, upTo: s.attempts.Load(), tombs: tombs}
	if keep > 0 {
		owed.keepTill = time.Now().Add(keep + s.drift(keep))
	}
	if err := s.awaitAcquires(ctx, token); err != nil {
		s.oweRelease(owed, s.all())
		return err
	}
	if keep <= 0 {
		// A late grant of the token's acquire is released as it lands,
		// and closed by the tombstone where its call is still in flight
		// (a node whose last call failed, which Release does not wait
		// for). One of a kept lock meets the tombstone every node gets.
		s.markReleased(token)
	}
	s.closeAcquiring(token, tombs)
	sent := time.Now()
	replies := s.releaseOn(ctx, keys, token, kind.shared, keep, closeAll, s.all(), s.nodeTimeout, tombs)
	released := make([]int, len(keys))
	answered := 0
	var failed []reply
	flying := make([]bool, len(s.nodes))
	for i := range flying {
		flying[i] = true
	}
	var slowest time.Duration // the slowest answer so far
	receive := func(r reply) {
		if r.err == nil && len(r.vals) != len(keys) {
			r.err = fmt.Errorf("%w: release %s answered %v", ErrUnexpectedReply, keysForMessage(keys), r.vals)
		}
		if r.err != nil {
			failed = append(failed, r)
			return
		}
		answered++
		for k, v := range r.vals {
			if v == 1 {
				released[k]++
			}
		}
	}
	total, q := len(s.nodes), s.quorum
	// decided reports whether the answers in settle the outcome, whatever
	// the nodes still out answer: every key released on a quorum, a key
	// not held on too many nodes, or no quorum possible either way.
	decided := func() bool {
		left := total - answered - len(failed)
		allOK, canOK, canNotHeld := true, true, false
		for k := range keys {
			if answered-released[k] > total-q {
				return true // not held, whatever the others answer
			}
			allOK = allOK && released[k] >= q
			canOK = canOK && released[k]+left >= q
			canNotHeld = canNotHeld || answered-released[k]+left > total-q
		}
		return allOK || left == 0 || (!canOK && !canNotHeld)
	}
	for !decided() {
		select {
		case r := <-replies:
			flying[r.node] = false
			if r.err == nil {
				slowest = max(slowest, time.Since(sent))
			}
			receive(r)
		case <-ctx.Done():
			// The calls go on: the Store owes the releases that fail.
			inFlight = true
			s.oweRelease(owed, replyNodes(failed))
			s.releaseRest(token, st, owed, replies, total-answered-len(failed))
			return ctx.Err()
		}
	}
	// Decided: the nodes still out get a short grace (healthy ones answer
	// within it, so that Release returns with the lock gone everywhere),
	// not a frozen or slow node's timeout.
	s.linger(ctx, replies, flying, slowest, receive)
	s.oweRelease(owed, replyNodes(failed))
	if left := total - answered - len(failed); left > 0 {
		inFlight = true
		s.releaseRest(token, st, owed, replies, left)
	}
	var notHeld []string
	unknown := false
	for k, key := range keys {
		switch {
		case released[k] >= s.quorum:
		case answered-released[k] > len(s.nodes)-s.quorum:
			notHeld = append(notHeld, key)
		default:
			unknown = true
		}
	}
	if len(notHeld) > 0 {
		return fmt.Errorf("%w: %d of %d keys: %s", stores.ErrNotHeld, len(notHeld), len(keys), keysForMessage(notHeld))
	}
	if unknown {
		return s.noQuorum("release "+keysForMessage(keys), answered, failed, false)
	}
	return nil
}

// releaseRest collects in the background the left replies of a Release
// that returned before them, owes the release on the nodes where it
// failed, and then ends the Release (endRelease): the token stays ended
// until then, so that no Refresh call of it starts meanwhile.
func (s *Store) releaseRest(token string, st *tokenState, owed owedRelease, replies <-chan reply, left int) {
	if !s.track(1) {
		s.endRelease(token, st) // Close gives up what it would owe
		return
	}
	go func() {
		defer s.wg.Done()
		defer s.endRelease(token, st)
		var nodes []int
		for range left {
			if r := <-replies; r.err != nil || len(r.vals) != len(owed.keys) {
				nodes = append(nodes, r.node)
			}
		}
		s.oweRelease(owed, nodes)
	}()
}

// owedRelease is a Release, as the Store owes it on the nodes whose call
// failed (see undo.go).
type owedRelease struct {
	keys     []string
	token    string
	shared   bool
	upTo     int64
	tombs    map[int]tombstone
	keepTill time.Time
}

// oweRelease owes r on the nodes of indexes: until what it releases has
// expired, the lock (at most the max TTL) or the tombstones it leaves.
func (s *Store) oweRelease(r owedRelease, indexes []int) {
	if len(indexes) == 0 {
		return
	}
	calls := make(map[int]owedCall, len(indexes))
	for _, i := range indexes {
		t := r.tombs[i]
		calls[i] = owedCall{upTo: r.upTo, close: t.attempt, closeTTL: t.ttl, keepTill: r.keepTill}
	}
	s.owe(r.keys, r.token, r.shared, time.Now().Add(s.tombstoneTTL()), calls)
}

// replyNodes returns the nodes of replies.
func replyNodes(replies []reply) []int {
	out := make([]int, len(replies))
	for i, r := range replies {
		out[i] = r.node
	}
	return out
}

// tombstone is what a release leaves on a node to close attempts of its
// token: the attempt closed (with every earlier one), and for how long.
type tombstone struct {
	attempt int64
	ttl     time.Duration
}

// tombstoneTTL is how long a tombstone closes an attempt: a call of it that
// reaches its node later than that after its undo or release is not
// stopped. The max TTL, as for the quarantine, plus the drift allowance and
// a margin.
func (s *Store) tombstoneTTL() time.Duration {
	return s.maxTTL + s.drift(s.maxTTL) + tombstoneMargin
}

// endToken records that token's lock is being released, so that no Refresh
// call of it starts until the Release ends (endRelease), and returns the
// tombstones the release must leave: on the nodes where a Refresh call is
// in flight or was lost, and with keep positive on every node (for as long
// as the keys are kept, so that no renewal extends them), closing every
// attempt of the token; and the token's state, which endRelease takes.
func (s *Store) endToken(token string, keep time.Duration) (map[int]tombstone, *tokenState) {
	tombs := make(map[int]tombstone)
	if keep > 0 {
		for i := range s.nodes {
			tombs[i] = tombstone{attempt: closeAll, ttl: keep + s.drift(keep)}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.tokens[token]
	if st == nil {
		// A Refresh that starts while the Release runs finds the token
		// ended too: its writes could land after the Release's.
		st = &tokenState{}
		s.tokens[token] = st
	}
	st.ended = true
	st.releasing++
	for i := range st.writing {
		tombs[i] = tombstone{attempt: closeAll, ttl: s.tombstoneTTL()}
	}
	for i := range st.uncertain {
		tombs[i] = tombstone{attempt: closeAll, ttl: s.tombstoneTTL()}
	}
	st.uncertain = nil
	return tombs, st
}

// awaitAcquires waits until no acquire call of token is in flight on a node
// whose last call succeeded (a healthy node answers soon; one that stalls
// is ended by its stall check or its timeout), or ctx ends: a release sent
// after them cannot be overtaken by their grants.
func (s *Store) awaitAcquires(ctx context.Context, token string) error {
	for {
		s.mu.Lock()
		st := s.tokens[token]
		var moved chan struct{}
		if st != nil {
			for i := range st.acquiring {
				if !s.nodes[i].failing.Load() && !s.skipped(i) {
					moved = st.moved
					break
				}
			}
		}
		s.mu.Unlock()
		if moved == nil {
			return nil
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// closeAcquiring adds to tombs a tombstone closing every attempt of token
// on each node where an acquire call of it is still in flight: its grant
// may land after the release.
func (s *Store) closeAcquiring(token string, tombs map[int]tombstone) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.tokens[token]; st != nil {
		for i := range st.acquiring {
			tombs[i] = tombstone{attempt: closeAll, ttl: s.tombstoneTTL()}
		}
	}
}

// endRelease ends what endToken counted. A Refresh that starts after the
// Release finds the keys released on a quorum, or the Release failed.
func (s *Store) endRelease(token string, st *tokenState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st.releasing--
	s.dropIdleLocked(token, st)
}

// markReleased tells the late replies of token's acquire that the lock is
// released.
func (s *Store) markReleased(token string) {
	s.mu.Lock()
	if st := s.tokens[token]; st != nil {
		st.released = true
	}
	s.mu.Unlock()
}

// releaseOn sends the release script to the nodes of indexes, each call
// bounded by timeout, releasing what the attempts of token up to upTo wrote
// (a later attempt's grant is not theirs to release) and leaving the
// tombstones of tombs (by node); with shared, the token's shared places.
// Every node publishes the releases of the keys it deletes.
func (s *Store) releaseOn(ctx context.Context, keys []string, token string, shared bool, keep time.Duration, upTo int64, indexes []int,
	timeout time.Duration, tombs map[int]tombstone) <-chan reply {
	var keepMS int64
	if keep > 0 {
		keepMS = milliseconds(keep + s.drift(keep))
	}
	return s.fanOut(ctx, timeout, indexes, func(ctx context.Context, i int) ([]int64, error) {
		t := tombs[i]
		return s.eval(ctx, i, releaseScript, keys, token, keepMS, 1, t.attempt, milliseconds(t.ttl), upTo,
			flag(shared))
	})
}
