package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
)

// keepTTL is the keep of the subtests that watch a kept key expire: long
// enough to see it still held right after the release, short enough to wait
// for.
const keepTTL = 500 * time.Millisecond

// RunMulti runs the conformance suite of reqlock.MultiStore as subtests of t.
// newStore is called once per subtest and must return a store that
// implements reqlock.MultiStore. The signal subtests apply to stores that
// also implement reqlock.ReleaseNotifier; other stores pass them with a log
// line.
//
// The keys of one call share one Redis Cluster hash tag, so a store on a
// Cluster can run the suite. Invalid arguments (no keys, a duplicate or
// unsorted key, a non-positive ttl, lastFences of the wrong length) must be
// refused with an error wrapping reqlock.ErrInvalid, changing nothing.
func RunMulti(t *testing.T, newStore func(t *testing.T) reqlock.Store) {
	runSuite(t, newStore, "{m}:", []suiteCase[reqlock.MultiStore]{
		{"AcquireAllGrantsEveryKey", testMultiGrantsEveryKey},
		{"AcquireAllIsAllOrNothing", testMultiAllOrNothing},
		{"RetriedAcquireAllIsGranted", testMultiRetriedAcquire},
		{"FencesIncreasePerKey", testMultiFencesIncrease},
		{"ReleaseAllTakenOverKey", testMultiReleaseTakenOver},
		{"ReleaseAllRecordsLastFences", testMultiReleaseRecordsFences},
		{"ReleaseAllKeepLeavesKeysHeld", testMultiReleaseKeep},
		{"RefreshAllExtendsEveryKey", testMultiRefreshExtends},
		{"RefreshAllIsAllOrNothing", testMultiRefreshAllOrNothing},
		{"InvalidArguments", testMultiInvalid},
		{"CancelledContext", testMultiCancelled},
		{"MutualExclusionOverlappingSets", testMultiMutualExclusion},
		{"ReleaseAllSignals", withNotifier(testMultiReleaseSignals)},
		{"ReleaseAllKeepDoesNotSignal", withNotifier(testMultiReleaseKeepNoSignal)},
	})
}

// keyList returns the keys of names, sorted.
func keyList(key func(string) string, names ...string) []string {
	keys := make([]string, len(names))
	for i, n := range names {
		keys[i] = key(n)
	}
	slices.Sort(keys)
	return keys
}

// acquireAll calls AcquireAll and checks the shape of its grant.
func acquireAll(t *testing.T, m reqlock.MultiStore, keys []string, token string, ttl time.Duration) reqlock.MultiGrant {
	t.Helper()
	g, err := m.AcquireAll(context.Background(), keys, token, ttl)
	if err != nil {
		t.Fatalf("AcquireAll(%q, %q): %v", keys, token, err)
	}
	if g.OK && len(g.Fences) != len(keys) {
		t.Fatalf("AcquireAll(%q): granted with %d fences, want %d", keys, len(g.Fences), len(keys))
	}
	if !g.OK && g.Fences != nil {
		t.Fatalf("AcquireAll(%q): refused with fences %v, want nil", keys, g.Fences)
	}
	return g
}

// mustAcquireAll calls AcquireAll and fails the test unless it grants.
func mustAcquireAll(t *testing.T, m reqlock.MultiStore, keys []string, token string, ttl time.Duration) reqlock.MultiGrant {
	t.Helper()
	g := acquireAll(t, m, keys, token, ttl)
	if !g.OK {
		t.Fatalf("AcquireAll(%q, %q) refused: %+v", keys, token, g)
	}
	return g
}

// mustReleaseAll releases keys with keep 0 and no raised fence.
func mustReleaseAll(t *testing.T, m reqlock.MultiStore, keys []string, token string) {
	t.Helper()
	if err := m.ReleaseAll(context.Background(), keys, token, make([]int64, len(keys)), 0); err != nil {
		t.Fatalf("ReleaseAll(%q, %q): %v", keys, token, err)
	}
}

// holder reports whether key is held, and the holder's remaining TTL, by
// trying to acquire it with a probe token, which it releases at once when
// granted.
func holder(t *testing.T, s reqlock.Store, key string) (held bool, ttl time.Duration) {
	t.Helper()
	g := mustAcquire(t, s, key, "probe", longTTL)
	if !g.OK {
		return true, g.HolderTTL
	}
	if err := s.Release(context.Background(), key, "probe", 0); err != nil {
		t.Fatalf("Release(%q) of the probe: %v", key, err)
	}
	return false, 0
}

