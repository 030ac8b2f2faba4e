package storetest

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// coreTests are the Core subtests: the contract on one key.
var coreTests = []subtest{
	{name: "AcquireGrantsFence", run: testAcquireGrantsFence},
	{name: "HeldKeyRefusesOtherToken", run: testHeldKeyRefusesOtherToken},
	{name: "RetriedAcquireIsGranted", run: testRetriedAcquireIsGranted},
	{name: "ReleaseThenReacquire", run: testReleaseThenReacquire},
	{name: "ReleaseWrongTokenKeepsLock", run: testReleaseWrongToken},
	{name: "DoubleRelease", run: testDoubleRelease},
	{name: "RefreshWrongToken", run: testRefreshWrongToken},
	{name: "RefreshExtendsTTL", run: testRefreshExtendsTTL},
	{name: "Expiry", run: testExpiry},
	{name: "FencesGrowByStride", run: testFencesGrowByStride},
	{name: "KeysIndependent", run: testKeysIndependent},
	{name: "RaceOneWinner", run: testRaceOneWinner},
	{name: "MutualExclusion", run: testMutualExclusion},
	{name: "CancelledContext", run: testCancelledContext},
}

// testAcquireGrantsFence: a free key is granted, with a positive fence.
func testAcquireGrantsFence(t *testing.T, e *env) {
	g := e.mustAcquire(t, e.keys("k"), "t1", e.long)
	if g.Fences[0] <= 0 {
		t.Fatalf("Acquire: fence %d, want > 0", g.Fences[0])
	}
}

// testHeldKeyRefusesOtherToken: a held key refuses another token, naming
// the key and the holder's remaining TTL.
func testHeldKeyRefusesOtherToken(t *testing.T, e *env) {
	k := e.keys("k")
	e.mustAcquire(t, k, "t1", e.long)
	g := e.acquire(t, k, "t2", e.long)
	if g.OK {
		t.Fatalf("second token on a held key: got %+v, want refused", g)
	}
	if g.Held != 0 {
		t.Errorf("refused grant: Held %d, want 0", g.Held)
	}
	if !e.waitIn(g.Wait, 0, e.long) {
		t.Errorf("refused grant: Wait %v, want the holder's remaining TTL, in (0, %v]", g.Wait, e.long)
	}
}

// testRetriedAcquireIsGranted: a token serves one acquisition, so a key
// that already holds the caller's token was set by this very call, run
// before: a client that retried after the reply was lost. The retry is
// granted, with a fresh fence and TTL, instead of waiting for itself.
func testRetriedAcquireIsGranted(t *testing.T, e *env) {
	k := e.keys("k")
	first := e.mustAcquire(t, k, "t1", e.short)
	retry := e.acquire(t, k, "t1", e.long)
	if !retry.OK {
		t.Fatalf("retried Acquire with the holder's token: got %+v, want granted", retry)
	}
	expectStride(t, first.Fences[0], retry.Fences[0], "retried Acquire")
	if g := e.acquire(t, k, "t2", e.long); g.OK || !e.waitIn(g.Wait, e.short, e.long) {
		t.Fatalf("other token after the retry: got %+v, want refused with the retry's TTL (above %v) left", g, e.short)
	}
	e.mustRelease(t, k, "t1")
}

// testReleaseThenReacquire: a released key is free for another token, whose
// fence is a stride above the released grant's.
func testReleaseThenReacquire(t *testing.T, e *env) {
	k := e.keys("k")
	g1 := e.mustAcquire(t, k, "t1", e.long)
	e.mustRelease(t, k, "t1")
	g2 := e.acquire(t, k, "t2", e.long)
	if !g2.OK {
		t.Fatalf("Acquire after release: got %+v, want OK", g2)
	}
	expectStride(t, g1.Fences[0], g2.Fences[0], "Acquire after a release")
}

// testReleaseWrongToken: a Release with a token the key does not hold, or of
// an absent key, returns ErrNotHeld and leaves the lock alone.
func testReleaseWrongToken(t *testing.T, e *env) {
	k := e.keys("k")
	e.mustAcquire(t, k, "t1", e.long)
	expectNotHeld(t, e.s.Release(t.Context(), k, "t2", 0), "Release with a wrong token")
	if g := e.acquire(t, k, "t3", e.long); g.OK {
		t.Fatal("a wrong-token Release removed the lock")
	}
	expectNotHeld(t, e.s.Release(t.Context(), e.keys("absent"), "t1", 0), "Release of an absent key")
}

