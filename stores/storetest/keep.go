package storetest

import (
	"fmt"
	"testing"
	"time"
)

// keepTests are the Keep subtests: Release with a positive keep leaves the
// keys held by the token until keep has passed. Each checks a set of one key
// and a set of three.
var keepTests = []subtest{
	{name: "LeavesKeysHeldUntilKeep", run: testKeepLeavesKeysHeld},
	{name: "ExtendsAShorterTTL", run: testKeepExtends},
	{name: "FencesGrowAcrossKeepAndExpiry", run: testKeepFences},
	{name: "WrongTokenOrAbsent", run: testKeepWrongToken},
	{name: "TakenOverKey", run: testKeepTakenOver},
	{name: "NonPositiveKeepReleases", run: testKeepNonPositive},
	{name: "CancelledContext", run: testKeepCancelled},
}

// testKeepLeavesKeysHeld: after a Release with keep the keys stay held, with
// at most keep left, refuse other tokens, and are free once keep has passed,
// not before; the token no longer releases them then.
func testKeepLeavesKeysHeld(t *testing.T, e *env) {
	ctx := t.Context()
	for _, keys := range e.keySets("k") {
		e.mustAcquire(t, keys, "t1", e.long)
		start := time.Now()
		if err := e.s.Release(ctx, keys, "t1", e.keep); err != nil {
			t.Fatalf("Release(%q) with keep %v: %v", keys, e.keep, err)
		}
		e.expectHeld(t, keys, e.keep, "right after Release with keep")
		if g := e.acquire(t, keys, "t2", e.long); g.OK {
			t.Fatalf("Acquire(%q) right after Release with keep: %+v, want refused", keys, g)
		}
		// Waiting for keep to run out is the behaviour under test.
		end := e.waitFree(t, keys, e.keep+expiryLimit)
		if d := end.Sub(start); d < e.keep-expiryEarly {
			t.Fatalf("kept keys %q free after %v, want >= %v", keys, d, e.keep-expiryEarly)
		}
		for _, keep := range []time.Duration{e.keep, 0} {
			expectNotHeld(t, e.s.Release(ctx, keys, "t1", keep),
				fmt.Sprintf("Release(%q) with keep %v after the kept keys expired", keys, keep))
		}
	}
}

// testKeepExtends: a keep longer than the TTL left extends the hold, and the
// token still releases the kept keys.
func testKeepExtends(t *testing.T, e *env) {
	ctx := t.Context()
	for _, keys := range e.keySets("k") {
		e.mustAcquire(t, keys, "t1", e.short)
		if err := e.s.Release(ctx, keys, "t1", e.long/2); err != nil {
			t.Fatalf("Release(%q) with keep %v: %v", keys, e.long/2, err)
		}
		for _, k := range keys {
			if held, ttl := e.probe(t, k); !held || ttl <= e.short {
				t.Fatalf("%q after a keep of %v on a %v lock: held %v, TTL %v; want held with TTL > %v", k, e.long/2, e.short, held, ttl, e.short)
			}
		}
		e.mustRelease(t, keys, "t1")
		e.expectFree(t, keys, "after the kept keys' Release by their token")
	}
}

// testKeepFences: the grant after a kept release has fences a stride above
// the released grant's, and so has the grant after that one expired
// unreleased.
func testKeepFences(t *testing.T, e *env) {
	ctx := t.Context()
	for _, keys := range e.keySets("k") {
		g1 := e.mustAcquire(t, keys, "t1", e.long)
		if err := e.s.Release(ctx, keys, "t1", e.expiry); err != nil {
			t.Fatalf("Release(%q) with keep %v: %v", keys, e.expiry, err)
		}
		// Waiting for keep, then the TTL, to run out is the behaviour
		// under test.
		g2 := e.pollAcquire(t, keys, "t2", e.expiry, e.expiry+expiryLimit)
		expectStrides(t, keys, g1.Fences, g2.Fences, "Acquire after a kept release")
		g3 := e.pollAcquire(t, keys, "t3", e.long, e.expiry+expiryLimit)
		expectStrides(t, keys, g2.Fences, g3.Fences, "Acquire after an expiry")
		e.mustRelease(t, keys, "t3")
	}
}