// expectHeld fails the test unless every key is held, with a remaining TTL
// in (0, atMost].
func expectHeld(t *testing.T, s reqlock.Store, keys []string, atMost time.Duration, what string) {
	t.Helper()
	for _, k := range keys {
		held, ttl := holder(t, s, k)
		if !held {
			t.Fatalf("%s: %q is free, want held", what, k)
		}
		if ttl <= 0 || ttl > atMost {
			t.Fatalf("%s: %q has TTL %v, want in (0, %v]", what, k, ttl, atMost)
		}
	}
}

// expectFree fails the test unless every key is free.
func expectFree(t *testing.T, s reqlock.Store, keys []string, what string) {
	t.Helper()
	for _, k := range keys {
		if held, ttl := holder(t, s, k); held {
			t.Fatalf("%s: %q is held (TTL %v), want free", what, k, ttl)
		}
	}
}

// waitFree polls until every key is free or limit passes, and returns when
// the last one was found free.
func waitFree(t *testing.T, s reqlock.Store, keys []string, limit time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(limit)
	ticker := time.NewTicker(5 * time.Millisecond)
	defer ticker.Stop()
	for _, k := range keys {
		for {
			if held, _ := holder(t, s, k); !held {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%q still held %v after it should have expired", k, limit)
			}
			<-ticker.C
		}
	}
	return time.Now()
}

func testMultiGrantsEveryKey(t *testing.T, s reqlock.Store, m reqlock.MultiStore, key func(string) string) {
	keys := keyList(key, "a", "b", "c")
	g := mustAcquireAll(t, m, keys, "t1", longTTL)
	for i, f := range g.Fences {
		if f <= 0 {
			t.Fatalf("fence of %q is %d, want > 0", keys[i], f)
		}
	}
	expectHeld(t, s, keys, longTTL, "after AcquireAll")
	// Each key is held by the token, as a single-key grant would be.
	if err := s.Refresh(context.Background(), keys[1], "t1", longTTL); err != nil {
		t.Fatalf("Refresh of one key of the grant: %v", err)
	}
	one := keys[:1]
	if g := acquireAll(t, m, one, "t2", longTTL); g.OK || g.Held != 0 {
		t.Fatalf("AcquireAll of one held key: %+v, want refused with Held 0", g)
	}
	mustReleaseAll(t, m, keys, "t1")
	expectFree(t, s, keys, "after ReleaseAll")
	// A single key works as a set of one.
	g = mustAcquireAll(t, m, one, "t3", longTTL)
	if len(g.Fences) != 1 {
		t.Fatalf("AcquireAll of one key: fences %v", g.Fences)
	}
	mustReleaseAll(t, m, one, "t3")
}

func testMultiAllOrNothing(t *testing.T, s reqlock.Store, m reqlock.MultiStore, key func(string) string) {
	ctx := context.Background()
	keys := keyList(key, "a", "b", "c", "d")
	cases := []struct {
		name string
		held []int // indexes of keys held by another owner
	}{
		{"first", []int{0}},
		{"middle", []int{2}},
		{"last", []int{3}},
		{"second and last", []int{1, 3}},
	}
	for _, c := range cases {
		for _, i := range c.held {
			if g := mustAcquire(t, s, keys[i], "other", longTTL); !g.OK {
				t.Fatalf("%s: Acquire(%q): %+v", c.name, keys[i], g)
			}
		}
		g := acquireAll(t, m, keys, "t1", longTTL)
		if g.OK {
			t.Fatalf("%s held: AcquireAll granted %+v", c.name, g)
		}
		if g.Held != c.held[0] {
			t.Errorf("%s held: Held %d, want %d (the first held key)", c.name, g.Held, c.held[0])
		}
		if g.HolderTTL <= 0 || g.HolderTTL > longTTL {
			t.Errorf("%s held: HolderTTL %v, want in (0, %v]", c.name, g.HolderTTL, longTTL)
		}
		var free []string
		for i, k := range keys {
			if !slices.Contains(c.held, i) {
				free = append(free, k)
			}
		}
		expectFree(t, s, free, c.name+" held: the refused AcquireAll")
		for _, i := range c.held {
			if err := s.Release(ctx, keys[i], "other", 0); err != nil {
				t.Fatalf("Release(%q): %v", keys[i], err)
			}
		}
	}

	// A grant of an overlapping set blocks too, and only its own keys.
	bcd := keys[1:]
	mustAcquireAll(t, m, bcd, "t2", longTTL)
	if g := acquireAll(t, m, keys[:2], "t3", longTTL); g.OK || g.Held != 1 {
		t.Fatalf("AcquireAll overlapping a held set: %+v, want refused with Held 1", g)
	}
	expectFree(t, s, keys[:1], "the refused overlapping AcquireAll")
	mustReleaseAll(t, m, bcd, "t2")
	g := mustAcquireAll(t, m, keys, "t4", longTTL)
	if len(g.Fences) != len(keys) {
		t.Fatalf("fences %v", g.Fences)
	}
	mustReleaseAll(t, m, keys, "t4")
}

