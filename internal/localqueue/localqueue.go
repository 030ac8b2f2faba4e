// Package localqueue orders the requests of one process that want the same
// key: the first has the key's turn (it contends with the store, then holds
// the lock), the others wait behind it in arrival order, and each turn passes
// to the next waiter, with the held grant itself (a handoff) or as the right
// to contend.
//
// Invariants, kept by this file alone (every field is guarded by
// Queues.mu, and no other package can reach them):
//   - A key has a queue exactly while some request has its turn.
//   - gen numbers the turns of a key; a Turn acts on its queue only while its
//     gen is current, so a turn that was taken over or passed on is inert.
//   - holder is set only while the turn's owner holds the key (Hold), and is
//     cleared whenever the turn moves on.
//   - A waiter is given at most one turn, through its channel, under the
//     mutex, at the moment it is unlinked from the queue.
//   - When the holder's validity has run out unreleased (a leaked lock, or a
//     holder stuck past its lease), the head waiter, or a try-once caller,
//     takes the turn: a lock nobody releases blocks local waiters no longer
//     than it blocks other processes.
//   - contention lives as long as the queue: what the key's contenders
//     learnt of other owners (see Contention).
//   - seenHeld reports that the key was seen held since the current turn
//     began (a holder, a handoff, a turn passed after a holder, a refusal):
//     a waiter whose wait ends in the queue learns it (Join). A turn passed
//     after a release the store confirmed (PassFreed) begins with the key
//     free: freedAt is when its store call may begin, and a waiter whose
//     wait ends in the queue counts the key seen held as SeenHeld says.
//   - A turn passed with PassFailed carries the store error its owner met:
//     each next waiter answers it at once and passes it on, so that the
//     whole queue learns of the failure together.
package localqueue

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrBusy is Join's answer to a caller that will not wait when another
// request of the process has the key's turn.
var ErrBusy = errors.New("localqueue: another local request has the key")

// Holder is what holds a key's turn while its owner holds the lock.
type Holder interface {
	// ValidUntil is when the holder's lock surely lapses unless renewed.
	ValidUntil() time.Time
}

// Queues holds the queues of every key this process is busy with. The zero
// value is not usable; call New.
type Queues struct {
	mu     sync.Mutex
	queues map[string]*queue
}

type queue struct {
	key        string
	head, tail *waiter
	gen        uint64
	holder     Holder
	seenHeld   bool
	freedAt    time.Time // see PassFreed; zero unless the turn began with the key free
	contention Contention
}

// FreedGrace is the least time a store call after a release the store
// confirmed must stay unanswered before a wait that ends then is the
// store's silence rather than a timeout behind the holder (see SeenHeld).
const FreedGrace = 50 * time.Millisecond

// SeenHeld reports whether a wait that began at joined and ends at now,
// spent behind a holder until a release the store confirmed at freedAt and
// then behind a store call the store left unanswered, counts as a wait on
// a held key: unless the store's silence lasted longer than both the time
// behind the holder and FreedGrace, it does (a healthy store answers well
// within either).
func SeenHeld(joined, freedAt, now time.Time) bool {
	return now.Sub(freedAt) < max(freedAt.Sub(joined), FreedGrace)
}

type waiter struct {
	turn       chan Turn // buffer 1; written once, under Queues.mu
	joined     time.Time
	prev, next *waiter
	queued     bool
	handoff    bool // takes a held grant (a request for this key alone)
}

// Turn is one request's turn on a key. Its zero value is no turn.
type Turn struct {
	qs  *Queues
	q   *queue
	gen uint64

	// Handoff is the held grant the previous holder passed on, or nil for
	// a turn to contend with the store.
	Handoff Holder
	// Yield, on a turn to contend, is how long to hold back first: the
	// previous holder's grant went back to the store while this process
	// still had waiters, and other processes get a head start.
	Yield time.Duration
	// Courtesy reports that Yield is long enough for other owners that
	// poll to find the key free (see PassCourtesy).
	Courtesy bool
	// AfterHeld reports that the turn comes after a holder, or after a
	// contender that saw the key held: the key has been seen held. On a
	// turn Join returns with ctx's error, it reports whether the key was
	// seen held while the caller waited.
	AfterHeld bool
	// FreedAt, on a turn that follows a release the store confirmed
	// (PassFreed), is when the key was free and the owner's store call may
	// begin (after Yield); zero otherwise. The key then counts as seen
	// held for that call only as SeenHeld says, although AfterHeld (for a
	// wait that ends before it) is set.
	FreedAt time.Time
	// Failed is the store error of the request ahead (PassFailed): the
	// turn's owner answers it without a store call, and passes it on.
	Failed error
}

