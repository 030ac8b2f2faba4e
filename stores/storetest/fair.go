package storetest

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
)

// Leases of the fair subtests: longLease outlives every subtest; shortLease
// lapses within one, so a waiter that stops calling is dropped.
const (
	longLease  = 10 * time.Second
	shortLease = 300 * time.Millisecond
)

// RunFair runs the conformance suite of reqlock.FairStore as subtests of t.
// newStore is called once per subtest and must return a store that
// implements reqlock.FairStore. The signal subtests apply to stores that also
// implement reqlock.ReleaseNotifier.
func RunFair(t *testing.T, newStore func(t *testing.T) reqlock.Store) {
	runSuite(t, newStore, "", []suiteCase[reqlock.FairStore]{
		{"GrantsAFreeKeyAtOnce", testFairGrantsFreeKey},
		{"GrantsInQueueOrder", testFairQueueOrder},
		{"TryOnceDoesNotJoin", testFairTryOnce},
		{"RetriedAcquireIsGranted", testFairRetriedAcquire},
		{"HeartbeatKeepsPlace", testFairHeartbeat},
		{"LapsedLeaseIsDropped", testFairLapsedLease},
		{"LeaveLetsNextIn", testFairLeave},
		{"FencesIncreaseAcrossFairAndPlain", testFairFences},
		{"PlainAcquireIgnoresQueue", testFairPlainAcquire},
		{"InvalidArguments", testFairInvalid},
		{"CancelledContext", testFairCancelled},
		{"MutualExclusionAndProgress", testFairMutualExclusion},
		{"LeaveOfHeadSignals", withNotifier(testFairLeaveSignals)},
		{"DroppedHeadSignals", withNotifier(testFairDropSignals)},
	})
}

func fairTry(t *testing.T, f reqlock.FairStore, key, token string, lease time.Duration) reqlock.FairGrant {
	t.Helper()
	g, err := f.AcquireFair(context.Background(), key, token, longTTL, lease)
	if err != nil {
		t.Fatalf("AcquireFair(%q, %q, lease %v): %v", key, token, lease, err)
	}
	return g
}

func expectGranted(t *testing.T, g reqlock.FairGrant, who string) {
	t.Helper()
	if !g.OK || g.Fence <= 0 {
		t.Fatalf("%s: %+v, want a grant with a fence", who, g)
	}
}

func expectRefused(t *testing.T, g reqlock.FairGrant, who string) {
	t.Helper()
	if g.OK {
		t.Fatalf("%s: granted (fence %d), want refused", who, g.Fence)
	}
}

func mustRelease(t *testing.T, s reqlock.Store, key, token string) {
	t.Helper()
	if err := s.Release(context.Background(), key, token, 0); err != nil {
		t.Fatalf("Release(%q, %q): %v", key, token, err)
	}
}

func mustLeave(t *testing.T, f reqlock.FairStore, key, token string) {
	t.Helper()
	if err := f.LeaveFair(context.Background(), key, token); err != nil {
		t.Fatalf("LeaveFair(%q, %q): %v", key, token, err)
	}
}

// plain wraps a Store.Acquire outcome for expectGranted and expectRefused.
func plain(g reqlock.Grant) reqlock.FairGrant { return reqlock.FairGrant{Grant: g} }

// expectAhead fails the test unless g says ahead waiters are queued before
// the caller.
func expectAhead(t *testing.T, g reqlock.FairGrant, ahead int, who string) {
	t.Helper()
	if g.Ahead != ahead {
		t.Fatalf("%s: %d waiters ahead, want %d", who, g.Ahead, ahead)
	}
}

// holdWithQueue makes holder hold k and queues tokens behind it in order.
func holdWithQueue(t *testing.T, s reqlock.Store, f reqlock.FairStore, k, holder string, lease time.Duration, tokens ...string) {
	t.Helper()
	expectGranted(t, plain(mustAcquire(t, s, k, holder, longTTL)), "holder")
	for i, tok := range tokens {
		g := fairTry(t, f, k, tok, lease)
		expectRefused(t, g, tok+" behind the holder")
		expectAhead(t, g, i, tok+" joining")
		if g.HolderTTL <= 0 || g.HolderTTL > longTTL {
			t.Fatalf("%s: hint %v, want the holder's remaining TTL", tok, g.HolderTTL)
		}
	}
}

// testFairGrantsFreeKey: a free key with nobody queued is granted at once,
// with or without joining.
func testFairGrantsFreeKey(t *testing.T, s reqlock.Store, f reqlock.FairStore, key func(string) string) {
	k := key("k")
	expectGranted(t, fairTry(t, f, k, "a", longLease), "first")
	mustRelease(t, s, k, "a")
	expectGranted(t, fairTry(t, f, k, "b", 0), "try once")
	mustRelease(t, s, k, "b")
}