func testMultiFencesIncrease(t *testing.T, s reqlock.Store, m reqlock.MultiStore, key func(string) string) {
	ctx := context.Background()
	keys := keyList(key, "a", "b", "c")
	last := make([]int64, len(keys))
	check := func(cycle, i int, fence int64) {
		t.Helper()
		if fence <= last[i] {
			t.Fatalf("cycle %d: fence of %q is %d, want > %d", cycle, keys[i], fence, last[i])
		}
		last[i] = fence
	}
	for c := range 40 {
		switch c % 3 {
		case 0, 1: // the whole set, or a pair that overlaps the next set
			set := keys
			if c%3 == 1 {
				set = keys[c%2 : c%2+2]
			}
			g := mustAcquireAll(t, m, set, "t", longTTL)
			for j, f := range g.Fences {
				check(c, slices.Index(keys, set[j]), f)
			}
			mustReleaseAll(t, m, set, "t")
		default: // one key at a time, with the single-key calls
			for i, k := range keys {
				g := mustAcquire(t, s, k, "t", longTTL)
				if !g.OK {
					t.Fatalf("cycle %d: Acquire(%q) refused: %+v", c, k, g)
				}
				check(c, i, g.Fence)
				if err := s.Release(ctx, k, "t", 0); err != nil {
					t.Fatalf("cycle %d: Release(%q): %v", c, k, err)
				}
			}
		}
	}
}

func testMultiReleaseTakenOver(t *testing.T, s reqlock.Store, m reqlock.MultiStore, key func(string) string) {
	ctx := context.Background()
	keys := keyList(key, "a", "b", "c")
	mustAcquireAll(t, m, keys, "t1", longTTL)
	// b changes hands behind the grant's back, as after an expiry.
	if err := s.Release(ctx, keys[1], "t1", 0); err != nil {
		t.Fatalf("Release(%q): %v", keys[1], err)
	}
	if g := mustAcquire(t, s, keys[1], "other", longTTL); !g.OK {
		t.Fatalf("Acquire(%q) by another owner: %+v", keys[1], g)
	}
	err := m.ReleaseAll(ctx, keys, "t1", make([]int64, len(keys)), 0)
	if !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("ReleaseAll with a key taken over: got %v, want ErrNotHeld", err)
	}
	expectFree(t, s, []string{keys[0], keys[2]}, "the keys ReleaseAll still held")
	expectHeld(t, s, keys[1:2], longTTL, "the key taken over")
	if err := s.Release(ctx, keys[1], "other", 0); err != nil {
		t.Fatalf("ReleaseAll removed the new owner of %q: %v", keys[1], err)
	}
	// Every key gone: ErrNotHeld, nothing else happens.
	if err := m.ReleaseAll(ctx, keys, "t1", make([]int64, len(keys)), 0); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("ReleaseAll of free keys: got %v, want ErrNotHeld", err)
	}
	expectFree(t, s, keys, "after a ReleaseAll of free keys")
}

