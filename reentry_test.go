package reqlock_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores/memstore"
)

// obtainWithin runs obtain and fails unless it returns within 5s, which a
// request that waited for itself (an hour's wait) would not.
func obtainWithin(t *testing.T, obtain func() (*reqlock.Lock, error)) *reqlock.Lock {
	t.Helper()
	type result struct {
		lock *reqlock.Lock
		err  error
	}
	got := make(chan result, 1)
	go func() {
		lock, err := obtain()
		got <- result{lock, err}
	}()
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("reentrant obtain: %v", r.err)
		}
		return r.lock
	case <-time.After(5 * time.Second):
		t.Fatal("reentrant obtain waited for its own request's lock")
		return nil
	}
}

// mustObtain obtains key on l at once, with a minute's TTL, and fails the
// test unless it is granted.
func mustObtain(t *testing.T, ctx context.Context, l *reqlock.Locker, key string) *reqlock.Lock {
	t.Helper()
	lock, err := l.Obtain(ctx, key, time.Minute, 0)
	if err != nil {
		t.Fatalf("Obtain(%q): %v", key, err)
	}
	return lock
}

// mustRelease releases each lock in turn, and fails the test on the first
// that does not release cleanly.
func mustRelease(t *testing.T, locks ...*reqlock.Lock) {
	t.Helper()
	for _, lock := range locks {
		if err := lock.Release(context.Background()); err != nil {
			t.Fatalf("release of %q: %v", lock.Keys(), err)
		}
	}
}

func TestReentrantObtainReturnsAView(t *testing.T) {
	forEachEnv(t, []string{pathFast}, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		outer := mustObtain(t, bg, l, "k")
		ctx := reqlock.NewContext(bg, outer)
		for _, wait := range []time.Duration{0, time.Hour} {
			inner := obtainWithin(t, func() (*reqlock.Lock, error) { return l.Obtain(ctx, "k", time.Minute, wait) })
			if inner == outer {
				t.Fatal("reentrant obtain returned the outer lock itself")
			}
			f, ok := inner.FenceOf("k")
			if inner.Fence() != outer.Fence() || f != outer.Fence() || !ok || inner.Token() != outer.Token() {
				t.Fatalf("view fence %d (FenceOf %d %v) token %q, want the outer lock's %d %q",
					inner.Fence(), f, ok, inner.Token(), outer.Fence(), outer.Token())
			}
			if inner.Key() != "k" || inner.StoreKey() != outer.StoreKey() || len(inner.Keys()) != 1 || inner.Keys()[0] != "k" {
				t.Fatalf("view key %q store key %q keys %q", inner.Key(), inner.StoreKey(), inner.Keys())
			}
			if inner.Released() || inner.Validity() <= 0 {
				t.Fatalf("fresh view: Released %v, Validity %v", inner.Released(), inner.Validity())
			}
			if err := inner.Release(bg); err != nil {
				t.Fatalf("release of the view: %v", err)
			}
			if !inner.Released() || inner.Validity() != 0 || outer.Released() {
				t.Fatalf("after the view's release: view Released %v Validity %v, outer Released %v",
					inner.Released(), inner.Validity(), outer.Released())
			}
			if err := inner.Release(bg); !errors.Is(err, reqlock.ErrNotHeld) {
				t.Fatalf("second release of the view: %v, want ErrNotHeld", err)
			}
			// The key is still the outer lock's: for another process, and
			// for another request of this one.
			e.expectHeld(t, "k")
			if _, err := l.Obtain(bg, "k", time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
				t.Fatalf("another request of the process: %v, want ErrHeld", err)
			}
			if err := outer.Refresh(bg, 0); err != nil {
				t.Fatalf("the outer lock after its view's release: %v", err)
			}
		}
		mustRelease(t, outer)
		e.expectFree(t, "k")
		e.expectNoKeysLeft(t)
	})
}

