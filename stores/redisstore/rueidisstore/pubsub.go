package rueidisstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/reqlock/reqlock/stores/redisstore"
)

const (
	// resubscribeTimeout bounds each SUBSCRIBE that subscribes the channels
	// again on a new connection.
	resubscribeTimeout = time.Second
	// resubscribeBatch is the most channels sent in one such SUBSCRIBE.
	resubscribeBatch = 512
	// reconnectMin and reconnectMax bound the pause before dialling the
	// pub/sub connection again after it broke; it doubles each time in
	// between, and starts again from reconnectMin once a connection holds.
	reconnectMin = 50 * time.Millisecond
	reconnectMax = time.Second
)

// errNotConnected is Subscribe's and Unsubscribe's error while the pub/sub
// connection is down; the channel set is kept for the next one.
var errNotConnected = errors.New("rueidisstore: the pub/sub connection is down; it subscribes again when it reconnects")

// PubSub returns the Store's pub/sub: a dedicated connection with pub/sub
// hooks, kept by a goroutine that dials it again when it breaks.
func (d *driver) PubSub(onMessage func(string), onBroken func()) redisstore.PubSub {
	p := &pubsub{client: d.client, onMessage: onMessage, onBroken: onBroken,
		want: make(map[string]struct{}), done: make(chan struct{}), exited: make(chan struct{})}
	go p.keep()
	return p
}

// pubsub is the Store's pub/sub on rueidis.
type pubsub struct {
	client    rueidis.Client
	onMessage func(string)
	onBroken  func()

	mu   sync.Mutex
	want map[string]struct{}     // the channels to be subscribed
	dc   rueidis.DedicatedClient // the current connection, nil while down

	doMu sync.Mutex // one command at a time on dc

	done      chan struct{} // closed by Close
	exited    chan struct{} // closed when keep has returned
	closeOnce sync.Once
}

// keep dials the dedicated connection, subscribes the wanted channels on
// it, and waits for it to break or for Close; then it dials again after a
// pause, unless the client was closed, which it reports with onBroken.
func (p *pubsub) keep() {
	defer close(p.exited)
	pause := reconnectMin
	for {
		dc, release := p.client.Dedicate()
		errs := dc.SetPubSubHooks(rueidis.PubSubHooks{
			OnMessage: func(m rueidis.PubSubMessage) { p.onMessage(m.Channel) },
		})
		p.mu.Lock()
		p.dc = dc
		channels := make([]string, 0, len(p.want))
		for c := range p.want {
			channels = append(channels, c)
		}
		p.mu.Unlock()
		subscribed := p.resubscribe(dc, channels)
		var err error
		select {
		case <-p.done:
		case err = <-errs:
		}
		p.mu.Lock()
		p.dc = nil
		p.mu.Unlock()
		p.doMu.Lock()
		dc.Close() // not back to the pool: it may still hold subscriptions
		p.doMu.Unlock()
		release()
		for range errs { // closed once the hooks are not called any more
		}
		select {
		case <-p.done:
			return
		default:
		}
		if errors.Is(err, rueidis.ErrClosing) || clientClosed(p.client) {
			p.onBroken() // the client was closed: from now on waiters poll
			return
		}
		if subscribed {
			pause = reconnectMin
		}
		t := time.NewTimer(pause)
		select {
		case <-p.done:
			t.Stop()
			return
		case <-t.C:
		}
		pause = min(2*pause, reconnectMax)
	}
}

// resubscribe subscribes channels on dc, and reports whether every SUBSCRIBE
// succeeded.
func (p *pubsub) resubscribe(dc rueidis.DedicatedClient, channels []string) bool {
	for len(channels) > 0 {
		n := min(len(channels), resubscribeBatch)
		ctx, cancel := context.WithTimeout(context.Background(), resubscribeTimeout)
		err := p.do(ctx, dc, true, channels[:n])
		cancel()
		if err != nil {
			return false
		}
		channels = channels[n:]
	}
	return true
}

// do sends SUBSCRIBE (or UNSUBSCRIBE) of channels on dc.
func (p *pubsub) do(ctx context.Context, dc rueidis.DedicatedClient, subscribe bool, channels []string) error {
	p.doMu.Lock()
	defer p.doMu.Unlock()
	if subscribe {
		return dc.Do(ctx, dc.B().Subscribe().Channel(channels...).Build()).Error()
	}
	return dc.Do(ctx, dc.B().Unsubscribe().Channel(channels...).Build()).Error()
}

// change records channels as wanted or not, and sends the change on the
// current connection, if any. A connection that keep dials later subscribes
// the wanted set.
func (p *pubsub) change(ctx context.Context, subscribe bool, channels []string) error {
	p.mu.Lock()
	for _, c := range channels {
		if subscribe {
			p.want[c] = struct{}{}
		} else {
			delete(p.want, c)
		}
	}
	dc := p.dc
	p.mu.Unlock()
	if dc == nil {
		return errNotConnected
	}
	return p.do(ctx, dc, subscribe, channels)
}

func (p *pubsub) Subscribe(ctx context.Context, channels ...string) error {
	return p.change(ctx, true, channels)
}

func (p *pubsub) Unsubscribe(ctx context.Context, channels ...string) error {
	return p.change(ctx, false, channels)
}

// Close closes the connection and waits for keep to return.
func (p *pubsub) Close() error {
	p.closeOnce.Do(func() { close(p.done) })
	<-p.exited
	return nil
}