// testDoubleRelease: a second Release of a grant returns ErrNotHeld.
func testDoubleRelease(t *testing.T, e *env) {
	k := e.keys("k")
	e.mustAcquire(t, k, "t1", e.long)
	e.mustRelease(t, k, "t1")
	expectNotHeld(t, e.s.Release(t.Context(), k, "t1", 0), "second Release")
}

// testRefreshWrongToken: a Refresh with a token the key does not hold, or of
// an absent key, returns ErrNotHeld and leaves the holder's TTL alone.
func testRefreshWrongToken(t *testing.T, e *env) {
	k := e.keys("k")
	e.mustAcquire(t, k, "t1", e.short)
	expectNotHeld(t, e.s.Refresh(t.Context(), k, "t2", e.long), "Refresh with a wrong token")
	if g := e.acquire(t, k, "t2", e.long); g.OK || g.Wait > e.short {
		t.Fatalf("after a wrong-token Refresh: got %+v, want refused with Wait <= %v", g, e.short)
	}
	expectNotHeld(t, e.s.Refresh(t.Context(), e.keys("absent"), "t1", e.long), "Refresh of an absent key")
	e.expectFree(t, e.keys("absent"), "after a Refresh of an absent key")
}

// testRefreshExtendsTTL: a Refresh by the holder sets the key's TTL anew.
func testRefreshExtendsTTL(t *testing.T, e *env) {
	k := e.keys("k")
	e.mustAcquire(t, k, "t1", e.short)
	if err := e.s.Refresh(t.Context(), k, "t1", e.long/2); err != nil {
		t.Fatalf("Refresh by the holder: %v", err)
	}
	g := e.acquire(t, k, "t2", e.long)
	if g.OK {
		t.Fatal("lock lost right after Refresh")
	}
	if !e.waitIn(g.Wait, e.short, e.long/2) {
		t.Fatalf("Wait after a Refresh to %v of a %v lock: %v, want in (%v, %v]", e.long/2, e.short, g.Wait, e.short, e.long/2)
	}
}

// testExpiry: a lock left to expire is free after its TTL, not before, and
// the next grant's fence is a stride above the expired one's, although
// nobody released it. The expired holder's Release and Refresh return
// ErrNotHeld and leave the new holder alone.
func testExpiry(t *testing.T, e *env) {
	k := e.keys("k")
	start := time.Now()
	g1 := e.mustAcquire(t, k, "t1", e.expiry)
	// Waiting for the TTL to run out is the behaviour under test.
	g2 := e.pollAcquire(t, k, "t2", e.long, e.expiry+expiryLimit)
	if elapsed := time.Since(start); elapsed < e.expiry-expiryEarly {
		t.Fatalf("expired lock re-granted after %v, want >= %v", elapsed, e.expiry-expiryEarly)
	}
	expectStride(t, g1.Fences[0], g2.Fences[0], "Acquire after an expiry")
	expectNotHeld(t, e.s.Release(t.Context(), k, "t1", 0), "Release by the expired holder")
	expectNotHeld(t, e.s.Refresh(t.Context(), k, "t1", e.long), "Refresh by the expired holder")
	if g := e.acquire(t, k, "t3", e.long); g.OK {
		t.Fatal("the expired holder's Release or Refresh removed the new holder")
	}
	e.mustRelease(t, k, "t2")
}

// testFencesGrowByStride: over many grants of one key, by release and
// re-acquire and by retry, each fence is a stride above the previous one.
func testFencesGrowByStride(t *testing.T, e *env) {
	k := e.keys("k")
	var last int64
	next := func(g stores.Grant, what string) {
		t.Helper()
		if last != 0 {
			expectStride(t, last, g.Fences[0], what)
		}
		last = g.Fences[0]
	}
	for i := range 100 {
		token := "t" + strconv.Itoa(i)
		next(e.mustAcquire(t, k, token, e.long), "cycle "+strconv.Itoa(i))
		if i%3 == 0 {
			next(e.mustAcquire(t, k, token, e.long), "retry in cycle "+strconv.Itoa(i))
		}
		e.mustRelease(t, k, token)
	}
}

