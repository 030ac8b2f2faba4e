package reqlock

import (
	"container/heap"
	"sync"
	"time"
)

// expiries watches the validity of every lock that has a context (see
// NewContext), for one Locker, with one timer: when a lock's validity passes
// unrenewed, the lock is lost and its contexts end. Watching a lock costs no
// allocation and no goroutine; the timer's goroutine runs only when a
// validity passes.
//
// Invariants, under mu: locks holds exactly the watched locks, as a min-heap
// by the validity each was last watched with (lifetime.until), each knowing
// its index (lifetime.heapAt); the timer is set for the earliest of them, or
// stopped when none is watched.
type expiries struct {
	mu    sync.Mutex
	locks expiryHeap
	timer *time.Timer // created on first use
	fire  func()      // the timer's function, made once

	// checked, when set by a test, runs in expire between a lock's check
	// and its new watch: the window a renewal or a release may fall in.
	checked func(*Lock)
}

// watch watches l until its validity until passes, or moves its watch there.
func (e *expiries) watch(l *Lock, until time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	lt := &l.life
	if lt.heapAt >= 0 && lt.heapAt < len(e.locks) && e.locks[lt.heapAt] == l {
		lt.until = until
		heap.Fix(&e.locks, lt.heapAt)
	} else {
		lt.until = until
		heap.Push(&e.locks, l)
	}
	e.resetLocked()
}

// unwatch stops watching l; a lock not watched is left alone.
func (e *expiries) unwatch(l *Lock) {
	e.mu.Lock()
	defer e.mu.Unlock()
	lt := &l.life
	if lt.heapAt >= 0 && lt.heapAt < len(e.locks) && e.locks[lt.heapAt] == l {
		heap.Remove(&e.locks, lt.heapAt)
		e.resetLocked()
	}
}

// resetLocked sets the timer for the earliest validity. The caller holds
// e.mu.
func (e *expiries) resetLocked() {
	if len(e.locks) == 0 {
		if e.timer != nil {
			e.timer.Stop()
		}
		return
	}
	d := time.Until(e.locks[0].life.until)
	if e.timer == nil {
		e.fire = e.expire
		e.timer = time.AfterFunc(d, e.fire)
		return
	}
	e.timer.Reset(d)
}

// expire runs on the timer: every lock whose watched validity has passed is
// checked; one that was renewed meanwhile is watched again, the others are
// lost.
func (e *expiries) expire() {
	now := time.Now()
	var due []*Lock
	e.mu.Lock()
	for len(e.locks) > 0 && !now.Before(e.locks[0].life.until) {
		due = append(due, heap.Pop(&e.locks).(*Lock))
	}
	e.resetLocked()
	e.mu.Unlock()
	for _, l := range due {
		if _, valid := l.checkValidity(); valid {
			if e.checked != nil {
				e.checked(l)
			}
			// Re-read under the lock's own mutex: a renewal or a release
			// may come between the check and the watch.
			l.life.rewatch(l)
		}
	}
}

// expiryHeap orders locks by the validity they are watched for.
type expiryHeap []*Lock

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].life.until.Before(h[j].life.until) }

func (h expiryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].life.heapAt = i
	h[j].life.heapAt = j
}

func (h *expiryHeap) Push(x any) {
	l := x.(*Lock)
	l.life.heapAt = len(*h)
	*h = append(*h, l)
}

func (h *expiryHeap) Pop() any {
	old := *h
	n := len(old) - 1
	l := old[n]
	old[n] = nil
	l.life.heapAt = -1
	*h = old[:n]
	return l
}
