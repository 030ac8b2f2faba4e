package etcdstore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Pauses between the tries of the undo queue while etcd answers them with
// failures.
const (
	undoPauseMin = 50 * time.Millisecond
	undoPauseMax = time.Second
)

// undoPatience is how long the undo queue sends tries that wait the attempt
// bound alone while etcd answers none, about an election's length; then a
// try's bound doubles with each unanswered one.
const undoPatience = 2 * time.Second

// undoTxnOps is how many operations an undo transaction takes at first:
// etcd's default --max-txn-ops (128) less the two comparisons of a nested
// owner check, which etcd counts against what its parent leaves. A cluster
// with a lower limit refuses it, and the queue halves it.
const undoTxnOps = 126

// pendingUndo is the undo of one abandoned acquire: the abandon marks of
// its token on the leases it used, then the owner-checked deletes of what
// it may have set. The marks go before the deletes (in the same
// transaction or an earlier one), so that a late copy of the acquire
// either lands before the deletes, which end it, or after the marks, which
// refuse it (see Store.abandonedKey).
type pendingUndo struct {
	token  string
	leases []clientv3.LeaseID // of the flight, which etcd may still know
	marks  []clientv3.LeaseID // still without their mark
	keys   []string           // holder keys (or shared holder keys) still to delete if they hold token
	queue  string             // the queue key still to delete (fair), or ""
	done   bool               // landed, or every lease gone
	// release: the undo is a Release whose caller left beyond
	// maxBackgroundReleases (keys only, no lease): it ends when it landed.
	release bool
}

// undoQueue undoes the Store's abandoned acquires (and sends the releases
// that goOn hands it) on one goroutine, which
// runs while some are pending: it puts as many of their operations in one
// transaction as etcd takes (undoTxnOps, and the request size), and while
// etcd does not answer it tries again after a pause that doubles up to a
// second. An undo ends only when its operations have landed, or when etcd
// reports every lease of its acquire gone (revoked by Close, say), after
// which nothing the acquire sent can hold a key: never on the local clock,
// since etcd extends every lease at a leader change.
type undoQueue struct {
	s *Store

	mu       sync.Mutex
	pending  []*pendingUndo
	running  bool
	maxOps   int // of one transaction
	maxBytes int // of one request, estimated as checkKeys does
	idle     chan struct{}
	kick     chan struct{} // wakes the worker from its pause
	wg       sync.WaitGroup
}

func newUndoQueue(s *Store) *undoQueue {
	return &undoQueue{s: s, maxOps: undoTxnOps, maxBytes: s.maxRequest - requestReserve,
		idle: make(chan struct{}), kick: make(chan struct{}, 1)}
}

// newUndo returns the undo of an acquire of keys by token that used the
// leases of fl, and queued token (when fair); nil when it sent nothing.
func (s *Store) newUndo(keys []string, token string, fair bool, fl *flight) *pendingUndo {
	if len(fl.leases) == 0 {
		return nil
	}
	u := &pendingUndo{token: token, leases: slices.Clone(fl.leases), marks: slices.Clone(fl.leases)}
	for _, k := range keys {
		u.keys = append(u.keys, holderKey(s.dir(k)))
	}
	if fair {
		u.queue = queueDir(s.dir(keys[0])) + token
	}
	return u
}

// newSharedUndo returns the undo of an AcquireShared by token that used
// the leases of fl and sent places: the owner-checked deletes of those
// places; nil when it sent nothing.
func newSharedUndo(token string, places []string, fl *flight) *pendingUndo {
	if len(fl.leases) == 0 {
		return nil
	}
	return &pendingUndo{token: token, leases: slices.Clone(fl.leases), marks: slices.Clone(fl.leases),
		keys: slices.Clone(places)}
}

