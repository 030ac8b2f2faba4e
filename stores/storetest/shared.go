package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// sharedTests are the Shared subtests: readers (limit 0) together, a writer
// (a plain Acquire) alone, writer preference, and the rules every holder
// keeps (see stores.SharedStore).
var sharedTests = []subtest{
	{name: "ReadersTogether", needs: needShared, run: testReadersTogether},
	{name: "WriterExcluded", needs: needShared, run: testWriterExcluded},
	{name: "WriterExcludes", needs: needShared, run: testWriterExcludes},
	{name: "WriterPreference", needs: needShared, run: testWriterPreference},
	{name: "WriterWindowLapses", needs: needShared, run: testWriterWindowLapses},
	{name: "WriterWithdraws", needs: needShared, run: testWriterWithdraws},
	{name: "WritersEachRecorded", needs: needShared, run: testWritersEachRecorded},
	{name: "WriterNotStarved", needs: needShared, run: testWriterNotStarved},
	{name: "OwnerChecks", needs: needShared, run: testSharedOwnerChecks},
	{name: "Fences", needs: needShared, run: testSharedFences},
	{name: "Retry", needs: needShared, run: testSharedRetry},
	{name: "Refresh", needs: needShared, run: testSharedRefresh},
	{name: "Keep", needs: needShared, run: testSharedKeep},
	{name: "Notify", needs: needShared | needNotify, run: testSharedNotify},
	{name: "Bounds", needs: needShared, run: testSharedBounds},
	{name: "Abandoned", needs: needShared, run: testSharedAbandoned},
}

// limitedTests are the Limit subtests: at most N holders of a key.
var limitedTests = []subtest{
	{name: "Full", needs: needShared, run: testLimitFull},
	{name: "NeverExceeded", needs: needShared, run: testLimitNeverExceeded},
	{name: "PerHolderExpiry", needs: needShared, run: testLimitPerHolderExpiry},
	{name: "StaleHolder", needs: needShared, run: testLimitStaleHolder},
	{name: "RetryCountsOnce", needs: needShared, run: testLimitRetryCountsOnce},
	{name: "OwnLimit", needs: needShared, run: testLimitOwnLimit},
}

// acquireShared calls AcquireShared and checks the shape of its grant.
func (e *env) acquireShared(t *testing.T, key, token string, limit int, ttl time.Duration) stores.Grant {
	t.Helper()
	g, err := e.sh.AcquireShared(t.Context(), key, token, limit, ttl)
	if err != nil {
		t.Fatalf("AcquireShared(%s, %q, limit %d): %v", stores.KeyForMessage(key), token, limit, err)
	}
	checkGrant(t, g, 1, "AcquireShared("+stores.KeyForMessage(key)+")")
	return g
}

// mustShare calls AcquireShared and fails the test unless it grants.
func (e *env) mustShare(t *testing.T, key, token string, limit int, ttl time.Duration) stores.Grant {
	t.Helper()
	g := e.acquireShared(t, key, token, limit, ttl)
	if !g.OK {
		t.Fatalf("AcquireShared(%s, %q, limit %d) refused: %+v", stores.KeyForMessage(key), token, limit, g)
	}
	return g
}

// refuseShare fails the test unless AcquireShared refuses token, with a
// Wait in (0, atMost], and returns the refusal.
func (e *env) refuseShare(t *testing.T, key, token string, limit int, atMost time.Duration, what string) stores.Grant {
	t.Helper()
	g := e.acquireShared(t, key, token, limit, e.long)
	if g.OK {
		t.Fatalf("%s: AcquireShared(%q, limit %d) granted, want refused", what, token, limit)
	}
	if !e.waitIn(g.Wait, 0, atMost) {
		t.Fatalf("%s: refused with Wait %v, want in (0, %v]", what, g.Wait, atMost)
	}
	return g
}

// mustUnshare releases token's place with keep 0 and fails on an error.
func (e *env) mustUnshare(t *testing.T, key, token string) {
	t.Helper()
	if err := e.sh.ReleaseShared(t.Context(), key, token, 0); err != nil {
		t.Fatalf("ReleaseShared(%s, %q): %v", stores.KeyForMessage(key), token, err)
	}
}

// pollShare retries AcquireShared until it grants or limit passes.
func (e *env) pollShare(t *testing.T, key, token string, lim int, ttl, limit time.Duration) stores.Grant {
	t.Helper()
	deadline := time.Now().Add(limit)
	ticker := time.NewTicker(5 * time.Millisecond)
	defer ticker.Stop()
	for {
		if g := e.acquireShared(t, key, token, lim, ttl); g.OK {
			return g
		}
		if time.Now().After(deadline) {
			t.Fatalf("AcquireShared(%s, %q) not granted within %v", stores.KeyForMessage(key), token, limit)
		}
		<-ticker.C
	}
}

// testReadersTogether: readers hold a key together, each with a fence of
// its own above the one before.
func testReadersTogether(t *testing.T, e *env) {
	k := e.key("k")
	var prev int64
	for i := range 5 {
		g := e.mustShare(t, k, "r"+strconv.Itoa(i), 0, e.long)
		if i > 0 {
			expectStride(t, prev, g.Fences[0], "the next reader")
		}
		prev = g.Fences[0]
	}
	for i := range 5 {
		e.mustUnshare(t, k, "r"+strconv.Itoa(i))
	}
}

