package rueidisstore

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redisstore/internal/redistest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// stacks returns the stacks of every goroutine.
func stacks() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

// TestNoGoroutinePerCall: acquires in flight to a stalled Redis wait in
// rueidis on their callers' goroutines, with no goroutine of the Store's
// per call (redisstore's scriptCall.inBackground, which a Driver that does
// not honour cancellation needs), and return as soon as their callers
// leave, abandoned (the Store undoes them). The client pipelines on one
// connection, which the warm-up opens (see newOneConnClient).
func TestNoGoroutinePerCall(t *testing.T) {
	const calls = 20
	p := faultproxy.New(t, testredis.Addr(t))
	s := newStore(t, newOneConnClient(t, p.Addr()))
	prefix := testredis.Prefix(t)
	redistest.Cycle(t, s, prefix+"warm", "t") // scripts cached, connections open
	p.Stall(faultproxy.Both)
	t.Cleanup(p.Heal)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, calls)
	for i := range calls {
		go func() {
			_, err := s.Acquire(ctx, []string{prefix + strconv.Itoa(i)}, "t", time.Minute)
			errs <- err
		}()
	}
	var all string
	redistest.WaitFor(t, redistest.SignalWait, func() bool {
		all = stacks()
		return strings.Count(all, "rueidisstore.(*driver).Eval(") >= calls
	}, func() string {
		return "the acquires are not all waiting in the driver:\n" + all
	})
	if strings.Contains(all, "inBackground") {
		t.Fatalf("a goroutine per call runs the script:\n%s", all)
	}
	cancel()
	timer := time.NewTimer(redistest.SignalWait)
	defer timer.Stop()
	for range calls {
		select {
		case err := <-errs:
			if !errors.Is(err, stores.ErrAbandoned) || !errors.Is(err, context.Canceled) {
				t.Errorf("Acquire left by its caller: %v, want ErrAbandoned and context.Canceled", err)
			}
		case <-timer.C:
			t.Fatalf("Acquire did not return within %v of its caller leaving, while Redis stalls", redistest.SignalWait)
		}
	}
}

// TestWrittenThenRefusedNotUnreachable: an acquire whose request reached
// Redis, whose connection then broke while Redis refuses new connections,
// does not answer stores.ErrUnreachable (Redis ran it), and leaves no grant
// once Redis can be reached again: the Store undoes it. On a client as Open
// makes it, rueidis answers such a call with the broken connection's error.
// With ClientOption.ConnLifetime it answers it with a dial error: it sends a
// call whose expired connection broke before the reply again on a new
// connection, which the refusal stops (see ExpiringConns).
func TestWrittenThenRefusedNotUnreachable(t *testing.T) {
	for _, lifetime := range []time.Duration{0, 2 * time.Second} {
		t.Run("ConnLifetime="+lifetime.String(), func(t *testing.T) {
			p := faultproxy.New(t, testredis.Addr(t))
			o := rueidis.ClientOption{
				InitAddress:       []string{p.Addr()},
				ForceSingleClient: true, AlwaysPipelining: true, DisableCache: true,
				ConnLifetime: lifetime,
				// One connection, so that the PING below is its own.
				PipelineMultiplex: -1,
				// No background PING: the only PING is the one an expired
				// connection sends before it closes.
				Dialer: net.Dialer{KeepAlive: time.Hour},
			}
			client, err := rueidis.NewClient(o)
			if err != nil {
				t.Fatalf("rueidis.NewClient: %v", err)
			}
			t.Cleanup(client.Close)
			if lifetime > 0 {
				client = ExpiringConns(client)
			}
			s := newStore(t, client)
			prefix := testredis.Prefix(t)
			redistest.Cycle(t, s, prefix+"warm", "t") // scripts cached
			key := prefix + "k"
			reached := p.Count(faultproxy.ToServer, []byte(key))
			p.Stall(faultproxy.ToClient) // Redis runs the acquire; its reply waits
			t.Cleanup(p.Heal)
			type result struct {
				g   stores.Grant
				err error
			}
			done := make(chan result, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				g, err := s.Acquire(ctx, []string{key}, "t1", time.Minute)
				done <- result{g, err}
			}()
			redistest.WaitFor(t, redistest.SignalWait, func() bool { return reached() > 0 },
				func() string { return "the acquire did not reach Redis" })
			pings := p.Count(faultproxy.ToServer, []byte("PING"))
			p.Refuse()
			if lifetime > 0 {
				// The connection expired: it sent its PING and waits for
				// the replies before it closes.
				redistest.WaitFor(t, lifetime+redistest.SignalWait, func() bool { return pings() > 0 },
					func() string { return "the connection did not expire" })
			}
			p.Cut()
			var r result
			select {
			case r = <-done:
			case <-time.After(redistest.SignalWait):
				t.Fatalf("Acquire did not return within %v of its connection's cut", redistest.SignalWait)
			}
			t.Logf("Acquire: %+v, %v", r.g, r.err)
			if errors.Is(r.err, stores.ErrUnreachable) {
				t.Errorf("Acquire whose request reached Redis: %v; ErrUnreachable says it never did", r.err)
			}
			if r.err == nil || r.g.OK {
				t.Fatalf("Acquire over a cut connection: %+v, %v; want a failure", r.g, r.err)
			}
			p.Heal()
			direct := newClient(t, testredis.Addr(t), true)
			redistest.WaitFor(t, 10*time.Second, func() bool {
				n, err := direct.Do(context.Background(), direct.B().Exists().Key(key).Build()).AsInt64()
				return err == nil && n == 0
			}, func() string { return "the acquire's grant still stands: nothing undid it" })
		})
	}
}
