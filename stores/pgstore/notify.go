package pgstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Timing of the listening connection.
const (
	// listenIdle is how long the listener waits for a notification before
	// it pings the server, to notice a connection that died silently.
	listenIdle = 15 * time.Second

	// listenPing bounds that ping, and each dial and LISTEN.
	listenPing = 5 * time.Second

	// Redials back off from redialMin to redialMax.
	redialMin = 50 * time.Millisecond
	redialMax = 2 * time.Second
)

// listener owns the Store's listening connection and the goroutine that
// reads it, and hands each release to the subscribers of its key.
type listener struct {
	config  *pgx.ConnConfig
	channel string
	cancel  context.CancelFunc
	done    chan struct{} // closed when the goroutine has returned

	mu   sync.Mutex
	subs map[string]map[*subscription]struct{} // by payload (payloadOf the key)
}

// subscription is one NotifyRelease.
type subscription struct {
	ch chan struct{} // buffered by one: sends never block
}

// NotifyRelease registers interest in the releases of key until stop is
// called (stop is idempotent and must be called). The channel receives,
// without blocking the release, after each plain release of key by any
// Store on the same table; several releases may arrive as one signal. The
// first call opens the Store's listening connection in the background, so a
// release right after the first subscription may pass unnoticed; signals
// are also lost while that connection is down. token is not used: every
// subscriber of the key is signalled. After Close it returns a nil channel.
func (s *Store) NotifyRelease(key, token string) (released <-chan struct{}, stop func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, func() {}
	}
	if s.notify == nil {
		s.notify = startListener(s.pool.Config().ConnConfig.Copy(), s.channel)
	}
	return s.notify.subscribe(payloadOf(key))
}

// startListener starts the goroutine that listens on channel over a
// connection of its own, made from config.
func startListener(config *pgx.ConnConfig, channel string) *listener {
	ctx, cancel := context.WithCancel(context.Background())
	l := &listener{config: config, channel: channel, cancel: cancel, done: make(chan struct{}),
		subs: make(map[string]map[*subscription]struct{})}
	go l.run(ctx)
	return l
}

// subscribe adds a subscriber of payload.
func (l *listener) subscribe(payload string) (<-chan struct{}, func()) {
	sub := &subscription{ch: make(chan struct{}, 1)}
	l.mu.Lock()
	set := l.subs[payload]
	if set == nil {
		set = make(map[*subscription]struct{})
		l.subs[payload] = set
	}
	set[sub] = struct{}{}
	l.mu.Unlock()
	var once sync.Once
	return sub.ch, func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			delete(l.subs[payload], sub)
			if len(l.subs[payload]) == 0 {
				delete(l.subs, payload)
			}
		})
	}
}

// signal wakes the subscribers of payload.
func (l *listener) signal(payload string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for sub := range l.subs[payload] {
		select {
		case sub.ch <- struct{}{}:
		default: // a signal is already waiting
		}
	}
}

// close stops the goroutine and closes the connection.
func (l *listener) close() {
	l.cancel()
	<-l.done
}

// run keeps a connection listening on the channel until ctx ends,
// redialling with backoff when it fails.
func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	pause := redialMin
	for ctx.Err() == nil {
		if l.listen(ctx) {
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
func (l *listener) listen(ctx context.Context) bool {
	dialCtx, cancel := context.WithTimeout(ctx, listenPing)
	conn, err := pgx.ConnectConfig(dialCtx, l.config)
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
	_, err = conn.Exec(listenCtx, "LISTEN "+pgx.Identifier{l.channel}.Sanitize())
	cancel()
	if err != nil {
		return false
	}
	for {
		waitCtx, cancel := context.WithTimeout(ctx, listenIdle)
		n, err := conn.WaitForNotification(waitCtx)
		cancel()
		switch {
		case err == nil:
			if n.Channel == l.channel {
				l.signal(n.Payload)
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
