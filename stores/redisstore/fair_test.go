package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores"
)

func TestFairKeysShareTheSlot(t *testing.T) {
	for _, key := range []string{"reqlock:sku:42", "reqlock:{sku:42}", "reqlock:{sku}:42", "a{b", "{", "ключ:😀"} {
		q, l := fairQueueKey(key), fairLeaseKey(key)
		if q == key || l == key || q == l || q == fenceKey(key) || l == fenceKey(key) {
			t.Errorf("%q: queue %q and lease %q clash", key, q, l)
		}
		for _, k := range []string{q, l} {
			if slot(k) != slot(key) {
				t.Errorf("%q hashes to slot %d, its lock key %q to %d", k, slot(k), key, slot(key))
			}
		}
	}
}

func FuzzFairKeysFollowFenceKey(f *testing.F) {
	for _, k := range []string{"reqlock:sku:42", "reqlock:{sku}:1", "a{b", "x}{y}", "{}", "{", "}"} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		if got := siblingKey(key, ":fence"); got != fenceKey(key) {
			t.Fatalf("siblingKey(%q, :fence) = %q, fenceKey %q", key, got, fenceKey(key))
		}
		if clusterSafe(key) && (slot(fairQueueKey(key)) != slot(key) || slot(fairLeaseKey(key)) != slot(key)) {
			t.Fatalf("fair keys of %q leave its slot", key)
		}
	})
}

