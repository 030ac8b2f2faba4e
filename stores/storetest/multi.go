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

	"github.com/reqlock/reqlock/stores"
)

// multiTests are the Multi subtests: calls over several keys at once, all or
// none. Invalid arguments (no keys, an empty, duplicate or unsorted key, a
// non-positive ttl) must be refused with an error wrapping stores.ErrInvalid,
// changing nothing.
var multiTests = []subtest{
	{name: "AcquireGrantsEveryKey", run: testMultiGrantsEveryKey},
	{name: "AcquireIsAllOrNothing", run: testMultiAllOrNothing},
	{name: "RetriedAcquireIsGranted", run: testMultiRetriedAcquire},
	{name: "FencesGrowPerKey", run: testMultiFencesGrow},
	{name: "ReleaseTakenOverKey", run: testMultiReleaseTakenOver},
	{name: "RefreshExtendsEveryKey", run: testMultiRefreshExtends},
	{name: "RefreshIsAllOrNothing", run: testMultiRefreshAllOrNothing},
	{name: "InvalidArguments", run: testMultiInvalid},
	{name: "CancelledContext", run: testMultiCancelled},
	{name: "MutualExclusionOverlappingSets", run: testMultiMutualExclusion},
}

// testMultiGrantsEveryKey: a grant of several free keys holds each of them
// under the token, as a grant of one key would, with a fence each.
func testMultiGrantsEveryKey(t *testing.T, e *env) {
	keys := e.keys("a", "b", "c")
	g := e.mustAcquire(t, keys, "t1", e.long)
	for i, f := range g.Fences {
		if f <= 0 {
			t.Fatalf("fence of %q is %d, want > 0", keys[i], f)
		}
	}
	e.expectHeld(t, keys, e.long, "after Acquire")
	// Each key is held by the token, as a one-key grant would be.
	if err := e.s.Refresh(t.Context(), keys[1:2], "t1", e.long); err != nil {
		t.Fatalf("Refresh of one key of the grant: %v", err)
	}
	if g := e.acquire(t, keys[:1], "t2", e.long); g.OK || g.Held != 0 {
		t.Fatalf("Acquire of one held key: %+v, want refused with Held 0", g)
	}
	e.mustRelease(t, keys, "t1")
	e.expectFree(t, keys, "after Release")
}

// testMultiAllOrNothing: when any key of the set is held by another token,
// Acquire grants none, names the first held key and its holder's TTL, and
// leaves the free keys free.
func testMultiAllOrNothing(t *testing.T, e *env) {
	keys := e.keys("a", "b", "c", "d")
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
			e.mustAcquire(t, keys[i:i+1], "other", e.long)
		}
		g := e.acquire(t, keys, "t1", e.long)
		if g.OK {
			t.Fatalf("%s held: Acquire granted %+v", c.name, g)
		}
		if g.Held != c.held[0] {
			t.Errorf("%s held: Held %d, want %d (the first held key)", c.name, g.Held, c.held[0])
		}
		if !e.waitIn(g.Wait, 0, e.long) {
			t.Errorf("%s held: Wait %v, want in (0, %v]", c.name, g.Wait, e.long)
		}
		var free []string
		for i, k := range keys {
			if !slices.Contains(c.held, i) {
				free = append(free, k)
			}
		}
		e.expectFree(t, free, c.name+" held: the refused Acquire")
		for _, i := range c.held {
			e.mustRelease(t, keys[i:i+1], "other")
		}
	}

	// A grant of an overlapping set blocks too, and only its own keys.
	bcd := keys[1:]
	e.mustAcquire(t, bcd, "t2", e.long)
	if g := e.acquire(t, keys[:2], "t3", e.long); g.OK || g.Held != 1 {
		t.Fatalf("Acquire overlapping a held set: %+v, want refused with Held 1", g)
	}
	e.expectFree(t, keys[:1], "the refused overlapping Acquire")
	e.mustRelease(t, bcd, "t2")
	e.mustAcquire(t, keys, "t4", e.long)
	e.mustRelease(t, keys, "t4")
}

