package reqlock_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
)

func TestRefresh(t *testing.T) {
	l, _ := newLocker(t)
	ctx := context.Background()
	lock, err := l.Obtain(ctx, "k", 100*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := lock.Refresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if lock.TTL() != time.Minute || validity(lock) < 50*time.Second {
		t.Fatalf("after refresh: ttl %v validity %v", lock.TTL(), validity(lock))
	}
	// Zero keeps the current TTL.
	if err := lock.Refresh(ctx, 0); err != nil || lock.TTL() != time.Minute {
		t.Fatalf("refresh with the current TTL: %v, ttl %v", err, lock.TTL())
	}
	if err := lock.Refresh(ctx, -1); !errors.Is(err, reqlock.ErrInvalid) {
		t.Fatalf("negative refresh: %v", err)
	}
	mustRelease(t, lock)
	if err := lock.Refresh(ctx, 0); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("refresh after release: %v, want ErrNotHeld", err)
	}
	if lost := lock.Lost(); lost != nil {
		t.Fatalf("Lost() = %v: a refresh after the release is no loss", lost)
	}
}

func TestReleaseAfterExpiryAndTakeover(t *testing.T) {
	l, _ := newLocker(t)
	ctx := context.Background()
	old, err := l.Obtain(ctx, "k", 20*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	next, err := l.Obtain(ctx, "k", time.Minute, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Refresh(ctx, time.Minute); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("stale refresh: %v, want ErrNotHeld", err)
	}
	if err := old.Release(ctx); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("stale release: %v, want ErrNotHeld", err)
	}
	if _, err := l.Obtain(ctx, "k", time.Second, 0); !errors.Is(err, reqlock.ErrHeld) {
		t.Fatalf("the stale release freed the new holder's lock: %v", err)
	}
	if err := next.Refresh(ctx, 0); err != nil {
		t.Fatalf("the stale refresh or release disturbed the new holder: %v", err)
	}
	mustRelease(t, next)
}

func TestReleaseIgnoresCancelledContext(t *testing.T) {
	l, store := newLocker(t)
	lock := mustObtain(t, context.Background(), l, "k")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := lock.Release(ctx); err != nil {
		t.Fatalf("release on a cancelled context: %v", err)
	}
	if store.Len() != 0 {
		t.Fatal("lock left behind")
	}
}

func TestReleaseHasItsOwnTimeout(t *testing.T) {
	fs := &faultStore{Store: memstore.New(), blockRelease: true}
	l := reqlock.MustNew(fs, reqlock.WithReleaseTimeout(30*time.Millisecond))
	lock := mustObtain(t, context.Background(), l, "k")
	err := lock.Release(context.Background())
	if !errors.Is(err, reqlock.ErrStore) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrStore after the release timeout", err)
	}
}

// TestReleaseOfAKeyTakenOver: a release where one key of several was taken
// over reports ErrNotHeld, ends the grant on the other keys, and leaves the
// new owner's key alone.
func TestReleaseOfAKeyTakenOver(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		ctx := context.Background()
		lock, err := l.ObtainAll(ctx, []string{"a", "b", "c"}, time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		e.overwrite(t, e.prefix+"b", lock.Token())
		if err := lock.Release(ctx); !errors.Is(err, reqlock.ErrNotHeld) || errors.Is(err, reqlock.ErrStore) {
			t.Fatalf("release = %v, want ErrNotHeld", err)
		}
		e.expectFree(t, "a", "c")
		e.expectHeld(t, "b")
	})
}

// releaseFailStore is a store whose Release fails with a store error for
// keys that include failKey.
type releaseFailStore struct {
	stores.Store
	failKey string
}

var errReleaseDown = errors.New("release path down")

func (s *releaseFailStore) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	if slices.Contains(keys, s.failKey) {
		return errReleaseDown
	}
	return s.Store.Release(ctx, keys, token, keep)
}

