package redlockstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"time"

	"github.com/reqlock/reqlock/internal/callctx"
	"github.com/reqlock/reqlock/stores"
)

// tokenState tracks what an acquisition token still has in flight: node
// calls that had not answered when Acquire returned, Refresh calls and
// Releases. A late grant stays part of the lock when the attempt that made
// it granted the lock and the lock is not released; otherwise it is
// released at once, owner-checked by attempt (see undo). A call whose
// outcome is unknown (it failed or timed out after it may have reached its
// node) is released at once, closing its attempt on the node (see Late
// calls in the package documentation). Each grant records its attempt on
// the node (TOKEN#ATTEMPT), and an undo releases only what its attempt or
// an earlier one wrote, so a new Acquire with the token (the Locker retries
// with one token until it is granted) waits for no undo: none deletes what
// a later attempt granted. Fields are guarded by Store.mu.
type tokenState struct {
	pending   int           // late replies not yet in
	acquiring map[int]int   // their nodes: acquire calls in flight, per node
	moved     chan struct{} // closed (and replaced) as each of them lands
	granted   int64         // the attempt that granted the lock (0: none)
	released  bool          // a Release (keep zero) of the lock began

	refreshing    int              // Refresh calls of the token running
	writing       map[int]int      // Refresh node calls in flight, per node
	uncertain     map[int]struct{} // nodes where a Refresh call's outcome is unknown
	uncertainTill time.Time        // when what those calls may have renewed has expired
	ended         bool             // a Release began: no Refresh call starts
	releasing     int              // Releases of the token running
}

// closeAll is the attempt a release closes: every attempt of the token.
const closeAll = 1<<53 - 1

// errUnverified is the failure of a node that granted before the Store knew
// its run_id: it may be a second address of a node that granted too.
var errUnverified = errors.New("redlockstore: granted, but its run_id is not known yet: not counted")

// errClosed is the failure of a call that arrived at its node after an undo
// or a release had closed its attempt there, or after a later attempt of
// its token wrote there: it wrote nothing.
var errClosed = errors.New("redlockstore: the call arrived after its undo or release, or after a later attempt, and wrote nothing")

// Acquire sets every key to token on every node it reaches, and grants the
// lock when a quorum of nodes did so within the TTL (see Algorithm in the
// package documentation). Each key's fence is the largest its quorum issued,
// stored on a quorum before Acquire returns (see Fencing).
//
// A refusal (Grant.OK false) comes when so many nodes refused that no quorum
// is possible and a quorum of nodes answered: when the nodes that failed or
// did not answer leave fewer, Acquire reports a store failure, not a busy
// key, whatever the others answered. Held is the index of the held key the most refusing
// nodes named (a key still held on a minority does not mask it), and Wait the shortest
// remaining TTL a refusing node reported, less the drift allowance. The
// nodes that granted are released first.
//
// It returns an error wrapping stores.ErrInvalid for no keys, an empty,
// duplicate, unsorted or too long key, or a ttl out of Bounds, and (also
// wrapping ErrDuplicateNode) when two nodes turned out to be one server;
// ctx.Err() without acting when ctx has ended; an error wrapping ErrNoQuorum
// (and stores.ErrUnreachable when no node was reached) that names every
// failed node when failures (with refusals) make a quorum impossible or the quorum came too
// late; and, when ctx ends while calls are in flight, an error wrapping
// stores.ErrAbandoned and ctx's error, the store releasing what the calls
// granted once they answer (see Clean-up in the package documentation).
//
// A refusal by shared holders (see AcquireShared) on a node records token
// as a waiting writer there, and sets Grant.SharedHeld when any node that
// answered did so: Release withdraws the records on every node.
func (s *Store) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return stores.Grant{}, err
	}
	if err := s.checkArgs(keys, "ttl", ttl); err != nil {
		return stores.Grant{}, err
	}
	return s.acquire(ctx, keys, token, ttl, plain)
}