// testMultiRetriedAcquire: a retried Acquire (its reply was lost) finds
// every key holding the caller's token and is granted again, with fresh
// fences and TTLs.
func testMultiRetriedAcquire(t *testing.T, e *env) {
	keys := e.keys("a", "b", "c")
	first := e.mustAcquire(t, keys, "t1", e.short)
	retry := e.acquire(t, keys, "t1", e.long)
	if !retry.OK {
		t.Fatalf("retried Acquire with the holder's token: %+v, want granted", retry)
	}
	expectStrides(t, keys, first.Fences, retry.Fences, "retried Acquire")
	e.expectHeld(t, keys, e.long, "after the retry")
	if g := e.acquire(t, keys, "t2", e.long); g.OK || !e.waitIn(g.Wait, e.short, e.long) {
		t.Fatalf("other token after the retry: %+v, want refused with the retry's TTL (above %v) left", g, e.short)
	}
	e.mustRelease(t, keys, "t1")
}

// testMultiFencesGrow: each key's fence is a stride above its previous
// grant's, whether the key was granted with the whole set, with an
// overlapping pair, or alone.
func testMultiFencesGrow(t *testing.T, e *env) {
	keys := e.keys("a", "b", "c")
	last := make([]int64, len(keys))
	check := func(cycle int, key string, fence int64) {
		t.Helper()
		i := slices.Index(keys, key)
		if last[i] != 0 {
			expectStride(t, last[i], fence, fmt.Sprintf("cycle %d: %q", cycle, key))
		}
		last[i] = fence
	}
	for c := range 40 {
		var sets [][]string
		switch c % 3 {
		case 0: // the whole set
			sets = [][]string{keys}
		case 1: // a pair that overlaps the next one
			sets = [][]string{keys[c%2 : c%2+2]}
		default: // one key at a time
			for i := range keys {
				sets = append(sets, keys[i:i+1])
			}
		}
		for _, set := range sets {
			token := "t" + strconv.Itoa(c)
			g := e.mustAcquire(t, set, token, e.long)
			for j, f := range g.Fences {
				check(c, set[j], f)
			}
			e.mustRelease(t, set, token)
		}
	}
}

// testMultiReleaseTakenOver: a Release of a set one of whose keys changed
// hands returns ErrNotHeld, after releasing the others, and leaves the new
// owner alone.
func testMultiReleaseTakenOver(t *testing.T, e *env) {
	ctx := t.Context()
	keys := e.keys("a", "b", "c")
	e.mustAcquire(t, keys, "t1", e.long)
	// b changes hands behind the grant's back, as after an expiry.
	e.mustRelease(t, keys[1:2], "t1")
	e.mustAcquire(t, keys[1:2], "other", e.long)
	expectNotHeld(t, e.s.Release(ctx, keys, "t1", 0), "Release with a key taken over")
	e.expectFree(t, []string{keys[0], keys[2]}, "the keys Release still held")
	e.expectHeld(t, keys[1:2], e.long, "the key taken over")
	if err := e.s.Release(ctx, keys[1:2], "other", 0); err != nil {
		t.Fatalf("Release removed the new owner of %q: %v", keys[1], err)
	}
	// Every key gone: ErrNotHeld, nothing else happens.
	expectNotHeld(t, e.s.Release(ctx, keys, "t1", 0), "Release of free keys")
	e.expectFree(t, keys, "after a Release of free keys")
}