func testMultiReleaseRecordsFences(t *testing.T, s reqlock.Store, m reqlock.MultiStore, key func(string) string) {
	ctx := context.Background()
	keys := keyList(key, "a", "b", "c")
	g1 := mustAcquireAll(t, m, keys, "t1", longTTL)
	raised := g1.Fences[0] + 1000
	// A higher report raises the key's floor; a low one (1) or none (0)
	// never lowers it.
	if err := m.ReleaseAll(ctx, keys, "t1", []int64{raised, 1, 0}, 0); err != nil {
		t.Fatalf("ReleaseAll: %v", err)
	}
	g2 := mustAcquireAll(t, m, keys, "t2", longTTL)
	if g2.Fences[0] <= raised {
		t.Fatalf("fence of %q after a release reporting %d is %d, want higher", keys[0], raised, g2.Fences[0])
	}
	for i := 1; i < len(keys); i++ {
		if g2.Fences[i] <= g1.Fences[i] {
			t.Fatalf("fence of %q went from %d to %d", keys[i], g1.Fences[i], g2.Fences[i])
		}
	}
	// The same through a release that keeps the keys.
	raised = g2.Fences[1] + 1000
	if err := m.ReleaseAll(ctx, keys, "t2", []int64{0, raised, 1}, 50*time.Millisecond); err != nil {
		t.Fatalf("ReleaseAll with keep: %v", err)
	}
	g3 := pollAcquireAll(t, m, keys, "t3", 5*time.Second)
	if g3.Fences[1] <= raised {
		t.Fatalf("fence of %q after a kept release reporting %d is %d, want higher", keys[1], raised, g3.Fences[1])
	}
	for _, i := range []int{0, 2} {
		if g3.Fences[i] <= g2.Fences[i] {
			t.Fatalf("fence of %q went from %d to %d", keys[i], g2.Fences[i], g3.Fences[i])
		}
	}
	mustReleaseAll(t, m, keys, "t3")
}

// pollAcquireAll retries AcquireAll until it is granted or limit passes.
func pollAcquireAll(t *testing.T, m reqlock.MultiStore, keys []string, token string, limit time.Duration) reqlock.MultiGrant {
	t.Helper()
	deadline := time.Now().Add(limit)
	ticker := time.NewTicker(5 * time.Millisecond)
	defer ticker.Stop()
	for {
		if g := acquireAll(t, m, keys, token, longTTL); g.OK {
			return g
		}
		if time.Now().After(deadline) {
			t.Fatalf("AcquireAll(%q) not granted within %v", keys, limit)
		}
		<-ticker.C
	}
}

func testMultiReleaseKeep(t *testing.T, s reqlock.Store, m reqlock.MultiStore, key func(string) string) {
	ctx := context.Background()
	keys := keyList(key, "a", "b", "c")
	mustAcquireAll(t, m, keys, "t1", longTTL)
	start := time.Now()
	if err := m.ReleaseAll(ctx, keys, "t1", make([]int64, len(keys)), keepTTL); err != nil {
		t.Fatalf("ReleaseAll with keep %v: %v", keepTTL, err)
	}
	expectHeld(t, s, keys, keepTTL, "right after ReleaseAll with keep")
	if g := acquireAll(t, m, keys, "t2", longTTL); g.OK {
		t.Fatalf("AcquireAll right after ReleaseAll with keep: %+v, want refused", g)
	}
	end := waitFree(t, s, keys, keepTTL+5*time.Second)
	if d := end.Sub(start); d < keepTTL-10*time.Millisecond {
		t.Fatalf("kept keys free after %v, want >= %v", d, keepTTL-10*time.Millisecond)
	}
	if err := m.ReleaseAll(ctx, keys, "t1", make([]int64, len(keys)), 0); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("ReleaseAll after the kept keys expired: got %v, want ErrNotHeld", err)
	}
}

func testMultiRefreshExtends(t *testing.T, s reqlock.Store, m reqlock.MultiStore, key func(string) string) {
	ctx := context.Background()
	keys := keyList(key, "a", "b", "c")
	mustAcquireAll(t, m, keys, "t1", time.Second)
	if err := m.RefreshAll(ctx, keys, "t1", 5*time.Second); err != nil {
		t.Fatalf("RefreshAll by the owner: %v", err)
	}
	for _, k := range keys {
		held, ttl := holder(t, s, k)
		if !held || ttl <= time.Second || ttl > 5*time.Second {
			t.Fatalf("%q after RefreshAll to 5s: held %v, TTL %v; want held with TTL in (1s, 5s]", k, held, ttl)
		}
	}
	// A shorter TTL is set as well: every key expires by it.
	if err := m.RefreshAll(ctx, keys, "t1", 50*time.Millisecond); err != nil {
		t.Fatalf("RefreshAll to a shorter TTL: %v", err)
	}
	waitFree(t, s, keys, 5*time.Second)
	if err := m.RefreshAll(ctx, keys, "t1", longTTL); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("RefreshAll after the keys expired: got %v, want ErrNotHeld", err)
	}
}

