package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// goRedis is the Driver over a go-redis client that New makes.
type goRedis struct {
	client  redis.Scripter
	routing Routing
	cluster *redis.ClusterClient // client, when it is one; see noteFailure

	single redis.Scripter // client, sending each command once; nil when it cannot (see attempts)
	retry  retryPolicy    // the client's retries, which the driver makes through single

	sub subscriber // nil when the client cannot notify releases
}

var _ Driver = (*goRedis)(nil)

// NewDriver returns the Driver over a go-redis client that New uses, for
// NewWithDriver or for a store of another package that runs its scripts on
// a Driver (redlockstore's nodes). client must not be nil.
func NewDriver(client redis.Scripter) Driver { return newGoRedis(client) }

// newGoRedis returns the Driver over client.
func newGoRedis(client redis.Scripter) *goRedis {
	g := &goRedis{client: client, routing: routingOf(client)}
	g.cluster, _ = client.(*redis.ClusterClient)
	if p, ok := client.(processor); ok {
		g.single, g.retry = oneAttempt{p}, retryPolicyOf(client)
	}
	if sub, ok := client.(subscriber); ok {
		// A Ring routes a channel to one shard, so one pub/sub cannot hear
		// the releases of keys on the other shards.
		if _, ring := client.(*redis.Ring); !ring {
			g.sub = sub
		}
	}
	return g
}

// Eval runs script through attempts; a call that never reached Redis, on
// any attempt, fails with an error wrapping stores.ErrUnreachable, and a
// failed one reaches noteFailure.
func (g *goRedis) Eval(ctx context.Context, script *Script, keys []string, args []any) (Reply, error) {
	cmd, reached := g.attempts(ctx, script, keys, args)
	err := cmd.Err()
	if err != nil {
		if !reached {
			err = unreachable(err)
		}
		g.noteFailure(err)
		return Reply{}, err
	}
	switch v := cmd.Val().(type) {
	case int64:
		return Reply{Int: v}, nil
	case string:
		return Reply{Bulk: append([]byte{}, v...)}, nil
	case []any:
		ints, err := cmd.Int64Slice()
		if err != nil {
			return Reply{}, fmt.Errorf("%w: %w", ErrUnexpectedReply, err)
		}
		return Reply{Ints: ints}, nil
	default:
		return Reply{}, fmt.Errorf("%w: %v (%T)", ErrUnexpectedReply, v, v)
	}
}

// Load loads every script; a Cluster client loads them on every node.
func (g *goRedis) Load(ctx context.Context, scripts []*Script) error {
	for _, script := range scripts {
		if err := g.client.ScriptLoad(ctx, script.src).Err(); err != nil {
			return err
		}
	}
	return nil
}

func (g *goRedis) Routing() Routing { return g.routing }

// HonoursCancel is false: go-redis bounds a call by its context's deadline
// but not by its cancellation.
func (g *goRedis) HonoursCancel() bool { return false }

func (g *goRedis) ReplyError(err error) (string, bool) {
	var reply redis.Error
	if errors.As(err, &reply) {
		return reply.Error(), true
	}
	return "", false
}

func (g *goRedis) Closed(err error) bool { return errors.Is(err, redis.ErrClosed) }

// noteFailure has a Cluster client reload its slot map after a call failed
// without a reply from Redis (a refused connection, a timeout). go-redis
// reloads it on a MOVED reply, which a dead master never sends, and
// otherwise only every ClusterStateReloadInterval (60s by default): until
// then it keeps sending the slots of a master that died to that master,
// while its replica has taken over. The reload runs in the background, at
// most once per go-redis's own minimum interval, so calling it on every
// failure costs nothing while a node is down.
func (g *goRedis) noteFailure(err error) {
	if g.cluster == nil || err == nil {
		return
	}
	if _, ok := g.ReplyError(err); ok {
		return // Redis answered: the map is not what failed
	}
	g.cluster.ReloadState(context.Background())
}

// subscriber is what a client needs for release notifications. *redis.Client
// (also a Sentinel failover client) and *redis.ClusterClient have it.
type subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// PubSub opens a go-redis pub/sub and starts the goroutine that hands its
// messages to onMessage. go-redis reconnects it and subscribes its channels
// again by itself.
func (g *goRedis) PubSub(onMessage func(string), onBroken func()) PubSub {
	if g.sub == nil {
		return nil
	}
	ps := subscribeNone(g.sub)
	if ps == nil {
		return nil
	}
	p := &goPubSub{ps: ps, exited: make(chan struct{})}
	go p.read(ps.Channel(), onMessage, onBroken)
	return p
}

// subscribeNone returns a pub/sub of client subscribed to no channel, or nil
// when client refuses. A client that cannot subscribe without a channel
// panics (a *redis.Ring, and a wrapper around one): that is caught here, and
// the Store's waiters poll.
func subscribeNone(client subscriber) (ps *redis.PubSub) {
	defer func() {
		if recover() != nil {
			ps = nil
		}
	}()
	return client.Subscribe(context.Background())
}

// goPubSub is a go-redis pub/sub with the goroutine that reads it.
type goPubSub struct {
	ps        *redis.PubSub
	mu        sync.Mutex
	closing   bool          // Close was called
	exited    chan struct{} // closed when read has returned
	closeOnce sync.Once
	closeErr  error
}

// read hands each message to onMessage until the pub/sub closes, and calls
// onBroken when it closed not by Close (the client was closed, say).
func (p *goPubSub) read(msgs <-chan *redis.Message, onMessage func(string), onBroken func()) {
	defer close(p.exited)
	for msg := range msgs {
		onMessage(msg.Channel)
	}
	p.mu.Lock()
	closing := p.closing
	p.mu.Unlock()
	if !closing {
		onBroken()
	}
}

func (p *goPubSub) Subscribe(ctx context.Context, channels ...string) error {
	return p.ps.Subscribe(ctx, channels...)
}

func (p *goPubSub) Unsubscribe(ctx context.Context, channels ...string) error {
	return p.ps.Unsubscribe(ctx, channels...)
}

// Close closes the pub/sub and waits for its reading goroutine to return.
func (p *goPubSub) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closing = true
		p.mu.Unlock()
		p.closeErr = p.ps.Close()
		<-p.exited
	})
	return p.closeErr
}