// testMultiRefreshExtends: a Refresh by the holder sets the TTL of every key
// anew, longer or shorter.
func testMultiRefreshExtends(t *testing.T, e *env) {
	ctx := t.Context()
	keys := e.keys("a", "b", "c")
	e.mustAcquire(t, keys, "t1", e.short)
	if err := e.s.Refresh(ctx, keys, "t1", e.long/2); err != nil {
		t.Fatalf("Refresh by the holder: %v", err)
	}
	for _, k := range keys {
		held, ttl := e.probe(t, k)
		if !held || ttl <= e.short || ttl > e.long/2 {
			t.Fatalf("%q after a Refresh to %v: held %v, TTL %v; want held with TTL in (%v, %v]", k, e.long/2, held, ttl, e.short, e.long/2)
		}
	}
	// A shorter TTL is set as well: every key expires by it.
	if err := e.s.Refresh(ctx, keys, "t1", e.expiry); err != nil {
		t.Fatalf("Refresh to a shorter TTL: %v", err)
	}
	// Waiting for the TTL to run out is the behaviour under test.
	e.waitFree(t, keys, e.expiry+expiryLimit)
	expectNotHeld(t, e.s.Refresh(ctx, keys, "t1", e.long), "Refresh after the keys expired")
}

// testMultiRefreshAllOrNothing: a Refresh of a set one of whose keys is
// absent or held by another token returns ErrNotHeld and changes no TTL.
func testMultiRefreshAllOrNothing(t *testing.T, e *env) {
	ctx := t.Context()
	keys := e.keys("a", "b", "c")
	e.mustAcquire(t, keys, "t1", e.short)
	// b is released behind the grant's back: absent.
	e.mustRelease(t, keys[1:2], "t1")
	expectNotHeld(t, e.s.Refresh(ctx, keys, "t1", e.long), "Refresh with an absent key")
	e.expectHeld(t, []string{keys[0], keys[2]}, e.short, "a refused Refresh (absent key)")
	e.expectFree(t, keys[1:2], "a refused Refresh (absent key)")
	// b is taken by another owner.
	e.mustAcquire(t, keys[1:2], "other", e.short)
	expectNotHeld(t, e.s.Refresh(ctx, keys, "t1", e.long), "Refresh with a key taken over")
	e.expectHeld(t, keys, e.short, "a refused Refresh (key taken over)")
	// The token of the other owner does not refresh the set either.
	expectNotHeld(t, e.s.Refresh(ctx, keys, "other", e.long), "Refresh by the owner of one key only")
	e.expectHeld(t, keys, e.short, "a refused Refresh (other token)")
	e.mustRelease(t, keys[1:2], "other")
	expectNotHeld(t, e.s.Release(ctx, keys, "t1", 0), "Release with b gone")
	e.expectFree(t, keys, "after the cleanup")
}

// testMultiInvalid: invalid keys or TTLs are refused with ErrInvalid before
// the store acts.
func testMultiInvalid(t *testing.T, e *env) {
	ctx := t.Context()
	a, b := e.key("a"), e.key("b")
	bad := map[string][]string{
		"nil":        nil,
		"empty":      {},
		"empty key":  {""},
		"empty keys": {"", a},
		"duplicate":  {a, a},
		"duplicates": {a, b, b},
		"unsorted":   {b, a},
	}
	for name, keys := range bad {
		if g, err := e.s.Acquire(ctx, keys, "t1", e.long); !errors.Is(err, stores.ErrInvalid) || g.OK {
			t.Errorf("Acquire of %s keys: %+v, %v; want stores.ErrInvalid", name, g, err)
		}
		if err := e.s.Refresh(ctx, keys, "t1", e.long); !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("Refresh of %s keys: got %v, want stores.ErrInvalid", name, err)
		}
		if err := e.s.Release(ctx, keys, "t1", 0); !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("Release of %s keys: got %v, want stores.ErrInvalid", name, err)
		}
	}
	keys := []string{a, b}
	for _, ttl := range []time.Duration{0, -time.Second} {
		if g, err := e.s.Acquire(ctx, keys, "t1", ttl); !errors.Is(err, stores.ErrInvalid) || g.OK {
			t.Errorf("Acquire with ttl %v: %+v, %v; want stores.ErrInvalid", ttl, g, err)
		}
	}
	e.expectFree(t, keys, "after refused Acquire calls")

	e.mustAcquire(t, keys, "t1", e.long)
	for _, ttl := range []time.Duration{0, -time.Second} {
		if err := e.s.Refresh(ctx, keys, "t1", ttl); !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("Refresh with ttl %v: got %v, want stores.ErrInvalid", ttl, err)
		}
		if err := e.s.Refresh(ctx, keys[:1], "t1", ttl); !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("Refresh of one key with ttl %v: got %v, want stores.ErrInvalid", ttl, err)
		}
	}
	for _, keep := range []time.Duration{0, e.keep} {
		if err := e.s.Release(ctx, []string{b, a}, "t1", keep); !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("Release (keep %v) of unsorted held keys: got %v, want stores.ErrInvalid", keep, err)
		}
	}
	e.expectHeld(t, keys, e.long, "after refused Refresh and Release calls")
	e.mustRelease(t, keys, "t1")
}

