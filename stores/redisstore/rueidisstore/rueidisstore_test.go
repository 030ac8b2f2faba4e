package rueidisstore

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redisstore"
	"github.com/reqlock/reqlock/stores/storetest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

func TestMain(m *testing.M) { os.Exit(testredis.Main(m)) }

// newClient returns a rueidis client of the Redis at addr, closed when the
// test ends. forceSingle makes it the client Open makes (one Redis, always
// pipelining, no client-side cache); without it, it is rueidis's default,
// which probes for a Cluster and tracks keys for its cache.
func newClient(tb testing.TB, addr string, forceSingle bool) rueidis.Client {
	tb.Helper()
	o := rueidis.ClientOption{InitAddress: []string{addr}}
	if forceSingle {
		o.ForceSingleClient, o.AlwaysPipelining, o.DisableCache = true, true, true
	}
	c, err := rueidis.NewClient(o)
	if err != nil {
		tb.Fatalf("rueidis.NewClient(%s): %v", addr, err)
	}
	tb.Cleanup(c.Close)
	return c
}

// newStore returns a Store over client, closed when the test ends (before
// the client, whose cleanup was registered first).
func newStore(tb testing.TB, client rueidis.Client, opts ...redisstore.Option) *redisstore.Store {
	tb.Helper()
	s, err := New(client, opts...)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

// TestConformance runs the conformance suite on a single Redis, on a
// client with rueidis's defaults, with its fault scenarios through a proxy
// and a client as Open makes it.
func TestConformance(t *testing.T) {
	runConformance(t, newClient(t, testredis.Addr(t), false), func(t *testing.T) (rueidis.Client, []*faultproxy.Proxy) {
		p := faultproxy.New(t, testredis.Addr(t))
		return newClient(t, p.Addr(), true), []*faultproxy.Proxy{p}
	})
}

// runConformance runs the conformance suite on stores of client, with
// every capability a Store declares; proxied returns a client of the same
// servers through fault proxies, one per server.
func runConformance(t *testing.T, client rueidis.Client, proxied func(t *testing.T) (rueidis.Client, []*faultproxy.Proxy)) {
	storetest.Run(t, storetest.Suite{
		New:    func(t *testing.T) stores.Store { return newStore(t, client) },
		Notify: true,
		Fair:   true,
		Proxied: func(t *testing.T) (stores.Store, []*faultproxy.Proxy) {
			c, proxies := proxied(t)
			return newStore(t, c), proxies
		},
	})
}

// TestOpenUnreachable: Open fails at start-up when Redis cannot be reached,
// naming its address, unless connect=lazy, and a lazy Store works once
// Redis answers.
func TestOpenUnreachable(t *testing.T) {
	p := faultproxy.New(t, testredis.Addr(t))
	storetest.Startup(t, []*faultproxy.Proxy{p}, func(ctx context.Context, addrs []string, lazy bool) (stores.Store, error) {
		u := "redis://" + addrs[0] + "/0"
		if lazy {
			u += "?connect=lazy"
		}
		return Open(ctx, u)
	})
}

func TestOpenURL(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, "redis://"+testredis.Addr(t)+"/0?connect=check&dial_timeout=2s&client_name=reqlock-test")
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	key := []string{testredis.Prefix(t) + "k"}
	if g, err := s.Acquire(ctx, key, "t", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := s.Release(ctx, key, "t", 0); !errors.Is(err, rueidis.ErrClosing) {
		t.Errorf("Release after Close: %v; want rueidis.ErrClosing: Close left Open's client open", err)
	}
	for _, bad := range []string{
		"redis://" + testredis.Addr(t) + "/0?connect=maybe",
		"redis://u:secret@" + testredis.Addr(t) + "/0?no_such_option=1",
		"redis://u:secret@" + testredis.Addr(t) + "/0?pool_size=10", // go-redis's, not rueidis's
		"http://" + testredis.Addr(t),
	} {
		_, err := Open(ctx, bad)
		if !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("Open(%q): got %v, want ErrInvalid", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%q): the error quotes the password: %v", bad, err)
		}
	}
	if _, err := Open(ctx, "redis://"+testredis.Addr(t)+"/0?pool_size=10"); !errors.Is(err, stores.ErrUnknownOption) {
		t.Errorf("Open with go-redis's pool_size: got %v, want ErrUnknownOption", err)
	}
}

func TestNewRejectsNil(t *testing.T) {
	if _, err := New(nil); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("New(nil): got %v, want ErrInvalid", err)
	}
}