// testWriterExcluded: a key with readers refuses a writer, plain and fair,
// with the longest remaining TTL of the readers, until the last one leaves.
func testWriterExcluded(t *testing.T, e *env) {
	k := e.key("k")
	e.mustShare(t, k, "r1", 0, e.short)
	e.mustShare(t, k, "r2", 0, e.long)
	g := e.acquire(t, []string{k}, "w", e.long)
	if g.OK || g.Held != 0 || !g.SharedHeld || !e.waitIn(g.Wait, e.short, e.long) {
		t.Fatalf("Acquire of a key with readers: %+v, want refused with SharedHeld and Wait in (%v, %v] (the longest reader's)", g, e.short, e.long)
	}
	if e.f != nil {
		fg, err := e.f.AcquireFair(t.Context(), k, "wf", e.long, 0)
		if err != nil || fg.OK || !fg.SharedHeld {
			t.Fatalf("AcquireFair of a key with readers: %+v, %v, want refused with SharedHeld", fg, err)
		}
		// wf's record stands too: withdraw it.
		expectNotHeld(t, e.s.Release(t.Context(), []string{k}, "wf", 0), "Release of a waiting fair writer")
	}
	e.mustUnshare(t, k, "r2")
	if g := e.acquire(t, []string{k}, "w", e.long); g.OK {
		t.Fatal("Acquire granted while a reader still holds the key")
	}
	e.mustUnshare(t, k, "r1")
	e.mustAcquire(t, []string{k}, "w", e.long)
	e.mustRelease(t, []string{k}, "w")
}

// testWriterExcludes: a writer's key refuses readers and limited holders,
// with its remaining TTL, until it is released.
func testWriterExcludes(t *testing.T, e *env) {
	k := e.key("k")
	e.mustAcquire(t, []string{k}, "w", e.short)
	if g := e.acquire(t, []string{k}, "w2", e.long); g.OK || g.SharedHeld {
		t.Fatalf("Acquire of a written key: %+v, want refused without SharedHeld", g)
	}
	for _, limit := range []int{0, 1, 3} {
		g := e.refuseShare(t, k, "r", limit, e.short, "a reader of a written key")
		if g.Held != 0 {
			t.Fatalf("refused with Held %d, want 0", g.Held)
		}
	}
	// A writer's token is no holder's either.
	e.refuseShare(t, k, "w", 0, e.short, "the writer's own token, shared")
	e.mustRelease(t, []string{k}, "w")
	e.mustShare(t, k, "r", 0, e.long)
	e.mustUnshare(t, k, "r")
}

// testWriterPreference: a writer refused by readers keeps new readers out,
// while the readers already in may retry their grant; the writer gets the
// key once they leave, and new readers come in after it.
func testWriterPreference(t *testing.T, e *env) {
	k := e.key("k")
	e.mustShare(t, k, "r1", 0, e.long)
	if g := e.acquire(t, []string{k}, "w", e.long); g.OK {
		t.Fatal("Acquire granted over a reader")
	}
	g := e.refuseShare(t, k, "r2", 0, stores.WriterWindow, "a new reader while a writer waits")
	if g.Held != 0 {
		t.Fatalf("refused with Held %d, want 0", g.Held)
	}
	e.mustShare(t, k, "r1", 0, e.long) // a retry of a holder
	e.mustUnshare(t, k, "r1")
	e.mustAcquire(t, []string{k}, "w", e.long)
	e.mustRelease(t, []string{k}, "w")
	// The writer's grant ended its wait: readers come in at once.
	e.mustShare(t, k, "r2", 0, e.long)
	e.mustUnshare(t, k, "r2")
}

// testWriterWindowLapses: a writer that stops trying keeps new readers out
// for about stores.WriterWindow, no longer.
func testWriterWindowLapses(t *testing.T, e *env) {
	k := e.key("k")
	e.mustShare(t, k, "r1", 0, e.long)
	refused := time.Now()
	if g := e.acquire(t, []string{k}, "w", e.long); g.OK {
		t.Fatal("Acquire granted over a reader")
	}
	e.refuseShare(t, k, "r2", 0, stores.WriterWindow, "a new reader right after the writer's refusal")
	e.pollShare(t, k, "r2", 0, e.long, stores.WriterWindow+expiryLimit)
	if took := time.Since(refused); took < stores.WriterWindow-expiryEarly {
		t.Fatalf("a new reader was granted %v after the writer's refusal, before its window of %v", took, stores.WriterWindow)
	}
	e.mustUnshare(t, k, "r1")
	e.mustUnshare(t, k, "r2")
}

