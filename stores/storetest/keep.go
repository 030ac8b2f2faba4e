package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
)

// RunKeep runs the conformance suite of reqlock.KeepReleaser as subtests of
// t. newStore is called once per subtest and must return a store that
// implements reqlock.KeepReleaser. The signal subtests apply to stores that
// also implement reqlock.ReleaseNotifier; other stores pass them with a log
// line.
func RunKeep(t *testing.T, newStore func(t *testing.T) reqlock.Store) {
	runSuite(t, newStore, "", []suiteCase[reqlock.KeepReleaser]{
		{"LeavesKeyHeldUntilKeep", testKeepLeavesKeyHeld},
		{"RecordsLastFence", testKeepRecordsFence},
		{"WrongTokenOrAbsent", testKeepWrongToken},
		{"NonPositiveKeepReleases", testKeepNonPositive},
		{"CancelledContext", testKeepCancelled},
		{"DoesNotSignal", withNotifier(testKeepNoSignal)},
		{"NonPositiveKeepSignals", withNotifier(testKeepZeroSignals)},
	})
}

func testKeepLeavesKeyHeld(t *testing.T, s reqlock.Store, kr reqlock.KeepReleaser, key func(string) string) {
	ctx := context.Background()
	k := key("k")
	if g := mustAcquire(t, s, k, "t1", longTTL); !g.OK {
		t.Fatalf("Acquire: %+v", g)
	}
	start := time.Now()
	if err := kr.ReleaseKeep(ctx, k, "t1", 0, keepTTL); err != nil {
		t.Fatalf("ReleaseKeep: %v", err)
	}
	expectHeld(t, s, []string{k}, keepTTL, "right after ReleaseKeep")
	end := waitFree(t, s, []string{k}, keepTTL+5*time.Second)
	if d := end.Sub(start); d < keepTTL-10*time.Millisecond {
		t.Fatalf("kept key free after %v, want >= %v", d, keepTTL-10*time.Millisecond)
	}
	if err := kr.ReleaseKeep(ctx, k, "t1", 0, keepTTL); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("ReleaseKeep after the key expired: got %v, want ErrNotHeld", err)
	}

	// A keep longer than the TTL left extends the hold.
	if g := mustAcquire(t, s, k, "t2", time.Second); !g.OK {
		t.Fatalf("Acquire: %+v", g)
	}
	if err := kr.ReleaseKeep(ctx, k, "t2", 0, 5*time.Second); err != nil {
		t.Fatalf("ReleaseKeep: %v", err)
	}
	if held, ttl := holder(t, s, k); !held || ttl <= time.Second {
		t.Fatalf("after ReleaseKeep of 5s on a 1s lock: held %v, TTL %v; want held with TTL > 1s", held, ttl)
	}
	if err := s.Release(ctx, k, "t2", 0); err != nil {
		t.Fatalf("Release of the kept key by its token: %v", err)
	}
}

func testKeepRecordsFence(t *testing.T, s reqlock.Store, kr reqlock.KeepReleaser, key func(string) string) {
	ctx := context.Background()
	k := key("k")
	g1 := mustAcquire(t, s, k, "t1", longTTL)
	raised := g1.Fence + 1000
	if err := kr.ReleaseKeep(ctx, k, "t1", raised, 20*time.Millisecond); err != nil {
		t.Fatalf("ReleaseKeep: %v", err)
	}
	g2 := pollAcquire(t, s, k, "t2", longTTL, 5*time.Second)
	if g2.Fence <= raised {
		t.Fatalf("fence after a ReleaseKeep reporting %d is %d, want higher", raised, g2.Fence)
	}
	if err := kr.ReleaseKeep(ctx, k, "t2", 1, 20*time.Millisecond); err != nil {
		t.Fatalf("ReleaseKeep: %v", err)
	}
	g3 := pollAcquire(t, s, k, "t3", longTTL, 5*time.Second)
	if g3.Fence <= g2.Fence {
		t.Fatalf("a ReleaseKeep reporting a low fence lowered the next one: %d after %d", g3.Fence, g2.Fence)
	}
	_ = s.Release(ctx, k, "t3", 0)
}

