package redlockstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/stores/redlockstore"
)

// TestUndoSparesLaterAttempt: the undo of an attempt whose call timed out
// after the attempt returned (a refusal) must not release what a later
// attempt with the same token (the waiter's retry) has since been granted on
// that node.
func TestUndoSparesLaterAttempt(t *testing.T) {
	const timeout = 300 * time.Millisecond
	s, proxies, direct := proxiedNodes(t, redlockstore.WithNodeTimeout(timeout))
	warm(t, s)
	ctx := context.Background()
	key := uniqueKey("undo-spares")
	// Another holder on nodes 0-2: the first attempt is refused there.
	for _, n := range direct[:3] {
		if err := n.(*redis.Client).Set(ctx, key, "other", 10*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Node 4 gets the first attempt's call late, after it timed out.
	answered := proxies[4].DelayNextRequest(3 * timeout)
	g, err := s.Acquire(ctx, []string{key}, "t", 10*time.Second)
	if err != nil || g.OK {
		t.Fatalf("first attempt: %+v, %v; want a refusal", g, err)
	}
	if proxies[4].Armed() != 0 {
		t.Fatal("the first attempt's call to node 4 was not held back")
	}
	for _, n := range direct[:3] {
		if err := n.(*redis.Client).Del(ctx, key).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The retry, while the first attempt's call to node 4 is still out.
	if g, err := s.Acquire(ctx, []string{key}, "t", 10*time.Second); err != nil || !g.OK {
		t.Fatalf("retry: %+v, %v; want a grant", g, err)
	}
	if h := holders(t, direct, key); h[4] != "t" {
		t.Fatalf("the retry was granted without node 4: holders %q", h)
	}
	select {
	case <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first attempt's call never reached node 4")
	}
	// The first attempt's undo on node 4 ran when its call timed out, well
	// before the call reached the node.
	if h := holders(t, direct, key); h[4] != "t" {
		t.Fatalf("the first attempt's undo released the retry's grant on node 4: holders %q", h)
	}
	if err := s.Release(ctx, []string{key}, "t", 0); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// TestRefreshDuringReleaseWritesNothing: a Refresh that starts while a
// Release of its token is under way (the Release's calls held back on their
// way to the nodes) writes nothing, and above all does not re-take a node
// the Release has already passed.
func TestRefreshDuringReleaseWritesNothing(t *testing.T) {
	s, proxies, direct := proxiedNodes(t, redlockstore.WithNodeTimeout(3*time.Second))
	warm(t, s)
	ctx := context.Background()
	key := uniqueKey("refresh-during-release")
	if g, err := s.Acquire(ctx, []string{key}, "t", 10*time.Second); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	// Node 4 lost the lock (restarted empty, say): a Refresh on top of a
	// quorum re-takes it.
	if err := direct[4].(*redis.Client).Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	// The Release reaches node 4 at once, nodes 0-3 500ms late.
	for _, p := range proxies[:4] {
		p.DelayNextRequest(500 * time.Millisecond)
	}
	released := make(chan error, 1)
	go func() { released <- s.Release(ctx, []string{key}, "t", 0) }()
	if err := eventually(5*time.Second, func() error {
		for i, p := range proxies[:4] {
			if p.Armed() != 0 {
				return fmt.Errorf("the Release's call to node %d has not left", i)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	err := s.Refresh(ctx, []string{key}, "t", 10*time.Second)
	t.Logf("the Refresh during the Release: %v", err)
	if err := <-released; err != nil {
		t.Fatalf("Release: %v", err)
	}
	if h := holders(t, direct, key); strings.Join(h, "") != "" {
		t.Fatalf("after Release returned nil, the key is held: holders %q", h)
	}
}
