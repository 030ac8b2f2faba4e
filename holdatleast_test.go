package reqlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
)

const (
	// holdFor is the HoldAtLeast of the tests.
	holdFor = 300 * time.Millisecond
	// holdMargin absorbs the stores' expiry precision (Redis: 1ms).
	holdMargin = 5 * time.Millisecond
)

// expectFreedAfter polls until another process can obtain every key, and
// fails unless that happened no sooner than hold after since, nor later than
// the poll's deadline (a key left to its full TTL of a minute would be).
func expectFreedAfter(t *testing.T, e *storeEnv, since time.Time, hold time.Duration, keys ...string) {
	t.Helper()
	for _, k := range keys {
		eventually(t, k+" free once the hold is up", func() bool { return e.free(t, k) })
		if d := time.Since(since); d < hold-holdMargin {
			t.Fatalf("%q was free %v after the grant, before the %v hold", k, d, hold)
		}
	}
}

func TestHoldAtLeastKeepsAnEarlyReleasedKeyLocked(t *testing.T) {
	forEachEnv(t, allPaths, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		before := time.Now() // no later than the grant
		lock := mustObtain(t, bg, l, "k")
		lock.HoldAtLeast(holdFor)
		lock.HoldAtLeast(holdFor / 10) // the longest wins
		lock.HoldAtLeast(0)
		if err := lock.Release(bg); err != nil {
			t.Fatalf("release: %v", err)
		}
		if !lock.Released() {
			t.Fatal("Released() is false after Release")
		}
		// Still held for another process, and for another request of this
		// one, which finds no local holder and asks the store.
		if _, err := e.other(t).Obtain(bg, "k", time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
			t.Fatalf("another process right after the release: %v, want ErrHeld", err)
		}
		if _, err := l.Obtain(bg, "k", time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
			t.Fatalf("another request right after the release: %v, want ErrHeld", err)
		}
		if n := reqlock.LocalQueues(l); n != 0 {
			t.Fatalf("%d local queues left", n)
		}
		expectFreedAfter(t, e, before, holdFor, "k")
		if e.path == pathFast && e.spy.releaseKeeps.Load() != 1 {
			t.Fatalf("%d ReleaseKeep calls, want 1", e.spy.releaseKeeps.Load())
		}
		e.expectNoKeysLeft(t)
	})
}

func TestHoldAtLeastNoHandoffBeforeTheTimeIsUp(t *testing.T) {
	forEachEnv(t, allPaths, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		before := time.Now()
		holder := mustObtain(t, bg, l, "k")
		holder.HoldAtLeast(holdFor)
		type result struct {
			lock *reqlock.Lock
			at   time.Duration // since before
			err  error
		}
		got := make(chan result, 1)
		go func() {
			lock, err := l.Obtain(bg, "k", time.Minute, 10*time.Second)
			got <- result{lock, time.Since(before), err}
		}()
		waitUntil(t, func() bool { return reqlock.LocalWaiters(l, e.prefix+"k") == 1 })
		mustRelease(t, holder)
		r := <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.at < holdFor-holdMargin {
			t.Fatalf("the local waiter got the key %v after the grant, before the %v hold", r.at, holdFor)
		}
		if r.lock.Token() == holder.Token() || r.lock.Fence() <= holder.Fence() {
			t.Fatalf("the waiter got the held grant (same token %v, fence %d after %d): a handoff",
				r.lock.Token() == holder.Token(), r.lock.Fence(), holder.Fence())
		}
		mustRelease(t, r.lock)
		e.expectNoKeysLeft(t)
	})
}

func TestHoldAtLeastReleasedAfterTheTimeIsUpDeletesAtOnce(t *testing.T) {
	forEachEnv(t, allPaths, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		const short = 30 * time.Millisecond
		for _, keys := range [][]string{{"k"}, {"a", "b", "c"}} {
			lock, err := l.ObtainAll(bg, keys, time.Minute, 0)
			if err != nil {
				t.Fatal(err)
			}
			granted := time.Now() // no sooner than the grant
			lock.HoldAtLeast(short)
			// The hold itself has to run out, and nothing signals its end
			// (that is the behaviour under test): let its time pass.
			<-time.After(time.Until(granted.Add(short + time.Millisecond)))
			mustRelease(t, lock)
			e.expectFree(t, keys...)
		}
		// Nothing to hold: deleted at once as well.
		for _, d := range []time.Duration{0, -time.Second} {
			lock := mustObtain(t, bg, l, "k")
			lock.HoldAtLeast(d)
			mustRelease(t, lock)
			e.expectFree(t, "k")
		}
		if e.path == pathFast && e.spy.releaseKeeps.Load() != 0 {
			t.Fatalf("%d ReleaseKeep calls, want none", e.spy.releaseKeeps.Load())
		}
		e.expectNoKeysLeft(t)
	})
}

func TestHoldAtLeastOnSeveralKeys(t *testing.T) {
	forEachEnv(t, allPaths, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		keys := []string{"a", "b", "c"}
		before := time.Now()
		lock, err := l.ObtainAll(bg, keys, time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		lock.HoldAtLeast(holdFor)
		mustRelease(t, lock)
		e.expectHeld(t, keys...)
		if _, err := l.ObtainAll(bg, []string{"c", "d"}, time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
			t.Fatalf("ObtainAll over a held-on key: %v, want ErrHeld", err)
		}
		expectFreedAfter(t, e, before, holdFor, keys...)
		if e.path == pathFast && e.spy.releaseAlls.Load() != 1 {
			t.Fatalf("%d ReleaseAll calls, want 1", e.spy.releaseAlls.Load())
		}
		e.expectNoKeysLeft(t)
	})
}

func TestHoldAtLeastThroughAView(t *testing.T) {
	forEachEnv(t, []string{pathFast}, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		before := time.Now()
		outer := mustObtain(t, bg, l, "k")
		view := mustObtain(t, reqlock.NewContext(bg, outer), l, "k")
		view.HoldAtLeast(holdFor)
		mustRelease(t, view, outer)
		e.expectHeld(t, "k")
		expectFreedAfter(t, e, before, holdFor, "k")
	})
}