func testKeepWrongToken(t *testing.T, s reqlock.Store, kr reqlock.KeepReleaser, key func(string) string) {
	ctx := context.Background()
	k := key("k")
	if g := mustAcquire(t, s, k, "t1", longTTL); !g.OK {
		t.Fatalf("Acquire: %+v", g)
	}
	for _, keep := range []time.Duration{keepTTL, 0} {
		if err := kr.ReleaseKeep(ctx, k, "t2", 0, keep); !errors.Is(err, reqlock.ErrNotHeld) {
			t.Fatalf("ReleaseKeep (keep %v) with a wrong token: got %v, want ErrNotHeld", keep, err)
		}
	}
	// The holder's TTL is untouched.
	if held, ttl := holder(t, s, k); !held || ttl <= keepTTL {
		t.Fatalf("after wrong-token ReleaseKeep calls: held %v, TTL %v; want held with TTL > %v", held, ttl, keepTTL)
	}
	if err := kr.ReleaseKeep(ctx, key("absent"), "t1", 0, keepTTL); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("ReleaseKeep of an absent key: got %v, want ErrNotHeld", err)
	}
	expectFree(t, s, []string{key("absent")}, "after ReleaseKeep of an absent key")
	if err := s.Release(ctx, k, "t1", 0); err != nil {
		t.Fatalf("Release by the holder: %v", err)
	}
}

func testKeepNonPositive(t *testing.T, s reqlock.Store, kr reqlock.KeepReleaser, key func(string) string) {
	ctx := context.Background()
	k := key("k")
	for _, keep := range []time.Duration{0, -time.Second} {
		g1 := mustAcquire(t, s, k, "t1", longTTL)
		if !g1.OK {
			t.Fatalf("Acquire: %+v", g1)
		}
		raised := g1.Fence + 1000
		if err := kr.ReleaseKeep(ctx, k, "t1", raised, keep); err != nil {
			t.Fatalf("ReleaseKeep with keep %v: %v", keep, err)
		}
		g2 := mustAcquire(t, s, k, "t2", longTTL)
		if !g2.OK {
			t.Fatalf("Acquire right after ReleaseKeep with keep %v: %+v, want granted", keep, g2)
		}
		if g2.Fence <= raised {
			t.Fatalf("fence after ReleaseKeep (keep %v) reporting %d is %d, want higher", keep, raised, g2.Fence)
		}
		if err := s.Release(ctx, k, "t2", 0); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
}

func testKeepCancelled(t *testing.T, s reqlock.Store, kr reqlock.KeepReleaser, key func(string) string) {
	k := key("k")
	if g := mustAcquire(t, s, k, "t1", time.Second); !g.OK {
		t.Fatalf("Acquire: %+v", g)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, keep := range []time.Duration{longTTL, 0} {
		if err := kr.ReleaseKeep(ctx, k, "t1", 0, keep); err == nil {
			t.Fatalf("ReleaseKeep (keep %v) on a cancelled context succeeded", keep)
		}
	}
	expectHeld(t, s, []string{k}, time.Second, "after ReleaseKeep on a cancelled context")
	if err := s.Release(context.Background(), k, "t1", 0); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func testKeepNoSignal(t *testing.T, s reqlock.Store, kr reqlock.KeepReleaser, n reqlock.ReleaseNotifier, key func(string) string) {
	ctx := context.Background()
	k := key("k")
	ch := quietSubscriptions(t, s, n, key, k)[0]
	if g := mustAcquire(t, s, k, "t1", longTTL); !g.OK {
		t.Fatalf("Acquire: %+v", g)
	}
	// A keep that outlives the test: an expiry may signal in some stores.
	if err := kr.ReleaseKeep(ctx, k, "t1", 0, longTTL); err != nil {
		t.Fatalf("ReleaseKeep: %v", err)
	}
	flush(t, s, n, key) // a signal of the ReleaseKeep would have arrived by now
	expectNone(t, ch, "after ReleaseKeep: the key stays held")
	if err := s.Release(ctx, k, "t1", 0); err != nil {
		t.Fatalf("Release of the kept key by its token: %v", err)
	}
	expectSignal(t, ch, "after the final Release")
}

func testKeepZeroSignals(t *testing.T, s reqlock.Store, kr reqlock.KeepReleaser, n reqlock.ReleaseNotifier, key func(string) string) {
	k := key("k")
	ch := quietSubscriptions(t, s, n, key, k)[0]
	if g := mustAcquire(t, s, k, "t1", longTTL); !g.OK {
		t.Fatalf("Acquire: %+v", g)
	}
	if err := kr.ReleaseKeep(context.Background(), k, "t1", 0, 0); err != nil {
		t.Fatalf("ReleaseKeep with keep 0: %v", err)
	}
	expectSignal(t, ch, "after ReleaseKeep with keep 0, a plain release")
}