// testKeysIndependent: a grant, release or wrong token on one key leaves
// another key alone.
func testKeysIndependent(t *testing.T, e *env) {
	a, b := e.keys("a"), e.keys("b")
	e.mustAcquire(t, a, "t1", e.long)
	if g := e.acquire(t, b, "t2", e.long); !g.OK {
		t.Fatalf("Acquire b while a is held: got %+v, want OK", g)
	}
	expectNotHeld(t, e.s.Release(t.Context(), b, "t1", 0), "Release of b with a's token")
	e.mustRelease(t, a, "t1")
	if g := e.acquire(t, b, "t3", e.long); g.OK {
		t.Fatal("releasing a freed b")
	}
	if g := e.acquire(t, a, "t3", e.long); !g.OK {
		t.Fatalf("Acquire a after its release: got %+v, want OK", g)
	}
}

// testRaceOneWinner: of many tokens racing for one free key, one wins.
func testRaceOneWinner(t *testing.T, e *env) {
	k := e.keys("k")
	const n = 50
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		granted atomic.Int32
		errs    = make(chan error, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			g, err := e.s.Acquire(context.Background(), k, "t"+strconv.Itoa(i), e.long)
			if err != nil {
				errs <- err
				return
			}
			if g.OK {
				granted.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Acquire: %v", err)
	}
	if got := granted.Load(); got != 1 {
		t.Fatalf("%d goroutines racing on one key: %d granted, want 1", n, got)
	}
}

// testMutualExclusion: workers that take turns on one key never hold it
// together, and each grant's fence is a stride above the previous one.
func testMutualExclusion(t *testing.T, e *env) {
	k := e.keys("k")
	const workers, cycles = 8, 50
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var (
		wg        sync.WaitGroup
		inside    atomic.Int32
		lastFence atomic.Int64
		failed    atomic.Bool
	)
	fail := func(format string, args ...any) {
		failed.Store(true)
		t.Errorf(format, args...)
	}
	for w := range workers {
		wg.Go(func() {
			for c := 0; c < cycles && !failed.Load(); c++ {
				token := "w" + strconv.Itoa(w) + "c" + strconv.Itoa(c)
				var g stores.Grant
				for !g.OK {
					var err error
					if g, err = e.s.Acquire(ctx, k, token, e.long); err != nil {
						fail("worker %d cycle %d: Acquire: %v", w, c, err)
						return
					}
				}
				if n := inside.Add(1); n != 1 {
					fail("worker %d cycle %d: %d holders inside the lock", w, c, n)
				}
				if prev := lastFence.Swap(g.Fences[0]); prev != 0 && g.Fences[0]-prev < stores.FenceStride {
					fail("worker %d cycle %d: fence %d after %d, want at least %d", w, c, g.Fences[0], prev, prev+stores.FenceStride)
				}
				inside.Add(-1)
				if err := e.s.Release(ctx, k, token, 0); err != nil {
					fail("worker %d cycle %d: Release: %v", w, c, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// testCancelledContext: calls on an ended context fail and change nothing.
func testCancelledContext(t *testing.T, e *env) {
	k := e.keys("k")
	ctx := cancelled()
	g, err := e.s.Acquire(ctx, k, "t1", e.long)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire on a cancelled context: got %v, want context.Canceled", err)
	}
	if g.OK {
		t.Fatalf("Acquire on a cancelled context granted %+v", g)
	}
	if g := e.acquire(t, k, "t2", e.long); !g.OK {
		t.Fatalf("Acquire after a cancelled attempt: got %+v, want OK (nothing granted)", g)
	}
	if err := e.s.Release(ctx, k, "t2", 0); err == nil {
		t.Fatal("Release on a cancelled context succeeded")
	}
	if err := e.s.Refresh(ctx, k, "t2", e.long); err == nil {
		t.Fatal("Refresh on a cancelled context succeeded")
	}
	if g := e.acquire(t, k, "t3", e.long); g.OK {
		t.Fatal("Release on a cancelled context removed the lock")
	}
}