// acquire is Acquire of a plain lock or of a shared place (kind), with
// checked arguments.
func (s *Store) acquire(ctx context.Context, keys []string, token string, ttl time.Duration, kind grantKind) (stores.Grant, error) {
	if err := s.identify(ctx, s.nodeTimeout); err != nil {
		return stores.Grant{}, err
	}
	if callctx.Ended(ctx) {
		// It ended while the first Acquire waited for the nodes'
		// identities: nothing sent, nothing to undo.
		return stores.Grant{}, callctx.Abandoned(ctx, false)
	}
	// Every write carries its attempt, which the undo of the attempt
	// closes on the node: a call that arrives after its undo writes
	// nothing, and the undo releases only what this attempt (or an earlier
	// one) wrote.
	attempt := s.attempts.Add(1)
	a := attemptOf{keys: keys, token: token, attempt: attempt, ttl: ttl, shared: kind.shared}
	start := time.Now()
	n := len(keys)
	scriptKeys := make([]string, 0, 2*n+1)
	scriptKeys = append(scriptKeys, keys...)
	for _, k := range keys {
		scriptKeys = append(scriptKeys, fenceKey(k))
	}
	scriptKeys = append(scriptKeys, MarkerKey)
	argv := []any{token, milliseconds(ttl + s.drift(ttl)), s.fenceRetention.Milliseconds(),
		stores.FenceStride, s.maxTTL.Milliseconds(), time.Now().Add(firstFenceMargin).UnixMicro(), attempt, writerWindowMS}
	script := acquireScript
	if kind.shared {
		script, argv[len(argv)-1] = sharedAcquireScript, kind.limit
	}
	timeout := s.callTimeout(ttl)
	call := func(ctx context.Context, i int) ([]int64, error) {
		return s.eval(ctx, i, script, scriptKeys, argv...)
	}

	// q grants make the lock; a refusal needs answers of a majority (a
	// busy key is never a store failure, and a store failure never a busy
	// key).
	total, q := len(s.nodes), s.quorumOf(kind)
	var granted, refused, failed, unverified []reply
	votes := 0 // grants of nodes whose identity is known: one per server
	classify := func(r reply) {
		switch {
		case r.err != nil:
			failed = append(failed, r)
		case len(r.vals) == n+1 && r.vals[0] == 1:
			granted = append(granted, r)
			if s.known(r.node) {
				votes++
			} else {
				// Maybe a second address of a node that voted: its
				// grant counts once its run_id is known.
				unverified = append(unverified, r)
			}
		case len(r.vals) == 5 && r.vals[0] == 0 && r.vals[1] >= 0 && r.vals[1] < int64(n):
			refused = append(refused, r)
		case len(r.vals) == 1 && r.vals[0] == -2:
			r.err = errClosed
			failed = append(failed, r)
		default:
			r.err = fmt.Errorf("%w: acquire %s answered %v", ErrUnexpectedReply, keysForMessage(keys), r.vals)
			failed = append(failed, r)
		}
	}

	// The gate: one node per key, the same for every client. A first
	// attempt asks every node at once (one round trip when the key is
	// free); a contender that wins the gate but not a quorum waits briefly
	// for the others, which lost the gate and let go (see gateRetries), so
	// that contenders splitting the nodes still yield one winner. A retry
	// after a refusal, or while another Acquire of the key runs in this
	// process, asks the gate first and the others only once the gate
	// granted: contenders that lose there cost one call, not one per node.
	// A gate whose last call failed is not asked first. A gate that
	// refuses with the holder that refused the token last time is not
	// trusted alone: the holder may have released the lock everywhere but
	// there (a lost release), so the other nodes are asked too.
	//
	// A skipped gate is passed over for the next node of the key's ranking
	// (the same in every process that skips it), and a gate that has not
	// answered within its patience (a few of its round trips) is not
	// waited for: the others are asked too, and its answer counts with
	// theirs.
	gate := s.liveGate(keys[0])
	others := make([]int, 0, total)
	contended, lastHolder := s.enter(keys[0], token)
	defer s.leave(keys[0])
	// Every call of the attempt answers on replies; flying tells the nodes
	// whose answer is not in yet.
	replies := make(chan reply, total)
	flying := make([]bool, total)
	pending := 0
	send := func(indexes []int) {
		for _, i := range indexes {
			flying[i] = true
		}
		pending += len(indexes)
		s.fanOutInto(ctx, timeout, indexes, call, replies)
	}
	receive := func(r reply) {
		pending--
		flying[r.node] = false
		classify(r)
	}
	asked := false
	if contended && !s.nodes[gate].failing.Load() && s.healthyQuorum() {
		asked = true
		send([]int{gate})
		patience := time.NewTimer(s.patience(gate, timeout))
		select {
		case r := <-replies:
			receive(r)
		case <-patience.C:
			// A slow gate: ask the others too.
		case <-ctx.Done():
			// Undo the grant the gate may make, once it answers.
			patience.Stop()
			s.settle(a, replies, flying, nil, nil, true)
			return stores.Grant{}, callctx.Abandoned(ctx, true)
		}
		patience.Stop()
		// A gate that refuses a writer for shared holders is not trusted
		// alone either: the writer's record must stand on the others too,
		// or new holders would keep a majority and starve it.
		if len(refused) == 1 && refused[0].vals[3] != lastHolder && refused[0].vals[4] == 0 {
			s.settle(a, nil, nil, nil, nil, true)
			return s.refusal(token, refused[0].vals[1], s.refusalWait(refused[0].vals[2]), refused[0].vals[3], false), nil
		}
	}
	for i := range total {
		if !asked || i != gate {
			others = append(others, i)
		}
	}
	phase2 := time.Now()
	send(others)
	for pending > 0 && votes < q && len(failed) <= total-q {
		if len(refused)+len(failed) > total-q && (len(granted)+len(refused) >= s.quorum || !s.waitFor(flying)) {
			// No quorum possible: a refusal when a quorum of nodes
			// answered, a store failure when the nodes that failed, or
			// are still out and failing, leave too few to tell.
			break
		}
		select {
		case r := <-replies:
			receive(r)
		case <-ctx.Done():
			s.settle(a, replies, flying, granted, failed, true)
			return stores.Grant{}, callctx.Abandoned(ctx, true)
		}
	}

	if votes < q && len(failed) <= total-q && slices.ContainsFunc(granted, func(r reply) bool { return r.node == gate }) {
		// The gate is ours: the nodes that refused are held by contenders
		// that lost it, and let go at once. Ask them again, briefly.
		for pending > 0 {
			select {
			case r := <-replies:
				receive(r)
			case <-ctx.Done():
				s.settle(a, replies, flying, granted, failed, true)
				return stores.Grant{}, callctx.Abandoned(ctx, true)
			}
		}
		backoff := time.Millisecond
		for try := 0; try < gateRetries && votes < q && len(refused) > 0 && len(failed) <= total-q; try++ {
			if time.Since(start)+backoff+timeout >= ttl {
				break
			}
			timer := time.NewTimer(backoff)
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
				s.settle(a, nil, nil, granted, failed, true)
				return stores.Grant{}, callctx.Abandoned(ctx, true)
			}
			backoff *= 2
			again := make([]int, len(refused))
			for i, r := range refused {
				again[i] = r.node
			}
			refused = refused[:0]
			send(again)
			for pending > 0 {
				select {
				case r := <-replies:
					receive(r)
				case <-ctx.Done():
					s.settle(a, replies, flying, granted, failed, true)
					return stores.Grant{}, callctx.Abandoned(ctx, true)
				}
			}
		}
	}

	// Give the other nodes as long again as the decision took: healthy
	// ones answer by then, so that fewer grants land after Acquire returns
	// and a refusal's Wait comes from most nodes. Nodes whose last call
	// failed (frozen, partitioned) are not waited for.
	if s.waitFor(flying) && (votes >= q || len(failed) <= total-q) {
		grace := time.NewTimer(max(time.Since(phase2), time.Millisecond))
	late:
		for s.waitFor(flying) {
			select {
			case r := <-replies:
				receive(r)
			case <-grace.C:
				// Replies already here still count: select picks at
				// random between them and the timer, and a burst of
				// replies that came with it must not be cut in two.
				for s.waitFor(flying) {
					select {
					case r := <-replies:
						receive(r)
						continue
					default:
					}
					break
				}
				break late
			case <-ctx.Done():
				break late
			}
		}
		grace.Stop()
	}

	if votes >= q {
		fences, err := s.grantFences(ctx, keys, granted, start, ttl, timeout, q)
		if err != nil {
			s.settle(a, replies, flying, granted, failed, true)
			if callctx.Ended(ctx) {
				return stores.Grant{}, callctx.Abandoned(ctx, true)
			}
			return stores.Grant{}, err
		}
		s.settle(a, replies, flying, nil, failed, false)
		s.forgetRefusal(token)
		return stores.Grant{OK: true, Fences: fences}, nil
	}

	s.settle(a, replies, flying, granted, failed, true)
	if len(refused) > 0 && len(granted)+len(refused) >= s.quorum {
		// A quorum of nodes answered (a busy key is never a store
		// failure, and a store failure never a busy key: with fewer,
		// the nodes that failed or did not answer decided).
		// The refusal stands until enough refusing nodes let go that the
		// rest no longer block a quorum.
		waits := make([]time.Duration, len(refused))
		for i, r := range refused {
			waits[i] = s.refusalWait(r.vals[2])
		}
		slices.Sort(waits)
		holder := refused[0]
		shared := false
		for _, r := range refused {
			if r.node == gate {
				holder = r
			}
			shared = shared || r.vals[4] == 1
		}
		return s.refusal(token, heldKey(refused, holder.vals[1]), waits[max(0, len(refused)-(total-q)-1)], holder.vals[3], shared), nil
	}
	if callctx.Ended(ctx) {
		return stores.Grant{}, callctx.Abandoned(ctx, true)
	}
	// Unreachable only when no node was reached: not one that refused.
	unreachable := len(granted) == 0 && len(refused) == 0 && pending == 0
	for _, r := range failed {
		unreachable = unreachable && r.unreachable()
	}
	for _, r := range unverified {
		r.err = errUnverified
		failed = append(failed, r)
	}
	if len(unverified) > 0 {
		s.probe(ctx, s.nodeTimeout, false)
	}
	return stores.Grant{}, s.noQuorumOf("acquire "+keysForMessage(keys), votes+len(refused), q, failed, unreachable)
}

