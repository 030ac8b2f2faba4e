package redlockstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// The owed clean-up (see Clean-up in the package documentation). A debt
// is what the Store owes for keys of a token: per node, one release that
// merges every release owed there. Each node has a queue of the debts that
// owe it a call not in flight. A call is sent as soon as it is due and its
// node's limit allows (dispatchLocked), each in a goroutine of its own
// (pay), which records the outcome, queues the debt again when the call
// failed or more was owed meanwhile, and sends what is due next. The
// janitor, one goroutine that runs only while calls wait for a node's
// backoff to end, sends them then.

// Bounds of the owed clean-up.
const (
	minCleanupBackoff  = 10 * time.Millisecond
	maxCleanupBackoff  = time.Second
	cleanupConcurrency = 64       // calls in flight per node that answers
	maxDebts           = 1 << 14  // debts held at once
	maxDebtBytes       = 64 << 20 // their keys and tokens together
	debtOverhead       = 256      // bytes a debt counts besides its keys and token
)

// owedCall is a release owed on one node.
type owedCall struct {
	upTo     int64         // the last attempt of the token released
	close    int64         // the attempt its tombstone closes (0: none)
	closeTTL time.Duration // how long the tombstone lasts
	keepTill time.Time     // zero: delete the keys; else keep them until then
	version  int           // counts the merges, so that a call in flight pays only what it carried
	queued   bool          // in its node's queue
	busy     bool          // a call of it is in flight
}

// merge adds o's release to c's.
func (c *owedCall) merge(o owedCall) {
	c.upTo, c.close, c.closeTTL = max(c.upTo, o.upTo), max(c.close, o.close), max(c.closeTTL, o.closeTTL)
	if o.keepTill.After(c.keepTill) {
		c.keepTill = o.keepTill
	}
	c.version++
}

// debt is what the Store owes for keys of token, per node.
type debt struct {
	keys   []string
	token  string
	shared bool      // releases the token's shared place (see AcquireShared)
	until  time.Time // after it, nothing it releases can still hold the keys
	calls  map[int]*owedCall
	size   int
	gone   bool // paid or given up: its entries in the queues are stale
}

// nodeCleanup is a node's share of the owed clean-up, guarded by Store.mu.
type nodeCleanup struct {
	queue    []*debt // debts that owe the node a call not in flight
	inflight int
	next     time.Time     // no call before it (backoff)
	backoff  time.Duration // zero while the node answers
	gen      uint64        // bumped with backoff: one failure counts once
	owed     int           // calls owed to the node
	givenUp  uint64
}

// limit is how many calls the node may have in flight.
func (c *nodeCleanup) limit() int {
	if c.backoff > 0 {
		return 1
	}
	return cleanupConcurrency
}

// oweUndo owes the undo of attempt a on the nodes of plain (where it
// granted) and of closing (where its outcome is unknown; their release
// closes the attempt).
func (s *Store) oweUndo(a attemptOf, plain, closing []int) {
	if len(plain)+len(closing) == 0 {
		return
	}
	calls := make(map[int]owedCall, len(plain)+len(closing))
	for _, i := range plain {
		calls[i] = owedCall{upTo: a.attempt}
	}
	for _, i := range closing {
		calls[i] = owedCall{upTo: a.attempt, close: a.attempt, closeTTL: s.tombstoneTTL()}
	}
	s.owe(a.keys, a.token, a.shared, time.Now().Add(a.ttl+2*s.drift(a.ttl)), calls)
}

// owe records calls as owed releases of keys by token (of its shared place
// when shared), until until, and wakes the janitor.
func (s *Store) owe(keys []string, token string, shared bool, until time.Time, calls map[int]owedCall) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		for i := range calls {
			s.nodes[i].clean.givenUp++
		}
		return
	}
	var d *debt
	for _, o := range s.debts[token] {
		if o.shared == shared && slices.Equal(o.keys, keys) {
			d = o
			break
		}
	}
	if d == nil {
		size := debtOverhead + len(token)
		for _, k := range keys {
			size += len(k)
		}
		if !s.roomLocked(size) {
			for i := range calls {
				s.nodes[i].clean.givenUp++
			}
			return
		}
		d = &debt{keys: slices.Clone(keys), token: token, shared: shared, calls: make(map[int]*owedCall, len(calls)), size: size}
		s.debts[token] = append(s.debts[token], d)
		s.debtCount++
		s.debtBytes += size
	}
	if until.After(d.until) {
		d.until = until
	}
	for i, c := range calls {
		oc := d.calls[i]
		if oc == nil {
			oc = &owedCall{}
			d.calls[i] = oc
			s.nodes[i].clean.owed++
		}
		oc.merge(c)
		if !oc.queued && !oc.busy {
			oc.queued = true
			s.nodes[i].clean.queue = append(s.nodes[i].clean.queue, d)
		}
	}
	s.dispatchAllLocked()
}

// roomLocked reports whether a new debt of size bytes fits, after giving up
// the expired debts when it does not (at most every 100ms: the sweep reads
// every debt). The caller holds s.mu.
func (s *Store) roomLocked(size int) bool {
	fits := func() bool { return s.debtCount < maxDebts && s.debtBytes+size <= maxDebtBytes }
	if fits() {
		return true
	}
	if now := time.Now(); now.After(s.nextSweep) {
		s.nextSweep = now.Add(100 * time.Millisecond)
		for _, ds := range s.debts {
			for _, d := range slices.Clone(ds) { // forgetDebtLocked edits ds
				if now.After(d.until) {
					s.forgetDebtLocked(d)
				}
			}
		}
		for _, n := range s.nodes {
			n.clean.queue = slices.DeleteFunc(n.clean.queue, func(d *debt) bool { return d.gone })
		}
	}
	return fits()
}

