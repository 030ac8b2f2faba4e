package mysqlstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// Undo of abandoned acquires: how many run at once, and the pause after a
// try that failed, from undoPauseMin doubling to undoPauseMax.
const (
	undoWorkers  = 2
	undoPauseMin = 50 * time.Millisecond
	undoPauseMax = time.Second
)

// debt is an acquire the Store must undo: its caller left, or it may still
// apply, and what it granted, or may grant, must not outlive it.
type debt struct {
	keys  []string
	token string
	ttl   time.Duration

	// sess carried a statement that may still apply; end is true until
	// the session has been seen ended.
	sess session
	end  bool

	// since is when a grant, if any, had been made at the latest: the
	// release is owed until since+ttl, when such a grant has expired.
	since time.Time
}

// undoer settles the Store's debts: each is tried by one of at most
// undoWorkers goroutines, again after a pause while tries fail (one pause
// for all: a server that cannot be reached is tried by two calls at a time,
// not by one per debt), until it is settled or the Store is closed.
type undoer struct {
	settle func(ctx context.Context, d *debt) bool // one try; true once settled
	limit  time.Duration                           // of each try

	ctx    context.Context // ends when the undoer stops
	cancel context.CancelFunc

	mu      sync.Mutex
	queue   []*debt
	workers int
	pause   time.Duration // before the next try; zero after a success
	closing chan struct{} // closed by close: each debt gets one more try
	stopped bool
	done    sync.WaitGroup
}

func newUndoer(settle func(context.Context, *debt) bool, limit time.Duration) *undoer {
	ctx, cancel := context.WithCancel(context.Background())
	return &undoer{settle: settle, limit: limit, ctx: ctx, cancel: cancel, closing: make(chan struct{})}
}

// add queues d, unless the undoer is closing (the Store's Close waits for
// every call that can add a debt before it closes the undoer).
func (u *undoer) add(d *debt) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.stopped || isClosed(u.closing) {
		return
	}
	u.queue = append(u.queue, d)
	if u.workers < undoWorkers {
		u.workers++
		u.done.Add(1)
		go u.work()
	}
}

// pending returns how many debts are queued, for tests.
func (u *undoer) pending() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.queue)
}

// work tries the queued debts until the queue is empty.
func (u *undoer) work() {
	defer u.done.Done()
	for {
		u.mu.Lock()
		if len(u.queue) == 0 || u.stopped {
			u.workers--
			u.mu.Unlock()
			return
		}
		d := u.queue[0]
		u.queue[0] = nil
		u.queue = u.queue[1:]
		pause := u.pause
		last := isClosed(u.closing)
		u.mu.Unlock()
		if pause > 0 && !last {
			timer := time.NewTimer(pause)
			select {
			case <-timer.C:
			case <-u.closing:
				timer.Stop()
				last = true
			}
		}
		ctx, cancel := context.WithTimeout(u.ctx, u.limit)
		settled := u.settle(ctx, d)
		cancel()
		u.mu.Lock()
		if settled {
			u.pause = 0
		} else {
			u.pause = min(max(2*u.pause, undoPauseMin), undoPauseMax)
			if !last {
				u.queue = append(u.queue, d)
			}
		}
		u.mu.Unlock()
	}
}

// close gives every queued debt one more try, for drain at most, then
// drops what is left and stops.
func (u *undoer) close(drain time.Duration) {
	u.mu.Lock()
	close(u.closing)
	u.mu.Unlock()
	idle := make(chan struct{})
	go func() {
		u.done.Wait()
		close(idle)
	}()
	timer := time.NewTimer(drain)
	select {
	case <-idle:
		timer.Stop()
	case <-timer.C:
	}
	u.mu.Lock()
	u.stopped = true
	u.queue = nil
	u.mu.Unlock()
	u.cancel()
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
	err := s.release(ctx, nil, d.keys, d.token, 0)
	return err == nil || errors.Is(err, stores.ErrNotHeld) || errors.Is(err, stores.ErrInvalid)
}
