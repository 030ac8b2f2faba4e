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
	"github.com/reqlock/reqlock/stores/redlockstore"
)

func TestOpen(t *testing.T) {
	addrs := testservers.RedisNodeAddrs(t)
	admit(t, clients(t, addrs))
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
			if _, err := grantOnce(ctx, s, "open:"+name, time.Second); err != nil {
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
		return clients(t, []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"})
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
