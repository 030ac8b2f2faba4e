package redlocktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redlockstore"
)

// LimitQuorums: readers and a limit of 1 are granted by a majority, a
// limit of 2 or more by every node only (see Shared and limited grants in
// the package documentation): with one node holding the key for another
// client, a limit of 3 is refused while a reader and a limit of 1 get in,
// and a place of a limit of 3 that one node lost is not renewed.
func LimitQuorums(t *testing.T, c Client) {
	nodes := clients(t, testservers.RedisNodeAddrs(t))
	admit(t, nodes)
	s := newStore(t, c, nodes, redlockstore.WithNodeTimeout(5*time.Second))
	ctx := t.Context()
	key := "redlock:limitquorums:" + t.Name() + time.Now().Format(time.RFC3339Nano)
	one := nodes[0].(*redis.Client)
	if err := one.Set(ctx, key, "another-client", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	for _, limit := range []int{0, 1} {
		g, err := s.AcquireShared(ctx, key+":free", "warm", limit, time.Second)
		if err != nil || !g.OK {
			t.Fatalf("AcquireShared of a free key, limit %d: %+v, %v", limit, g, err)
		}
		if err := s.ReleaseShared(ctx, key+":free", "warm", 0); err != nil {
			t.Fatal(err)
		}
		g, err = s.AcquireShared(ctx, key, "r", limit, 10*time.Second)
		if err != nil || !g.OK {
			t.Fatalf("AcquireShared, limit %d, with one node of %d held: %+v, %v; want granted by a majority", limit, len(nodes), g, err)
		}
		if err := s.ReleaseShared(ctx, key, "r", 0); err != nil {
			t.Fatalf("ReleaseShared, limit %d: %v", limit, err)
		}
	}
	g, err := s.AcquireShared(ctx, key, "l", 3, 10*time.Second)
	if err != nil || g.OK {
		t.Fatalf("AcquireShared, limit 3, with one node of %d held: %+v, %v; want refused (every node needed)", len(nodes), g, err)
	}
	if err := one.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	if g, err := s.AcquireShared(ctx, key, "l", 3, 10*time.Second); err != nil || !g.OK {
		t.Fatalf("AcquireShared, limit 3, on every node: %+v, %v", g, err)
	}
	// A node loses the place (as if restarted): the renewal needs it.
	if err := one.Del(ctx, key, key+":places").Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.RefreshShared(ctx, key, "l", 10*time.Second); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("RefreshShared of a limit-3 place lost on one node: %v, want ErrNotHeld", err)
	}
	_ = s.ReleaseShared(context.WithoutCancel(ctx), key, "l", 0)
}
