package zkstore

import (
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
)

// rearmDelay is how long a subscription waits before it tries to set its
// watch again after a failure, such as a lost connection.
const rearmDelay = 100 * time.Millisecond

// notifier holds the Store's release subscriptions, by the node each
// watches. The connection's event callback marks the subscriptions of a
// deleted node, in the order the server sent the events, and wakes them;
// each sets its watch again before it signals its waiter, so that the
// waiter's next move, which may be a new grant and release at once, is seen.
type notifier struct {
	mu     sync.Mutex
	byPath map[string]map[*subscription]struct{}
	all    map[*subscription]struct{}
}

// subscription is one NotifyRelease: a goroutine keeps a ZooKeeper watch on
// the node whose deletion means the waiter's turn may have come, its
// target: the key's lock node, or for a waiter this Store has queued the
// queue node just ahead of it (the lock node when it heads the queue).
type subscription struct {
	id       waiterID
	released chan struct{} // to the waiter; buffered, sends never block
	nudge    chan struct{} // wakes the goroutine to find its target anew
	stop     chan struct{} // closed by the stop function
	target   string        // guarded by notifier.mu
	pending  bool          // a signal is due; guarded by subscriptions.mu
}

func (n *notifier) init() {
	n.byPath = make(map[string]map[*subscription]struct{})
	n.all = make(map[*subscription]struct{})
}

// signal sends to ch without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// deleted has the subscriptions that watch the node at path, which was
// just deleted, find their target anew and signal.
func (n *notifier) deleted(path string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for sub := range n.byPath[path] {
		sub.pending = true
		signal(sub.nudge)
	}
}

// wakeAll has every subscription set its watch anew and signal.
func (n *notifier) wakeAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for sub := range n.all {
		sub.pending = true
		signal(sub.nudge)
	}
}

// flush signals sub when a signal is due, unless it has stopped.
func (n *notifier) flush(sub *subscription) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if sub.pending {
		sub.pending = false
		if _, ok := n.all[sub]; ok {
			signal(sub.released)
		}
	}
}

// nudgeWaiter has the subscriptions of the waiter id find their target
// anew, since its queue place changed.
func (n *notifier) nudgeWaiter(id waiterID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for sub := range n.all {
		if sub.id == id {
			signal(sub.nudge)
		}
	}
}

// setTarget makes sub watch path.
func (n *notifier) setTarget(sub *subscription, path string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.all[sub]; !ok || sub.target == path {
		return
	}
	n.unsetLocked(sub)
	sub.target = path
	set := n.byPath[path]
	if set == nil {
		set = make(map[*subscription]struct{})
		n.byPath[path] = set
	}
	set[sub] = struct{}{}
}

// remove ends sub: it gets no further signal once remove returns.
func (n *notifier) remove(sub *subscription) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.unsetLocked(sub)
	delete(n.all, sub)
}

// unsetLocked takes sub off its target. The caller holds n.mu.
func (n *notifier) unsetLocked(sub *subscription) {
	if set := n.byPath[sub.target]; set != nil {
		delete(set, sub)
		if len(set) == 0 {
			delete(n.byPath, sub.target)
		}
	}
	sub.target = ""
}

// NotifyRelease registers interest in the releases of key by the waiter
// token until stop is called; see stores.Notifier. A waiter that this Store
// has queued (AcquireFair) is signalled when the queue node ahead of it is
// deleted, or, once it heads the queue, when the lock node is: only the
// waiter whose turn came wakes. Any other waiter is signalled when the
// lock node is deleted. Every waiter is signalled when the connection gets
// its session back or a new one, since events may have been missed. It
// returns a nil channel for a closed Store and for a key out of its bounds
// (empty, or too long for a request).
func (s *Store) NotifyRelease(key, token string) (<-chan struct{}, func()) {
	if s.bounds.CheckKey(key) != nil || s.checkSize([]string{key}, token, true) != nil {
		return nil, func() {}
	}
	sub := &subscription{
		id:       waiterID{key, token},
		released: make(chan struct{}, 1),
		nudge:    make(chan struct{}, 1),
		stop:     make(chan struct{}),
	}
	s.notify.mu.Lock()
	s.notify.all[sub] = struct{}{}
	s.notify.mu.Unlock()
	if !s.goTracked(func() { s.watch(sub) }) {
		s.notify.remove(sub)
		return nil, func() {}
	}
	var once sync.Once
	return sub.released, func() {
		once.Do(func() {
			s.notify.remove(sub)
			close(sub.stop)
		})
	}
}

// watch keeps sub's watch set until sub stops or the Store closes.
func (s *Store) watch(sub *subscription) {
	p := s.pathsOf(sub.id.key)
	retry := time.NewTimer(0)
	defer retry.Stop()
	<-retry.C
	var (
		expectPresent bool   // the last event said the target exists
		lastTarget    string // the target of the last watch set
		lastExists    bool   // whether it existed then
	)
	for {
		target, err := s.target(p, sub.id)
		var (
			exists bool
			events <-chan zk.Event
		)
		if err == nil {
			s.notify.setTarget(sub, target)
			exists, events, err = s.watchNode(target, target == p.lock)
		}
		var wake <-chan time.Time
		if err != nil {
			retry.Reset(rearmDelay)
			wake = retry.C
		} else {
			if !exists && (expectPresent || lastExists || target != lastTarget) {
				// Gone before the watch was set: deleted since the waiter
				// was refused, or created and deleted between two watches,
				// a release the event callback could not see.
				s.notify.mu.Lock()
				sub.pending = true
				s.notify.mu.Unlock()
			}
			lastTarget, lastExists = target, exists
		}
		s.notify.flush(sub)
		expectPresent = false
		if err == nil && !exists && target != p.lock {
			continue // the waiter ahead has gone: find the node to watch now
		}
		select {
		case ev := <-events:
			expectPresent = ev.Type == zk.EventNodeCreated || ev.Type == zk.EventNodeDataChanged
		case <-sub.nudge:
		case <-wake:
		case <-sub.stop:
			return
		case <-s.done:
			return
		}
		retry.Stop()
	}
}

// watchNode sets a watch on the node at path and reports whether it
// exists. The lock node is watched for its creation too, when it is absent:
// its path serves every grant of the key, so the watch fires at the next
// grant, and the grant's release is then seen. A queue node's name never
// comes back once its node is gone: it is watched only while it exists
// (ZooKeeper keeps a watch on an absent node until the node is created or
// the session ends, and go-zookeeper keeps it too, and sets it again on
// every reconnection).
func (s *Store) watchNode(path string, lock bool) (exists bool, events <-chan zk.Event, err error) {
	if lock {
		exists, _, events, err = s.conn.ExistsW(path)
		return exists, events, err
	}
	_, _, events, err = s.conn.GetW(path) // sets no watch on an absent node
	if errors.Is(err, zk.ErrNoNode) {
		return false, nil, nil
	}
	return err == nil, events, err
}

// target returns the node whose deletion signals the waiter id of the key
// at p: its predecessor in the queue when this Store has queued it, and the
// lock node otherwise.
func (s *Store) target(p paths, id waiterID) (string, error) {
	if _, ok := s.placeOf(id); !ok {
		return p.lock, nil
	}
	children, _, err := s.conn.Children(p.parent)
	if errors.Is(err, zk.ErrNoNode) {
		return p.lock, nil
	}
	if err != nil {
		return "", err
	}
	queue := parseQueue(children)
	mine := slices.IndexFunc(queue, func(q queueNode) bool { return q.token == id.token })
	if mine <= 0 {
		return p.lock, nil
	}
	return p.parent + "/" + queue[mine-1].name, nil
}