func testMultiRefreshAllOrNothing(t *testing.T, s reqlock.Store, m reqlock.MultiStore, key func(string) string) {
	ctx := context.Background()
	keys := keyList(key, "a", "b", "c")
	mustAcquireAll(t, m, keys, "t1", time.Second)
	// b is released behind the grant's back: absent.
	if err := s.Release(ctx, keys[1], "t1", 0); err != nil {
		t.Fatalf("Release(%q): %v", keys[1], err)
	}
	if err := m.RefreshAll(ctx, keys, "t1", longTTL); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("RefreshAll with an absent key: got %v, want ErrNotHeld", err)
	}
	expectHeld(t, s, []string{keys[0], keys[2]}, time.Second, "a refused RefreshAll (absent key)")
	// b is taken by another owner.
	if g := mustAcquire(t, s, keys[1], "other", time.Second); !g.OK {
		t.Fatalf("Acquire(%q): %+v", keys[1], g)
	}
	if err := m.RefreshAll(ctx, keys, "t1", longTTL); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("RefreshAll with a key taken over: got %v, want ErrNotHeld", err)
	}
	expectHeld(t, s, keys, time.Second, "a refused RefreshAll (key taken over)")
	// The token of the other owner does not refresh the set either.
	if err := m.RefreshAll(ctx, keys, "other", longTTL); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("RefreshAll by the owner of one key only: got %v, want ErrNotHeld", err)
	}
	expectHeld(t, s, keys, time.Second, "a refused RefreshAll (other token)")
	if err := s.Release(ctx, keys[1], "other", 0); err != nil {
		t.Fatalf("Release(%q): %v", keys[1], err)
	}
	if err := m.ReleaseAll(ctx, keys, "t1", make([]int64, len(keys)), 0); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("ReleaseAll with b gone: got %v, want ErrNotHeld", err)
	}
	expectFree(t, s, keys, "after the cleanup")
}

func testMultiInvalid(t *testing.T, s reqlock.Store, m reqlock.MultiStore, key func(string) string) {
	ctx := context.Background()
	a, b := key("a"), key("b")
	bad := map[string][]string{
		"nil":        nil,
		"empty":      {},
		"duplicate":  {a, a},
		"duplicates": {a, b, b},
		"unsorted":   {b, a},
	}
	for name, keys := range bad {
		if g, err := m.AcquireAll(ctx, keys, "t1", longTTL); !errors.Is(err, reqlock.ErrInvalid) || g.OK {
			t.Errorf("AcquireAll of %s keys: %+v, %v; want ErrInvalid", name, g, err)
		}
		if err := m.RefreshAll(ctx, keys, "t1", longTTL); !errors.Is(err, reqlock.ErrInvalid) {
			t.Errorf("RefreshAll of %s keys: got %v, want ErrInvalid", name, err)
		}
		if err := m.ReleaseAll(ctx, keys, "t1", make([]int64, len(keys)), 0); !errors.Is(err, reqlock.ErrInvalid) {
			t.Errorf("ReleaseAll of %s keys: got %v, want ErrInvalid", name, err)
		}
	}
	keys := []string{a, b}
	for _, ttl := range []time.Duration{0, -time.Second} {
		if g, err := m.AcquireAll(ctx, keys, "t1", ttl); !errors.Is(err, reqlock.ErrInvalid) || g.OK {
			t.Errorf("AcquireAll with ttl %v: %+v, %v; want ErrInvalid", ttl, g, err)
		}
	}
	expectFree(t, s, keys, "after refused AcquireAll calls")

	mustAcquireAll(t, m, keys, "t1", longTTL)
	for _, ttl := range []time.Duration{0, -time.Second} {
		if err := m.RefreshAll(ctx, keys, "t1", ttl); !errors.Is(err, reqlock.ErrInvalid) {
			t.Errorf("RefreshAll with ttl %v: got %v, want ErrInvalid", ttl, err)
		}
	}
	for _, fences := range [][]int64{nil, {0}, {0, 0, 0}} {
		if err := m.ReleaseAll(ctx, keys, "t1", fences, 0); !errors.Is(err, reqlock.ErrInvalid) {
			t.Errorf("ReleaseAll with %d last fences for 2 keys: got %v, want ErrInvalid", len(fences), err)
		}
	}
	if err := m.ReleaseAll(ctx, []string{b, a}, "t1", []int64{0, 0}, 0); !errors.Is(err, reqlock.ErrInvalid) {
		t.Errorf("ReleaseAll of unsorted held keys: got %v, want ErrInvalid", err)
	}
	expectHeld(t, s, keys, longTTL, "after refused RefreshAll and ReleaseAll calls")
	mustReleaseAll(t, m, keys, "t1")
}