// fairState reads a key's queue (token -> ticket) and leases (token ->
// deadline) behind the store's back.
func fairState(t *testing.T, c *redis.Client, key string) (queue, leases []redis.Z) {
	t.Helper()
	ctx := context.Background()
	queue, err := c.ZRangeWithScores(ctx, fairQueueKey(key), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	leases, err = c.ZRangeWithScores(ctx, fairLeaseKey(key), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	return queue, leases
}

func members(zs []redis.Z) []string {
	out := make([]string, len(zs))
	for i, z := range zs {
		out[i] = z.Member.(string)
	}
	return out
}

func TestFairStoredState(t *testing.T) {
	c := testredis.Client(t)
	s := newStore(t, c)
	ctx := context.Background()
	key := testredis.Prefix(t) + "k"
	lease := 3 * time.Second
	mustAcquire(t, s, []string{key}, "holder", time.Minute)
	for _, tok := range []string{"a", "b", "c"} {
		if g, err := s.AcquireFair(ctx, key, tok, time.Minute, lease); err != nil || g.OK {
			t.Fatalf("%s: %+v %v", tok, g, err)
		}
	}
	queue, leases := fairState(t, c, key)
	if got := strings.Join(members(queue), ","); got != "a,b,c" {
		t.Fatalf("queue %s, want a,b,c", got)
	}
	for i := 1; i < len(queue); i++ {
		if queue[i].Score <= queue[i-1].Score {
			t.Fatalf("tickets do not grow: %v", queue)
		}
	}
	tm, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	now := float64(tm.UnixMilli())
	for _, z := range leases {
		if z.Score < now || z.Score > now+float64(lease.Milliseconds()) {
			t.Fatalf("lease deadline of %v is %v, server now %v", z.Member, z.Score, now)
		}
	}
	// Both sets expire when abandoned, after at least two leases.
	for _, k := range []string{fairQueueKey(key), fairLeaseKey(key)} {
		pttl, err := c.PTTL(ctx, k).Result()
		if err != nil || pttl <= lease || pttl > 2*lease {
			t.Fatalf("PTTL %s = %v %v, want in (%v, %v]", k, pttl, err, lease, 2*lease)
		}
	}
	// A shorter lease never cuts the TTL a longer one set.
	if g, err := s.AcquireFair(ctx, key, "short", time.Minute, 100*time.Millisecond); err != nil || g.OK {
		t.Fatalf("short: %+v %v", g, err)
	}
	if pttl := c.PTTL(ctx, fairQueueKey(key)).Val(); pttl <= lease {
		t.Fatalf("a short lease cut the queue's TTL to %v", pttl)
	}
	if err := s.LeaveFair(ctx, key, "short"); err != nil {
		t.Fatal(err)
	}
	// Granting everybody empties both sets, which then no longer exist.
	mustRelease(t, s, []string{key}, "holder")
	for _, tok := range []string{"a", "b", "c"} {
		if g, err := s.AcquireFair(ctx, key, tok, time.Minute, lease); err != nil || !g.OK {
			t.Fatalf("%s: %+v %v, want granted", tok, g, err)
		}
		mustRelease(t, s, []string{key}, tok)
	}
	if n := c.Exists(ctx, fairQueueKey(key), fairLeaseKey(key)).Val(); n != 0 {
		t.Fatalf("%d fair keys left after the queue drained", n)
	}
}

// TestFairDropsBoundedAndRepairs: one attempt drops at most fairDropLimit dead
// waiters; queue entries without a lease are dropped; the rest go on later
// calls, and the live waiter behind them is granted.
func TestFairDropsBoundedAndRepairs(t *testing.T) {
	c := testredis.Client(t)
	s := newStore(t, c)
	ctx := context.Background()
	key := testredis.Prefix(t) + "k"
	const dead = 2*fairDropLimit + 10
	pipe := c.TxPipeline()
	for i := range dead {
		tok := "dead" + strconv.Itoa(i)
		pipe.ZAdd(ctx, fairQueueKey(key), redis.Z{Score: float64(i + 1), Member: tok})
		pipe.ZAdd(ctx, fairLeaseKey(key), redis.Z{Score: 1, Member: tok}) // lapsed long ago
	}
	pipe.ZAdd(ctx, fairQueueKey(key), redis.Z{Score: 0, Member: "no-lease"}) // the head, with no lease
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := s.AcquireFair(ctx, key, "live", time.Minute, time.Minute)
	if err != nil || g.OK {
		t.Fatalf("first attempt: %+v %v, want refused (dead waiters remain ahead)", g, err)
	}
	queue, _ := fairState(t, c, key)
	if left := len(queue) - 1; left <= 0 || left >= dead {
		t.Fatalf("%d dead waiters left after one attempt, want some dropped and some left", left)
	}
	if slicesContain(members(queue), "no-lease") {
		t.Fatal("the entry without a lease is still queued")
	}
	for i := 0; ; i++ {
		g, err := s.AcquireFair(ctx, key, "live", time.Minute, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if g.OK {
			break
		}
		if i > dead/fairDropLimit+2 {
			t.Fatal("the live waiter was not granted")
		}
	}
	if n := c.Exists(ctx, fairQueueKey(key), fairLeaseKey(key)).Val(); n != 0 {
		t.Fatalf("%d fair keys left", n)
	}
}

func slicesContain(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestFairBadFenceKeyWritesNothing: like Acquire, a fence key holding
// something else fails the call before anything is written.
func TestFairBadFenceKeyWritesNothing(t *testing.T) {
	c := testredis.Client(t)
	s := newStore(t, c)
	ctx := context.Background()
	key := testredis.Prefix(t) + "k"
	if err := c.Set(ctx, fenceKey(key), "not a number", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := s.AcquireFair(ctx, key, "t", time.Minute, time.Minute)
	if err == nil || !strings.Contains(err.Error(), "does not hold a fence") {
		t.Fatalf("AcquireFair with a bad fence key: %v", err)
	}
	if n := c.Exists(ctx, key, fairQueueKey(key), fairLeaseKey(key)).Val(); n != 0 {
		t.Fatalf("%d keys written", n)
	}
}

// TestFairTicketsGrowWhenClockStepsBack: a queue whose tail carries a ticket
// from the future (a clock that stepped back) still queues newcomers after it.
func TestFairTicketsGrowWhenClockStepsBack(t *testing.T) {
	c := testredis.Client(t)
	s := newStore(t, c)
	ctx := context.Background()
	key := testredis.Prefix(t) + "k"
	mustAcquire(t, s, []string{key}, "holder", time.Minute)
	future := float64(time.Now().Add(time.Hour).UnixMicro())
	pipe := c.TxPipeline()
	pipe.ZAdd(ctx, fairQueueKey(key), redis.Z{Score: future, Member: "early"})
	pipe.ZAdd(ctx, fairLeaseKey(key), redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: "early"})
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if g, err := s.AcquireFair(ctx, key, "late", time.Minute, time.Minute); err != nil || g.OK {
		t.Fatalf("late: %+v %v", g, err)
	}
	queue, _ := fairState(t, c, key)
	if got := strings.Join(members(queue), ","); got != "early,late" {
		t.Fatalf("queue %s, want early,late", got)
	}
}

func TestFairInvalidAndUnexpected(t *testing.T) {
	s := newStore(t, testredis.Client(t))
	if _, err := s.AcquireFair(context.Background(), "k", "t", time.Second, -time.Second); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("negative lease: %v", err)
	}
}