// testWriterWithdraws: a Release by a writer refused by readers, which
// holds nothing, answers ErrNotHeld and withdraws its record: new readers
// come in at once, not after stores.WriterWindow.
func testWriterWithdraws(t *testing.T, e *env) {
	k := e.key("k")
	e.mustShare(t, k, "r1", 0, e.long)
	if g := e.acquire(t, []string{k}, "w", e.long); g.OK || !g.SharedHeld {
		t.Fatalf("Acquire over a reader: %+v, want refused with SharedHeld", g)
	}
	e.refuseShare(t, k, "r2", 0, stores.WriterWindow, "a new reader while a writer waits")
	withdrawn := time.Now()
	expectNotHeld(t, e.s.Release(t.Context(), []string{k}, "w", 0), "Release by a waiting writer")
	e.mustShare(t, k, "r2", 0, e.long)
	if took := time.Since(withdrawn); took >= stores.WriterWindow/2 {
		t.Fatalf("a new reader got in %v after the writer withdrew, want at once", took)
	}
	// The reader the writer met still holds: the withdrawal touched no
	// holder.
	if err := e.sh.RefreshShared(t.Context(), k, "r1", e.long); err != nil {
		t.Fatalf("RefreshShared of the reader after the writer withdrew: %v", err)
	}
	e.mustUnshare(t, k, "r1")
	e.mustUnshare(t, k, "r2")
}

// testWritersEachRecorded: each refused writer has a record of its own. One
// writer's withdrawal, or grant, leaves the other's standing: new readers
// stay out until every writer has been granted or withdrawn.
func testWritersEachRecorded(t *testing.T, e *env) {
	k := e.key("k")
	e.mustShare(t, k, "r1", 0, e.long)
	for _, w := range []string{"w1", "w2"} {
		if g := e.acquire(t, []string{k}, w, e.long); g.OK || !g.SharedHeld {
			t.Fatalf("Acquire of %s over a reader: %+v, want refused with SharedHeld", w, g)
		}
	}
	expectNotHeld(t, e.s.Release(t.Context(), []string{k}, "w1", 0), "Release by waiting writer w1")
	e.refuseShare(t, k, "r2", 0, stores.WriterWindow, "a new reader while w2 still waits")
	expectNotHeld(t, e.s.Release(t.Context(), []string{k}, "w2", 0), "Release by waiting writer w2")
	e.mustShare(t, k, "r2", 0, e.long) // no writer waits now

	// w1 and w2 wait again; w1 is granted once the readers leave, and w2's
	// record still keeps new readers out.
	for _, w := range []string{"w1", "w2"} {
		if g := e.acquire(t, []string{k}, w, e.long); g.OK {
			t.Fatalf("Acquire of %s granted over readers", w)
		}
	}
	e.mustUnshare(t, k, "r1")
	e.mustUnshare(t, k, "r2")
	e.mustAcquire(t, []string{k}, "w1", e.long)
	e.mustRelease(t, []string{k}, "w1")
	e.refuseShare(t, k, "r3", 0, stores.WriterWindow, "a new reader after w1's grant while w2 waits")
	e.mustAcquire(t, []string{k}, "w2", e.long)
	e.mustRelease(t, []string{k}, "w2")
	e.mustShare(t, k, "r3", 0, e.long) // both writers had the key
	e.mustUnshare(t, k, "r3")
}

// sharedRun is how long the concurrent subtests run their holders.
const sharedRun = 1500 * time.Millisecond

// testWriterNotStarved: readers that come and go so that the key never has
// no reader for long do not keep a writer that tries every 10ms out for
// more than a few of their holds; and no reader holds while the writer does.
func testWriterNotStarved(t *testing.T, e *env) {
	k := e.key("k")
	const readers = 8
	hold := 20 * time.Millisecond
	var (
		active  atomic.Int64 // readers granted and not yet releasing
		writing atomic.Bool
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		errs    = make(chan error, readers+1)
	)
	for i := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			token := "r" + strconv.Itoa(i)
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				g, err := e.sh.AcquireShared(context.Background(), k, token+"-"+strconv.Itoa(n), 0, e.long)
				if err != nil {
					errs <- err
					return
				}
				if !g.OK {
					<-time.After(time.Millisecond) // a reader's poll
					continue
				}
				active.Add(1)
				if writing.Load() {
					errs <- fmt.Errorf("reader %s granted while the writer holds the key", token)
				}
				<-time.After(hold) // the reader's work
				active.Add(-1)
				if err := e.sh.ReleaseShared(context.Background(), k, token+"-"+strconv.Itoa(n), 0); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	// Let the readers overlap first.
	deadline := time.Now().Add(expiryLimit)
	for active.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the readers never overlapped")
		}
		<-time.After(time.Millisecond)
	}
	start := time.Now()
	limit := 2*stores.WriterWindow + expiryLimit
	for {
		g := e.acquire(t, []string{k}, "w", e.long)
		if g.OK {
			writing.Store(true)
			if n := active.Load(); n != 0 {
				t.Fatalf("the writer was granted while %d readers hold the key", n)
			}
			break
		}
		if time.Since(start) > limit {
			t.Fatalf("a writer among %d readers was not granted within %v: starved", readers, limit)
		}
		<-time.After(10 * time.Millisecond)
	}
	took := time.Since(start)
	<-time.After(2 * hold) // the writer's work, while readers keep trying
	writing.Store(false)
	e.mustRelease(t, []string{k}, "w")
	t.Logf("the writer got the key after %v among %d readers holding %v each", took, readers, hold)
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
}

