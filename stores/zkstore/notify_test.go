package zkstore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
	"github.com/reqlock/reqlock/stores/zkstore"
)

// TestSubscriptionPastGoneWaiter (issue 18, from review): a queued
// waiter's subscription that finds the waiter ahead of it gone when it sets
// its watch signals, and then watches the node that now comes before it,
// here the lock node: the holder's release signals it again. Before the
// fix, it kept watching for the creation of the gone queue node, whose
// name never comes back (a watch the server and the client kept for the
// session), and missed every later release.
func TestSubscriptionPastGoneWaiter(t *testing.T) {
	holder := newStore(t)
	w3, p := proxiedStore(t, zkstore.WithRoot(holder.Root()))
	w2 := sameRootStore(t, holder)
	ctx := t.Context()
	if g, err := holder.Acquire(ctx, []string{"k"}, "h", 10*time.Second); err != nil || !g.OK {
		t.Fatalf("the holder's Acquire: %+v, %v", g, err)
	}
	if g, err := w2.AcquireFair(ctx, "k", "w2", 10*time.Second, 10*time.Second); err != nil || g.OK || g.Ahead != 0 {
		t.Fatalf("w2: %+v, %v; want queued at the head", g, err)
	}
	if g, err := w3.AcquireFair(ctx, "k", "w3", 10*time.Second, 10*time.Second); err != nil || g.OK || g.Ahead != 1 {
		t.Fatalf("w3: %+v, %v; want queued behind w2", g, err)
	}
	// The subscription's watch of w2's node (the only request that names
	// it from here on) is held until w2 has left.
	p.DelayWhen(faultproxy.ToServer, func(chunk []byte) bool { return strings.Contains(string(chunk), "q-w2-") }, time.Minute)
	released, stop := w3.NotifyRelease("k", "w3")
	defer stop()
	pollUntil(t, 10*time.Second, "the watch of w2's node is held", func() bool { return p.Armed() == 0 })
	if err := w2.LeaveFair(ctx, "k", "w2"); err != nil {
		t.Fatal(err)
	}
	p.Heal()
	expectSignal(t, released, 5*time.Second, "once the waiter ahead is found gone")
	if err := holder.Release(ctx, []string{"k"}, "h", 0); err != nil {
		t.Fatal(err)
	}
	expectSignal(t, released, 5*time.Second, "at the holder's release, to the waiter now at the head")
	if g, err := w3.AcquireFair(ctx, "k", "w3", 10*time.Second, 10*time.Second); err != nil || !g.OK {
		t.Fatalf("w3 after the release: %+v, %v", g, err)
	}
}
