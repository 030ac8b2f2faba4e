package pgstore

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Timing of the listening connection.
const (
	// listenIdle is how long the listener waits for a notification before
	// it pings the server, to notice a connection that died silently.
	listenIdle = 15 * time.Second

	// listenPing bounds that ping, and each dial and LISTEN.
	listenPing = 5 * time.Second

	// watchRenew is how often the keys with subscribers are marked
	// watched again: a third of watchFor in queries.go.
	watchRenew = 10 * time.Second

	// Redials back off from redialMin to redialMax.
	redialMin = 50 * time.Millisecond
	redialMax = 2 * time.Second
)

// notifier owns the Store's listening connection and the goroutine that
// reads it, and hands each release to the subscribers of its key.
type notifier struct {
	config  *pgx.ConnConfig
	channel string
	pool    *pgxpool.Pool
	watch   string // the statement that marks keys watched
	cancel  context.CancelFunc
	done    sync.WaitGroup // the listening and marking goroutines
	kick    chan struct{}  // buffered by one: a key awaits its first mark

	mu      sync.Mutex
	subs    map[string]map[*subscription]struct{} // by payload (payloadOf the key)
	keys    map[string]string                     // the key of each payload in subs
	pending map[string]bool                       // keys not marked watched yet
}

// subscription is one NotifyRelease.
type subscription struct {
	ch chan struct{} // buffered by one: sends never block
}

// NotifyRelease registers interest in the releases of key until stop is
// called (stop is idempotent and must be called). The channel receives,
// without blocking the release, after each plain release of key by any
// Store on the same table; several releases may arrive as one signal. The
// first call opens the Store's listening connection in the background, and
// the key is marked watched (a release notifies only watched keys; see
// Release notification in the package documentation) in the background
// too, so a release right after a subscription may pass unnoticed; signals
// are also lost while that connection is down. token is not used: every
// subscriber of the key is signalled. After Close it returns a nil channel.
func (s *Store) NotifyRelease(key, token string) (released <-chan struct{}, stop func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, func() {}
	}
	if s.notify == nil {
		s.notify = startNotifier(s.pool, s.q.watch, s.channel)
	}
	return s.notify.subscribe(key)
}

// startNotifier starts the goroutine that listens on channel over a
// connection of its own, made with pool's configuration, and the one that
// marks subscribed keys watched through pool.
func startNotifier(pool *pgxpool.Pool, watch, channel string) *notifier {
	ctx, cancel := context.WithCancel(context.Background())
	n := &notifier{config: pool.Config().ConnConfig.Copy(), channel: channel, pool: pool, watch: watch,
		cancel: cancel, kick: make(chan struct{}, 1),
		subs: make(map[string]map[*subscription]struct{}), keys: make(map[string]string), pending: make(map[string]bool)}
	n.done.Add(2)
	go n.run(ctx)
	go n.markWatched(ctx)
	return n
}

// subscribe adds a subscriber of key.
func (n *notifier) subscribe(key string) (<-chan struct{}, func()) {
	payload := payloadOf(key)
	sub := &subscription{ch: make(chan struct{}, 1)}
	n.mu.Lock()
	set := n.subs[payload]
	if set == nil {
		set = make(map[*subscription]struct{})
		n.subs[payload] = set
		n.keys[payload] = key
		n.pending[key] = true
		select {
		case n.kick <- struct{}{}:
		default: // a kick is waiting already
		}
	}
	set[sub] = struct{}{}
	n.mu.Unlock()
	var once sync.Once
	return sub.ch, func() {
		once.Do(func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			delete(n.subs[payload], sub)
			if len(n.subs[payload]) == 0 {
				delete(n.subs, payload)
				delete(n.pending, n.keys[payload])
				delete(n.keys, payload)
			}
		})
	}
}

// markWatched marks the keys of new subscriptions watched as they come, and
// every key with subscribers every watchRenew, until ctx ends.
func (n *notifier) markWatched(ctx context.Context) {
	defer n.done.Done()
	ticker := time.NewTicker(watchRenew)
	defer ticker.Stop()
	for {
		var keys [][]byte
		select {
		case <-ctx.Done():
			return
		case <-n.kick:
			n.mu.Lock()
			for k := range n.pending {
				keys = append(keys, []byte(k))
			}
			clear(n.pending)
			n.mu.Unlock()
		case <-ticker.C:
			n.mu.Lock()
			for _, k := range n.keys {
				keys = append(keys, []byte(k))
			}
			n.mu.Unlock()
		}
		if len(keys) == 0 {
			continue
		}
		slices.SortFunc(keys, bytes.Compare) // rows are locked in key order
		// A key that fails to be marked is marked at the next renewal;
		// its waiters poll meanwhile.
		markCtx, cancel := context.WithTimeout(ctx, listenPing)
		_, _ = retrying(markCtx, func(ctx context.Context) (pgconn.CommandTag, error) {
			return n.pool.Exec(ctx, n.watch, keys)
		})
		cancel()
	}
}

// signal wakes the subscribers of payload.
func (n *notifier) signal(payload string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for sub := range n.subs[payload] {
		select {
		case sub.ch <- struct{}{}:
		default: // a signal is already waiting
		}
	}
}

// close stops the goroutine and closes the connection.
func (n *notifier) close() {
	n.cancel()
	n.done.Wait()
}

// run keeps a connection listening on the channel until ctx ends,
// redialling with backoff when it fails.
func (n *notifier) run(ctx context.Context) {
	defer n.done.Done()
	pause := redialMin
	for ctx.Err() == nil {
		if n.listen(ctx) {
			pause = redialMin // it worked for a while
		}
		timer := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		pause = min(2*pause, redialMax)
	}
}

// listen dials, listens and hands notifications on until the connection
// fails or ctx ends. It reports whether the connection got as far as
// listening.
func (n *notifier) listen(ctx context.Context) bool {
	dialCtx, cancel := context.WithTimeout(ctx, listenPing)
	conn, err := pgx.ConnectConfig(dialCtx, n.config)
	cancel()
	if err != nil {
		return false
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	listenCtx, cancel := context.WithTimeout(ctx, listenPing)
	_, err = conn.Exec(listenCtx, "LISTEN "+pgx.Identifier{n.channel}.Sanitize())
	cancel()
	if err != nil {
		return false
	}
	for {
		waitCtx, cancel := context.WithTimeout(ctx, listenIdle)
		msg, err := conn.WaitForNotification(waitCtx)
		cancel()
		switch {
		case err == nil:
			if msg.Channel == n.channel {
				n.signal(msg.Payload)
			}
			continue
		case ctx.Err() != nil:
			return true
		case errors.Is(err, context.DeadlineExceeded) && !conn.IsClosed():
			// Idle: check that the server is still there.
			pingCtx, cancel := context.WithTimeout(ctx, listenPing)
			err = conn.Ping(pingCtx)
			cancel()
			if err == nil {
				continue
			}
		}
		return true
	}
}
