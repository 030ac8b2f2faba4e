package rueidisstore

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redisstore"
	"github.com/reqlock/reqlock/stores/redisstore/internal/redistest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// TestMain serves testredis (one Redis) and testservers (the Redlock
// nodes of redlock_test.go).
func TestMain(m *testing.M) { os.Exit(testservers.Main(m, testredis.Main)) }

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
	return clientOf(tb, o)
}

// newOneConnClient is newClient(tb, addr, true) on one pipeline connection,
// which the first call opens: rueidis opens its connections on first use,
// and a call sent to one it has yet to open waits for its handshake however
// the call's context ends (see the package documentation).
func newOneConnClient(tb testing.TB, addr string) rueidis.Client {
	tb.Helper()
	return clientOf(tb, rueidis.ClientOption{InitAddress: []string{addr},
		ForceSingleClient: true, AlwaysPipelining: true, DisableCache: true, PipelineMultiplex: -1})
}

// clientOf returns a client made with o, closed when the test ends.
func clientOf(tb testing.TB, o rueidis.ClientOption) rueidis.Client {
	tb.Helper()
	c, err := rueidis.NewClient(o)
	if err != nil {
		tb.Fatalf("rueidis.NewClient(%v): %v", o.InitAddress, err)
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

// runConformance runs the conformance suite on stores of client (see
// redistest.Conformance).
func runConformance(t *testing.T, client rueidis.Client, proxied func(t *testing.T) (rueidis.Client, []*faultproxy.Proxy)) {
	redistest.Conformance(t, client, storeOf, proxied)
}

// storeOf returns a Store over client, closed when the test ends.
func storeOf(t testing.TB, client rueidis.Client) stores.Store { return newStore(t, client) }

// openURL is Open without options.
func openURL(ctx context.Context, rawURL string) (*redisstore.Store, error) { return Open(ctx, rawURL) }

// TestOpenUnreachable: Open fails at start-up when Redis cannot be reached,
// naming its address, unless connect=lazy, and a lazy Store works once
// Redis answers.
func TestOpenUnreachable(t *testing.T) {
	redistest.OpenUnreachable(t, testredis.Addr(t), openURL)
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
	// go-redis's pool_size is not rueidis's.
	redistest.OpenRejects(t, testredis.Addr(t), openURL, "redis://u:secret@"+testredis.Addr(t)+"/0?pool_size=10")
	if _, err := Open(ctx, "redis://"+testredis.Addr(t)+"/0?pool_size=10"); !errors.Is(err, stores.ErrUnknownOption) {
		t.Errorf("Open with go-redis's pool_size: got %v, want ErrUnknownOption", err)
	}
}

func TestNewRejectsNil(t *testing.T) {
	if _, err := New(nil); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("New(nil): got %v, want ErrInvalid", err)
	}
	if _, err := New(ExpiringConns(nil)); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("New(ExpiringConns(nil)): got %v, want ErrInvalid", err)
	}
}
