package redlockstore

import (
	"context"
	"fmt"
	"time"

	"github.com/reqlock/reqlock/internal/callctx"
	"github.com/reqlock/reqlock/stores"
)

// Refresh resets the TTL of token's lock on every node that still holds
// every key, and succeeds once a quorum did so within ttl: the lock's
// validity moves forward only on what a quorum confirmed still held it.
// Only then do nodes that lost the keys (restarted empty, or that missed
// the grant) take them again where they are free, before Refresh returns;
// a minority that still holds the token never revives a lock that expired
// on the others, whoever held it in between. Once the answers decide the
// outcome, Refresh gives the nodes still out a short grace (as Release
// does), so that on a healthy cluster a refusal right after it sees the new
// TTL everywhere while a frozen minority costs little.
//
// A Release of the token that starts while a Refresh runs ends it: the
// Refresh starts no more calls, and the Release closes the token on every
// node where a call of the Refresh is in flight or was lost (see Release),
// so that none lands after the Release, also when ctx ended the Refresh
// first.
//
// It returns an error wrapping stores.ErrNotHeld when too few nodes hold
// the token for a quorum: more nodes than a quorum allows answered that a
// key holds another token, is absent, or was released (nothing is re-taken
// then); one wrapping ErrNoQuorum, naming the failed nodes, when too few
// nodes answered or they did not within ttl; one wrapping stores.ErrInvalid
// for no keys, an empty, duplicate, unsorted or too long key, or a ttl out
// of Bounds; and ctx.Err() when ctx ends first. A refresh that fails may
// have renewed the lock on some nodes.
func (s *Store) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return err
	}
	if err := s.checkArgs(keys, "ttl", ttl); err != nil {
		return err
	}
	return s.refresh(ctx, keys, token, ttl, plain)
}