// heldKey returns the index of the key a refusal names: the first held key
// that the most refusing nodes named, so that a key still held on a
// minority for a moment (a release landing late there) does not mask the
// key that actually blocks; on a tie, prefer (the gate's), then the lowest.
func heldKey(refused []reply, prefer int64) int64 {
	votes := make(map[int64]int, len(refused))
	for _, r := range refused {
		votes[r.vals[1]]++
	}
	best := prefer
	for k, n := range votes {
		if n > votes[best] || (n == votes[best] && k < best && best != prefer) {
			best = k
		}
	}
	return best
}

// firstFenceMargin is how far ahead of the client's clock the first fence of
// a key is proposed: nodes whose clocks are within it of the client's all
// take the proposal, so they agree without a second round trip.
const firstFenceMargin = time.Second

// gateRetries is how many times a contender that won the gate asks the
// nodes that refused it again, after 1ms, 2ms, 4ms, ... (and while the TTL
// leaves room).
const gateRetries = 6

// maxRefusedTokens bounds the tokens remembered as refused.
const maxRefusedTokens = 4096

// refusedBy is a token's last refusal: when, and a digest of the holder's
// token (of the gate's refusal when the gate refused).
type refusedBy struct {
	at     time.Time
	holder int64
}

// refusal returns the Grant of a refusal, and remembers that token was
// refused, and by which holder: its next attempt, a waiter's retry, asks
// the gate first.
func (s *Store) refusal(token string, held int64, wait time.Duration, holder int64, shared bool) stores.Grant {
	s.mu.Lock()
	if len(s.refused) >= maxRefusedTokens {
		// Waiters that gave up never come back: drop the old entries.
		for t, r := range s.refused {
			if time.Since(r.at) > time.Minute {
				delete(s.refused, t)
			}
		}
		if len(s.refused) >= maxRefusedTokens {
			clear(s.refused)
		}
	}
	s.refused[token] = refusedBy{at: time.Now(), holder: holder}
	s.mu.Unlock()
	return stores.Grant{Held: int(held), Wait: wait, SharedHeld: shared}
}

