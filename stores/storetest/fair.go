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

// fairTests are the Fair subtests, for stores.FairStore. The signal subtests
// need stores.Notifier too.
var fairTests = []subtest{
	{name: "GrantsAFreeKeyAtOnce", needs: needFair, run: testFairGrantsFreeKey},
	{name: "GrantsInQueueOrder", needs: needFair, run: testFairQueueOrder},
	{name: "TryOnceDoesNotJoin", needs: needFair, run: testFairTryOnce},
	{name: "RetriedAcquireIsGranted", needs: needFair, run: testFairRetriedAcquire},
	{name: "HeartbeatKeepsPlace", needs: needFair, run: testFairHeartbeat},
	{name: "LapsedLeaseIsDropped", needs: needFair, run: testFairLapsedLease},
	{name: "LeaveLetsNextIn", needs: needFair, run: testFairLeave},
	{name: "FencesGrowAcrossFairAndPlain", needs: needFair, run: testFairFences},
	{name: "PlainAcquireIgnoresQueue", needs: needFair, run: testFairPlainAcquire},
	{name: "InvalidArguments", needs: needFair, run: testFairInvalid},
	{name: "CancelledContext", needs: needFair, run: testFairCancelled},
	{name: "MutualExclusionAndProgress", needs: needFair, run: testFairMutualExclusion},
	{name: "LeaveOfHeadSignals", needs: needFair | needNotify, run: testFairLeaveSignals},
	{name: "DroppedHeadSignals", needs: needFair | needNotify, run: testFairDropSignals},
}

// fairTry calls AcquireFair with the suite's long TTL and checks the shape
// of its grant.
func (e *env) fairTry(t *testing.T, key, token string, lease time.Duration) stores.FairGrant {
	t.Helper()
	g, err := e.f.AcquireFair(t.Context(), key, token, e.long, lease)
	if err != nil {
		t.Fatalf("AcquireFair(%q, %q, lease %v): %v", key, token, lease, err)
	}
	checkGrant(t, g.Grant, 1, "AcquireFair("+key+", "+token+")")
	if !g.OK && g.Ahead < -1 {
		t.Fatalf("AcquireFair(%q, %q): Ahead %d, want -1 or more", key, token, g.Ahead)
	}
	return g
}

// expectGranted fails the test unless g is a grant with a positive fence.
func expectGranted(t *testing.T, g stores.FairGrant, who string) {
	t.Helper()
	if !g.OK || g.Fences[0] <= 0 {
		t.Fatalf("%s: %+v, want a grant with a fence", who, g)
	}
}

// expectRefused fails the test unless g is a refusal.
func expectRefused(t *testing.T, g stores.FairGrant, who string) {
	t.Helper()
	if g.OK {
		t.Fatalf("%s: granted (fences %v), want refused", who, g.Fences)
	}
}

// releaseKey releases one key with keep 0 and fails the test on an error.
func (e *env) releaseKey(t *testing.T, key, token string) {
	t.Helper()
	e.mustRelease(t, []string{key}, token)
}

// acquireKey acquires one key with a plain Acquire, as a FairGrant for
// expectGranted and expectRefused.
func (e *env) acquireKey(t *testing.T, key, token string) stores.FairGrant {
	t.Helper()
	return stores.FairGrant{Grant: e.acquire(t, []string{key}, token, e.long)}
}

// mustLeave calls LeaveFair and fails the test on an error.
func (e *env) mustLeave(t *testing.T, key, token string) {
	t.Helper()
	if err := e.f.LeaveFair(t.Context(), key, token); err != nil {
		t.Fatalf("LeaveFair(%q, %q): %v", key, token, err)
	}
}

// expectAhead fails the test unless g says ahead waiters are queued before
// the caller.
func expectAhead(t *testing.T, g stores.FairGrant, ahead int, who string) {
	t.Helper()
	if g.Ahead != ahead {
		t.Fatalf("%s: %d waiters ahead, want %d", who, g.Ahead, ahead)
	}
}