// testSharedOwnerChecks: each kind of grant is let go and renewed by its
// own operations and its own token only.
func testSharedOwnerChecks(t *testing.T, e *env) {
	k, x := e.key("k"), e.key("x")
	e.mustShare(t, k, "r1", 0, e.long)
	e.mustShare(t, k, "r2", 0, e.long)
	expectNotHeld(t, e.sh.ReleaseShared(t.Context(), k, "other", 0), "ReleaseShared by a token that holds nothing")
	expectNotHeld(t, e.sh.RefreshShared(t.Context(), k, "other", e.long), "RefreshShared by a token that holds nothing")
	expectNotHeld(t, e.s.Release(t.Context(), []string{k}, "r1", 0), "Release of a reader's token")
	expectNotHeld(t, e.s.Refresh(t.Context(), []string{k}, "r1", e.long), "Refresh of a reader's token")
	// r1 still holds: its own release works once, then not again.
	e.mustUnshare(t, k, "r1")
	expectNotHeld(t, e.sh.ReleaseShared(t.Context(), k, "r1", 0), "a second ReleaseShared")
	expectNotHeld(t, e.sh.RefreshShared(t.Context(), k, "r1", e.long), "RefreshShared after the release")
	if err := e.sh.RefreshShared(t.Context(), k, "r2", e.long); err != nil {
		t.Fatalf("RefreshShared of the other reader: %v", err)
	}
	e.mustUnshare(t, k, "r2")

	e.mustAcquire(t, []string{x}, "w", e.long)
	expectNotHeld(t, e.sh.ReleaseShared(t.Context(), x, "w", 0), "ReleaseShared of a writer's token")
	expectNotHeld(t, e.sh.RefreshShared(t.Context(), x, "w", e.long), "RefreshShared of a writer's token")
	e.mustRelease(t, []string{x}, "w")
}

// testSharedFences: exclusive and shared grants of a key draw from one
// sequence: each fence is at least stores.FenceStride above the one before,
// across release and expiry.
func testSharedFences(t *testing.T, e *env) {
	k := e.key("k")
	var fences []int64
	next := func(f int64, what string) {
		t.Helper()
		if len(fences) > 0 {
			expectStride(t, fences[len(fences)-1], f, what)
		}
		fences = append(fences, f)
	}
	next(e.mustAcquire(t, []string{k}, "w1", e.long).Fences[0], "a writer")
	e.mustRelease(t, []string{k}, "w1")
	next(e.mustShare(t, k, "r1", 0, e.long).Fences[0], "a reader after a writer")
	next(e.mustShare(t, k, "r2", 0, e.expiry).Fences[0], "a second reader")
	e.mustUnshare(t, k, "r1")
	// r2 expires: the writer after it still gets a higher fence.
	deadline := time.Now().Add(e.expiry + expiryLimit)
	for {
		g := e.acquire(t, []string{k}, "w2", e.long)
		if g.OK {
			next(g.Fences[0], "a writer after an expired reader")
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the expired reader still holds the key %v after its TTL", expiryLimit)
		}
		<-time.After(5 * time.Millisecond)
	}
	e.mustRelease(t, []string{k}, "w2")
	next(e.mustShare(t, k, "l1", 2, e.long).Fences[0], "a limited holder")
	e.mustUnshare(t, k, "l1")
	next(e.mustAcquire(t, []string{k}, "w3", e.long).Fences[0], "a writer after a limited holder")
	e.mustRelease(t, []string{k}, "w3")
}

// testSharedRetry: a token that holds a key is granted it again, with a
// fresh fence, even while a writer waits.
func testSharedRetry(t *testing.T, e *env) {
	k := e.key("k")
	f1 := e.mustShare(t, k, "r", 0, e.long).Fences[0]
	if g := e.acquire(t, []string{k}, "w", e.long); g.OK {
		t.Fatal("Acquire granted over a reader")
	}
	f2 := e.mustShare(t, k, "r", 0, e.long).Fences[0]
	expectStride(t, f1, f2, "a reader's retry")
	e.mustUnshare(t, k, "r")
	expectNotHeld(t, e.sh.ReleaseShared(t.Context(), k, "r", 0), "a second release after a retry: the retry counts once")
	e.mustAcquire(t, []string{k}, "w", e.long)
	e.mustRelease(t, []string{k}, "w")
}

// testSharedRefresh: RefreshShared renews one holder's TTL alone.
func testSharedRefresh(t *testing.T, e *env) {
	k := e.key("k")
	e.mustShare(t, k, "a", 1, e.expiry)
	if err := e.sh.RefreshShared(t.Context(), k, "a", e.long); err != nil {
		t.Fatalf("RefreshShared: %v", err)
	}
	g := e.refuseShare(t, k, "b", 1, e.long, "the refreshed holder's slot")
	if !e.waitIn(g.Wait, e.short, e.long) {
		t.Fatalf("refused with Wait %v after a refresh to %v, want in (%v, %v]", g.Wait, e.long, e.short, e.long)
	}
	e.mustUnshare(t, k, "a")
}

// testSharedKeep: ReleaseShared with keep leaves the place held until keep
// has passed.
func testSharedKeep(t *testing.T, e *env) {
	k := e.key("k")
	e.mustShare(t, k, "a", 1, e.long)
	released := time.Now()
	if err := e.sh.ReleaseShared(t.Context(), k, "a", e.keep); err != nil {
		t.Fatalf("ReleaseShared with keep: %v", err)
	}
	e.refuseShare(t, k, "b", 1, e.keep, "a place released with keep")
	e.pollShare(t, k, "b", 1, e.long, e.keep+expiryLimit)
	if took := time.Since(released); took < e.keep-expiryEarly {
		t.Fatalf("the kept place was free after %v, keep %v", took, e.keep)
	}
	e.mustUnshare(t, k, "b")
}