// testKeepWrongToken: a Release with keep of keys held by another token, or
// absent, returns ErrNotHeld and changes nothing: the holder's TTL stays,
// and an absent key stays free.
func testKeepWrongToken(t *testing.T, e *env) {
	ctx := t.Context()
	for _, keys := range e.keySets("k") {
		e.mustAcquire(t, keys, "t1", e.long)
		for _, keep := range []time.Duration{e.keep, 0} {
			expectNotHeld(t, e.s.Release(ctx, keys, "t2", keep),
				fmt.Sprintf("Release(%q) (keep %v) with a wrong token", keys, keep))
		}
		for _, k := range keys {
			if held, ttl := e.probe(t, k); !held || ttl <= e.keep {
				t.Fatalf("%q after wrong-token releases: held %v, TTL %v; want held with TTL > %v", k, held, ttl, e.keep)
			}
		}
		e.mustRelease(t, keys, "t1")
	}
	absent := e.keys("absent")
	expectNotHeld(t, e.s.Release(ctx, absent, "t1", e.keep), "Release with keep of an absent key")
	e.expectFree(t, absent, "after a Release with keep of an absent key")
}

// testKeepTakenOver: a Release with keep of a set one of whose keys changed
// hands returns ErrNotHeld, after keeping the others held for keep, and
// leaves the new owner's TTL alone.
func testKeepTakenOver(t *testing.T, e *env) {
	ctx := t.Context()
	keys := e.keys("a", "b", "c")
	e.mustAcquire(t, keys, "t1", e.long)
	// b changes hands behind the grant's back, as after an expiry.
	e.mustRelease(t, keys[1:2], "t1")
	e.mustAcquire(t, keys[1:2], "other", e.long)
	expectNotHeld(t, e.s.Release(ctx, keys, "t1", e.keep), "Release with keep and a key taken over")
	e.expectHeld(t, []string{keys[0], keys[2]}, e.keep, "the kept keys of a Release with a key taken over")
	if held, ttl := e.probe(t, keys[1]); !held || ttl <= e.keep {
		t.Fatalf("%q, taken over, after the other token's Release with keep: held %v, TTL %v; want held with TTL > %v", keys[1], held, ttl, e.keep)
	}
	e.mustRelease(t, keys[1:2], "other")
	expectNotHeld(t, e.s.Release(ctx, keys, "t1", 0), "Release with b gone")
	e.expectFree(t, keys, "after the cleanup")
}

// testKeepNonPositive: a keep of zero or less is a plain release: the keys
// are free at once, for a grant a stride above.
func testKeepNonPositive(t *testing.T, e *env) {
	ctx := t.Context()
	for _, keys := range e.keySets("k") {
		for _, keep := range []time.Duration{0, -time.Second} {
			g1 := e.mustAcquire(t, keys, "t1", e.long)
			if err := e.s.Release(ctx, keys, "t1", keep); err != nil {
				t.Fatalf("Release(%q) with keep %v: %v", keys, keep, err)
			}
			g2 := e.acquire(t, keys, "t2", e.long)
			if !g2.OK {
				t.Fatalf("Acquire(%q) right after Release with keep %v: %+v, want granted", keys, keep, g2)
			}
			expectStrides(t, keys, g1.Fences, g2.Fences, fmt.Sprintf("Acquire after Release with keep %v", keep))
			e.mustRelease(t, keys, "t2")
		}
	}
}

// testKeepCancelled: a Release with keep on an ended context fails and
// changes nothing.
func testKeepCancelled(t *testing.T, e *env) {
	ctx := cancelled()
	for _, keys := range e.keySets("k") {
		e.mustAcquire(t, keys, "t1", e.short)
		for _, keep := range []time.Duration{e.long, 0} {
			if err := e.s.Release(ctx, keys, "t1", keep); err == nil {
				t.Fatalf("Release(%q) (keep %v) on a cancelled context succeeded", keys, keep)
			}
		}
		e.expectHeld(t, keys, e.short, "after Release on a cancelled context")
		e.mustRelease(t, keys, "t1")
	}
}