// testFairQueueOrder: after the holder lets go, waiters are granted in the
// order they joined, whoever asks first.
func testFairQueueOrder(t *testing.T, s reqlock.Store, f reqlock.FairStore, key func(string) string) {
	k := key("k")
	order := []string{"w0", "w1", "w2", "w3"}
	holdWithQueue(t, s, f, k, "holder", longLease, order...)
	mustRelease(t, s, k, "holder")
	for i, want := range order {
		// Every later waiter asks first, and is refused.
		for j, other := range order[i+1:] {
			g := fairTry(t, f, k, other, longLease)
			expectRefused(t, g, other+" while "+want+" heads the queue")
			expectAhead(t, g, j+1, other)
			if g.HolderTTL <= 0 || g.HolderTTL > longLease {
				t.Fatalf("%s: hint %v, want the head's remaining lease", other, g.HolderTTL)
			}
		}
		expectGranted(t, fairTry(t, f, k, want, longLease), want)
		if i+1 < len(order) {
			g := fairTry(t, f, k, order[i+1], longLease)
			expectRefused(t, g, order[i+1]+" while "+want+" holds")
			expectAhead(t, g, 0, order[i+1]+", the new head")
		}
		mustRelease(t, s, k, want)
	}
	// The queue is empty now: a newcomer is granted at once.
	expectGranted(t, fairTry(t, f, k, "late", 0), "newcomer after the queue drained")
	mustRelease(t, s, k, "late")
}

// testFairTryOnce: a try (lease zero) never joins, and is refused while
// anybody waits.
func testFairTryOnce(t *testing.T, s reqlock.Store, f reqlock.FairStore, key func(string) string) {
	k := key("k")
	holdWithQueue(t, s, f, k, "holder", longLease, "w")
	g := fairTry(t, f, k, "try", 0)
	expectRefused(t, g, "try while held")
	expectAhead(t, g, -1, "try")
	mustRelease(t, s, k, "holder")
	g = fairTry(t, f, k, "try", 0)
	expectRefused(t, g, "try while w waits for a free key")
	expectAhead(t, g, -1, "try")
	expectGranted(t, fairTry(t, f, k, "w", longLease), "w")
	mustRelease(t, s, k, "w")
	// "try" never joined: the queue is empty, so a newcomer wins at once.
	expectGranted(t, fairTry(t, f, k, "new", 0), "newcomer")
	mustRelease(t, s, k, "new")
}

// testFairHeartbeat: a waiter that keeps calling keeps its place long past
// its lease.
func testFairHeartbeat(t *testing.T, s reqlock.Store, f reqlock.FairStore, key func(string) string) {
	k := key("k")
	holdWithQueue(t, s, f, k, "holder", shortLease, "a")
	holdWithQueueJoin(t, f, k, "b", longLease)
	end := time.Now().Add(4 * shortLease)
	tick := time.NewTicker(shortLease / 10)
	defer tick.Stop()
	for time.Now().Before(end) {
		expectRefused(t, fairTry(t, f, k, "a", shortLease), "a while held")
		expectRefused(t, fairTry(t, f, k, "b", longLease), "b while held")
		<-tick.C
	}
	mustRelease(t, s, k, "holder")
	expectRefused(t, fairTry(t, f, k, "b", longLease), "b behind a live a")
	expectGranted(t, fairTry(t, f, k, "a", shortLease), "a, which kept its place")
	mustRelease(t, s, k, "a")
	expectGranted(t, fairTry(t, f, k, "b", longLease), "b")
	mustRelease(t, s, k, "b")
}

func holdWithQueueJoin(t *testing.T, f reqlock.FairStore, k, token string, lease time.Duration) {
	t.Helper()
	expectRefused(t, fairTry(t, f, k, token, lease), token+" joining")
}

// testFairLapsedLease: a waiter that stops calling is dropped once its lease
// has passed, and the next waiter gets the key.
func testFairLapsedLease(t *testing.T, s reqlock.Store, f reqlock.FairStore, key func(string) string) {
	k := key("k")
	holdWithQueue(t, s, f, k, "holder", shortLease, "dead")
	holdWithQueueJoin(t, f, k, "live", longLease)
	mustRelease(t, s, k, "holder")
	start := time.Now()
	deadline := start.Add(shortLease + signalWait)
	tick := time.NewTicker(shortLease / 10)
	defer tick.Stop()
	for {
		g := fairTry(t, f, k, "live", longLease)
		if g.OK {
			break
		}
		if g.HolderTTL > shortLease {
			t.Fatalf("hint %v while the dead head's lease is %v", g.HolderTTL, shortLease)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the live waiter was not granted within %v of the dead one's lease", signalWait)
		}
		<-tick.C
	}
	if waited := time.Since(start); waited < shortLease/2 {
		t.Fatalf("granted after %v: the dead waiter's lease (%v) was not respected", waited, shortLease)
	}
	mustRelease(t, s, k, "live")
	// The dead waiter is gone: a newcomer is granted at once.
	expectGranted(t, fairTry(t, f, k, "new", 0), "newcomer")
	mustRelease(t, s, k, "new")
}

