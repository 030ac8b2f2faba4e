package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores/redisstore/internal/redistest"
)

// openURL is Open without options.
func openURL(ctx context.Context, rawURL string) (*Store, error) { return Open(ctx, rawURL) }

// TestOpenUnreachable: Open fails at start-up when Redis cannot be reached,
// naming its address, unless connect=lazy, and a lazy Store works once
// Redis answers (issue 19 item 6: redis://127.0.0.1:1 used to start).
func TestOpenUnreachable(t *testing.T) {
	redistest.OpenUnreachable(t, testredis.Addr(t), openURL)
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
	redistest.OpenRejects(t, testredis.Addr(t), openURL)
}
