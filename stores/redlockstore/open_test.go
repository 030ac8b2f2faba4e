package redlockstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/internal/redlocktest"
	"github.com/reqlock/reqlock/stores/redlockstore"
	"github.com/reqlock/reqlock/stores/storetest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

func TestOpen(t *testing.T) {
	addrs := testservers.RedisNodeAddrs(t)
	redlocktest.Admit(t, redlocktest.Clients(t, addrs))
	for name, url := range map[string]string{
		"redlock":    "redlock://" + strings.Join(addrs, ",") + "/0?drift=0.02&drift_fixed=3ms&node_timeout=300ms&max_ttl=30s",
		"redis list": "redis://" + strings.Join(addrs, "/0,redis://") + "/0?fence_retention=1h",
	} {
		t.Run(name, func(t *testing.T) {
			s, err := redlockstore.Open(context.Background(), url)
			if err != nil {
				t.Fatalf("Open(%q): %v", url, err)
			}
			defer func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}()
			stats := s.NodeStats()
			if len(stats) != len(addrs) || s.Quorum() != len(addrs)/2+1 {
				t.Fatalf("Open(%q): %d nodes, quorum %d; want %d nodes", url, len(stats), s.Quorum(), len(addrs))
			}
			for i, st := range stats {
				if st.Node != addrs[i] {
					t.Errorf("node %d is %q, want %q", i, st.Node, addrs[i])
				}
			}
			ctx := context.Background()
			if _, err := s.Acquire(ctx, []string{"open:" + name}, "t1", 2*time.Minute); !errors.Is(err, stores.ErrInvalid) {
				t.Errorf("Acquire with a TTL above max_ttl: %v, want ErrInvalid", err)
			}
			if _, err := redlocktest.GrantOnce(ctx, s, "open:"+name, time.Second); err != nil {
				t.Fatalf("a lock through the opened store: %v", err)
			}
		})
	}
}

func TestOpenRejectsBadURLs(t *testing.T) {
	for _, url := range []string{
		"",
		"http://a:1,b:2,c:3",
		"redlock://a:1,b:2",                  // fewer than 3 nodes
		"redlock://a:1,b,c:3",                // a node without port
		"redlock://a:1,b:2,c:3/?drift=x",     // not a number
		"redlock://a:1,b:2,c:3/?drift=0.9",   // out of range
		"redlock://a:1,b:2,c:3/?max_ttl=-1s", // not positive
		"redlock://a:1,b:2,c:3/?node_timeout=soon",
		"redlock://a:1,b:2,c:3/?fence_retention=1s",
		"redlock://a:1,b:2,c:3/?colour=blue", // unknown option
		"redis://a:1,redis://b:2,redis://c:3?db=x",
		"redlock://a:1,b:2,c:3/?connect=later",
	} {
		s, err := redlockstore.Open(context.Background(), url)
		if !errors.Is(err, stores.ErrInvalid) {
			if s != nil {
				_ = s.Close()
			}
			t.Errorf("Open(%q): %v, want an error wrapping ErrInvalid", url, err)
		}
	}
}

func TestNewRejectsInvalid(t *testing.T) {
	ok := func() []redis.Scripter {
		return redlocktest.Clients(t, []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"})
	}
	noTimeouts := ok()
	noTimeouts[1] = redis.NewClient(&redis.Options{Addr: "127.0.0.1:2"})
	t.Cleanup(func() { _ = noTimeouts[1].(*redis.Client).Close() })
	withNil := ok()
	withNil[2] = (*redis.Client)(nil)
	for name, tc := range map[string]struct {
		nodes []redis.Scripter
		opts  []redlockstore.Option
	}{
		"two nodes":            {ok()[:2], nil},
		"nil node":             {withNil, nil},
		"ignores deadlines":    {noTimeouts, nil},
		"zero node timeout":    {ok(), []redlockstore.Option{redlockstore.WithNodeTimeout(0)}},
		"negative max TTL":     {ok(), []redlockstore.Option{redlockstore.WithMaxTTL(-time.Second)}},
		"drift factor too big": {ok(), []redlockstore.Option{redlockstore.WithDrift(0.5, 0)}},
		"negative drift":       {ok(), []redlockstore.Option{redlockstore.WithDrift(0.01, -time.Millisecond)}},
		"short retention":      {ok(), []redlockstore.Option{redlockstore.WithFenceRetention(time.Second)}},
	} {
		if _, err := redlockstore.New(tc.nodes, tc.opts...); !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("%s: New: %v, want an error wrapping ErrInvalid", name, err)
		}
	}
}

// TestOpenUnreachable: Open fails at start-up when a quorum of nodes cannot
// be reached, naming them, unless connect=lazy; a lazy Store works once the
// nodes answer (issue 19 item 6). A dead minority does not stop Open.
func TestOpenUnreachable(t *testing.T) {
	addrs := testservers.RedisNodeAddrs(t)[:3]
	redlocktest.Admit(t, redlocktest.Clients(t, addrs))
	proxies := make([]*faultproxy.Proxy, len(addrs))
	for i, a := range addrs {
		proxies[i] = faultproxy.New(t, a)
	}
	open := func(ctx context.Context, addrs []string, lazy bool) (stores.Store, error) {
		u := "redlock://" + strings.Join(addrs, ",")
		if lazy {
			u += "?connect=lazy"
		}
		return redlockstore.Open(ctx, u)
	}
	storetest.Startup(t, proxies, open)

	proxyAddrs := []string{proxies[0].Addr(), proxies[1].Addr(), proxies[2].Addr()}
	proxies[2].Refuse()
	s, err := open(t.Context(), proxyAddrs, false)
	if err != nil {
		t.Fatalf("Open with 1 of 3 nodes down: %v; want a Store (a quorum answers)", err)
	}
	_ = s.(*redlockstore.Store).Close()
	proxies[1].Refuse()
	if _, err := open(t.Context(), proxyAddrs, false); !errors.Is(err, stores.ErrUnreachable) ||
		!strings.Contains(err.Error(), proxyAddrs[1]) || !strings.Contains(err.Error(), proxyAddrs[2]) ||
		strings.Contains(err.Error(), "reach "+proxyAddrs[0]) {
		t.Fatalf("Open with 2 of 3 nodes down: %v; want ErrUnreachable naming the 2", err)
	}
}