// testFairLeave: a waiter that leaves no longer blocks the queue; leaving
// twice, or a queue one never joined, is no error.
func testFairLeave(t *testing.T, s reqlock.Store, f reqlock.FairStore, key func(string) string) {
	k := key("k")
	holdWithQueue(t, s, f, k, "holder", longLease, "a", "b")
	mustLeave(t, f, k, "a")
	mustLeave(t, f, k, "a")
	mustLeave(t, f, k, "never-joined")
	mustLeave(t, f, key("no-queue"), "x")
	mustRelease(t, s, k, "holder")
	expectGranted(t, fairTry(t, f, k, "b", longLease), "b after a left")
	mustRelease(t, s, k, "b")
	expectGranted(t, fairTry(t, f, k, "a", 0), "a, no longer queued, on an empty queue")
	mustRelease(t, s, k, "a")
}

// testFairFences: fences strictly grow across fair grants, plain grants and
// a release that reports a raised fence.
func testFairFences(t *testing.T, s reqlock.Store, f reqlock.FairStore, key func(string) string) {
	ctx := context.Background()
	k := key("k")
	var last int64
	next := func(g reqlock.FairGrant, who string) {
		t.Helper()
		expectGranted(t, g, who)
		if g.Fence <= last {
			t.Fatalf("%s: fence %d after %d", who, g.Fence, last)
		}
		last = g.Fence
	}
	for i := range 3 {
		tok := "plain" + strconv.Itoa(i)
		next(plain(mustAcquire(t, s, k, tok, longTTL)), tok)
		if err := s.Release(ctx, k, tok, last+100); err != nil { // as after local handoffs
			t.Fatal(err)
		}
		last += 100
		tok = "fair" + strconv.Itoa(i)
		next(fairTry(t, f, k, tok, longLease), tok)
		mustRelease(t, s, k, tok)
	}
	holdWithQueue(t, s, f, k, "holder", longLease, "queued")
	mustRelease(t, s, k, "holder")
	next(fairTry(t, f, k, "queued", longLease), "queued")
	mustRelease(t, s, k, "queued")
}

// testFairPlainAcquire: the queue does not bind plain Acquire (fairness holds
// among fair waiters), and a plain holder blocks fair waiters like any other.
func testFairPlainAcquire(t *testing.T, s reqlock.Store, f reqlock.FairStore, key func(string) string) {
	k := key("k")
	holdWithQueue(t, s, f, k, "holder", longLease, "w")
	mustRelease(t, s, k, "holder")
	expectGranted(t, plain(mustAcquire(t, s, k, "plain", longTTL)), "plain acquire past the queue")
	expectRefused(t, fairTry(t, f, k, "w", longLease), "w while plain holds")
	mustRelease(t, s, k, "plain")
	expectGranted(t, fairTry(t, f, k, "w", longLease), "w")
	mustRelease(t, s, k, "w")
}

func testFairInvalid(t *testing.T, _ reqlock.Store, f reqlock.FairStore, key func(string) string) {
	ctx := context.Background()
	k := key("k")
	for _, tc := range []struct{ ttl, lease time.Duration }{{0, time.Second}, {-time.Second, time.Second}, {time.Second, -1}} {
		if _, err := f.AcquireFair(ctx, k, "t", tc.ttl, tc.lease); !errors.Is(err, reqlock.ErrInvalid) {
			t.Errorf("AcquireFair(ttl %v, lease %v): %v, want ErrInvalid", tc.ttl, tc.lease, err)
		}
	}
	expectGranted(t, fairTry(t, f, k, "t", 0), "after invalid calls")
}