// testSharedNotify: a waiter refused by a full key is signalled when a place
// is freed, by release and by expiry.
func testSharedNotify(t *testing.T, e *env) {
	k := e.key("k")
	// Subscribed and live (a store may subscribe asynchronously) before
	// the scenario, as the Notify group's subtests are.
	ch, _ := e.subscribe(t, k, "b")
	if ch == nil {
		t.Fatal("NotifyRelease returned a nil channel")
	}
	e.prime(t, k, ch)
	e.flush(t)
	drain(ch)
	e.mustShare(t, k, "a", 1, e.long)
	e.refuseShare(t, k, "b", 1, e.long, "a full key")
	e.mustUnshare(t, k, "a")
	select {
	case <-ch:
	case <-time.After(expiryLimit):
		t.Fatalf("no signal within %v of a released place", expiryLimit)
	}
	e.mustShare(t, k, "a", 1, e.expiry)
	e.refuseShare(t, k, "b", 1, e.long, "a full key")
	// The expiry is noticed by a call of the store: poll until b gets in,
	// then the signal must have come.
	e.pollShare(t, k, "b", 1, e.long, e.expiry+expiryLimit)
	select {
	case <-ch:
	case <-time.After(expiryLimit):
		t.Fatalf("no signal within %v of an expired place", expiryLimit)
	}
	e.mustUnshare(t, k, "b")
}

// testSharedBounds: invalid arguments are refused with ErrInvalid before the
// store acts; long keys and extreme TTLs are honoured within the store's
// Bounds and refused beyond them.
func testSharedBounds(t *testing.T, e *env) {
	k := e.key("k")
	ctx := t.Context()
	_, err := e.sh.AcquireShared(ctx, "", "t", 0, e.long)
	expectInvalid(t, err, "AcquireShared of an empty key")
	_, err = e.sh.AcquireShared(ctx, k, "t", -1, e.long)
	expectInvalid(t, err, "AcquireShared with a negative limit")
	_, err = e.sh.AcquireShared(ctx, k, "t", 0, 0)
	expectInvalid(t, err, "AcquireShared with ttl 0")
	expectInvalid(t, e.sh.RefreshShared(ctx, k, "t", 0), "RefreshShared with ttl 0")
	expectInvalid(t, e.sh.ReleaseShared(ctx, "", "t", 0), "ReleaseShared of an empty key")
	// Nothing was set by the refused calls.
	e.mustShare(t, k, "u", 1, e.long)
	e.mustUnshare(t, k, "u")

	for _, n := range e.longKeySizes() {
		long := e.keyOfLen(n)
		g, err := e.sh.AcquireShared(ctx, long, "t", 1, e.long)
		if !e.keyFits(long) {
			expectInvalid(t, err, "AcquireShared of a key of "+byteCount(n))
			continue
		}
		if err != nil || !g.OK {
			t.Fatalf("AcquireShared of a key of %s: %+v, %v", byteCount(n), g, err)
		}
		e.refuseShare(t, long, "t2", 1, e.long, "a full long key")
		e.mustUnshare(t, long, "t")
	}
	for _, ttl := range e.extremeTTLs() {
		g, err := retryShort(ttl, func() (stores.Grant, error) { return e.sh.AcquireShared(ctx, k, "x", 1, ttl) })
		if !e.ttlFits(ttl) {
			expectInvalid(t, err, "AcquireShared with ttl "+ttl.String())
			continue
		}
		if err != nil || !g.OK {
			t.Fatalf("AcquireShared with ttl %v: %+v, %v", ttl, g, err)
		}
		if ttl == math.MaxInt64 || (e.bounds.MaxTTL > 0 && ttl == e.bounds.MaxTTL) {
			e.refuseShare(t, k, "y", 1, ttl, "a place with the longest TTL")
		}
		// Released, or already expired (ErrNotHeld).
		if err := e.sh.ReleaseShared(ctx, k, "x", 0); err != nil {
			expectNotHeld(t, err, "ReleaseShared after a TTL of "+ttl.String())
		}
	}
	e.expectServing(t, e.s, "after the shared bounds")
}

// testSharedAbandoned: an AcquireShared whose context has ended grants
// nothing, or is released by its caller as the Locker does, so that no
// place is left behind.
func testSharedAbandoned(t *testing.T, e *env) {
	k := e.key("k")
	g, err := e.sh.AcquireShared(cancelled(), k, "a", 1, e.long)
	if err == nil || g.OK {
		t.Fatalf("AcquireShared on an ended context: %+v, %v, want a failure", g, err)
	}
	if mayHaveActed(err) {
		if err := e.sh.ReleaseShared(t.Context(), k, "a", 0); err != nil {
			expectNotHeld(t, err, "the caller's release after a failed AcquireShared")
		}
	}
	e.mustShare(t, k, "b", 1, e.long) // the only place is free
	e.mustUnshare(t, k, "b")
}

