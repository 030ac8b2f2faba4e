package testredis

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A command the proxy holds back reaches Redis after its client gave up,
// and after a command another connection sent later: the late one wins.
func TestProxyDelayedCommandRunsAfterLaterOnes(t *testing.T) {
	p := NewProxy(t)
	direct := Client(t)
	key := Prefix(t) + "k"
	viaProxy := func() *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		if err := c.Ping(context.Background()).Err(); err != nil { // connected before the fault is armed
			t.Fatalf("PING through the proxy: %v", err)
		}
		return c
	}
	late, prompt := viaProxy(), viaProxy()
	ctx := context.Background()

	answered := p.DelayNextRequest(200 * time.Millisecond)
	tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := late.Set(tctx, key, "late", 0).Err(); err == nil {
		t.Fatal("a command held back 200ms was answered within 20ms")
	}
	if err := prompt.Set(ctx, key, "prompt", 0).Err(); err != nil {
		t.Fatalf("SET on another connection: %v", err)
	}
	if v := direct.Get(ctx, key).Val(); v != "prompt" {
		t.Fatalf("GET before the held command arrived: %q, want %q", v, "prompt")
	}
	select {
	case <-answered:
	case <-time.After(5 * time.Second):
		t.Fatal("the held command was not answered within 5s")
	}
	if v := direct.Get(ctx, key).Val(); v != "late" {
		t.Fatalf("GET after the held command was answered: %q, want %q: it did not run", v, "late")
	}
}