func TestReentrantOuterReleasedFirst(t *testing.T) {
	forEachEnv(t, []string{pathFast}, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		outer := mustObtain(t, bg, l, "k")
		inner := mustObtain(t, reqlock.NewContext(bg, outer), l, "k")
		if err := outer.Release(bg); err != nil {
			t.Fatalf("release of the outer lock: %v", err)
		}
		if !outer.Released() || inner.Released() {
			t.Fatalf("outer Released %v, view Released %v", outer.Released(), inner.Released())
		}
		// The view still holds the key, and can renew it.
		e.expectHeld(t, "k")
		if err := inner.Refresh(bg, 0); err != nil {
			t.Fatalf("refresh of the view: %v", err)
		}
		if err := outer.Release(bg); !errors.Is(err, reqlock.ErrNotHeld) {
			t.Fatalf("second release of the outer lock: %v, want ErrNotHeld", err)
		}
		e.expectHeld(t, "k")
		if err := inner.Release(bg); err != nil {
			t.Fatalf("release of the view: %v", err)
		}
		e.expectFree(t, "k")
		e.expectNoKeysLeft(t)
	})
}

func TestReentrantThreeLevelsDeep(t *testing.T) {
	forEachEnv(t, []string{pathFast}, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		// Every order of releasing the outer lock and its three nested
		// views: the key is free after the last release, and only then.
		for _, order := range permutations(4) {
			outer := mustObtain(t, bg, l, "k")
			locks := []*reqlock.Lock{outer}
			ctx := bg
			for range 3 {
				ctx = reqlock.NewContext(ctx, locks[len(locks)-1])
				v := obtainWithin(t, func() (*reqlock.Lock, error) { return l.Obtain(ctx, "k", time.Minute, 0) })
				if v.Fence() != outer.Fence() || v.Token() != outer.Token() {
					t.Fatalf("level %d: fence %d token %q, want %d %q", len(locks), v.Fence(), v.Token(), outer.Fence(), outer.Token())
				}
				locks = append(locks, v)
			}
			for i, which := range order {
				if err := locks[which].Release(bg); err != nil {
					t.Fatalf("order %v: release of level %d: %v", order, which, err)
				}
				if last := i == len(order)-1; e.free(t, "k") != last {
					t.Fatalf("order %v: after releasing level %d (%d of %d), free = %v", order, which, i+1, len(order), !last)
				}
			}
		}
		e.expectNoKeysLeft(t)
	})
}

// permutations returns every order of 0..n-1.
func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(append([]int{}, p[:i]...), n-1), p[i:]...)
			out = append(out, q)
		}
	}
	return out
}

func TestReentrantObtainAllHoldsNewKeysAndReentersHeldOnes(t *testing.T) {
	forEachEnv(t, allPaths, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		outer := mustObtain(t, bg, l, "b")
		ctx := reqlock.NewContext(bg, outer)

		// One new key (taken like Obtain), then two (taken together).
		for _, keys := range [][]string{{"c", "b"}, {"c", "a", "b"}} {
			v := obtainWithin(t, func() (*reqlock.Lock, error) { return l.ObtainAll(ctx, keys, time.Minute, 0) })
			want := slices.Sorted(slices.Values(keys))
			if got := v.Keys(); !slices.Equal(got, want) || v.Key() != want[0] {
				t.Fatalf("Keys() = %q, want %q", got, want)
			}
			if f, ok := v.FenceOf("b"); !ok || f != outer.Fence() {
				t.Fatalf("FenceOf(b) = %d, %v; want the outer lock's %d", f, ok, outer.Fence())
			}
			for _, k := range want {
				if k == "b" {
					continue
				}
				if f, ok := v.FenceOf(k); !ok || f <= 0 {
					t.Fatalf("FenceOf(%q) = %d, %v", k, f, ok)
				}
			}
			e.expectHeld(t, want...)
			if err := v.Release(bg); err != nil {
				t.Fatalf("release of the view: %v", err)
			}
			// The new keys went back to the store; the outer key stayed.
			e.expectHeld(t, "b")
			for _, k := range want {
				if k != "b" && !e.free(t, k) {
					t.Fatalf("%q still held after the view's release", k)
				}
			}
		}

		// Outer lock released first: the view keeps b until it goes.
		v, err := l.ObtainAll(ctx, []string{"a", "b", "c"}, time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		mustRelease(t, outer)
		e.expectHeld(t, "a", "b", "c")
		mustRelease(t, v)
		e.expectFree(t, "a", "b", "c")
		e.expectNoKeysLeft(t)
	})
}