// testFairCancelled: a call on an ended context fails without joining.
func testFairCancelled(t *testing.T, s reqlock.Store, f reqlock.FairStore, key func(string) string) {
	k := key("k")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	expectGranted(t, plain(mustAcquire(t, s, k, "holder", longTTL)), "holder")
	if _, err := f.AcquireFair(ctx, k, "gone", longTTL, longLease); !errors.Is(err, context.Canceled) {
		t.Fatalf("AcquireFair on a cancelled context: %v", err)
	}
	if err := f.LeaveFair(ctx, k, "gone"); !errors.Is(err, context.Canceled) {
		t.Fatalf("LeaveFair on a cancelled context: %v", err)
	}
	mustRelease(t, s, k, "holder")
	expectGranted(t, fairTry(t, f, k, "new", 0), "newcomer: the cancelled call did not join")
	mustRelease(t, s, k, "new")
}

// testFairMutualExclusion: concurrent fair waiters polling one key never hold
// it together, and each is granted.
func testFairMutualExclusion(t *testing.T, s reqlock.Store, f reqlock.FairStore, key func(string) string) {
	k := key("k")
	const waiters, rounds = 8, 5
	var (
		inside, overlaps atomic.Int32
		wg               sync.WaitGroup
		errs             = make(chan error, waiters)
	)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for w := range waiters {
		wg.Go(func() {
			for r := range rounds {
				token := "w" + strconv.Itoa(w) + "r" + strconv.Itoa(r)
				for {
					g, err := f.AcquireFair(ctx, k, token, longTTL, longLease)
					if err != nil {
						errs <- err
						return
					}
					if g.OK {
						break
					}
					time.Sleep(time.Millisecond) // poll interval, as a waiter's backoff
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				inside.Add(-1)
				if err := s.Release(context.Background(), k, token, 0); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if overlaps.Load() != 0 {
		t.Fatalf("%d overlapping holders", overlaps.Load())
	}
}

// testFairLeaveSignals: the head leaving a free key signals, so the next
// waiter wakes without polling.
func testFairLeaveSignals(t *testing.T, s reqlock.Store, f reqlock.FairStore, n reqlock.ReleaseNotifier, key func(string) string) {
	k := key("k")
	ch, _ := subscribe(t, n, k)
	prime(t, s, k, ch)
	holdWithQueue(t, s, f, k, "holder", longLease, "head", "next")
	mustRelease(t, s, k, "holder")
	expectSignal(t, ch, "after the holder's release")
	flush(t, s, n, key)
	drain(ch)
	mustLeave(t, f, k, "head")
	expectSignal(t, ch, "after the head left a free key")
	expectGranted(t, fairTry(t, f, k, "next", longLease), "next")
	mustRelease(t, s, k, "next")
}

// testFairDropSignals: an attempt that drops a dead head of a free key
// signals, so the new head wakes without polling.
func testFairDropSignals(t *testing.T, s reqlock.Store, f reqlock.FairStore, n reqlock.ReleaseNotifier, key func(string) string) {
	k := key("k")
	ch, _ := subscribe(t, n, k)
	prime(t, s, k, ch)
	holdWithQueue(t, s, f, k, "holder", shortLease, "dead")
	holdWithQueueJoin(t, f, k, "head", longLease)
	holdWithQueueJoin(t, f, k, "third", longLease)
	mustRelease(t, s, k, "holder")
	expectSignal(t, ch, "after the holder's release")
	deadline := time.Now().Add(shortLease + signalWait)
	tick := time.NewTicker(shortLease / 10)
	defer tick.Stop()
	for {
		flush(t, s, n, key)
		drain(ch)
		// "third" polls; once the dead head's lease has passed, its
		// attempt drops it and must signal the new head.
		if g := fairTry(t, f, k, "third", longLease); g.OK {
			t.Fatal("third granted ahead of head")
		} else if g.HolderTTL > shortLease {
			break // the head is now "head", whose lease is long
		}
		if time.Now().After(deadline) {
			t.Fatal("the dead head was not dropped")
		}
		<-tick.C
	}
	expectSignal(t, ch, "after an attempt dropped the dead head of a free key")
	expectGranted(t, fairTry(t, f, k, "head", longLease), "head")
	mustRelease(t, s, k, "head")
}

// A retried AcquireFair (its reply was lost) finds the key holding the
// caller's token and is granted again, even with other waiters queued.
func testFairRetriedAcquire(t *testing.T, s reqlock.Store, f reqlock.FairStore, key func(string) string) {
	k := key("k")
	lease := time.Minute
	first := fairTry(t, f, k, "t1", lease)
	expectGranted(t, first, "first attempt")
	expectRefused(t, fairTry(t, f, k, "t2", lease), "a waiter")
	retry := fairTry(t, f, k, "t1", lease)
	expectGranted(t, retry, "retried attempt")
	if retry.Fence <= first.Fence {
		t.Fatalf("retry fence %d, want above %d", retry.Fence, first.Fence)
	}
	mustRelease(t, s, k, "t1")
	mustLeave(t, f, k, "t2")
}