// mayHaveActed reports whether a failed call may have changed the store, so
// that its caller releases what it may have set.
func mayHaveActed(err error) bool {
	return !errors.Is(err, stores.ErrInvalid) && !errors.Is(err, stores.ErrUnreachable) &&
		!errors.Is(err, stores.ErrAbandoned)
}

// testLimitFull: a key with limit holders refuses the next with the soonest
// expiry among them, and grants it once one leaves.
func testLimitFull(t *testing.T, e *env) {
	k := e.key("k")
	e.mustShare(t, k, "a", 2, e.short)
	e.mustShare(t, k, "b", 2, e.long)
	g := e.refuseShare(t, k, "c", 2, e.short, "a third holder of a limit of 2")
	if g.Held != 0 {
		t.Fatalf("refused with Held %d, want 0", g.Held)
	}
	e.mustUnshare(t, k, "a")
	e.mustShare(t, k, "c", 2, e.long)
	e.refuseShare(t, k, "d", 2, e.long, "a key full again")
	e.mustUnshare(t, k, "b")
	e.mustUnshare(t, k, "c")
}

// testLimitNeverExceeded: many goroutines contend for a key with a limit of
// 3, holding it, letting holders die (left to expire), and a writer trying
// now and then; never more than 3 hold it, no holder while the writer
// does, and the limit is reached.
func testLimitNeverExceeded(t *testing.T, e *env) {
	k := e.key("k")
	const limit, workers = 3, 16
	var (
		active  atomic.Int64
		peak    atomic.Int64
		writing atomic.Bool
		grants  atomic.Int64
		wg      sync.WaitGroup
		errs    = make(chan error, workers+1)
		stop    = make(chan struct{})
	)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				token := "w" + strconv.Itoa(i) + "-" + strconv.Itoa(n)
				// This holder dies: its place expires. Not on a store
				// whose shortest TTL is long (etcd's 2s): a dead holder
				// would keep a place, and a writer's wait (see
				// stores.WriterWindow) every other, for most of the run;
				// PerHolderExpiry tests its death there.
				dies := n%7 == 3 && e.expiry <= sharedRun/10
				ttl := e.long
				if dies {
					ttl = e.expiry
				}
				g, err := e.sh.AcquireShared(context.Background(), k, token, limit, ttl)
				if err != nil {
					fail(err)
					return
				}
				if !g.OK {
					<-time.After(time.Millisecond)
					continue
				}
				grants.Add(1)
				if dies {
					continue // never counted: the count stays a lower bound
				}
				a := active.Add(1)
				for p := peak.Load(); a > p && !peak.CompareAndSwap(p, a); p = peak.Load() {
				}
				if a > limit {
					fail(fmt.Errorf("%d holders at once, limit %d", a, limit))
				}
				if writing.Load() {
					fail(fmt.Errorf("holder %s granted while the writer holds the key", token))
				}
				// The holder's work: until the limit is reached or 50ms
				// have passed, so that holders overlap even on a store
				// whose grants take a few round trips each.
				for worked := time.Now(); active.Load() < limit && time.Since(worked) < 50*time.Millisecond; {
					<-time.After(time.Millisecond)
				}
				active.Add(-1)
				if err := e.sh.ReleaseShared(context.Background(), k, token, 0); err != nil {
					fail(fmt.Errorf("ReleaseShared of %s: %w", token, err))
					return
				}
			}
		}()
	}
	// Past sharedRun until the limit is reached, for a store whose round
	// trips are long next to the holders' work.
	end, hardEnd := time.Now().Add(sharedRun), time.Now().Add(sharedRun+expiryLimit)
	writes := 0
	for time.Now().Before(end) || (peak.Load() < limit && time.Now().Before(hardEnd)) {
		<-time.After(100 * time.Millisecond)
		g, err := e.s.Acquire(t.Context(), []string{k}, "writer", e.long)
		if err != nil {
			t.Fatal(err)
		}
		if g.OK {
			writing.Store(true)
			if n := active.Load(); n != 0 {
				t.Errorf("the writer was granted while %d holders hold the key", n)
			}
			writes++
			<-time.After(5 * time.Millisecond)
			writing.Store(false)
			e.mustRelease(t, []string{k}, "writer")
		}
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	if p := peak.Load(); p != limit {
		t.Fatalf("at most %d holders at once, want the limit %d reached", p, limit)
	}
	t.Logf("%d grants, peak %d holders, %d writes", grants.Load(), peak.Load(), writes)
}

// testLimitPerHolderExpiry: a holder that dies frees its place at its own
// TTL, not at the longest one's; the others keep theirs.
func testLimitPerHolderExpiry(t *testing.T, e *env) {
	k := e.key("k")
	e.mustShare(t, k, "long", 2, e.long)
	granted := time.Now()
	e.mustShare(t, k, "dies", 2, e.expiry)
	e.refuseShare(t, k, "next", 2, e.expiry, "a full key whose soonest place expires first")
	e.pollShare(t, k, "next", 2, e.long, e.expiry+expiryLimit)
	if took := time.Since(granted); took < e.expiry-expiryEarly {
		t.Fatalf("the dead holder's place was free after %v, its TTL %v", took, e.expiry)
	}
	if err := e.sh.RefreshShared(t.Context(), k, "long", e.long); err != nil {
		t.Fatalf("the long holder lost its place with the dead one: %v", err)
	}
	e.refuseShare(t, k, "more", 2, e.long, "a full key again")
	e.mustUnshare(t, k, "long")
	e.mustUnshare(t, k, "next")
}