// refresh is Refresh of a plain lock or of a shared place (kind.shared),
// with checked arguments. A shared place is never re-taken where it was
// lost: that would admit a holder past a node's count. Its renewal needs
// the quorum of its limit (see quorumOf), which the nodes tell.
func (s *Store) refresh(ctx context.Context, keys []string, token string, ttl time.Duration, kind grantKind) error {
	if err := s.identify(ctx, s.nodeTimeout); err != nil {
		return err
	}
	if callctx.Ended(ctx) {
		return callctx.Abandoned(ctx, false)
	}
	st := s.beginRefresh(token)
	defer s.endRefresh(token, st)
	start := time.Now()
	timeout := s.callTimeout(ttl)
	scriptKeys := append(append(make([]string, 0, len(keys)+1), keys...), MarkerKey)
	ttlMS := milliseconds(ttl + s.drift(ttl))
	attempt := s.attempts.Add(1)
	run := func(indexes []int, retake int) (<-chan reply, bool) {
		return s.writes(ctx, token, st, ttl, timeout, indexes, func(ctx context.Context, i int) ([]int64, error) {
			return s.eval(ctx, i, refreshScript, scriptKeys, token, ttlMS, retake, s.maxTTL.Milliseconds(), attempt,
				flag(kind.shared))
		})
	}

	replies, ok := run(s.all(), 0)
	if !ok {
		return fmt.Errorf("%w: refresh %s: the lock is being released", stores.ErrNotHeld, keysForMessage(keys))
	}
	var refreshed, absent, other, failed []reply
	total, q := len(s.nodes), s.quorum // q grows to a limited place's quorum as its nodes tell its limit
	// Only nodes whose identity is known count: one vote per server.
	votes := 0
	flying := make([]bool, total)
	for i := range flying {
		flying[i] = true
	}
	var slowest time.Duration // the slowest answer so far
	receive := func(r reply) {
		switch {
		case r.err != nil:
			failed = append(failed, r)
		case !kind.shared && len(r.vals) == 1 && r.vals[0] == 0,
			kind.shared && len(r.vals) == 2 && r.vals[0] == 0 && r.vals[1] >= 0:
			if kind.shared {
				q = max(q, s.quorumOf(grantKind{shared: true, limit: int(r.vals[1])}))
			}
			refreshed = append(refreshed, r)
			if s.known(r.node) {
				votes++
			}
		case len(r.vals) == 1 && (r.vals[0] == 2 || r.vals[0] == 3):
			absent = append(absent, r)
		case len(r.vals) == 2 && r.vals[0] == 1 && r.vals[1] >= 1 && r.vals[1] <= int64(len(keys)):
			other = append(other, r)
		default:
			r.err = fmt.Errorf("%w: refresh %s answered %v", ErrUnexpectedReply, keysForMessage(keys), r.vals)
			failed = append(failed, r)
		}
	}
	// decided reports whether the answers in settle the outcome, whatever
	// the nodes still out answer (see the switch below).
	decided := func() bool {
		left := total - len(refreshed) - len(absent) - len(other) - len(failed)
		notHeld := len(other) + len(absent)
		return left == 0 || votes >= q || notHeld > total-q || (votes+left < q && notHeld+left <= total-q)
	}
	for !decided() {
		select {
		case r := <-replies:
			flying[r.node] = false
			if r.err == nil {
				slowest = max(slowest, time.Since(start))
			}
			receive(r)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// Decided: the nodes still out get a short grace (healthy ones answer
	// within it, so that Refresh returns with the TTL renewed everywhere,
	// and a node that lost the keys is re-taken now), not a frozen or slow
	// node's timeout. The rest land in the background.
	s.linger(ctx, replies, flying, slowest, receive)

	if !kind.shared && votes >= q && len(absent) > 0 {
		// The lock stands on a quorum: nodes that lost it (and answered)
		// take it again. Nodes still out are not waited for: the next
		// Refresh re-takes where they lost it.
		indexes := make([]int, len(absent))
		for i, r := range absent {
			indexes[i] = r.node
		}
		if retaken, ok := run(indexes, 1); ok {
			for range indexes {
				select {
				case r := <-retaken:
					if r.err != nil {
						failed = append(failed, r)
					}
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
	}

	notHeld := len(other) + len(absent)
	switch {
	case votes >= q:
		if elapsed := time.Since(start); elapsed >= ttl {
			return fmt.Errorf("%w: refresh %s: a quorum renewed after %v, not within the TTL %v",
				ErrNoQuorum, keysForMessage(keys), elapsed, ttl)
		}
		return nil
	case len(other) > len(s.nodes)-q:
		return fmt.Errorf("%w: %s is held by another token on %d of %d nodes",
			stores.ErrNotHeld, stores.KeyForMessage(keys[other[0].vals[1]-1]), len(other), len(s.nodes))
	case notHeld > len(s.nodes)-q:
		return fmt.Errorf("%w: %s: held by the token on %d of %d nodes, not held on %d, quorum %d",
			stores.ErrNotHeld, keysForMessage(keys), len(refreshed), len(s.nodes), notHeld, q)
	}
	return s.noQuorumOf("refresh "+keysForMessage(keys), len(refreshed)+notHeld, q, failed, false)
}

// beginRefresh counts a Refresh of token running, so that a Release that
// starts meanwhile finds its state. endRefresh undoes it.
func (s *Store) beginRefresh(token string) *tokenState {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now := time.Now(); len(s.tokens) >= maxTokenStates || now.After(s.nextTokenSweep) {
		s.nextTokenSweep = now.Add(tokenSweepEvery)
		s.sweepLocked(now)
	}
	st := s.tokens[token]
	if st == nil {
		st = &tokenState{}
		s.tokens[token] = st
	}
	st.refreshing++
	return st
}

// Token states are swept every tokenSweepEvery, and whenever there are
// maxTokenStates of them.
const (
	tokenSweepEvery = time.Second
	maxTokenStates  = 4096
)

// sweepLocked forgets the uncertain nodes of tokens whose lock was never
// released once what the calls of unknown outcome may have renewed has
// expired (a late plain renewal then finds the keys gone, and writes
// nothing), and the states that nothing else keeps. The caller holds s.mu.
func (s *Store) sweepLocked(now time.Time) {
	for token, st := range s.tokens {
		if len(st.uncertain) > 0 && now.After(st.uncertainTill) {
			st.uncertain = nil
			s.dropIdleLocked(token, st)
		}
	}
}

// endRefresh ends what beginRefresh counted.
func (s *Store) endRefresh(token string, st *tokenState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st.refreshing--
	s.dropIdleLocked(token, st)
}

// writes runs call on the nodes of indexes as fanOut does, unless a Release
// of token began (it reports false then and calls nothing), and counts
// each call in flight on its node until it answers; a call whose outcome
// is unknown leaves its node uncertain. A Release closes the token on the
// nodes of both (see Release), so that none of these calls lands after it.
func (s *Store) writes(ctx context.Context, token string, st *tokenState, ttl, timeout time.Duration, indexes []int,
	call func(ctx context.Context, i int) ([]int64, error)) (<-chan reply, bool) {
	s.mu.Lock()
	if st.ended {
		s.mu.Unlock()
		return nil, false
	}
	if st.writing == nil {
		st.writing = make(map[int]int)
	}
	for _, i := range indexes {
		st.writing[i]++
	}
	st.refreshing++ // keeps st until every reply is in
	s.mu.Unlock()
	replies := s.fanOut(ctx, timeout, indexes, call)
	out := make(chan reply, len(indexes))
	forward := func() {
		for range indexes {
			r := <-replies
			s.mu.Lock()
			if st.writing[r.node]--; st.writing[r.node] == 0 {
				delete(st.writing, r.node)
			}
			if s.mayHaveGranted(r) {
				if st.uncertain == nil {
					st.uncertain = make(map[int]struct{})
				}
				st.uncertain[r.node] = struct{}{}
				if till := time.Now().Add(ttl + 2*s.drift(ttl)); till.After(st.uncertainTill) {
					st.uncertainTill = till
				}
			}
			s.mu.Unlock()
			out <- r
		}
		s.endRefresh(token, st)
	}
	if s.track(1) {
		go func() {
			defer s.wg.Done()
			forward()
		}()
	} else {
		// Close began: the replies come at once, or from calls it waits for.
		go forward()
	}
	return out, true
}