// TestReleaseReportsEveryFailure: a lock on two grants (one re-entered),
// where one grant's release fails in the store and the other's key was
// taken over, reports the store failure (ErrStore), not only ErrNotHeld.
func TestReleaseReportsEveryFailure(t *testing.T) {
	mem := memstore.New()
	l := reqlock.MustNew(&releaseFailStore{Store: mem, failKey: "reqlock:a"})
	ctx := context.Background()
	outer := mustObtain(t, ctx, l, "a")
	lock, err := l.ObtainAll(reqlock.NewContext(ctx, outer), []string{"a", "b"}, 30*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	mustRelease(t, outer) // a stays held: lock holds its grant too
	// b's grant expires and another process takes it.
	var intruder *reqlock.Lock
	eventually(t, "another process takes b", func() bool {
		intruder, err = reqlock.MustNew(mem).Obtain(ctx, "b", time.Minute, 0)
		return err == nil
	})
	defer intruder.Release(ctx)
	err = lock.Release(ctx)
	if !errors.Is(err, reqlock.ErrStore) || !errors.Is(err, errReleaseDown) || !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("release = %v, want ErrStore wrapping the failure, joined with ErrNotHeld", err)
	}
}

// TestLockOnSeveralGrants: a lock that holds a re-entered grant beside its
// own reports each key's fence from the grant that holds it, the shortest
// TTL and the earliest validity of the two, and the token of its Key.
func TestLockOnSeveralGrants(t *testing.T) {
	l, _ := newLocker(t)
	ctx := context.Background()
	outer, err := l.Obtain(ctx, "b", 10*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ttl       time.Duration
		shortestB bool // the outer grant on b is the shorter
	}{{time.Minute, true}, {time.Second, false}} {
		lock, err := l.ObtainAll(reqlock.NewContext(ctx, outer), []string{"a", "b"}, tc.ttl, 0)
		if err != nil {
			t.Fatal(err)
		}
		fb, _ := lock.FenceOf("b")
		fa, _ := lock.FenceOf("a")
		if fb != outer.Fence() || fa <= 0 || fa == fb {
			t.Fatalf("fences a %d b %d, want b's from the outer lock (%d) and a's own", fa, fb, outer.Fence())
		}
		wantTTL, wantUntil := tc.ttl, lock.ValidUntil()
		if tc.shortestB {
			wantTTL, wantUntil = outer.TTL(), outer.ValidUntil()
		}
		if lock.TTL() != wantTTL || !lock.ValidUntil().Equal(wantUntil) || lock.ValidUntil().After(outer.ValidUntil()) {
			t.Fatalf("ttl %v: TTL %v ValidUntil in %v, want the shortest (%v) and the earliest (outer's in %v)",
				tc.ttl, lock.TTL(), validity(lock), wantTTL, validity(outer))
		}
		if lock.Token() == outer.Token() {
			t.Fatal("Token() is the outer lock's, want the token of the grant on Key a")
		}
		mustRelease(t, lock)
	}
	mustRelease(t, outer)
}

func TestObtainAllRefreshRenewsEveryKey(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		ctx := context.Background()
		keys := []string{"a", "b", "c"}
		lock, err := l.ObtainAll(ctx, keys, time.Hour, 0)
		if err != nil {
			t.Fatal(err)
		}
		// Shortening the TTL from an hour is seen on every key: each one
		// expires within the deadline.
		if err := lock.Refresh(ctx, 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if lock.TTL() != 50*time.Millisecond || validity(lock) > 50*time.Millisecond {
			t.Fatalf("after refresh: TTL %v, validity %v", lock.TTL(), validity(lock))
		}
		if n := e.spy.refreshes.Load(); n != 1 {
			t.Fatalf("%d Refresh calls for 3 keys, want 1", n)
		}
		for _, k := range keys {
			eventually(t, k+" expires with the refreshed TTL", func() bool { return e.free(t, k) })
		}
		if err := lock.Refresh(ctx, 0); !errors.Is(err, reqlock.ErrNotHeld) {
			t.Fatalf("refresh of an expired lock: %v, want ErrNotHeld", err)
		}
		if err := lock.Release(ctx); !errors.Is(err, reqlock.ErrNotHeld) {
			t.Fatalf("release of an expired lock: %v, want ErrNotHeld", err)
		}

		// And lengthening it: every key outlives the first TTL.
		lock, err = l.ObtainAll(ctx, keys, 100*time.Millisecond, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := lock.Refresh(ctx, time.Hour); err != nil {
			t.Fatal(err)
		}
		if lock.TTL() != time.Hour || validity(lock) < 50*time.Minute {
			t.Fatalf("after a refresh to an hour: TTL %v, validity %v", lock.TTL(), validity(lock))
		}
		if e.client != nil {
			for _, k := range keys {
				if ttl := e.client.PTTL(ctx, e.prefix+k).Val(); ttl < 50*time.Minute {
					t.Fatalf("PTTL %q = %v after a refresh to an hour", k, ttl)
				}
			}
		} else {
			for _, k := range keys {
				if !heldInStore(t, e.real, e.prefix+k) {
					t.Fatalf("%q free after a refresh to an hour", k)
				}
			}
		}
		mustRelease(t, lock)
		e.expectNoKeysLeft(t)
	})
}