// releaseUndo returns the owner-checked deletes of a Release of keys by
// token (keep 0) that goOn gave up.
func (s *Store) releaseUndo(keys []string, token string) *pendingUndo {
	u := &pendingUndo{token: token, release: true}
	for _, k := range keys {
		u.keys = append(u.keys, holderKey(s.dir(k)))
	}
	return u
}

// add queues u, and starts the worker unless it runs.
func (q *undoQueue) add(u *pendingUndo) {
	if u == nil {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.pending = append(q.pending, u)
	if !q.running {
		q.running = true
		q.idle = make(chan struct{})
		q.wg.Add(1)
		go q.run(q.s.bg)
	}
}

// len returns how many undos are pending.
func (q *undoQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending)
}

// wakeUp ends the worker's pause, if it pauses.
func (q *undoQueue) wakeUp() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// leasesGone tells the queue that etcd no longer knows ids: the undos
// whose every lease is among them are over.
func (q *undoQueue) leasesGone(ids []clientv3.LeaseID) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, u := range q.pending {
		if u.release {
			continue // its keys' leases are unknown
		}
		u.leases = slices.DeleteFunc(u.leases, func(id clientv3.LeaseID) bool { return slices.Contains(ids, id) })
		if len(u.leases) == 0 {
			u.done = true
		}
	}
	q.compactLocked()
}

func (q *undoQueue) compactLocked() {
	q.pending = slices.DeleteFunc(q.pending, func(u *pendingUndo) bool { return u.done })
}

// finish waits until no undo is pending or ctx ends, then stops the worker
// and returns how many undos are left.
func (q *undoQueue) finish(ctx context.Context, stop context.CancelFunc) int {
	q.mu.Lock()
	idle := q.idle
	running := q.running
	q.mu.Unlock()
	if running {
		q.wakeUp()
		select {
		case <-idle:
		case <-ctx.Done():
		}
	}
	stop()
	q.wg.Wait()
	return q.len()
}

// batchItem is what one transaction takes of an undo: its first marks,
// keys, and its queue key or not.
type batchItem struct {
	u            *pendingUndo
	marks, keys  int
	queue        bool
	markedLeases []clientv3.LeaseID
}

// take returns the operations of the next transaction, from the undos in
// the order they came, and what it takes of each.
func (q *undoQueue) take() ([]clientv3.Op, []batchItem) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var ops []clientv3.Op
	var items []batchItem
	bytes := 0
	marked := map[string]bool{} // etcd refuses a key put twice in one transaction
	fits := func(size int) bool {
		if len(ops) == 0 || (len(ops) < q.maxOps && bytes+size <= q.maxBytes) {
			bytes += size
			return true
		}
		return false
	}
	for _, u := range q.pending {
		it := batchItem{u: u}
		full := false
		for _, id := range u.marks {
			if !slices.Contains(u.leases, id) {
				it.marks++ // gone: no mark needed
				continue
			}
			k := q.s.abandonedKey(u.token, id)
			if !marked[k] {
				if !fits(len(k) + opOverhead) {
					full = true
					break
				}
				marked[k] = true
				ops = append(ops, clientv3.OpPut(k, "", clientv3.WithLease(id)))
			}
			it.marks++
			it.markedLeases = append(it.markedLeases, id)
		}
		for _, h := range u.keys {
			if full || it.marks < len(u.marks) || !fits(3*(len(h)+len(u.token)+opOverhead)) {
				full = true
				break
			}
			ops = append(ops, clientv3.OpTxn(heldBy(h, u.token), []clientv3.Op{clientv3.OpDelete(h)}, nil))
			it.keys++
		}
		if u.queue != "" && !full && it.keys == len(u.keys) {
			if fits(len(u.queue) + opOverhead) {
				ops = append(ops, clientv3.OpDelete(u.queue))
				it.queue = true
			} else {
				full = true
			}
		}
		nothingLeft := len(u.marks) == 0 && len(u.keys) == 0 && u.queue == ""
		if it.marks > 0 || it.keys > 0 || it.queue || nothingLeft {
			items = append(items, it)
		}
		if full {
			break
		}
	}
	return ops, items
}