func TestReentrantObtainAllFailureGivesItsHoldsBack(t *testing.T) {
	forEachEnv(t, allPaths, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		outer := mustObtain(t, bg, l, "b")
		other, err := e.other(t).Obtain(bg, "c", time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		ctx := reqlock.NewContext(bg, outer)
		for _, keys := range [][]string{{"b", "c"}, {"a", "b", "c"}} {
			if _, err := l.ObtainAll(ctx, keys, time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
				t.Fatalf("ObtainAll(%q) = %v, want ErrHeld", keys, err)
			}
			if _, err := l.ObtainAll(ctx, keys, time.Minute, 20*time.Millisecond); !errors.Is(err, reqlock.ErrWaitEnded) {
				t.Fatalf("ObtainAll(%q) with a wait = %v, want ErrWaitEnded", keys, err)
			}
		}
		// A wait that ended mid-attempt may leave a grant of "a" whose reply
		// was cut off; the Locker releases it in the background.
		waitUntil(t, func() bool { return e.free(t, "a") })
		// The failed calls left no hold on the outer lock: its release
		// frees b at once.
		mustRelease(t, outer)
		e.expectFree(t, "b")
		mustRelease(t, other)
		e.expectNoKeysLeft(t)
	})
}

func TestNoReentryWithoutTheLockInContext(t *testing.T) {
	forEachEnv(t, []string{pathFast}, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		outer := mustObtain(t, bg, l, "k")
		unrelated := mustObtain(t, bg, l, "u")
		another := e.locker(t) // another Locker: another process
		for name, tc := range map[string]struct {
			l   *reqlock.Locker
			ctx context.Context
		}{
			"another Locker, same context": {another, reqlock.NewContext(bg, outer)},
			"same Locker, no lock":         {l, bg},
			"same Locker, another key":     {l, reqlock.NewContext(bg, unrelated)},
		} {
			if _, err := tc.l.Obtain(tc.ctx, "k", time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
				t.Errorf("%s, try once: %v, want ErrHeld", name, err)
			}
			if _, err := tc.l.ObtainAll(tc.ctx, []string{"k", "x"}, time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
				t.Errorf("%s, ObtainAll try once: %v, want ErrHeld", name, err)
			}
			_, err := tc.l.Obtain(tc.ctx, "k", time.Minute, 30*time.Millisecond)
			if !errors.Is(err, reqlock.ErrWaitEnded) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s, wait: %v, want ErrWaitEnded with DeadlineExceeded", name, err)
			}
		}
		mustRelease(t, outer, unrelated)
		e.expectNoKeysLeft(t)
	})
}

func TestReentryAfterFullReleaseAcquiresAnew(t *testing.T) {
	forEachEnv(t, []string{pathFast}, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		outer := mustObtain(t, bg, l, "k")
		ctx := reqlock.NewContext(bg, outer)
		view := mustObtain(t, ctx, l, "k")
		mustRelease(t, outer, view)
		e.expectFree(t, "k")
		// Both holds have ended: the context's lock is gone, so this is a
		// new grant, and its release frees the key.
		for _, c := range []context.Context{ctx, reqlock.NewContext(ctx, view)} {
			fresh := mustObtain(t, c, l, "k")
			if fresh.Token() == outer.Token() || fresh.Fence() <= outer.Fence() {
				t.Fatalf("token reused %v, fence %d after %d: not a new grant", fresh.Token() == outer.Token(), fresh.Fence(), outer.Fence())
			}
			e.expectHeld(t, "k")
			mustRelease(t, fresh)
			e.expectFree(t, "k")
		}
		e.expectNoKeysLeft(t)
	})
}