// holdWithQueue makes holder hold k and queues tokens behind it in order,
// checking each one's place and that it waits for the holder's TTL.
func (e *env) holdWithQueue(t *testing.T, k, holder string, lease time.Duration, tokens ...string) {
	t.Helper()
	expectGranted(t, e.acquireKey(t, k, holder), "holder")
	for i, tok := range tokens {
		g := e.fairTry(t, k, tok, lease)
		expectRefused(t, g, tok+" behind the holder")
		expectAhead(t, g, i, tok+" joining")
		if !e.waitIn(g.Wait, 0, e.long) {
			t.Fatalf("%s: Wait %v, want the holder's remaining TTL", tok, g.Wait)
		}
	}
}

// join queues token for k, which is held or has waiters ahead.
func (e *env) join(t *testing.T, k, token string, lease time.Duration) {
	t.Helper()
	expectRefused(t, e.fairTry(t, k, token, lease), token+" joining")
}

// testFairGrantsFreeKey: a free key with nobody queued is granted at once,
// with or without joining.
func testFairGrantsFreeKey(t *testing.T, e *env) {
	k := e.key("k")
	expectGranted(t, e.fairTry(t, k, "a", e.long), "first")
	e.releaseKey(t, k, "a")
	expectGranted(t, e.fairTry(t, k, "b", 0), "try once")
	e.releaseKey(t, k, "b")
}

// testFairQueueOrder: after the holder lets go, waiters are granted in the
// order they joined, whoever asks first.
func testFairQueueOrder(t *testing.T, e *env) {
	k := e.key("k")
	order := []string{"w0", "w1", "w2", "w3"}
	e.holdWithQueue(t, k, "holder", e.long, order...)
	e.releaseKey(t, k, "holder")
	for i, want := range order {
		// Every later waiter asks first, and is refused.
		for j, other := range order[i+1:] {
			g := e.fairTry(t, k, other, e.long)
			expectRefused(t, g, other+" while "+want+" heads the queue")
			expectAhead(t, g, j+1, other)
			if !e.waitIn(g.Wait, 0, e.long) {
				t.Fatalf("%s: Wait %v, want the head's remaining lease", other, g.Wait)
			}
		}
		expectGranted(t, e.fairTry(t, k, want, e.long), want)
		if i+1 < len(order) {
			g := e.fairTry(t, k, order[i+1], e.long)
			expectRefused(t, g, order[i+1]+" while "+want+" holds")
			expectAhead(t, g, 0, order[i+1]+", the new head")
		}
		e.releaseKey(t, k, want)
	}
	// The queue is empty now: a newcomer is granted at once.
	expectGranted(t, e.fairTry(t, k, "late", 0), "newcomer after the queue drained")
	e.releaseKey(t, k, "late")
}

// testFairTryOnce: a try (lease zero) never joins, and is refused while
// anybody waits.
func testFairTryOnce(t *testing.T, e *env) {
	k := e.key("k")
	e.holdWithQueue(t, k, "holder", e.long, "w")
	g := e.fairTry(t, k, "try", 0)
	expectRefused(t, g, "try while held")
	expectAhead(t, g, -1, "try")
	e.releaseKey(t, k, "holder")
	g = e.fairTry(t, k, "try", 0)
	expectRefused(t, g, "try while w waits for a free key")
	expectAhead(t, g, -1, "try")
	expectGranted(t, e.fairTry(t, k, "w", e.long), "w")
	e.releaseKey(t, k, "w")
	// "try" never joined: the queue is empty, so a newcomer wins at once.
	expectGranted(t, e.fairTry(t, k, "new", 0), "newcomer")
	e.releaseKey(t, k, "new")
}

// testFairRetriedAcquire: a retried AcquireFair (its reply was lost) finds
// the key holding the caller's token and is granted again, with a fence a
// stride above, even with other waiters queued.
func testFairRetriedAcquire(t *testing.T, e *env) {
	k := e.key("k")
	first := e.fairTry(t, k, "t1", e.long)
	expectGranted(t, first, "first attempt")
	e.join(t, k, "t2", e.long)
	retry := e.fairTry(t, k, "t1", e.long)
	expectGranted(t, retry, "retried attempt")
	expectStride(t, first.Fences[0], retry.Fences[0], "retried AcquireFair")
	e.releaseKey(t, k, "t1")
	e.mustLeave(t, k, "t2")
}