// landed records that the operations of items landed.
func (q *undoQueue) landed(items []batchItem) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, it := range items {
		u := it.u
		u.marks = u.marks[it.marks:]
		u.keys = u.keys[it.keys:]
		if it.queue {
			u.queue = ""
		}
		if len(u.marks) == 0 && len(u.keys) == 0 && u.queue == "" {
			u.done = true
		}
	}
	q.compactLocked()
}

// run sends the pending undos until none is left or ctx ends.
func (q *undoQueue) run(ctx context.Context) {
	defer q.wg.Done()
	pause := undoPauseMin
	// A try waits for etcd's answer for the copy bound (a request
	// forwarded to a leader that died is never answered), and the next one
	// follows at once; once etcd has left tries unanswered for
	// undoPatience, each waits twice as long as the one before, up to the
	// request timeout (a large undo on a slow cluster takes its time).
	bound := q.s.copyBound()
	var unanswered time.Time // since when etcd answers no try
	for {
		ops, items := q.take()
		if len(items) == 0 && q.exitIfIdle() {
			return // none pending: take takes something of the first
		}
		var err error
		timedOut := false
		if len(ops) > 0 {
			sent := time.Now()
			reqCtx, cancel := context.WithTimeout(ctx, bound)
			_, err = q.s.kv.Txn(reqCtx).Then(ops...).Commit()
			timedOut = reqCtx.Err() != nil && ctx.Err() == nil
			cancel()
			if timedOut {
				if unanswered.IsZero() {
					unanswered = sent
				}
				if time.Since(unanswered) >= undoPatience {
					bound = min(2*bound, q.s.timeout)
				}
			} else {
				if err == nil {
					q.s.rtt.observe(time.Since(sent), q.s.attemptBound())
				}
				unanswered, bound = time.Time{}, q.s.copyBound()
			}
		}
		switch {
		case err == nil:
			q.landed(items)
			pause = undoPauseMin
			continue
		case timedOut:
			continue // it waited already
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			if q.dropGone(ctx, items) {
				continue
			}
		case errors.Is(err, rpctypes.ErrTooManyOps) || tooLarge(err):
			q.mu.Lock()
			shrunk := q.maxOps > 1 || q.maxBytes > 1
			q.maxOps, q.maxBytes = max(q.maxOps/2, 1), max(q.maxBytes/2, 1)
			q.mu.Unlock()
			if shrunk {
				continue
			}
		}
		if ctx.Err() != nil {
			q.stopped()
			return
		}
		select {
		case <-time.After(pause):
		case <-q.kick:
		case <-ctx.Done():
			q.stopped()
			return
		}
		pause = min(2*pause, undoPauseMax)
	}
}

// exitIfIdle marks the worker stopped and reports true when no undo is
// pending.
func (q *undoQueue) exitIfIdle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.pending) > 0 {
		return false
	}
	q.running = false
	close(q.idle)
	return true
}

// stopped marks the worker stopped.
func (q *undoQueue) stopped() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.running = false
	close(q.idle)
}

// dropGone asks etcd which leases of the marks of items are gone, after a
// transaction found one gone, and drops them from their undos. It reports
// whether it found one.
func (q *undoQueue) dropGone(ctx context.Context, items []batchItem) bool {
	var ids []clientv3.LeaseID
	for _, it := range items {
		for _, id := range it.markedLeases {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	reqCtx, cancel := context.WithTimeout(ctx, q.s.timeout)
	alive, err := q.s.leases.alive(reqCtx, ids)
	cancel()
	if err != nil || len(alive) == len(ids) {
		return false
	}
	gone := slices.DeleteFunc(ids, func(id clientv3.LeaseID) bool { return slices.Contains(alive, id) })
	q.leasesGone(gone)
	return true
}