// New returns an empty set of queues.
func New() *Queues { return &Queues{queues: make(map[string]*queue)} }

// Join gives the caller key's turn. When nobody has it, Join returns it at
// once. Otherwise, with wait, the caller queues and Join blocks until the
// turn comes or ctx ends; it then returns ctx.Err(), and, when the turn came
// as ctx ended, that turn too, which the caller must give up (Pass, or its
// Handoff released); else a turn that is no turn (its methods do nothing)
// whose AfterHeld reports whether the key was seen held meanwhile. Without wait it returns ErrBusy instead of queueing.
// A waiter at the head of the queue checks the holder's validity at least
// every poll. handoff says the caller takes a held grant of the key alone
// (HandOff); a request for several keys does not, and gets a turn to
// contend instead.
func (qs *Queues) Join(ctx context.Context, key string, wait bool, poll time.Duration, handoff bool) (Turn, error) {
	qs.mu.Lock()
	q := qs.queues[key]
	if q == nil {
		now := time.Now()
		q = &queue{key: key, gen: 1, contention: Contention{CourtesyAt: now, TurnAt: now}}
		qs.queues[key] = q
		qs.mu.Unlock()
		return Turn{qs: qs, q: q, gen: q.gen}, nil
	}
	if !wait {
		defer qs.mu.Unlock()
		if t, ok := qs.takeLapsedLocked(q); ok {
			return t, nil
		}
		return Turn{}, ErrBusy
	}
	w := &waiter{turn: make(chan Turn, 1), handoff: handoff, joined: time.Now()}
	q.push(w)
	qs.mu.Unlock()

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		qs.mu.Lock()
		next := poll
		if w.queued && q.head == w && q.holder != nil {
			if left := time.Until(q.holder.ValidUntil()); left > 0 {
				next = min(left, poll)
			} else {
				q.remove(w)
				t, _ := qs.takeLapsedLocked(q)
				qs.mu.Unlock()
				return t, nil
			}
		}
		qs.mu.Unlock()
		timer.Reset(next)
		select {
		case t := <-w.turn:
			return t, nil
		case <-ctx.Done():
			qs.mu.Lock()
			queued := w.queued
			seen := q.seenHeld || q.holder != nil ||
				(!q.freedAt.IsZero() && SeenHeld(w.joined, q.freedAt, time.Now()))
			if queued {
				q.remove(w)
			}
			qs.mu.Unlock()
			if queued {
				return Turn{AfterHeld: seen}, ctx.Err()
			}
			return <-w.turn, ctx.Err() // the turn came as the wait ended
		case <-timer.C:
		}
	}
}

// takeLapsedLocked takes q's turn when its holder's validity has run out.
// The caller holds qs.mu.
func (qs *Queues) takeLapsedLocked(q *queue) (Turn, bool) {
	if q.holder == nil || time.Now().Before(q.holder.ValidUntil()) {
		return Turn{}, false
	}
	q.gen++
	q.holder = nil
	q.seenHeld = true
	return Turn{qs: qs, q: q, gen: q.gen, AfterHeld: true}, true
}

// Hold records that the turn's owner now holds the key, as h.
func (t Turn) Hold(h Holder) {
	if t.q == nil {
		return
	}
	t.qs.mu.Lock()
	defer t.qs.mu.Unlock()
	if t.q.gen == t.gen {
		t.q.holder = h
		t.q.seenHeld = true
	}
}

// Pass gives the turn, if it is still current, to the next waiter as a turn
// to contend after yield, or drops the queue when nobody waits. The next
// turn is AfterHeld when afterHeld says so or this turn held the key.
func (t Turn) Pass(yield time.Duration, afterHeld bool) {
	t.pass(passing{yield: yield, afterHeld: afterHeld})
}

// PassFreed is Pass for a holder whose release the store confirmed (the
// key is free): the next turn is AfterHeld, for a wait that ends before
// its store call, and has FreedAt; a courtesy as PassCourtesy's.
func (t Turn) PassFreed(yield time.Duration, courtesy bool) {
	t.pass(passing{yield: yield, afterHeld: true, courtesy: courtesy, freed: true})
}

// PassFailed gives the turn, if it is still current, to the next waiter
// with err, the store error its owner met on the key (see Turn.Failed), or
// drops the queue when nobody waits.
func (t Turn) PassFailed(err error) {
	t.pass(passing{failed: err})
}

// PassCourtesy is Pass for a holder that lets go of the key while other
// owners are known, or may be, waiting for it: the next turn is a Courtesy,
// and the queue records that it held back now (see Contention).
func (t Turn) PassCourtesy(yield time.Duration) {
	t.pass(passing{yield: yield, afterHeld: true, courtesy: true})
}