// forgetCallLocked forgets d's call to node i, paid or given up, and d once
// it owes nothing. The caller holds s.mu.
func (s *Store) forgetCallLocked(d *debt, i int, givenUp bool) {
	if _, ok := d.calls[i]; !ok {
		return
	}
	delete(d.calls, i)
	c := &s.nodes[i].clean
	c.owed--
	if givenUp {
		c.givenUp++
	}
	if len(d.calls) == 0 {
		s.forgetDebtLocked(d)
	}
}

// forgetDebtLocked forgets d, giving up what it still owes. The caller holds
// s.mu.
func (s *Store) forgetDebtLocked(d *debt) {
	if d.gone {
		return
	}
	for i := range d.calls {
		c := &s.nodes[i].clean
		c.owed--
		c.givenUp++
	}
	d.calls, d.gone = nil, true
	s.debtCount--
	s.debtBytes -= d.size
	ds := slices.DeleteFunc(s.debts[d.token], func(o *debt) bool { return o == d })
	if len(ds) == 0 {
		delete(s.debts, d.token)
	} else {
		s.debts[d.token] = ds
	}
}

// dispatchLocked sends node i's owed calls that are due, as many as its
// limit allows, and reports how long until the next is due when one waits
// for the node's backoff (ok false when none does: a call in flight that
// ends dispatches the rest). The caller holds s.mu.
func (s *Store) dispatchLocked(now time.Time, i int) (wait time.Duration, ok bool) {
	c := &s.nodes[i].clean
	limit := c.limit()
	if s.skipped(i) {
		limit = 1 // as in backoff: its calls time out
	}
	for len(c.queue) > 0 && c.inflight < limit && !now.Before(c.next) {
		d := c.queue[0]
		c.queue[0] = nil
		c.queue = c.queue[1:]
		oc := d.calls[i]
		if d.gone || oc == nil || !oc.queued {
			continue
		}
		oc.queued = false
		if now.After(d.until) {
			s.forgetCallLocked(d, i, true)
			continue
		}
		oc.busy = true
		c.inflight++
		call, gen := *oc, c.gen
		s.wg.Add(1)
		go s.pay(d, i, call, gen)
	}
	if len(c.queue) == 0 || c.inflight >= limit {
		return 0, false
	}
	return c.next.Sub(now), true
}

// dispatchAllLocked dispatches every node's due calls (see dispatchLocked),
// and starts the janitor, or wakes it, when a call waits for a backoff.
// The caller holds s.mu.
func (s *Store) dispatchAllLocked() {
	waiting := s.closed // the janitor gives up the debts
	if !s.closed {
		now := time.Now()
		for i := range s.nodes {
			if _, ok := s.dispatchLocked(now, i); ok {
				waiting = true
			}
		}
	}
	if !waiting {
		return
	}
	if !s.janitorOn {
		s.janitorOn = true
		s.wg.Add(1)
		go s.janitor()
		return
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// janitor dispatches the calls that wait for a node's backoff when it
// ends, and returns once none waits, or the Store closes (giving up every
// debt).
func (s *Store) janitor() {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		if s.closed {
			for _, ds := range s.debts {
				for _, d := range slices.Clone(ds) {
					s.forgetDebtLocked(d)
				}
			}
			for _, n := range s.nodes {
				n.clean.queue = nil
			}
			s.janitorOn = false
			s.mu.Unlock()
			return
		}
		now := time.Now()
		wait := time.Duration(-1)
		for i := range s.nodes {
			if d, ok := s.dispatchLocked(now, i); ok && (wait < 0 || d < wait) {
				wait = d
			}
		}
		if wait < 0 {
			s.janitorOn = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		timer.Reset(wait)
		select {
		case <-s.wake:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// pay sends the owed call c of d to node i, and records its outcome: paid,
// or due again after the node's backoff, which a failure of a call sent
// since the last change of the backoff (gen) doubles.
func (s *Store) pay(d *debt, i int, c owedCall, gen uint64) {
	defer s.wg.Done()
	var keepMS int64
	if !c.keepTill.IsZero() {
		if left := time.Until(c.keepTill); left > 0 {
			keepMS = milliseconds(left)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.nodeTimeout)
	start := time.Now()
	s.nodes[i].calls.Add(1)
	vals, err := s.eval(ctx, i, releaseScript, d.keys, d.token, keepMS, 1, c.close,
		milliseconds(c.closeTTL), c.upTo, flag(d.shared))
	err, _ = unmark(err)
	took := time.Since(start)
	cancel()
	if err == nil && len(vals) != len(d.keys) {
		err = fmt.Errorf("%w: release %s answered %v", ErrUnexpectedReply, keysForMessage(d.keys), vals)
	}
	s.count(i, err)
	s.health(i, err, took, s.nodeTimeout)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := &s.nodes[i].clean
	n.inflight--
	switch {
	case err == nil && n.backoff > 0:
		n.backoff, n.next = 0, time.Time{}
		n.gen++
	case err != nil && gen == n.gen:
		n.backoff = min(max(2*n.backoff, minCleanupBackoff), maxCleanupBackoff)
		n.next = time.Now().Add(n.backoff/2 + rand.N(n.backoff/2+1))
		n.gen++
	}
	if oc := d.calls[i]; oc != nil && !d.gone {
		oc.busy = false
		if err == nil && oc.version == c.version {
			s.forgetCallLocked(d, i, false)
		} else {
			// Failed, or merged with more since it was sent.
			oc.queued = true
			n.queue = append(n.queue, d)
		}
	}
	s.dispatchAllLocked()
}
