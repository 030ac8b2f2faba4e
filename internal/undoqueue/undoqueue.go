// Package undoqueue settles a store's debts in the background: the undo of
// acquires whose callers left, or whose outcome is unknown. The SQL stores
// share it; each says what one try at a debt is.
package undoqueue

import (
	"context"
	"sync"
	"time"
)

// How many debts are tried at once, and the pause after a try that failed,
// from PauseMin doubling to PauseMax.
const (
	Workers  = 2
	PauseMin = 50 * time.Millisecond
	PauseMax = time.Second
)

// Queue settles debts of type D: each is tried by one of at most Workers
// goroutines, again after a pause while tries fail (one pause for all: a
// server that cannot be reached is tried by two calls at a time, not by one
// per debt), until it is settled or the queue is closed.
type Queue[D any] struct {
	settle func(ctx context.Context, d D) bool // one try; true once settled
	limit  time.Duration                       // of each try

	ctx    context.Context // ends when the queue stops
	cancel context.CancelFunc

	mu      sync.Mutex
	queue   []D
	workers int
	pause   time.Duration // before the next try; zero after a success
	closing chan struct{} // closed by Close: each debt gets one more try
	stopped bool
	done    sync.WaitGroup
}

// New returns a Queue whose tries call settle, each bounded by limit.
func New[D any](settle func(context.Context, D) bool, limit time.Duration) *Queue[D] {
	ctx, cancel := context.WithCancel(context.Background())
	return &Queue[D]{settle: settle, limit: limit, ctx: ctx, cancel: cancel, closing: make(chan struct{})}
}

// Add queues d, unless the queue is closing (a store's Close waits for
// every call that can add a debt before it closes the queue).
func (q *Queue[D]) Add(d D) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.stopped || isClosed(q.closing) {
		return
	}
	q.queue = append(q.queue, d)
	if q.workers < Workers {
		q.workers++
		q.done.Add(1)
		go q.work()
	}
}

// work tries the queued debts until the queue is empty.
func (q *Queue[D]) work() {
	defer q.done.Done()
	var zero D
	for {
		q.mu.Lock()
		if len(q.queue) == 0 || q.stopped {
			q.workers--
			q.mu.Unlock()
			return
		}
		d := q.queue[0]
		q.queue[0] = zero
		q.queue = q.queue[1:]
		pause := q.pause
		last := isClosed(q.closing)
		q.mu.Unlock()
		if pause > 0 && !last {
			timer := time.NewTimer(pause)
			select {
			case <-timer.C:
			case <-q.closing:
				timer.Stop()
				last = true
			}
		}
		ctx, cancel := context.WithTimeout(q.ctx, q.limit)
		settled := q.settle(ctx, d)
		cancel()
		q.mu.Lock()
		if settled {
			q.pause = 0
		} else {
			q.pause = min(max(2*q.pause, PauseMin), PauseMax)
			if !last {
				q.queue = append(q.queue, d)
			}
		}
		q.mu.Unlock()
	}
}

// Close gives every queued debt one more try, for drain at most, then
// drops what is left and stops.
func (q *Queue[D]) Close(drain time.Duration) {
	q.mu.Lock()
	close(q.closing)
	q.mu.Unlock()
	idle := make(chan struct{})
	go func() {
		q.done.Wait()
		close(idle)
	}()
	timer := time.NewTimer(drain)
	select {
	case <-idle:
		timer.Stop()
	case <-timer.C:
	}
	q.mu.Lock()
	q.stopped = true
	q.queue = nil
	q.mu.Unlock()
	q.cancel()
	<-idle
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// SettleNow tries to settle d with settle, each try bounded by limit, again
// after a pause (PauseMin doubling to PauseMax) while it fails, until it is
// settled or ctx ends (or, for a ctx that never ends, limit passes), and
// reports whether it was settled. A caller that waits for its debt uses it
// instead of a Queue.
func SettleNow[D any](ctx context.Context, d D, settle func(context.Context, D) bool, limit time.Duration) bool {
	if ctx.Done() == nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, limit)
		defer cancel()
	}
	pause := PauseMin
	for {
		try, cancel := context.WithTimeout(ctx, limit)
		settled := settle(try, d)
		cancel()
		if settled {
			return true
		}
		timer := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			timer.Stop()
			return false
		case <-timer.C:
		}
		pause = min(2*pause, PauseMax)
	}
}