// testLimitStaleHolder: a holder past its TTL can neither release nor
// renew the place of the holder that took it since.
func testLimitStaleHolder(t *testing.T, e *env) {
	k := e.key("k")
	e.mustShare(t, k, "stale", 1, e.expiry)
	e.pollShare(t, k, "next", 1, e.long, e.expiry+expiryLimit)
	expectNotHeld(t, e.sh.ReleaseShared(t.Context(), k, "stale", 0), "ReleaseShared by a stale holder")
	expectNotHeld(t, e.sh.RefreshShared(t.Context(), k, "stale", e.long), "RefreshShared by a stale holder")
	e.refuseShare(t, k, "other", 1, e.long, "the next holder's place after the stale one's calls")
	e.mustUnshare(t, k, "next")
}

// testLimitRetryCountsOnce: a retry of a holder's grant is granted with a
// full key, and counts once.
func testLimitRetryCountsOnce(t *testing.T, e *env) {
	k := e.key("k")
	e.mustShare(t, k, "a", 2, e.long)
	e.mustShare(t, k, "a", 2, e.long)
	e.mustShare(t, k, "b", 2, e.long)
	e.mustShare(t, k, "b", 2, e.long) // full, but b holds
	e.refuseShare(t, k, "c", 2, e.long, "a third holder")
	e.mustUnshare(t, k, "a")
	e.mustShare(t, k, "c", 2, e.long)
	e.mustUnshare(t, k, "b")
	e.mustUnshare(t, k, "c")
}

// proxiedShared is proxied for the shared fault subtests: the proxied
// store as a stores.SharedStore, warmed up by a shared grant too.
func (e *env) proxiedShared(t *testing.T) (stores.SharedStore, backend) {
	t.Helper()
	p, b := e.proxied(t)
	sh, ok := p.(stores.SharedStore)
	if !ok {
		t.Fatalf("%T from Suite.Proxied does not implement stores.SharedStore", p)
	}
	warm := "storetest:{" + e.tag + "}:warm:" + randomHex(8)
	if g, err := sh.AcquireShared(t.Context(), warm, "warm", 1, e.short); err != nil || !g.OK {
		t.Fatalf("warming up the proxied store: AcquireShared: %+v, %v", g, err)
	}
	if err := sh.ReleaseShared(t.Context(), warm, "warm", 0); err != nil {
		t.Fatalf("warming up the proxied store: ReleaseShared: %v", err)
	}
	return sh, b
}

// abandonShared runs an AcquireShared of key by token on sh under a fault
// that keeps it unanswered, as abandon does for Acquire, and releases the
// place as the Locker does after a failure other than ErrAbandoned and
// ErrUnreachable; it returns whether that release is still owed. When
// restage is set and the call failed with ErrUnreachable while carried
// counts no request carrying the key at the server, the call never left
// (its connection broke, or could not be made, before the fault could
// catch it): it returns unsent, for the caller to stage the fault again.
func (e *env) abandonShared(t *testing.T, sh stores.SharedStore, key, token string, carried func() int, restage bool) (release func() bool, owed, unsent bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), abandonWait)
	defer cancel()
	start := time.Now()
	g, err := sh.AcquireShared(ctx, key, token, 1, e.maxTTLOr(minFaultTTL))
	if took := time.Since(start); took > abandonWait+returnSlack {
		t.Errorf("AcquireShared under the fault returned after %v, %v past its context's end", took, took-abandonWait)
	}
	switch {
	case err == nil:
		t.Fatalf("AcquireShared under the fault: %+v with no error, want a failure", g)
	case g.OK:
		t.Fatalf("AcquireShared under the fault failed (%v) but reports a grant", err)
	}
	if restage && errors.Is(err, stores.ErrUnreachable) && carried() == 0 {
		return nil, false, true
	}
	expectNotUnreachable(t, err, "AcquireShared under a fault, which may have reached the server")
	release = func() bool {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), healLimit)
		defer cancel()
		err := sh.ReleaseShared(ctx, key, token, 0)
		return err == nil || errors.Is(err, stores.ErrNotHeld)
	}
	if !errors.Is(err, stores.ErrAbandoned) {
		owed = !release()
	}
	t.Logf("the abandoned AcquireShared failed with %v; a release is still owed: %v", err, owed)
	return release, owed, false
}