// passing is how a turn passes on.
type passing struct {
	yield                      time.Duration
	afterHeld, courtesy, freed bool
	failed                     error
}

func (t Turn) pass(p passing) {
	if t.q == nil {
		return
	}
	t.qs.mu.Lock()
	defer t.qs.mu.Unlock()
	q := t.q
	if q.gen != t.gen {
		return // taken over when the holder's validity ran out
	}
	afterHeld := p.failed == nil && (p.afterHeld || q.holder != nil)
	freed := p.failed == nil && p.freed
	q.gen++
	q.holder = nil
	q.seenHeld = afterHeld && !freed
	q.freedAt = time.Time{}
	if freed {
		q.freedAt = time.Now().Add(p.yield)
	}
	if p.courtesy {
		q.contention.CourtesyAt = time.Now()
	}
	if w := q.pop(); w != nil {
		w.turn <- Turn{qs: t.qs, q: q, gen: q.gen, Yield: p.yield, Courtesy: p.courtesy, AfterHeld: afterHeld,
			FreedAt: q.freedAt, Failed: p.failed}
		return
	}
	delete(t.qs.queues, q.key)
}

// Contention is what a key's queue knows of other owners of the key
// (other processes, other Lockers).
type Contention struct {
	// RefusedAt is when the store last refused the key to the queue's
	// contender (see Refused); zero if never.
	RefusedAt time.Time
	// CourtesyAt is when the queue last held back for other owners
	// (PassCourtesy), or was made.
	CourtesyAt time.Time
	// TurnAt is when the queue's turn on the key began: when a contender
	// was last granted it after a refusal or a courtesy (see TurnBegan),
	// or the queue was made.
	TurnAt time.Time
}

// Contention returns what the key's queue knows of other owners.
func (t Turn) Contention() Contention {
	if t.q == nil {
		return Contention{}
	}
	t.qs.mu.Lock()
	defer t.qs.mu.Unlock()
	return t.q.contention
}

// Refused records that the store refused the key to this queue's
// contender: another owner wants it. A turn that was passed on still
// records it: the queue is the key's.
func (t Turn) Refused() {
	if t.q == nil {
		return
	}
	t.qs.mu.Lock()
	t.q.contention.RefusedAt = time.Now()
	if t.q.gen == t.gen {
		t.q.seenHeld = true
	}
	t.qs.mu.Unlock()
}

// WaitsElsewhere records that the turn's owner, a request for several
// keys, goes on to wait for another key's turn: until the turn moves on,
// the key counts as seen held for its waiters whose wait ends in the queue,
// whatever freed it before (see PassFreed).
func (t Turn) WaitsElsewhere() {
	if t.q == nil {
		return
	}
	t.qs.mu.Lock()
	if t.q.gen == t.gen {
		t.q.seenHeld = true
	}
	t.qs.mu.Unlock()
}

// TurnBegan records that the store granted the key to this queue's
// contender after it was refused it or held back for other owners: the
// process's turn on the key begins.
func (t Turn) TurnBegan() {
	if t.q == nil {
		return
	}
	t.qs.mu.Lock()
	t.q.contention.TurnAt = time.Now()
	t.qs.mu.Unlock()
}

// HandOff passes the held key to the next waiter, when the turn is still
// current, the next waiter takes handoffs and offer (called under the
// queues' mutex, so no waiter comes or goes meanwhile) returns the holder
// to pass and true. It reports whether the key was handed on, and whether
// waiters were left without it.
func (t Turn) HandOff(offer func() (Holder, bool)) (handed, waiting bool) {
	if t.q == nil {
		return false, false // no turn: several keys have no local queue
	}
	t.qs.mu.Lock()
	defer t.qs.mu.Unlock()
	q := t.q
	if q.gen != t.gen || q.head == nil {
		return false, false
	}
	if !q.head.handoff {
		return false, true
	}
	h, ok := offer()
	if !ok {
		return false, true
	}
	q.gen++
	q.holder = h
	q.pop().turn <- Turn{qs: t.qs, q: q, gen: q.gen, Handoff: h, AfterHeld: true}
	return true, false
}

// Len reports how many keys have a queue.
func (qs *Queues) Len() int {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	return len(qs.queues)
}

// Waiters reports how many requests wait for key's turn.
func (qs *Queues) Waiters(key string) int {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	n := 0
	if q := qs.queues[key]; q != nil {
		for w := q.head; w != nil; w = w.next {
			n++
		}
	}
	return n
}

func (q *queue) push(w *waiter) {
	w.queued = true
	w.prev = q.tail
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
}

func (q *queue) pop() *waiter {
	w := q.head
	if w != nil {
		q.remove(w)
	}
	return w
}

func (q *queue) remove(w *waiter) {
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
