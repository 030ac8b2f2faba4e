package reqlock

import (
	"sync"
	"time"
)

// localQueues holds, for each key this process is busy with, the request
// that has the key's turn (contending with the store, or holding the lock)
// and the requests queued behind it in arrival order. Only the request with
// the turn talks to the store, so a hot key costs the store one contender
// per process, not one per request.
type localQueues struct {
	mu     sync.Mutex
	queues map[string]*keyQueue
}

// keyQueue is one key's FIFO of waiters. Its fields are guarded by
// localQueues.mu. A keyQueue exists exactly while some request has the
// key's turn; it is dropped when the turn is passed to nobody.
//
// gen numbers the turns: a request acts on the queue only while it holds the
// current turn. leaseEnd is the end of the current holder's lease (zero
// while the turn's owner is still contending): once it passes unreleased (a
// leaked Lock, or a holder stuck past its TTL), the head waiter takes the
// turn, so a lock nobody releases blocks local waiters no longer than it
// blocks other processes.
type keyQueue struct {
	key        string
	head, tail *waiter
	gen        uint64
	leaseEnd   time.Time
}

// waiter is a request queued for a key's turn.
type waiter struct {
	turn       chan turn // buffer 1; written once, under localQueues.mu
	prev, next *waiter
	queued     bool
}

// turn gives a waiter the key: with a still-held grant (a local handoff),
// or, when handoff is nil, the right to contend with the store. gen is the
// turn's number in its keyQueue.
type turn struct {
	handoff *handoff
	gen     uint64
	// yield, on a turn to contend, is how long to hold back first: the
	// previous holder's chain was cut by its handoff bounds while this
	// process still had waiters, so other processes get a head start.
	yield time.Duration
	// afterHold, on a turn to contend, says the turn comes after a holder
	// (a release, or a lease that ran out): the waiter has seen the key held.
	afterHold bool
}

// handoff passes a held lock to the next local waiter.
type handoff struct {
	chain      *chain
	fence      int64
	validUntil time.Time
}

// chain is one store grant, handed from local holder to local holder. Only
// its current holder touches it; handing it over through a channel orders
// the accesses.
type chain struct {
	storeKey  string
	token     string
	baseFence int64 // the fence the store issued
	lastFence int64 // the highest fence issued under this grant
	started   time.Time
	handoffs  int
}

func newLocalQueues() *localQueues {
	return &localQueues{queues: make(map[string]*keyQueue)}
}

// join gives the caller key's turn at once (w is nil, gen its number) or
// queues it behind the request that has it (w is not nil). With queue false
// (a try-once caller) it never queues: busy reports that another local
// request has the turn.
func (lq *localQueues) join(key string, queue bool) (q *keyQueue, w *waiter, gen uint64, busy bool) {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	q = lq.queues[key]
	if q == nil {
		q = &keyQueue{key: key, gen: 1}
		lq.queues[key] = q
		return q, nil, q.gen, false
	}
	if !queue {
		if q.leaseEnd.IsZero() || time.Now().Before(q.leaseEnd) {
			return nil, nil, 0, true
		}
		// The holder's lease ended unreleased: take the turn, as a head
		// waiter would (checkLease). Queued waiters get it back by pass.
		q.gen++
		q.leaseEnd = time.Time{}
		return q, nil, q.gen, false
	}
	w = &waiter{turn: make(chan turn, 1)}
	q.push(w)
	return q, w, 0, false
}

// checkLease lets w take the turn when w heads the queue and the holder's
// lease ended unreleased. Otherwise it returns how long until w should check
// again: the lease's end when w is the head, else poll.
func (lq *localQueues) checkLease(q *keyQueue, w *waiter, poll time.Duration) (t turn, took bool, next time.Duration) {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	if !w.queued || q.head != w || q.leaseEnd.IsZero() {
		return turn{}, false, poll
	}
	if left := time.Until(q.leaseEnd); left > 0 {
		return turn{}, false, min(left, poll)
	}
	q.remove(w)
	q.gen++
	q.leaseEnd = time.Time{}
	return turn{gen: q.gen, afterHold: true}, true, 0
}

// setLease records the lease of the holder of turn gen, if it still has it.
func (lq *localQueues) setLease(q *keyQueue, gen uint64, end time.Time) {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	if q.gen == gen {
		q.leaseEnd = end
	}
}

// leave takes a waiter whose wait ended out of q. It reports false when the
// waiter had already been given the turn, which the caller must then take
// from w.turn and pass on.
func (lq *localQueues) leave(q *keyQueue, w *waiter) bool {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	if !w.queued {
		return false
	}
	q.remove(w)
	return true
}

// pass gives the key's turn, which gen must still be, to the next waiter as
// a turn to contend after yield, or drops q when nobody waits.
//
// The turn is marked afterHold when turn gen held the key (its lease was
// set) or afterHold says so.
func (lq *localQueues) pass(q *keyQueue, gen uint64, yield time.Duration, afterHold bool) {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	if q.gen != gen {
		return // a waiter took the turn when this holder's lease ended
	}
	afterHold = afterHold || !q.leaseEnd.IsZero()
	q.gen++
	q.leaseEnd = time.Time{}
	if w := q.pop(); w != nil {
		w.turn <- turn{gen: q.gen, yield: yield, afterHold: afterHold}
		return
	}
	delete(lq.queues, q.key)
}

// handOff gives the next waiter the held lock when turn gen is still
// current, a waiter waits and allow (called under the lock, so no waiter can
// arrive or leave meanwhile) says the chain may grow. It reports whether the
// lock was handed off, and whether waiters were left without it.
func (lq *localQueues) handOff(q *keyQueue, gen uint64, allow func() (handoff, bool)) (handed, waiting bool) {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	if q.gen != gen || q.head == nil {
		return false, false
	}
	h, ok := allow()
	if !ok {
		return false, true
	}
	q.gen++
	q.leaseEnd = h.validUntil
	q.pop().turn <- turn{handoff: &h, gen: q.gen}
	return true, false
}

// len reports how many keys have a local queue, for tests.
func (lq *localQueues) len() int {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	return len(lq.queues)
}

func (q *keyQueue) push(w *waiter) {
	w.queued = true
	w.prev = q.tail
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
}

func (q *keyQueue) pop() *waiter {
	w := q.head
	if w != nil {
		q.remove(w)
	}
	return w
}

func (q *keyQueue) remove(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.prev, w.next, w.queued = nil, nil, false
}
