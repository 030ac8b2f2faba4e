package privateredis

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Start gives a server that answers, and Stop stops it and removes its
// directory.
func TestStartStop(t *testing.T) {
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	s.Stop()
	if err := ping(s.Addr()); err == nil {
		t.Fatal("the server still answers after Stop")
	}
	if _, err := os.Stat(s.dir); !os.IsNotExist(err) {
		t.Fatalf("its directory %s: %v, want it removed", s.dir, err)
	}
	s.Stop() // a second Stop does nothing
}

// Restart gives an empty server on the same address.
func TestRestart(t *testing.T) {
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS k after Restart: %d, %v; want 0 (an empty server)", n, err)
	}
}