// TestReentryRacesWithRelease has requests re-enter a lock while its holder
// releases it: each either gets a view of the lock or, once it is gone, a new
// grant; no two grants ever overlap, and the key ends free.
func TestReentryRacesWithRelease(t *testing.T) {
	forEachEnv(t, []string{pathFast}, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		rounds := 200
		if e.client != nil {
			rounds = 50
		}
		var (
			mu       sync.Mutex
			holders  = map[string]int{} // token → requests that hold the key with it
			overlaps int
			views    int
			fresh    int
		)
		enter := func(token string) {
			mu.Lock()
			defer mu.Unlock()
			for other, n := range holders {
				if other != token && n > 0 {
					overlaps++
				}
			}
			holders[token]++
		}
		leave := func(token string) {
			mu.Lock()
			defer mu.Unlock()
			holders[token]--
		}
		for range rounds {
			outer := mustObtain(t, bg, l, "k")
			enter(outer.Token())
			ctx := reqlock.NewContext(bg, outer)
			start := make(chan struct{})
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for range 4 {
				wg.Go(func() {
					<-start
					lock, err := l.Obtain(ctx, "k", time.Minute, 10*time.Second)
					if err != nil {
						errs <- err
						return
					}
					enter(lock.Token())
					mu.Lock()
					if lock.Token() == outer.Token() {
						views++
					} else {
						fresh++
						if lock.Fence() <= outer.Fence() {
							overlaps++
						}
					}
					mu.Unlock()
					leave(lock.Token())
					if err := lock.Release(bg); err != nil {
						errs <- err
					}
				})
			}
			wg.Go(func() {
				<-start
				leave(outer.Token())
				if err := outer.Release(bg); err != nil {
					errs <- err
				}
			})
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			e.expectFree(t, "k")
		}
		if overlaps != 0 {
			t.Fatalf("%d overlapping holders", overlaps)
		}
		t.Logf("%d views, %d new grants", views, fresh)
		if views+fresh != 4*rounds {
			t.Fatalf("%d views and %d new grants, want one of them for each of the %d requests", views, fresh, 4*rounds)
		}
		e.expectNoKeysLeft(t)
		if n := reqlock.LocalQueues(l); n != 0 {
			t.Fatalf("%d local queues left", n)
		}
	})
}

// gateStore blocks every Refresh, whatever its context, until gate closes.
type gateStore struct {
	reqlock.Store
	entered chan struct{} // told of each Refresh that starts to wait
	gate    chan struct{}
}

func (s *gateStore) Refresh(ctx context.Context, key, token string, ttl time.Duration) error {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-s.gate
	return s.Store.Refresh(ctx, key, token, ttl)
}

// TestNoReentryIntoALockBeingReleased catches a request re-entering a lock
// whose release has begun but not reached the store yet (Release waits for a
// watchdog renewal in flight): it must not get a view of a lock on its way
// out, but wait for the key like any request.
func TestNoReentryIntoALockBeingReleased(t *testing.T) {
	gs := &gateStore{Store: memstore.New(), entered: make(chan struct{}, 1), gate: make(chan struct{})}
	l := reqlock.MustNew(gs)
	bg := context.Background()
	outer, err := l.Obtain(bg, "k", wdTTL, 0)
	if err != nil {
		t.Fatal(err)
	}
	outer.KeepAlive(bg)
	<-gs.entered // a renewal is in flight, and stays so until the gate opens
	released := make(chan error, 1)
	go func() { released <- outer.Release(bg) }()
	eventually(t, "release begun", outer.Released)

	ctx := reqlock.NewContext(bg, outer)
	if lock, err := l.Obtain(ctx, "k", time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
		t.Fatalf("re-entering a lock being released: %v, %v; want ErrHeld", lock, err)
	}
	type result struct {
		lock *reqlock.Lock
		err  error
	}
	waiter := make(chan result, 1)
	go func() {
		lock, err := l.Obtain(ctx, "k", time.Minute, 10*time.Second)
		waiter <- result{lock, err} // reported by the test, never after it ends
	}()
	waitUntil(t, func() bool { return reqlock.LocalWaiters(l, "reqlock:k") == 1 })
	close(gs.gate)
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	r := <-waiter
	if r.err != nil {
		t.Fatalf("the waiter behind the released lock: %v", r.err)
	}
	lock := r.lock
	if lock.Fence() <= outer.Fence() {
		t.Fatalf("the waiter's fence %d after the released lock's %d", lock.Fence(), outer.Fence())
	}
	mustRelease(t, lock)
	if _, err := reqlock.MustNew(gs.Store).Obtain(bg, "k", time.Minute, 0); err != nil {
		t.Fatalf("key not free at the end: %v", err)
	}
}

