package redisstore

import (
	"context"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores"
)

// cancelReturnLimit bounds how long an acquire may take to return once its
// context is cancelled while Redis is frozen: "at once", far below the
// client's 3s ReadTimeout, which is what it would sit out otherwise.
const cancelReturnLimit = time.Second

// writeSignalConn is a client connection that signals each write: a command
// has left the client.
type writeSignalConn struct {
	net.Conn
	written chan<- struct{}
}

func (c writeSignalConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	select {
	case c.written <- struct{}{}:
	default: // a signal is pending already
	}
	return n, err
}

// scriptReply is one reply of a script, as the client received it.
type scriptReply struct {
	reply []int64
	err   error
}

// replyLog hands on the replies of one script.
type replyLog struct {
	hash    string
	replies chan scriptReply
}

func (l *replyLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *replyLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		// The Store's commands are *redis.Cmd, or wrap one (see attempts).
		if c, ok := cmd.(interface{ Int64Slice() ([]int64, error) }); ok && cmd.Name() == "evalsha" && len(cmd.Args()) > 1 && cmd.Args()[1] == l.hash {
			r := scriptReply{err: err}
			if err == nil {
				r.reply, r.err = c.Int64Slice()
			}
			select {
			case l.replies <- r:
			default:
			}
		}
		return err
	}
}

func (l *replyLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// cancelEnv is a Store that reaches Redis through a testredis.Proxy, with a
// client straight to Redis to look behind the proxy's back.
type cancelEnv struct {
	s       *Store
	proxy   *testredis.Proxy
	direct  *redis.Client
	written <-chan struct{}
	replies *replyLog
}

// newCancelEnv returns a cancelEnv whose store has its scripts cached and a
// connection open, so that an acquire is one EVALSHA on that connection.
// replies gets the replies of script.
func newCancelEnv(t *testing.T, script *Script) *cancelEnv {
	t.Helper()
	proxy := testredis.NewProxy(t)
	written := make(chan struct{}, 1)
	client := redis.NewClient(&redis.Options{
		Addr:                  proxy.Addr(),
		ContextTimeoutEnabled: true,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return writeSignalConn{Conn: c, written: written}, nil
		},
	})
	t.Cleanup(func() { _ = client.Close() })
	replies := &replyLog{hash: script.SHA1(), replies: make(chan scriptReply, 1)}
	client.AddHook(replies)
	s := newStore(t, client)
	if err := s.Load(context.Background()); err != nil {
		t.Fatalf("Load: %v", err)
	}
	return &cancelEnv{s: s, proxy: proxy, direct: testredis.Client(t), written: written, replies: replies}
}

// cancelWhileFrozen freezes the proxy, starts acquire, cancels its context
// once its command has left the client, and checks that acquire returns at
// once, while Redis is still frozen, with context.Canceled and no grant.
// It leaves the proxy frozen.
func (e *cancelEnv) cancelWhileFrozen(t *testing.T, acquire func(ctx context.Context) (stores.Grant, error)) {
	t.Helper()
	e.proxy.Freeze()
	t.Cleanup(e.proxy.Thaw)
	select {
	case <-e.written: // drop a stale signal
	default:
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		g   stores.Grant
		err error
	}
	done := make(chan result, 1)
	go func() {
		g, err := acquire(ctx)
		done <- result{g, err}
	}()
	timer := time.NewTimer(signalWait)
	defer timer.Stop()
	select {
	case <-e.written:
	case <-timer.C:
		t.Fatalf("the acquire sent nothing within %v", signalWait)
	}
	cancel()
	timer.Reset(cancelReturnLimit)
	select {
	case r := <-done:
		if !errors.Is(r.err, context.Canceled) || r.g.OK || r.g.Fences != nil {
			t.Fatalf("acquire cancelled while Redis is frozen: %+v, %v; want no grant and context.Canceled", r.g, r.err)
		}
	case <-timer.C:
		t.Fatalf("acquire did not return within %v of its cancellation while Redis is frozen", cancelReturnLimit)
	}
}