// enter counts an Acquire of key in flight and reports whether the key is
// contended: token's last attempt was refused, or another Acquire of key
// runs in this process; and the digest of the holder that refused token
// last (-1 when none did). leave undoes it.
func (s *Store) enter(key, token string) (contended bool, holder int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight[key]++
	r, refused := s.refused[token]
	if !refused {
		r.holder = -1
	}
	return refused || s.inflight[key] > 1, r.holder
}

// leave ends what enter counted.
func (s *Store) leave(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inflight[key]--; s.inflight[key] == 0 {
		delete(s.inflight, key)
	}
}

// forgetRefusal forgets that token was refused.
func (s *Store) forgetRefusal(token string) {
	s.mu.Lock()
	delete(s.refused, token)
	s.mu.Unlock()
}

// gate returns the node a key's acquisitions try first: the first of the
// key's ranking (see rank), the same in every process that names the nodes
// alike, in any order.
func (s *Store) gate(key string) int { return s.rank(key)[0] }

// liveGate returns the first node of key's ranking that is not skipped (the
// gate while it is not; the gate when all are).
func (s *Store) liveGate(key string) int {
	order := s.rank(key)
	for _, i := range order {
		if !s.skipped(i) {
			return i
		}
	}
	return order[0]
}

// healthyQuorum reports whether a quorum of nodes is neither skipped nor
// failing (its last call failed): only then is a refusal by the gate alone
// trusted; else a refusal may be another Acquire's grant on one of the few
// live nodes, and the failures decide.
func (s *Store) healthyQuorum() bool {
	live := 0
	for i, n := range s.nodes {
		if !s.skipped(i) && !n.failing.Load() {
			live++
		}
	}
	return live >= s.quorum
}