// testMultiCancelled: calls over several keys on an ended context fail and
// change nothing.
func testMultiCancelled(t *testing.T, e *env) {
	keys := e.keys("a", "b")
	ctx := cancelled()
	g, err := e.s.Acquire(ctx, keys, "t1", e.long)
	if !errors.Is(err, context.Canceled) || g.OK {
		t.Fatalf("Acquire on a cancelled context: %+v, %v; want context.Canceled", g, err)
	}
	e.expectFree(t, keys, "after Acquire on a cancelled context")
	e.mustAcquire(t, keys, "t2", e.short)
	if err := e.s.Refresh(ctx, keys, "t2", e.long); err == nil {
		t.Fatal("Refresh on a cancelled context succeeded")
	}
	if err := e.s.Release(ctx, keys, "t2", 0); err == nil {
		t.Fatal("Release on a cancelled context succeeded")
	}
	e.expectHeld(t, keys, e.short, "after Refresh and Release on a cancelled context")
	e.mustRelease(t, keys, "t2")
}

// testMultiMutualExclusion: 50 goroutines lock random overlapping sets of a
// few keys, sets of one among them. An in-process owner map shows that no
// two grants ever hold one key at once, and that each key's fences grow by a
// stride from grant to grant.
func testMultiMutualExclusion(t *testing.T, e *env) {
	// Each round a worker retries its set up to attempts times.
	const workers, rounds, attempts, nkeys, maxSet = 50, 10, 100, 8, 4
	names := make([]string, nkeys)
	for i := range names {
		names[i] = fmt.Sprintf("k%02d", i)
	}
	all := e.keys(names...)
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
				var fences []int64
				for a := 0; a < attempts && fences == nil; a++ {
					if a > 0 {
						runtime.Gosched()
					}
					attempted.Add(1)
					g, err := e.s.Acquire(ctx, set, token, e.long)
					if err != nil {
						fail("worker %d: Acquire(%q): %v", w, set, err)
						return
					}
					switch {
					case g.OK && len(g.Fences) != len(set):
						fail("worker %d: Acquire(%q) granted with fences %v", w, set, g.Fences)
						return
					case g.OK:
						fences = g.Fences
					case g.Held < 0 || g.Held >= len(set):
						fail("worker %d: Acquire(%q) refused with Held %d", w, set, g.Held)
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
					if last[j] != 0 && fences[i]-last[j] < stores.FenceStride {
						fail("worker %d: fence of %q is %d after %d, want a stride above", w, all[j], fences[i], last[j])
					}
					last[j] = fences[i]
				}
				mu.Unlock()
				runtime.Gosched() // let others try while the set is held
				if r%3 == 0 {
					if err := e.s.Refresh(ctx, set, token, e.long); err != nil {
						fail("worker %d: Refresh(%q): %v", w, set, err)
					}
				}
				mu.Lock()
				for _, j := range idx {
					owner[j] = ""
				}
				mu.Unlock()
				if err := e.s.Release(ctx, set, token, 0); err != nil {
					fail("worker %d: Release(%q): %v", w, set, err)
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
	e.mustAcquire(t, all, "final", e.long)
	e.mustRelease(t, all, "final")
}