// thawAndReply thaws the proxy and returns the reply of the script that
// was in flight, which must have succeeded.
func (e *cancelEnv) thawAndReply(t *testing.T) []int64 {
	t.Helper()
	e.proxy.Thaw()
	timer := time.NewTimer(signalWait)
	defer timer.Stop()
	select {
	case r := <-e.replies.replies:
		if r.err != nil {
			t.Fatalf("the abandoned script failed once Redis answered: %v", r.err)
		}
		return r.reply
	case <-timer.C:
		t.Fatalf("no reply to the abandoned script within %v of the thaw", signalWait)
		return nil
	}
}

// expectUntouched fails the test if the frozen script already ran: none of
// keys, nor their fence keys, exists.
func (e *cancelEnv) expectUntouched(t *testing.T, keys []string) {
	t.Helper()
	if n := e.direct.Exists(context.Background(), withFenceKeys(keys)...).Val(); n != 0 {
		t.Fatalf("%d of the keys and fence keys exist before Redis answered the acquire", n)
	}
}

// waitFree polls until none of keys exists, that is, until the abandoned
// grant has been released.
func (e *cancelEnv) waitFree(t *testing.T, keys []string) {
	t.Helper()
	waitFor(t, signalWait, func() bool { return e.direct.Exists(context.Background(), keys...).Val() == 0 },
		func() string { return "the grant of the cancelled acquire was not released" })
}

// TestCancelledAcquireReleasesItsGrant: an Acquire whose context is
// cancelled while Redis is frozen returns at once with context.Canceled;
// the script goes on, and once Redis answers, the grant it made is
// released, for one key and for several.
func TestCancelledAcquireReleasesItsGrant(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(strconv.Itoa(n)+"keys", func(t *testing.T) {
			script := acquireAllScript
			if n == 1 {
				script = acquireScript
			}
			e := newCancelEnv(t, script)
			p := testredis.Prefix(t)
			keys := []string{p + "{c}:a", p + "{c}:b", p + "{c}:c"}[:n]

			e.cancelWhileFrozen(t, func(ctx context.Context) (stores.Grant, error) {
				return e.s.Acquire(ctx, keys, "t", time.Minute)
			})
			e.expectUntouched(t, keys)
			reply := e.thawAndReply(t)
			if len(reply) != n+1 || reply[0] != 1 {
				t.Fatalf("the abandoned script answered %v, want a grant of %d keys", reply, n)
			}
			e.waitFree(t, keys)
			// The grant happened: its fences stay recorded.
			for i, k := range keys {
				if stored := storedFence(t, e.direct, k); stored != reply[i+1] {
					t.Fatalf("fence key of %q holds %d, want the abandoned grant's fence %d", k, stored, reply[i+1])
				}
			}
			g := mustAcquire(t, e.s, keys, "next", time.Minute)
			for i, k := range keys {
				expectStride(t, reply[i+1], g.Fences[i], "grant after the abandoned one of "+k)
			}
			mustRelease(t, e.s, keys, "next")
		})
	}
}