func testMultiCancelled(t *testing.T, s reqlock.Store, m reqlock.MultiStore, key func(string) string) {
	keys := keyList(key, "a", "b")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	g, err := m.AcquireAll(ctx, keys, "t1", longTTL)
	if !errors.Is(err, context.Canceled) || g.OK {
		t.Fatalf("AcquireAll on a cancelled context: %+v, %v; want context.Canceled", g, err)
	}
	expectFree(t, s, keys, "after AcquireAll on a cancelled context")
	mustAcquireAll(t, m, keys, "t2", time.Second)
	if err := m.RefreshAll(ctx, keys, "t2", longTTL); err == nil {
		t.Fatal("RefreshAll on a cancelled context succeeded")
	}
	if err := m.ReleaseAll(ctx, keys, "t2", make([]int64, len(keys)), 0); err == nil {
		t.Fatal("ReleaseAll on a cancelled context succeeded")
	}
	expectHeld(t, s, keys, time.Second, "after RefreshAll and ReleaseAll on a cancelled context")
	mustReleaseAll(t, m, keys, "t2")
}

// testMultiMutualExclusion: 50 goroutines lock random overlapping sets of a
// few keys, with AcquireAll or, for a set of one, now and then the
// single-key Acquire. An in-process owner map shows that no two grants ever
// hold one key at once, and that each key's fences grow across grants.
func testMultiMutualExclusion(t *testing.T, s reqlock.Store, m reqlock.MultiStore, key func(string) string) {
	// Each round a worker retries its set up to attempts times.
	const workers, rounds, attempts, nkeys, maxSet = 50, 10, 100, 8, 4
	names := make([]string, nkeys)
	for i := range names {
		names[i] = fmt.Sprintf("k%02d", i)
	}
	all := keyList(key, names...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		owner     = make([]string, nkeys) // token holding each key, per the grants seen
		last      = make([]int64, nkeys)  // fence of each key's latest grant
		grants    atomic.Int64
		attempted atomic.Int64
		failed    atomic.Bool
		started   = make(chan struct{})
	)
	fail := func(format string, args ...any) {
		failed.Store(true)
		t.Errorf(format, args...)
	}
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			<-started
			for r := 0; r < rounds && !failed.Load(); r++ {
				idx := rng.Perm(nkeys)[:1+rng.IntN(maxSet)]
				slices.Sort(idx)
				set := make([]string, len(idx))
				for i, j := range idx {
					set[i] = all[j]
				}
				token := "w" + strconv.Itoa(w) + "r" + strconv.Itoa(r)
				single := len(set) == 1 && rng.IntN(2) == 0
				var fences []int64
				for a := 0; a < attempts && fences == nil; a++ {
					if a > 0 {
						runtime.Gosched()
					}
					attempted.Add(1)
					if single {
						g, err := s.Acquire(ctx, set[0], token, longTTL)
						if err != nil {
							fail("worker %d: Acquire(%q): %v", w, set[0], err)
							return
						}
						if g.OK {
							fences = []int64{g.Fence}
						}
						continue
					}
					g, err := m.AcquireAll(ctx, set, token, longTTL)
					if err != nil {
						fail("worker %d: AcquireAll(%q): %v", w, set, err)
						return
					}
					if g.OK {
						fences = g.Fences
					} else if g.Held < 0 || g.Held >= len(set) {
						fail("worker %d: AcquireAll(%q) refused with Held %d", w, set, g.Held)
						return
					}
				}
				if fences == nil {
					continue // crowded out this round
				}
				grants.Add(1)
				mu.Lock()
				for i, j := range idx {
					if owner[j] != "" {
						fail("worker %d: %q granted to %s while %s holds it", w, all[j], token, owner[j])
					}
					owner[j] = token
					if fences[i] <= last[j] {
						fail("worker %d: fence of %q is %d, want > %d", w, all[j], fences[i], last[j])
					}
					last[j] = fences[i]
				}
				mu.Unlock()
				runtime.Gosched() // let others try while the set is held
				if !single && r%3 == 0 {
					if err := m.RefreshAll(ctx, set, token, longTTL); err != nil {
						fail("worker %d: RefreshAll(%q): %v", w, set, err)
					}
				}
				mu.Lock()
				for _, j := range idx {
					owner[j] = ""
				}
				mu.Unlock()
				var err error
				if single {
					err = s.Release(ctx, set[0], token, 0)
				} else {
					err = m.ReleaseAll(ctx, set, token, make([]int64, len(set)), 0)
				}
				if err != nil {
					fail("worker %d: release of %q: %v", w, set, err)
					return
				}
			}
		})
	}
	close(started)
	wg.Wait()
	if t.Failed() {
		return
	}
	if grants.Load() == 0 {
		t.Fatal("no grant at all")
	}
	t.Logf("%d grants of %d rounds, in %d attempts", grants.Load(), workers*rounds, attempted.Load())
	// Nothing is left behind: the whole set is free.
	mustAcquireAll(t, m, all, "final", longTTL)
	mustReleaseAll(t, m, all, "final")
}