// waitFor reports whether a node of flying (the nodes whose answer is not
// in) is worth waiting for: its last call did not fail.
func (s *Store) waitFor(flying []bool) bool {
	for i, f := range flying {
		if f && !s.nodes[i].failing.Load() {
			return true
		}
	}
	return false
}

// rank returns the nodes in their order for key, by rendezvous hashing of
// the key with each node's identity (its canonical address, see
// canonicalAddr): the order in which the nodes were listed plays no part.
func (s *Store) rank(key string) []int {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	k := h.Sum64()
	weights := make([]uint64, len(s.nodes))
	order := make([]int, len(s.nodes))
	for i, n := range s.nodes {
		weights[i], order[i] = mix64(k^n.idHash), i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(weights[b], weights[a]) })
	return order
}

// mix64 is splitmix64's finalizer: every input bit flips about half of the
// output bits.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// grantFences returns the fences of a grant by the nodes of granted: per
// key the largest they issued, once a quorum stores it (raising the fence
// keys of nodes that lag, when fewer do), and within the TTL.
func (s *Store) grantFences(ctx context.Context, keys []string, granted []reply, start time.Time, ttl, timeout time.Duration, q int) ([]int64, error) {
	n := len(keys)
	fences := make([]int64, n)
	for _, r := range granted {
		for k := range n {
			fences[k] = max(fences[k], r.vals[k+1])
		}
	}
	agree := true
	var lag []int
	for k := range n {
		count := 0
		for _, r := range granted {
			if r.vals[k+1] == fences[k] && s.known(r.node) {
				count++
			}
		}
		agree = agree && count >= q
	}
	for _, r := range granted {
		for k := range n {
			if r.vals[k+1] != fences[k] {
				lag = append(lag, r.node)
				break
			}
		}
	}
	if len(lag) > 0 {
		// Nodes that missed grants catch up, so that they agree again.
		raised := s.raise(ctx, keys, fences, lag, timeout)
		if !agree {
			stored := 0
			for _, r := range granted {
				if !slices.Contains(lag, r.node) && s.known(r.node) {
					stored++
				}
			}
			var failed []reply
			for range lag {
				select {
				case r := <-raised:
					if r.err == nil && s.known(r.node) {
						stored++
					} else {
						failed = append(failed, r)
					}
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			if stored < q {
				return nil, s.noQuorumOf(fmt.Sprintf("store the fences of %q", keys), stored, q, failed, false)
			}
		}
	}
	if elapsed := time.Since(start); elapsed >= ttl {
		return nil, fmt.Errorf("%w: acquire %q: a quorum granted after %v, not within the TTL %v",
			ErrNoQuorum, keys, elapsed, ttl)
	}
	return fences, nil
}

// raise raises the fence keys of keys on the nodes of indexes to fences.
func (s *Store) raise(ctx context.Context, keys []string, fences []int64, indexes []int, timeout time.Duration) <-chan reply {
	fks := make([]string, len(keys))
	argv := make([]any, 0, len(keys)+1)
	for i, k := range keys {
		fks[i] = fenceKey(k)
		argv = append(argv, fences[i])
	}
	argv = append(argv, s.fenceRetention.Milliseconds())
	return s.fanOut(ctx, timeout, indexes, func(ctx context.Context, i int) ([]int64, error) {
		r, err := s.nodes[i].driver.Eval(ctx, raiseScript, fks, argv)
		n := r.Int
		return []int64{n}, err
	})
}

// refusalWait turns a refusing node's PTTL into the holder's remaining TTL:
// less the drift allowance the holder's Acquire added, at least 1ms, and
// zero (unknown) for a key without TTL.
func (s *Store) refusalWait(pttl int64) time.Duration {
	if pttl < 0 {
		return 0
	}
	d := time.Duration(pttl) * time.Millisecond
	d = time.Duration(float64(d)*(1-s.driftFactor)) - s.driftFixed
	return max(d, time.Millisecond)
}

// undoNodes returns the nodes to release: plain, those that granted, and
// closing, those whose call failed with an unknown outcome, whose attempt
// the release closes (a late arrival of the call then writes nothing).
func (s *Store) undoNodes(granted, failed []reply) (plain, closing []int) {
	for _, r := range granted {
		plain = append(plain, r.node)
	}
	for _, r := range failed {
		if s.mayHaveGranted(r) {
			closing = append(closing, r.node)
		}
	}
	return plain, closing
}

// mayHaveGranted reports whether a failed call may have written: not when
// it never reached the node, was refused by quarantine or by its closed
// attempt, or failed in its script (which checks before it writes).
func (s *Store) mayHaveGranted(r reply) bool {
	if r.err == nil {
		return false
	}
	_, replyErr := s.nodes[r.node].driver.ReplyError(r.err)
	return r.err != nil && !r.unreachable() && !errors.Is(r.err, ErrQuarantined) &&
		!errors.Is(r.err, errClosed) && !replyErr
}

// attemptOf is one Acquire call: its keys, token, attempt and TTL.
type attemptOf struct {
	keys    []string
	token   string
	attempt int64
	ttl     time.Duration
	shared  bool // the attempt of an AcquireShared
}

// settle records the outcome of attempt a: released when it did not grant
// (or was abandoned). It owes the undo (see oweUndo) of the nodes of
// granted (all when released) and of those of failed whose outcome is
// unknown, closing the attempt on the latter, and hands the replies of the
// nodes still flying (true at their index) to a background goroutine that
// owes the undo of each node that granted, unless a granted the lock and
// it is not released as the reply arrives, and of each whose outcome is
// unknown, closing the attempt there. Until a node's reply is in, a
// Release of the token closes the token on it (see endToken).
func (s *Store) settle(a attemptOf, replies <-chan reply, flying []bool, granted, failed []reply, released bool) {
	plainNodes, closing := s.undoNodes(granted, failed)
	if !released {
		plainNodes = nil
	}
	s.oweUndo(a, plainNodes, closing)
	pending := 0
	for _, f := range flying {
		if f {
			pending++
		}
	}
	if pending > 0 && !s.track(1) {
		// Close began: it gives up what the late replies would owe.
		pending = 0
	}
	s.mu.Lock()
	st := s.tokens[a.token]
	if st == nil && pending > 0 {
		// Nothing of the token was in flight before.
		st = &tokenState{}
		s.tokens[a.token] = st
	}
	if st != nil && !released {
		st.granted, st.released = a.attempt, false
	}
	if pending == 0 {
		s.mu.Unlock()
		return
	}
	st.pending += pending
	if st.acquiring == nil {
		st.acquiring = make(map[int]int)
	}
	if st.moved == nil {
		st.moved = make(chan struct{})
	}
	for i, f := range flying {
		if f {
			st.acquiring[i]++
		}
	}
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		for range pending {
			r := <-replies
			granted := r.err == nil && len(r.vals) > 0 && r.vals[0] == 1
			unknown := s.mayHaveGranted(r)
			s.mu.Lock()
			st.pending--
			if st.acquiring[r.node]--; st.acquiring[r.node] == 0 {
				delete(st.acquiring, r.node)
			}
			close(st.moved)
			st.moved = make(chan struct{})
			keep := st.granted == a.attempt && !st.released
			s.dropIdleLocked(a.token, st)
			s.mu.Unlock()
			switch {
			case unknown:
				s.oweUndo(a, nil, []int{r.node})
			case granted && !keep:
				s.oweUndo(a, []int{r.node}, nil)
			}
		}
	}()
}

// dropIdleLocked forgets st once nothing of it is in flight. The caller
// holds s.mu.
func (s *Store) dropIdleLocked(token string, st *tokenState) {
	if st.pending == 0 && st.refreshing == 0 && st.releasing == 0 && len(st.writing) == 0 &&
		len(st.uncertain) == 0 && s.tokens[token] == st {
		delete(s.tokens, token)
	}
}