// TestCancelledFairAcquireLeavesNothing: an AcquireFair whose context is
// cancelled while Redis is frozen returns at once with context.Canceled;
// once Redis answers, a grant it made is released and the token leaves the
// queue it joined.
func TestCancelledFairAcquireLeavesNothing(t *testing.T) {
	ctx := context.Background()
	fair := func(e *cancelEnv, key string) func(ctx context.Context) (stores.Grant, error) {
		return func(ctx context.Context) (stores.Grant, error) {
			g, err := e.s.AcquireFair(ctx, key, "t", time.Minute, time.Minute)
			return g.Grant, err
		}
	}
	queued := func(t *testing.T, e *cancelEnv, key, token string) bool {
		t.Helper()
		queue, leases := fairState(t, e.direct, key)
		return slicesContain(members(queue), token) || slicesContain(members(leases), token)
	}

	t.Run("Granted", func(t *testing.T) {
		e := newCancelEnv(t, fairAcquireScript)
		key := testredis.Prefix(t) + "k"
		e.cancelWhileFrozen(t, fair(e, key))
		e.expectUntouched(t, []string{key})
		reply := e.thawAndReply(t)
		if len(reply) != 2 || reply[0] != 1 {
			t.Fatalf("the abandoned fair script answered %v, want a grant", reply)
		}
		e.waitFree(t, []string{key})
		waitFor(t, signalWait, func() bool { return !queued(t, e, key, "t") },
			func() string { return "the cancelled fair waiter is still queued" })
		if stored := storedFence(t, e.direct, key); stored != reply[1] {
			t.Fatalf("fence key holds %d, want the abandoned grant's fence %d", stored, reply[1])
		}
	})

	t.Run("Queued", func(t *testing.T) {
		e := newCancelEnv(t, fairAcquireScript)
		key := testredis.Prefix(t) + "k"
		other := newStore(t, e.direct)
		mustAcquire(t, other, []string{key}, "holder", time.Minute)
		if g, err := other.AcquireFair(ctx, key, "w0", time.Minute, time.Minute); err != nil || g.OK || g.Ahead != 0 {
			t.Fatalf("first waiter: %+v, %v; want queued at the head", g, err)
		}
		e.cancelWhileFrozen(t, fair(e, key))
		if queued(t, e, key, "t") {
			t.Fatal("the waiter is queued before Redis answered its attempt")
		}
		reply := e.thawAndReply(t)
		if len(reply) != 4 || reply[0] != 0 || reply[2] != 1 {
			t.Fatalf("the abandoned fair script answered %v, want a refusal queued behind one waiter", reply)
		}
		waitFor(t, signalWait, func() bool { return !queued(t, e, key, "t") },
			func() string { return "the cancelled fair waiter is still queued" })
		// The others are left as they were: the holder holds, w0 waits.
		if v := e.direct.Get(ctx, key).Val(); v != "holder" {
			t.Fatalf("%q holds %q after the cancelled attempt was undone, want the holder's token", key, v)
		}
		if queue, _ := fairState(t, e.direct, key); len(queue) != 1 || queue[0].Member != "w0" {
			t.Fatalf("queue %v after the cancelled attempt was undone, want w0 alone", members(queue))
		}
	})
}

// TestCancelledRefreshReturnsAtOnce: a Refresh whose context is cancelled
// while Redis is frozen returns at once with context.Canceled (a handoff
// recipient renews while it waits, and its client may leave), for one key
// and for several; the renewal left in flight goes on and, once Redis
// answers, is applied: its outcome was unknown, and nothing undoes it.
func TestCancelledRefreshReturnsAtOnce(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(strconv.Itoa(n)+"keys", func(t *testing.T) {
			script := refreshAllScript
			if n == 1 {
				script = refreshScript
			}
			e := newCancelEnv(t, script)
			p := testredis.Prefix(t)
			keys := []string{p + "{c}:a", p + "{c}:b", p + "{c}:c"}[:n]
			mustAcquire(t, e.s, keys, "t", time.Minute)

			const renewed = time.Hour
			e.cancelWhileFrozen(t, func(ctx context.Context) (stores.Grant, error) {
				return stores.Grant{}, e.s.Refresh(ctx, keys, "t", renewed)
			})
			if ttl := e.direct.PTTL(context.Background(), keys[0]).Val(); ttl > time.Minute {
				t.Fatalf("%q has TTL %v before Redis answered the renewal", keys[0], ttl)
			}
			e.proxy.Thaw()
			waitFor(t, signalWait, func() bool {
				for _, k := range keys {
					if e.direct.PTTL(context.Background(), k).Val() <= time.Minute {
						return false
					}
				}
				return true
			}, func() string { return "the renewal left in flight was not applied once Redis answered" })
			mustRelease(t, e.s, keys, "t")
		})
	}
}