func testMultiReleaseSignals(t *testing.T, s reqlock.Store, m reqlock.MultiStore, n reqlock.ReleaseNotifier, key func(string) string) {
	keys := keyList(key, "a", "b", "c")
	chs := quietSubscriptions(t, s, n, key, keys...)
	mustAcquireAll(t, m, keys, "t1", longTTL)
	mustReleaseAll(t, m, keys, "t1")
	for i, ch := range chs {
		expectSignal(t, ch, fmt.Sprintf("on %q after ReleaseAll", keys[i]))
	}
}

func testMultiReleaseKeepNoSignal(t *testing.T, s reqlock.Store, m reqlock.MultiStore, n reqlock.ReleaseNotifier, key func(string) string) {
	ctx := context.Background()
	keys := keyList(key, "a", "b")
	chs := quietSubscriptions(t, s, n, key, keys...)
	mustAcquireAll(t, m, keys, "t1", longTTL)
	// A keep that outlives the test: an expiry may signal in some stores.
	if err := m.ReleaseAll(ctx, keys, "t1", make([]int64, len(keys)), longTTL); err != nil {
		t.Fatalf("ReleaseAll with keep: %v", err)
	}
	flush(t, s, n, key) // a signal of the kept release would have arrived by now
	for i, ch := range chs {
		expectNone(t, ch, fmt.Sprintf("on %q after ReleaseAll with keep: the keys stay held", keys[i]))
	}
	mustReleaseAll(t, m, keys, "t1") // the keys still hold the token
	for i, ch := range chs {
		expectSignal(t, ch, fmt.Sprintf("on %q after the final ReleaseAll", keys[i]))
	}
}

// A retried AcquireAll (its reply was lost) finds every key holding the
// caller's token and is granted again, with fresh fences and TTLs.
func testMultiRetriedAcquire(t *testing.T, s reqlock.Store, m reqlock.MultiStore, key func(string) string) {
	keys := keyList(key, "a", "b", "c")
	first := mustAcquireAll(t, m, keys, "t1", time.Second)
	retry := acquireAll(t, m, keys, "t1", longTTL)
	if !retry.OK {
		t.Fatalf("retried AcquireAll with the holder's token: %+v, want granted", retry)
	}
	for i := range keys {
		if retry.Fences[i] <= first.Fences[i] {
			t.Errorf("key %q: retry fence %d, want above %d", keys[i], retry.Fences[i], first.Fences[i])
		}
	}
	expectHeld(t, s, keys, longTTL, "after the retry")
	if g := acquireAll(t, m, keys, "t2", longTTL); g.OK || g.HolderTTL <= time.Second {
		t.Fatalf("other token after the retry: %+v, want refused with the retry's TTL (above 1s) left", g)
	}
	mustReleaseAll(t, m, keys, "t1")
}