// TestViewKeepAliveEndsWithTheView: a view's keep-alive context ends when the
// view is released, as a lock's does, though the lock behind it stays held
// (and kept alive by its own watchdog).
func TestViewKeepAliveEndsWithTheView(t *testing.T) {
	forEachEnv(t, []string{pathFast}, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		for _, tc := range []struct {
			keys []string
			// outerFirst: the outer lock's watchdog starts before the
			// view's KeepAlive, else after (following the one it started).
			outerFirst bool
		}{{[]string{"k"}, true}, {[]string{"k"}, false}, {[]string{"k", "n"}, true}, {[]string{"k", "n"}, false}} {
			keys := tc.keys
			outer, err := l.Obtain(bg, "k", wdTTL, 0)
			if err != nil {
				t.Fatal(err)
			}
			var outerCtx context.Context
			if tc.outerFirst {
				outerCtx = outer.KeepAlive(bg)
			}
			view, err := l.ObtainAll(reqlock.NewContext(bg, outer), keys, wdTTL, 0)
			if err != nil {
				t.Fatal(err)
			}
			viewCtx := view.KeepAlive(bg)
			if !tc.outerFirst {
				outerCtx = outer.KeepAlive(bg)
			}
			mustRelease(t, view)
			waitDone(t, viewCtx, 5*time.Second)
			if cause := context.Cause(viewCtx); !errors.Is(cause, reqlock.ErrNotHeld) || errors.Is(cause, reqlock.ErrLockLost) {
				t.Fatalf("%q: view's keep-alive cause %v, want ErrNotHeld without ErrLockLost", keys, cause)
			}
			// The outer lock is untouched: still held, still kept alive.
			if outerCtx.Err() != nil {
				t.Fatalf("%q: the outer keep-alive context ended: %v", keys, context.Cause(outerCtx))
			}
			// Renewed beyond its TTL, the watchdog's work alone. Outliving
			// the TTL is the behaviour under test, so time has to pass: the
			// key is probed all along, for twice the TTL.
			renewUntil := time.Now().Add(2 * wdTTL)
			for time.Now().Before(renewUntil) {
				e.expectHeld(t, "k")
				<-time.After(20 * time.Millisecond) // probe interval
			}
			if outerCtx.Err() != nil {
				t.Fatalf("%q: the outer keep-alive context ended: %v", keys, context.Cause(outerCtx))
			}
			// A released view's KeepAlive has ended already.
			if again := view.KeepAlive(bg); again.Err() == nil {
				t.Fatalf("%q: KeepAlive of a released view is live", keys)
			}
			mustRelease(t, outer)
			waitDone(t, outerCtx, 5*time.Second)
		}
		eventually(t, "watchdogs exited", func() bool { return watchdogs() == 0 })
		e.expectNoKeysLeft(t)
	})
}

// TestViewFenceOfOnlyItsKeys: a view of a lock on several keys holds only the
// keys it was obtained for, and FenceOf answers for those alone.
func TestViewFenceOfOnlyItsKeys(t *testing.T) {
	l := reqlock.MustNew(memstore.New())
	bg := context.Background()
	outer, err := l.ObtainAll(bg, []string{"a", "b", "c"}, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Release(bg)
	ctx := reqlock.NewContext(bg, outer)
	for _, keys := range [][]string{{"a"}, {"b", "c"}, {"c", "d"}} {
		view, err := l.ObtainAll(ctx, keys, time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := view.Keys(); !slices.Equal(got, keys) {
			t.Fatalf("Keys() = %q, want %q", got, keys)
		}
		for _, k := range []string{"a", "b", "c", "d"} {
			f, ok := view.FenceOf(k)
			want, wantOK := outer.FenceOf(k)
			if !slices.Contains(keys, k) {
				want, wantOK = 0, false
			} else if k == "d" {
				want, wantOK = f, f > 0
			}
			if f != want || ok != wantOK {
				t.Errorf("view of %q: FenceOf(%q) = %d, %v; want %d, %v", keys, k, f, ok, want, wantOK)
			}
		}
		mustRelease(t, view)
	}
}
