package redlocktest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// slowMinority delays the requests to nodes 0-2 by 20ms and to nodes 3-4 by
// 35ms: a quorum decides at about 20ms, and the other two answer well
// within the grace (twice the slowest answer) after it. It heals at the
// end of the test.
func slowMinority(t *testing.T, proxies []*faultproxy.Proxy) {
	t.Helper()
	for i, p := range proxies {
		d := 20 * time.Millisecond
		if i >= 3 {
			d = 35 * time.Millisecond
		}
		p.Delay(faultproxy.ToServer, d)
		t.Cleanup(p.Heal)
	}
}

// ReleaseWaitsForHealthyStragglers (issue 19 follow-up): once a quorum
// has released, Release gives the other nodes a short grace, so that on a
// cluster whose nodes all answer a Release that returned nil leaves the key
// held nowhere (the conformance suite's next refusal must not name a key a
// minority still held for a moment).
func ReleaseWaitsForHealthyStragglers(t *testing.T, c Client) {
	s, proxies, direct := proxiedNodes(t, c)
	warm(t, s)
	ctx, key, token := context.Background(), uniqueKey("grace-release"), uniqueKey("token")
	if g, err := s.Acquire(ctx, []string{key}, token, 10*time.Second); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	slowMinority(t, proxies)
	if err := s.Release(ctx, []string{key}, token, 0); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if h := holders(t, direct, key); strings.Join(h, "") != "" {
		t.Fatalf("after Release returned, holders %q: want the key released on every node", h)
	}
}

// RefreshWaitsForHealthyStragglers (issue 19 follow-up): as Release,
// Refresh gives the nodes still out a short grace once a quorum renewed:
// on a cluster whose nodes all answer, the new TTL is on every node when
// it returns.
func RefreshWaitsForHealthyStragglers(t *testing.T, c Client) {
	s, proxies, direct := proxiedNodes(t, c)
	warm(t, s)
	ctx, key, token := context.Background(), uniqueKey("grace-refresh"), uniqueKey("token")
	if g, err := s.Acquire(ctx, []string{key}, token, 2*time.Second); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	t.Cleanup(func() { _ = s.Release(context.Background(), []string{key}, token, 0) })
	slowMinority(t, proxies)
	if err := s.Refresh(ctx, []string{key}, token, time.Minute); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	for i, n := range direct {
		ttl, err := n.(*redis.Client).PTTL(ctx, key).Result()
		if err != nil {
			t.Fatalf("PTTL on node %d: %v", i, err)
		}
		if ttl < 30*time.Second {
			t.Fatalf("after Refresh returned, node %d has the key for %v more: want the new TTL (1m) on every node", i, ttl)
		}
	}
}

// RefusalNamesMostRefusedKey (issue 19 follow-up): a refusal's Held
// names the key the most nodes refused with, not a key a minority (here
// including the gate) still holds for a moment.
func RefusalNamesMostRefusedKey(t *testing.T, c Client) {
	s, proxies, direct := proxiedNodes(t, c)
	// Connections open and round trips known: the replies of the refusal
	// come together, within the grace that waits for the last of them.
	warm(t, s)
	ctx := context.Background()
	a, b := uniqueKey("held-a"), uniqueKey("held-b")
	keys := []string{a, b}
	if a > b {
		keys = []string{b, a}
	}
	if g, err := s.Acquire(ctx, keys[1:], "holder", 10*time.Second); err != nil || !g.OK {
		t.Fatalf("Acquire of the second key: %+v, %v", g, err)
	}
	t.Cleanup(func() { _ = s.Release(context.Background(), keys[1:], "holder", 0) })
	// A stale hold of the first key on a minority that includes the gate.
	gate := gate(s, keys[0])
	stale := []int{gate, (gate + 1) % len(direct)}
	for _, i := range stale {
		if err := direct[i].(*redis.Client).Set(ctx, keys[0], "stale#1", 10*time.Second).Err(); err != nil {
			t.Fatalf("SET on node %d: %v", i, err)
		}
		t.Cleanup(func() { direct[i].(*redis.Client).Del(context.Background(), keys[0]) })
	}
	// Every reply 20ms late: the decision takes that long, and so does the
	// grace after it, while the replies still come in one burst, so that a
	// loaded machine's scheduling does not end the grace before the last.
	for _, p := range proxies {
		p.Delay(faultproxy.ToClient, 20*time.Millisecond)
	}
	g, err := s.Acquire(ctx, keys, uniqueKey("token"), 10*time.Second)
	for _, p := range proxies {
		p.Heal()
	}
	if err != nil || g.OK {
		t.Fatalf("Acquire of both keys: %+v, %v: want a refusal", g, err)
	}
	if g.Held != 1 {
		t.Fatalf("refusal names key %d: want 1, the key every node refused with (key 0 is held on a minority)", g.Held)
	}
}