// testFairHeartbeat: a waiter that keeps calling keeps its place long past
// its lease.
func testFairHeartbeat(t *testing.T, e *env) {
	k := e.key("k")
	// Between two of a's calls come b's and a tick: at shortLease, a
	// loaded machine (a cluster's redirects, -race) let a's lease lapse
	// now and then. heartbeatLease leaves them most of a second.
	lease := max(e.shortLease, heartbeatLease)
	e.holdWithQueue(t, k, "holder", lease, "a")
	e.join(t, k, "b", e.long)
	end := time.Now().Add(4 * lease)
	tick := time.NewTicker(lease / 10)
	defer tick.Stop()
	for time.Now().Before(end) {
		expectRefused(t, e.fairTry(t, k, "a", lease), "a while held")
		expectRefused(t, e.fairTry(t, k, "b", e.long), "b while held")
		<-tick.C
	}
	e.releaseKey(t, k, "holder")
	expectRefused(t, e.fairTry(t, k, "b", e.long), "b behind a live a")
	expectGranted(t, e.fairTry(t, k, "a", lease), "a, which kept its place")
	e.releaseKey(t, k, "a")
	expectGranted(t, e.fairTry(t, k, "b", e.long), "b")
	e.releaseKey(t, k, "b")
}

// testFairLapsedLease: a waiter that stops calling is dropped once its lease
// has passed, and the next waiter gets the key.
func testFairLapsedLease(t *testing.T, e *env) {
	k := e.key("k")
	e.holdWithQueue(t, k, "holder", e.shortLease, "dead")
	e.join(t, k, "live", e.long)
	e.releaseKey(t, k, "holder")
	start := time.Now()
	deadline := start.Add(e.shortLease + expiryLimit)
	tick := time.NewTicker(e.shortLease / 10)
	defer tick.Stop()
	// Waiting for the dead waiter's lease to run out is the behaviour under
	// test.
	for {
		g := e.fairTry(t, k, "live", e.long)
		if g.OK {
			break
		}
		if g.Wait > e.shortLease {
			t.Fatalf("Wait %v while the dead head's lease is %v", g.Wait, e.shortLease)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the live waiter was not granted within %v of the dead one's lease", expiryLimit)
		}
		<-tick.C
	}
	if waited := time.Since(start); waited < e.shortLease/2 {
		t.Fatalf("granted after %v: the dead waiter's lease (%v) was not respected", waited, e.shortLease)
	}
	e.releaseKey(t, k, "live")
	// The dead waiter is gone: a newcomer is granted at once.
	expectGranted(t, e.fairTry(t, k, "new", 0), "newcomer")
	e.releaseKey(t, k, "new")
}

// testFairLeave: a waiter that leaves no longer blocks the queue; leaving
// twice, or a queue one never joined, is no error.
func testFairLeave(t *testing.T, e *env) {
	k := e.key("k")
	e.holdWithQueue(t, k, "holder", e.long, "a", "b")
	e.mustLeave(t, k, "a")
	e.mustLeave(t, k, "a")
	e.mustLeave(t, k, "never-joined")
	e.mustLeave(t, e.key("no-queue"), "x")
	e.releaseKey(t, k, "holder")
	expectGranted(t, e.fairTry(t, k, "b", e.long), "b after a left")
	e.releaseKey(t, k, "b")
	expectGranted(t, e.fairTry(t, k, "a", 0), "a, no longer queued, on an empty queue")
	e.releaseKey(t, k, "a")
}