// abandonedShared: an AcquireShared that the fault set by fault leaves
// unanswered leaves no holder once the network heals: the key's one place
// is free within healLimit and stays free.
//
// The check that the fault caught a call counts every request that reached
// a server once it was armed, not only one carrying the key: a store may
// send a request without it first (etcdstore grants each holder a lease),
// which the fault then catches. AbandonedShared/ReplyCut catches the
// request carrying the key itself. A call that provably never left (see
// abandonShared) is staged again, up to stagingTries times.
func (e *env) abandonedShared(t *testing.T, fault func(backend), what string) {
	k := e.key("k")
	var (
		sh           stores.SharedStore
		b            backend
		reached      func() int
		release      func() bool
		owed, unsent bool
	)
	for try := 1; ; try++ {
		sh, b = e.proxiedShared(t)
		reached = b.count("")
		carried := b.count(e.needle())
		fault(b)
		release, owed, unsent = e.abandonShared(t, sh, k, "t1", carried, try < stagingTries)
		if !unsent {
			break
		}
		b.heal()
		t.Logf("try %d: the AcquireShared never left (ErrUnreachable, no request carrying the key reached the server); staging the fault again", try)
	}
	<-time.After(faultHold) // the fault outlasts the call
	reachedServer(t, reached, what)
	b.heal()
	deadline := time.Now().Add(healLimit)
	for owed && !release() {
		if time.Now().After(deadline) {
			t.Fatalf("the release owed after the abandoned AcquireShared did not land within %v of the heal", healLimit)
		}
		<-time.After(50 * time.Millisecond) // between retries of a store that reconnects
	}
	e.expectFreeForGood(t, []string{k}, healLimit, "after "+what+" of an AcquireShared")
}

// testAbandonedSharedReplyLost: an AcquireShared whose reply is lost leaves
// no holder once the network heals.
func testAbandonedSharedReplyLost(t *testing.T, e *env) {
	e.abandonedShared(t, func(b backend) { b.blackhole(faultproxy.ToClient) }, "a lost reply")
}

// testAbandonedSharedReplyCut: an AcquireShared whose request carrying the
// key reached the server, and whose connection was then cut while the
// server refuses new connections (so that a client's retry, which would
// answer the call, cannot get through), leaves no holder.
func testAbandonedSharedReplyCut(t *testing.T, e *env) {
	needle := []byte(e.needle())
	e.abandonedShared(t, func(b backend) {
		b.refuse()
		b.cutWhen(faultproxy.ToServer, func(chunk []byte) bool { return bytes.Contains(chunk, needle) }, true)
	}, "a reply cut off")
}

// testAbandonedSharedReplyLate: an AcquireShared whose reply arrives after
// the call gave up leaves no holder.
func testAbandonedSharedReplyLate(t *testing.T, e *env) {
	e.abandonedShared(t, func(b backend) { b.stall(faultproxy.ToClient) }, "a late reply")
}

// testStaleSharedPaused: a holder whose server connection pauses past its
// TTL, while another takes the key's one place, can neither release nor
// renew the new holder's place once it resumes.
func testStaleSharedPaused(t *testing.T, e *env) {
	k := e.key("k")
	sh, b := e.proxiedShared(t)
	g, err := sh.AcquireShared(t.Context(), k, "t1", 1, e.expiry)
	if err != nil || !g.OK {
		t.Fatalf("AcquireShared through the proxy: %+v, %v", g, err)
	}
	b.stall(faultproxy.Both)
	next := e.pollShare(t, k, "t2", 1, e.long, e.expiry+expiryLimit)
	expectStride(t, g.Fences[0], next.Fences[0], "the place after the paused holder's")
	b.heal()
	expectStaleCalls(t, []staleCall{
		{"RefreshShared", func(ctx context.Context) error { return sh.RefreshShared(ctx, k, "t1", e.long) }},
		{"ReleaseShared", func(ctx context.Context) error { return sh.ReleaseShared(ctx, k, "t1", 0) }},
	})
	if err := e.sh.RefreshShared(t.Context(), k, "t2", e.long); err != nil {
		t.Fatalf("RefreshShared by the new holder after the stale one's calls: %v", err)
	}
	e.refuseShare(t, k, "other", 1, e.long, "the new holder's place after the stale one's calls")
	e.mustUnshare(t, k, "t2")
}

// testLimitOwnLimit: a caller is admitted while fewer than its own limit
// hold the key, whatever limits they were admitted under: a rolling change
// of a limit neither locks the new callers out nor lets the old ones past
// their own limit; a reader (limit 0) is admitted at any count.
func testLimitOwnLimit(t *testing.T, e *env) {
	k := e.key("k")
	for _, h := range []string{"a", "b", "c"} {
		e.mustShare(t, k, h, 3, e.long)
	}
	e.refuseShare(t, k, "old", 3, e.long, "a fourth holder under a limit of 3")
	e.mustShare(t, k, "new", 4, e.long) // 3 hold it: fewer than 4
	e.refuseShare(t, k, "new2", 4, e.long, "a fifth holder under a limit of 4")
	e.refuseShare(t, k, "small", 2, e.long, "a holder under a limit of 2 with 4 in")
	e.mustUnshare(t, k, "a")
	e.mustUnshare(t, k, "b")
	// c and new hold it.
	e.refuseShare(t, k, "small", 2, e.long, "a holder under a limit of 2 with 2 in")
	e.mustShare(t, k, "old", 3, e.long)
	e.refuseShare(t, k, "old2", 3, e.long, "a fourth holder under a limit of 3 again")
	// A reader is admitted at any count, and counts.
	e.mustShare(t, k, "reader", 0, e.long)
	e.refuseShare(t, k, "new2", 4, e.long, "a holder under a limit of 4 with 4 in, a reader among them")
	for _, h := range []string{"c", "new", "old", "reader"} {
		e.mustUnshare(t, k, h)
	}
	e.mustShare(t, k, "small", 1, e.long) // the key drained
	e.mustUnshare(t, k, "small")
}
