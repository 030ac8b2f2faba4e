package redisstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// TestOpenUnreachable: Open fails at start-up when Redis cannot be reached,
// naming its address, unless connect=lazy, and a lazy Store works once
// Redis answers (issue 19 item 6: redis://127.0.0.1:1 used to start).
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
	s, err := Open(ctx, "redis://"+testredis.Addr(t)+"/0?connect=check&read_timeout=2s")
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := s.Acquire(ctx, []string{testredis.Prefix(t) + "k"}, "t", time.Second); !errors.Is(err, redis.ErrClosed) {
		t.Error("Close left Open's client open")
	}
	for _, bad := range []string{
		"redis://" + testredis.Addr(t) + "/0?connect=maybe",
		"redis://u:secret@" + testredis.Addr(t) + "/0?no_such_option=1",
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
}