// testFairFences: each fence is a stride above the previous grant's, across
// fair grants, plain grants, retries, a queued waiter's grant and a fair
// grant left to expire.
func testFairFences(t *testing.T, e *env) {
	k := e.key("k")
	var last int64
	next := func(g stores.FairGrant, who string) {
		t.Helper()
		expectGranted(t, g, who)
		if last != 0 {
			expectStride(t, last, g.Fences[0], who)
		}
		last = g.Fences[0]
	}
	for i := range 3 {
		tok := "plain" + strconv.Itoa(i)
		next(e.acquireKey(t, k, tok), tok)
		e.releaseKey(t, k, tok)
		tok = "fair" + strconv.Itoa(i)
		next(e.fairTry(t, k, tok, e.long), tok)
		next(e.fairTry(t, k, tok, e.long), tok+" retried")
		e.releaseKey(t, k, tok)
	}
	e.holdWithQueue(t, k, "holder", e.long, "queued")
	e.releaseKey(t, k, "holder")
	next(e.fairTry(t, k, "queued", e.long), "queued")
	e.releaseKey(t, k, "queued")

	g, err := e.f.AcquireFair(t.Context(), k, "expiring", e.expiry, e.long)
	if err != nil {
		t.Fatalf("AcquireFair with ttl %v: %v", e.expiry, err)
	}
	next(g, "expiring")
	// Waiting for the TTL to run out is the behaviour under test.
	next(stores.FairGrant{Grant: e.pollAcquire(t, []string{k}, "after-expiry", e.long, e.expiry+expiryLimit)}, "plain after the fair grant expired")
	e.releaseKey(t, k, "after-expiry")
}

// testFairPlainAcquire: the queue does not bind plain Acquire (fairness holds
// among fair waiters), and a plain holder blocks fair waiters like any other.
func testFairPlainAcquire(t *testing.T, e *env) {
	k := e.key("k")
	e.holdWithQueue(t, k, "holder", e.long, "w")
	e.releaseKey(t, k, "holder")
	expectGranted(t, e.acquireKey(t, k, "plain"), "plain acquire past the queue")
	expectRefused(t, e.fairTry(t, k, "w", e.long), "w while plain holds")
	e.releaseKey(t, k, "plain")
	expectGranted(t, e.fairTry(t, k, "w", e.long), "w")
	e.releaseKey(t, k, "w")
}

// testFairInvalid: an empty key, a non-positive ttl or a negative lease is
// refused with ErrInvalid, and nobody joins.
func testFairInvalid(t *testing.T, e *env) {
	ctx := t.Context()
	k := e.key("k")
	for _, tc := range []struct {
		key        string
		ttl, lease time.Duration
	}{
		{"", time.Second, time.Second},
		{k, 0, time.Second},
		{k, -time.Second, time.Second},
		{k, time.Second, -1},
	} {
		g, err := e.f.AcquireFair(ctx, tc.key, "t", tc.ttl, tc.lease)
		if !errors.Is(err, stores.ErrInvalid) || g.OK {
			t.Errorf("AcquireFair(%q, ttl %v, lease %v): %+v, %v; want stores.ErrInvalid", tc.key, tc.ttl, tc.lease, g, err)
		}
	}
	expectGranted(t, e.fairTry(t, k, "t2", 0), "a try after invalid calls: nobody joined")
	e.releaseKey(t, k, "t2")
}

// testFairCancelled: a call on an ended context fails without joining.
func testFairCancelled(t *testing.T, e *env) {
	k := e.key("k")
	ctx := cancelled()
	expectGranted(t, e.acquireKey(t, k, "holder"), "holder")
	if _, err := e.f.AcquireFair(ctx, k, "gone", e.long, e.long); !errors.Is(err, context.Canceled) {
		t.Fatalf("AcquireFair on a cancelled context: got %v, want context.Canceled", err)
	}
	if err := e.f.LeaveFair(ctx, k, "gone"); !errors.Is(err, context.Canceled) {
		t.Fatalf("LeaveFair on a cancelled context: got %v, want context.Canceled", err)
	}
	e.releaseKey(t, k, "holder")
	expectGranted(t, e.fairTry(t, k, "new", 0), "newcomer: the cancelled call did not join")
	e.releaseKey(t, k, "new")
}