func TestObtainAllFencesIncreasePerKey(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		other := e.other(t)
		ctx := context.Background()
		// Single-key grants, a different number per key, so that stores
		// that count fences per key are at a different fence on each.
		last := map[string]int64{}
		grant := func(key string) {
			t.Helper()
			lock := mustObtain(t, ctx, other, key)
			mustRelease(t, lock)
			if lock.Fence() <= last[key] {
				t.Fatalf("single-key fence of %q: %d after %d", key, lock.Fence(), last[key])
			}
			last[key] = lock.Fence()
		}
		for i, k := range []string{"a", "b", "c", "d"} {
			for range 1 + 2*i {
				grant(k)
			}
		}
		// Each key's fence follows that key's grants, multi-key or not.
		for _, keys := range [][]string{{"a", "b", "c"}, {"b", "c", "d"}, {"a", "d"}} {
			lock, err := l.ObtainAll(ctx, keys, time.Minute, 0)
			if err != nil {
				t.Fatal(err)
			}
			e.spy.expectFences(t, lock, e.prefix)
			for _, k := range keys {
				f, _ := lock.FenceOf(k)
				if f <= last[k] {
					t.Fatalf("multi-key fence of %q: %d after %d", k, f, last[k])
				}
				last[k] = f
			}
			mustRelease(t, lock)
			for _, k := range keys {
				grant(k)
			}
		}
		e.expectNoKeysLeft(t)
	})
}

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
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		before := time.Now() // no later than the grant
		lock := mustObtain(t, bg, l, "k")
		lock.HoldAtLeast(holdFor)
		lock.HoldAtLeast(holdFor / 10) // the longest wins
		lock.HoldAtLeast(0)
		mustRelease(t, lock)
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
		if n, keep := e.spy.releases.Load(), e.spy.keepReleases.Load(); n != 1 || keep != 1 {
			t.Fatalf("%d Release calls (%d keeping the key), want one that keeps it", n, keep)
		}
		e.expectNoKeysLeft(t)
	})
}

func TestHoldAtLeastNoHandoffBeforeTheTimeIsUp(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		before := time.Now()
		holder := mustObtain(t, bg, l, "k")
		holder.HoldAtLeast(holdFor)
		got := make(chan obtained, 1)
		go func() {
			lock, err := l.Obtain(bg, "k", time.Minute, 10*time.Second)
			got <- obtained{lock, err, time.Now()}
		}()
		eventually(t, "the waiter queued", func() bool { return reqlock.LocalWaiters(l, e.prefix+"k") == 1 })
		mustRelease(t, holder)
		r := <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		if d := r.at.Sub(before); d < holdFor-holdMargin {
			t.Fatalf("the local waiter got the key %v after the grant, before the %v hold", d, holdFor)
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
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
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
		if n := e.spy.keepReleases.Load(); n != 0 {
			t.Fatalf("%d Release calls kept the keys, want none", n)
		}
		e.expectNoKeysLeft(t)
	})
}

func TestHoldAtLeastOnSeveralKeys(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
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
		if n, keep := e.spy.releases.Load(), e.spy.keepReleases.Load(); n != 1 || keep != 1 {
			t.Fatalf("%d Release calls (%d keeping the keys), want one that keeps them", n, keep)
		}
		e.expectNoKeysLeft(t)
	})
}

// TestHoldAtLeastThroughAReentrantLock: a hold set on a reentrant lock
// holds its outer lock's grant, counted from that grant, once the last hold
// on it ends.
func TestHoldAtLeastThroughAReentrantLock(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		before := time.Now()
		outer := mustObtain(t, bg, l, "k")
		inner := mustObtain(t, reqlock.NewContext(bg, outer), l, "k")
		inner.HoldAtLeast(holdFor)
		mustRelease(t, inner, outer)
		e.expectHeld(t, "k")
		expectFreedAfter(t, e, before, holdFor, "k")
	})
}
