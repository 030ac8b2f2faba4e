package etcdstore

import (
	"context"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Bounds of the pause before a watch that failed starts again.
const (
	rewatchMin = 50 * time.Millisecond
	rewatchMax = time.Second
)

// NotifyRelease returns a channel that receives when key becomes free for
// the waiter with token: when its holder key is deleted (a release, or its
// lease expired), or a claim of it is replaced by a finished record (see
// FinishRecord), and nobody is queued, or, while fair waiters queue, only
// when token is the one whose turn came: the head of the queue of a free
// key, after a release or after the waiter ahead left or lapsed.
//
// A Store watches each key that has subscribers once, from the first
// subscriber to the last one's stop, on one goroutine that keeps a copy of
// the key's holder and queue (read once, then kept by the watch's events)
// so that it knows whose turn it is; all watches share the client's watch
// stream. So a release wakes only the next waiter, even among many in one
// process, and sends one event per process that waits on the key.
//
// Signals can be lost while a watch starts again (after a member failed or
// lost its leader; the watch requires a leader so that a partitioned member
// cannot hold it silently); the watch then reads the key again and signals
// when it is free. Waiters poll as well, as stores.Notifier says.
//
// A key out of the Store's Bounds gets a nil channel: it cannot be locked.
func (s *Store) NotifyRelease(key, token string) (<-chan struct{}, func()) {
	if s.bounds.CheckKey(key) != nil {
		return nil, func() {}
	}
	return s.notify.subscribe(key, token)
}

// notifier holds the Store's watches, one per key with subscribers.
type notifier struct {
	s *Store

	mu     sync.Mutex
	keys   map[string]*keyWatch
	closed bool
	wg     sync.WaitGroup // watch goroutines
}

// keyWatch is the watch of one key and its subscribers.
type keyWatch struct {
	key    string
	cancel context.CancelFunc
	subs   map[*subscription]struct{} // guarded by notifier.mu
}

// subscription is one NotifyRelease.
type subscription struct {
	token string
	ch    chan struct{}
}

func newNotifier(s *Store) *notifier {
	return &notifier{s: s, keys: map[string]*keyWatch{}}
}

func (n *notifier) subscribe(key, token string) (<-chan struct{}, func()) {
	sub := &subscription{token: token, ch: make(chan struct{}, 1)}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, func() {}
	}
	w := n.keys[key]
	if w == nil {
		ctx, cancel := context.WithCancel(context.Background())
		w = &keyWatch{key: key, cancel: cancel, subs: map[*subscription]struct{}{}}
		n.keys[key] = w
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.watch(ctx, w)
		}()
	}
	w.subs[sub] = struct{}{}
	var once sync.Once
	return sub.ch, func() { once.Do(func() { n.unsubscribe(w, sub) }) }
}

func (n *notifier) unsubscribe(w *keyWatch, sub *subscription) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(w.subs, sub)
	if len(w.subs) == 0 && n.keys[w.key] == w {
		delete(n.keys, w.key)
		w.cancel()
	}
}

// close stops every watch and waits for their goroutines.
func (n *notifier) close() {
	n.mu.Lock()
	n.closed = true
	for _, w := range n.keys {
		w.cancel()
	}
	n.keys = map[string]*keyWatch{}
	n.mu.Unlock()
	n.wg.Wait()
}

// signalFree signals the subscribers of w whose turn it is on a free key:
// every one when nobody is queued, else those of the head's token.
func (n *notifier) signalFree(w *keyWatch, st *keyState) {
	head, queued := st.head()
	n.mu.Lock()
	defer n.mu.Unlock()
	for sub := range w.subs {
		if !queued || sub.token == head {
			signal(sub.ch)
		}
	}
}

// nudge signals the subscribers of key with token, the head of the queue
// of a free key, as signalFree would.
func (n *notifier) nudge(key, token string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if w := n.keys[key]; w != nil {
		for sub := range w.subs {
			if sub.token == token {
				signal(sub.ch)
			}
		}
	}
}

// signal sends on ch without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// keyState is the watch's copy of a key's holder and queue.
type keyState struct {
	held    bool
	queue   map[string]int64    // token to create revision
	writers map[string]struct{} // waiting writers' records (see writerWaits)
}

// head returns the token at the head of the queue, if any.
func (st *keyState) head() (string, bool) {
	var head string
	var rev int64
	for tok, r := range st.queue {
		if rev == 0 || r < rev {
			head, rev = tok, r
		}
	}
	return head, rev != 0
}

// apply applies a change of name ("holder", holder/<token>, writer/<token>
// or q/<token>) to st and reports whether the key became free (or a shared
// holder's place did, or its last waiting writer's record went) or, free,
// got a new head.
func (st *keyState) apply(name string, kv *mvccpb.KeyValue, deleted bool) (freed bool) {
	switch {
	case name == "holder":
		// A finished record (see FinishRecord) holds no lock: its put
		// over a claim is the claim's release, so that waiters claim
		// again and read it.
		was := st.held
		st.held = !deleted && !isRecord(kv.Value)
		return was && !st.held
	case strings.HasPrefix(name, "holder/"):
		// A shared holder: each place freed is signalled (see
		// stores.SharedStore), the key being free of a writer.
		return deleted && !st.held
	case strings.HasPrefix(name, "writer/"):
		// The last writer's withdrawal (or lapse) lets refused readers in
		// at once (see stores.SharedStore).
		tok := name[len("writer/"):]
		if !deleted {
			st.writers[tok] = struct{}{}
			return false
		}
		_, was := st.writers[tok]
		delete(st.writers, tok)
		return was && len(st.writers) == 0 && !st.held
	case strings.HasPrefix(name, "q/"):
		tok := name[2:]
		if !deleted {
			st.queue[tok] = kv.CreateRevision
			return false
		}
		head, _ := st.head()
		_, was := st.queue[tok]
		delete(st.queue, tok)
		return was && head == tok && !st.held
	}
	return false
}

// watch keeps st in step with key's directory and signals its subscribers,
// until ctx ends; after a failure it reads the key again and starts anew.
func (n *notifier) watch(ctx context.Context, w *keyWatch) {
	dir := n.s.dir(w.key)
	pause := rewatchMin
	for first := true; ; first = false {
		if !first && !sleepCtx(ctx, pause) {
			return
		}
		pause = min(2*pause, rewatchMax)
		reqCtx, cancel := context.WithTimeout(ctx, n.s.timeout)
		resp, err := n.s.client.Get(reqCtx, dir, clientv3.WithPrefix())
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			continue
		}
		st := &keyState{queue: map[string]int64{}, writers: map[string]struct{}{}}
		for _, kv := range resp.Kvs {
			st.apply(string(kv.Key[len(dir):]), kv, false)
		}
		if !first && !st.held {
			n.signalFree(w, st) // a release may have gone unseen
		}
		watchCtx, stopWatch := context.WithCancel(ctx)
		events := n.s.client.Watch(clientv3.WithRequireLeader(watchCtx), dir,
			clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		for wr := range events {
			if wr.Err() != nil || wr.Canceled {
				break
			}
			pause = rewatchMin
			for _, ev := range wr.Events {
				if st.apply(string(ev.Kv.Key[len(dir):]), ev.Kv, ev.Type == clientv3.EventTypeDelete) {
					n.signalFree(w, st)
				}
			}
		}
		stopWatch()
		for range events {
			// The client closes the channel once the watch has stopped.
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// sleepCtx sleeps for d and reports true, or false as soon as ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