// testFairMutualExclusion: concurrent fair waiters polling one key never hold
// it together, each is granted, and each grant's fence is a stride above
// the previous one.
func testFairMutualExclusion(t *testing.T, e *env) {
	k := e.key("k")
	const waiters, rounds = 8, 5
	var (
		inside, overlaps atomic.Int32
		lastFence        atomic.Int64
		strideErrs       atomic.Int32
		wg               sync.WaitGroup
		errs             = make(chan error, waiters)
	)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for w := range waiters {
		wg.Go(func() {
			tick := time.NewTicker(time.Millisecond) // a waiter's poll interval
			defer tick.Stop()
			for r := range rounds {
				token := "w" + strconv.Itoa(w) + "r" + strconv.Itoa(r)
				var g stores.FairGrant
				for {
					var err error
					if g, err = e.f.AcquireFair(ctx, k, token, e.long, e.long); err != nil {
						errs <- err // the deadline of ctx ends a waiter never granted
						return
					}
					if g.OK {
						break
					}
					<-tick.C
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				if prev := lastFence.Swap(g.Fences[0]); prev != 0 && g.Fences[0]-prev < stores.FenceStride {
					strideErrs.Add(1)
				}
				inside.Add(-1)
				if err := e.s.Release(context.Background(), []string{k}, token, 0); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if overlaps.Load() != 0 {
		t.Errorf("%d overlapping holders", overlaps.Load())
	}
	if strideErrs.Load() != 0 {
		t.Errorf("%d grants with a fence less than a stride above the previous one", strideErrs.Load())
	}
}

// testFairLeaveSignals: the head leaving a free key signals, so the next
// waiter wakes without polling. Each waiter subscribes with its token, and
// only the waiter whose turn came is expected to get the signal.
func testFairLeaveSignals(t *testing.T, e *env) {
	k := e.key("k")
	chHead, _ := e.subscribe(t, k, "head")
	chNext, _ := e.subscribe(t, k, "next")
	e.prime(t, k, chHead)
	e.prime(t, k, chNext)
	e.holdWithQueue(t, k, "holder", e.long, "head", "next")
	e.releaseKey(t, k, "holder")
	expectSignal(t, chHead, "to the head after the holder's release")
	e.flush(t)
	drain(chHead)
	drain(chNext)
	e.mustLeave(t, k, "head")
	expectSignal(t, chNext, "to the next waiter after the head left a free key")
	expectGranted(t, e.fairTry(t, k, "next", e.long), "next")
	e.releaseKey(t, k, "next")
}

// testFairDropSignals: an attempt that drops a dead head of a free key
// signals, so the new head wakes without polling.
func testFairDropSignals(t *testing.T, e *env) {
	k := e.key("k")
	ch, _ := e.subscribe(t, k, "head")
	e.prime(t, k, ch)
	e.holdWithQueue(t, k, "holder", e.shortLease, "dead")
	e.join(t, k, "head", e.long)
	e.join(t, k, "third", e.long)
	e.releaseKey(t, k, "holder")
	deadline := time.Now().Add(e.shortLease + expiryLimit)
	tick := time.NewTicker(e.shortLease / 10)
	defer tick.Stop()
	// Waiting for the dead head's lease to run out is the behaviour under
	// test.
	for {
		e.flush(t)
		drain(ch)
		// "third" polls; once the dead head's lease has passed, its
		// attempt drops it and must signal the new head.
		if g := e.fairTry(t, k, "third", e.long); g.OK {
			t.Fatal("third granted ahead of head")
		} else if g.Wait > e.shortLease {
			break // the head is now "head", whose lease is long
		}
		if time.Now().After(deadline) {
			t.Fatal("the dead head was not dropped")
		}
		<-tick.C
	}
	expectSignal(t, ch, "to the new head after an attempt dropped the dead head of a free key")
	expectGranted(t, e.fairTry(t, k, "head", e.long), "head")
	e.releaseKey(t, k, "head")
}
