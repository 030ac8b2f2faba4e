package reqlock_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
)

// obtainWithin runs obtain and fails unless it returns within 5s, which a
// request that waited for itself (an hour's wait) would not.
func obtainWithin(t *testing.T, obtain func() (*reqlock.Lock, error)) *reqlock.Lock {
	t.Helper()
	got := make(chan obtained, 1)
	go func() {
		lock, err := obtain()
		got <- obtained{lock, err, time.Now()}
	}()
	r := within(t, got, 5*time.Second, "the reentrant obtain waited for its own request's lock: it did not return")
	if r.err != nil {
		t.Fatalf("reentrant obtain: %v", r.err)
	}
	return r.lock
}

func TestContextCarriesLock(t *testing.T) {
	l, _ := newLocker(t)
	bg := context.Background()
	a := mustObtain(t, bg, l, "a")
	b := mustObtain(t, bg, l, "b")
	defer mustRelease(t, a, b)
	if _, ok := reqlock.FromContext(bg); ok {
		t.Fatal("empty context has a lock")
	}
	if reqlock.NewContext(bg, nil) != bg {
		t.Fatal("NewContext with no lock did not return the context as is")
	}
	ctxA := reqlock.NewContext(bg, a)
	if got, ok := reqlock.FromContext(ctxA); !ok || got != a {
		t.Fatal("lock not found in its context")
	}
	if got, ok := reqlock.FromContext(reqlock.NewContext(ctxA, b)); !ok || got != b {
		t.Fatal("FromContext did not return the innermost lock")
	}
	// Values survive a context that drops the lock's cancellation.
	if got, ok := reqlock.FromContext(context.WithoutCancel(ctxA)); !ok || got != a {
		t.Fatal("lock not found through a detached context")
	}
}

func TestReentrantObtainHoldsTheOuterGrant(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		outer := mustObtain(t, bg, l, "k")
		ctx := reqlock.NewContext(bg, outer)
		for _, wait := range []time.Duration{0, time.Hour} {
			acquires := e.spy.acquires.Load()
			inner := obtainWithin(t, func() (*reqlock.Lock, error) { return l.Obtain(ctx, "k", time.Minute, wait) })
			if inner == outer {
				t.Fatal("reentrant obtain returned the outer lock itself")
			}
			if n := e.spy.acquires.Load(); n != acquires {
				t.Fatalf("the reentrant obtain called the store %d times", n-acquires)
			}
			f, ok := inner.FenceOf("k")
			if inner.Fence() != outer.Fence() || f != outer.Fence() || !ok || inner.Token() != outer.Token() {
				t.Fatalf("inner fence %d (FenceOf %d %v) token %q, want the outer lock's %d %q",
					inner.Fence(), f, ok, inner.Token(), outer.Fence(), outer.Token())
			}
			if inner.Key() != "k" || !slices.Equal(inner.Keys(), []string{"k"}) {
				t.Fatalf("inner key %q keys %q", inner.Key(), inner.Keys())
			}
			if inner.Released() || validity(inner) <= 0 || !inner.ValidUntil().Equal(outer.ValidUntil()) {
				t.Fatalf("fresh inner lock: Released %v, valid for %v (outer: %v)", inner.Released(), validity(inner), validity(outer))
			}
			mustRelease(t, inner)
			if !inner.Released() || outer.Released() {
				t.Fatalf("after the inner lock's release: inner Released %v, outer Released %v", inner.Released(), outer.Released())
			}
			if err := inner.Release(bg); !errors.Is(err, reqlock.ErrNotHeld) {
				t.Fatalf("second release of the inner lock: %v, want ErrNotHeld", err)
			}
			// The key is still the outer lock's: for another process, and
			// for another request of this one.
			e.expectHeld(t, "k")
			if _, err := l.Obtain(bg, "k", time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
				t.Fatalf("another request of the process: %v, want ErrHeld", err)
			}
			if err := outer.Refresh(bg, 0); err != nil {
				t.Fatalf("the outer lock after its inner lock's release: %v", err)
			}
			if ctx.Err() != nil {
				t.Fatalf("the outer lock's context ended with the inner lock: %v", context.Cause(ctx))
			}
		}
		mustRelease(t, outer)
		e.expectFree(t, "k")
		e.expectNoKeysLeft(t)
	})
}

func TestReentrantOuterReleasedFirst(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		outer := mustObtain(t, bg, l, "k")
		inner := mustObtain(t, reqlock.NewContext(bg, outer), l, "k")
		mustRelease(t, outer)
		if !outer.Released() || inner.Released() {
			t.Fatalf("outer Released %v, inner Released %v", outer.Released(), inner.Released())
		}
		// The inner lock still holds the key, and can renew it.
		e.expectHeld(t, "k")
		if err := inner.Refresh(bg, 0); err != nil {
			t.Fatalf("refresh of the inner lock: %v", err)
		}
		if err := outer.Release(bg); !errors.Is(err, reqlock.ErrNotHeld) {
			t.Fatalf("second release of the outer lock: %v, want ErrNotHeld", err)
		}
		e.expectHeld(t, "k")
		mustRelease(t, inner)
		e.expectFree(t, "k")
		e.expectNoKeysLeft(t)
	})
}

func TestReentrantThreeLevelsDeep(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		// Every order of releasing the outer lock and its three nested
		// locks: the key is free after the last release, and only then.
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
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
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
			mustRelease(t, v)
			// The new keys went back to the store; the outer key stayed.
			e.expectHeld(t, "b")
			for _, k := range want {
				if k != "b" && !e.free(t, k) {
					t.Fatalf("%q still held after the inner lock's release", k)
				}
			}
		}

		// Outer lock released first: the inner lock keeps b until it goes.
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
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		outer := mustObtain(t, bg, l, "b")
		other := mustObtain(t, bg, e.other(t), "c")
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
		eventually(t, "a free again", func() bool { return e.free(t, "a") })
		// The failed calls left no hold on the outer lock: its release
		// frees b at once.
		mustRelease(t, outer)
		e.expectFree(t, "b")
		mustRelease(t, other)
		e.expectNoKeysLeft(t)
	})
}

func TestNoReentryWithoutTheLockInContext(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
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

// TestReentryAfterFullReleaseAcquiresAnew: once every hold on a grant has
// ended, a context that still carries its locks re-enters nothing: the
// lock's own context has ended with the release, and a detached context
// (one that drops the lock's cancellation) gets a new grant.
func TestReentryAfterFullReleaseAcquiresAnew(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		outer := mustObtain(t, bg, l, "k")
		ctx := reqlock.NewContext(bg, outer)
		inner := mustObtain(t, ctx, l, "k")
		innerCtx := reqlock.NewContext(ctx, inner)
		mustRelease(t, outer, inner)
		e.expectFree(t, "k")
		for _, c := range []context.Context{ctx, innerCtx} {
			if cause := context.Cause(c); !errors.Is(cause, reqlock.ErrNotHeld) || errors.Is(cause, reqlock.ErrLockLost) {
				t.Fatalf("a released lock's context: cause %v, want ErrNotHeld without ErrLockLost", cause)
			}
			if _, err := l.Obtain(c, "k", time.Minute, 0); !errors.Is(err, reqlock.ErrWaitEnded) || !errors.Is(err, context.Canceled) {
				t.Fatalf("Obtain on a released lock's context: %v, want ErrWaitEnded joined with Canceled", err)
			}
		}
		for _, c := range []context.Context{context.WithoutCancel(ctx), context.WithoutCancel(innerCtx)} {
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
// releases it: no two grants ever overlap, and the key ends free. On the
// lock's own context each request gets a hold on the lock or, once its
// release began, ends with the context; on a detached context it gets a
// hold or, once the lock is gone, a new grant.
func TestReentryRacesWithRelease(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		for _, detached := range []bool{false, true} {
			l := e.locker(t)
			bg := context.Background()
			rounds := 200
			if e.client != nil {
				rounds = 50
			}
			var (
				mu                        sync.Mutex
				holders                   = map[string]int{} // token → requests that hold the key with it
				overlaps, reentered       int
				fresh, ended, otherErrors int
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
				if detached {
					ctx = context.WithoutCancel(ctx)
				}
				start := make(chan struct{})
				var wg sync.WaitGroup
				errs := make(chan error, 16)
				for range 4 {
					wg.Go(func() {
						<-start
						lock, err := l.Obtain(ctx, "k", time.Minute, 10*time.Second)
						if err != nil {
							mu.Lock()
							if !detached && errors.Is(err, reqlock.ErrWaitEnded) && errors.Is(err, context.Canceled) {
								ended++
							} else {
								otherErrors++
								errs <- err
							}
							mu.Unlock()
							return
						}
						enter(lock.Token())
						mu.Lock()
						if lock.Token() == outer.Token() {
							reentered++
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
					t.Fatalf("detached %v: %v", detached, err)
				}
				e.expectFree(t, "k")
			}
			if overlaps != 0 {
				t.Fatalf("detached %v: %d overlapping holders", detached, overlaps)
			}
			t.Logf("detached %v: %d holds on the lock, %d new grants, %d ended with the lock's context", detached, reentered, fresh, ended)
			if reentered+fresh+ended != 4*rounds || (!detached && fresh != 0) {
				t.Fatalf("detached %v: %d holds, %d new grants, %d ended contexts: want one of them for each of the %d requests, and no new grant on the lock's context",
					detached, reentered, fresh, ended, 4*rounds)
			}
			if n := reqlock.LocalQueues(l); n != 0 {
				t.Fatalf("%d local queues left", n)
			}
		}
		e.expectNoKeysLeft(t)
	})
}

// gateStore blocks every Refresh, whatever its context, until gate closes.
type gateStore struct {
	stores.Store
	entered chan struct{} // told of each Refresh that starts to wait
	gate    chan struct{}
}

func (s *gateStore) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-s.gate
	return s.Store.Refresh(ctx, keys, token, ttl)
}

// TestNoReentryIntoALockBeingReleased catches a request re-entering a lock
// whose release has begun but not reached the store yet (Release waits for a
// watchdog renewal in flight): it must not take a hold on a lock on its way
// out, but wait for the key like any request. On the lock's own context it
// cannot even try: that context ends as the release begins.
func TestNoReentryIntoALockBeingReleased(t *testing.T) {
	for _, detached := range []bool{false, true} {
		name := "lock's context"
		if detached {
			name = "detached context"
		}
		t.Run(name, func(t *testing.T) {
			gs := &gateStore{Store: memstore.New(), entered: make(chan struct{}, 1), gate: make(chan struct{})}
			var openGate sync.Once
			open := func() { openGate.Do(func() { close(gs.gate) }) }
			t.Cleanup(open) // a failed test must not leave the release stuck
			l := reqlock.MustNew(gs)
			bg := context.Background()
			outer, err := l.Obtain(bg, "k", wdTTL, 0)
			if err != nil {
				t.Fatal(err)
			}
			ctx := reqlock.NewContext(bg, outer)
			if detached {
				ctx = context.WithoutCancel(ctx)
			}
			outer.KeepAlive(bg)
			<-gs.entered // a renewal is in flight, and stays so until the gate opens
			released := make(chan error, 1)
			go func() { released <- outer.Release(bg) }()
			eventually(t, "release begun", outer.Released)

			if !detached {
				waitDone(t, ctx, 5*time.Second) // ends as the release begins, before it returns
				if _, err := l.Obtain(ctx, "k", time.Minute, 0); !errors.Is(err, reqlock.ErrWaitEnded) || !errors.Is(err, context.Canceled) {
					t.Fatalf("Obtain on the context of a lock being released: %v, want ErrWaitEnded joined with Canceled", err)
				}
				open()
				if err := <-released; err != nil {
					t.Fatal(err)
				}
				return
			}
			if lock, err := l.Obtain(ctx, "k", time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
				if lock != nil {
					t.Cleanup(func() { _ = lock.Release(bg) })
				}
				t.Fatalf("re-entering a lock being released: lock %v, err %v; want ErrHeld", lock != nil, err)
			}
			waiter := make(chan obtained, 1)
			go func() {
				lock, err := l.Obtain(ctx, "k", time.Minute, 10*time.Second)
				waiter <- obtained{lock, err, time.Now()} // reported by the test, never after it ends
			}()
			eventually(t, "the waiter queued", func() bool { return reqlock.LocalWaiters(l, "reqlock:k") == 1 })
			open()
			if err := <-released; err != nil {
				t.Fatal(err)
			}
			r := <-waiter
			if r.err != nil {
				t.Fatalf("the waiter behind the released lock: %v", r.err)
			}
			if r.lock.Fence() <= outer.Fence() {
				t.Fatalf("the waiter's fence %d after the released lock's %d", r.lock.Fence(), outer.Fence())
			}
			mustRelease(t, r.lock)
			if _, err := reqlock.MustNew(gs.Store).Obtain(bg, "k", time.Minute, 0); err != nil {
				t.Fatalf("key not free at the end: %v", err)
			}
		})
	}
}

// TestReentrantKeepAliveEndsWithTheReentrantLock: a reentrant lock's
// keep-alive context ends when that lock is released, as any lock's does,
// though the outer lock stays held (and kept alive by its own watchdog).
func TestReentrantKeepAliveEndsWithTheReentrantLock(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		bg := context.Background()
		for _, tc := range []struct {
			keys []string
			// outerFirst: the outer lock's watchdog starts before the
			// inner lock's KeepAlive, else after.
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
			inner, err := l.ObtainAll(reqlock.NewContext(bg, outer), keys, wdTTL, 0)
			if err != nil {
				t.Fatal(err)
			}
			innerCtx := inner.KeepAlive(bg)
			if !tc.outerFirst {
				outerCtx = outer.KeepAlive(bg)
			}
			mustRelease(t, inner)
			waitDone(t, innerCtx, 5*time.Second)
			if cause := context.Cause(innerCtx); !errors.Is(cause, reqlock.ErrNotHeld) || errors.Is(cause, reqlock.ErrLockLost) {
				t.Fatalf("%q: the inner lock's keep-alive cause %v, want ErrNotHeld without ErrLockLost", keys, cause)
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
			// A released lock's KeepAlive has ended already.
			if again := inner.KeepAlive(bg); again.Err() == nil {
				t.Fatalf("%q: KeepAlive of a released inner lock is live", keys)
			}
			mustRelease(t, outer)
			waitDone(t, outerCtx, 5*time.Second)
		}
		eventually(t, "watchdogs exited", func() bool { return watchdogs() == 0 })
		e.expectNoKeysLeft(t)
	})
}

// TestReentrantFenceOfOnlyItsKeys: a reentrant lock within a lock on several
// keys holds only the keys it was obtained for, and FenceOf answers for
// those alone.
func TestReentrantFenceOfOnlyItsKeys(t *testing.T) {
	l := reqlock.MustNew(memstore.New())
	bg := context.Background()
	outer, err := l.ObtainAll(bg, []string{"a", "b", "c"}, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Release(bg)
	ctx := reqlock.NewContext(bg, outer)
	for _, keys := range [][]string{{"a"}, {"b", "c"}, {"c", "d"}} {
		inner, err := l.ObtainAll(ctx, keys, time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := inner.Keys(); !slices.Equal(got, keys) {
			t.Fatalf("Keys() = %q, want %q", got, keys)
		}
		for _, k := range []string{"a", "b", "c", "d"} {
			f, ok := inner.FenceOf(k)
			want, wantOK := outer.FenceOf(k)
			if !slices.Contains(keys, k) {
				want, wantOK = 0, false
			} else if k == "d" {
				want, wantOK = f, f > 0
			}
			if f != want || ok != wantOK {
				t.Errorf("inner lock on %q: FenceOf(%q) = %d, %v; want %d, %v", keys, k, f, ok, want, wantOK)
			}
		}
		mustRelease(t, inner)
	}
}

// TestReentryAfterExpiryChecksTheStore: a request whose lock outlived its
// TTL (no watchdog) and was taken over must not take a hold while the new
// owner holds the key; it learns its lock was lost. The lock's own context
// ended when the validity ran out, so the request asks on a detached one.
func TestReentryAfterExpiryChecksTheStore(t *testing.T) {
	store := memstore.New()
	locker := reqlock.MustNew(store, quiet)
	other := reqlock.MustNew(store)
	bg := context.Background()
	outer, err := locker.Obtain(bg, "k", 30*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	lockCtx := reqlock.NewContext(bg, outer)
	// Another process takes the key once the outer lock's TTL has run out.
	var taker *reqlock.Lock
	eventually(t, "another process takes the expired key", func() bool {
		taker, err = other.Obtain(bg, "k", time.Minute, 0)
		return err == nil
	})
	defer taker.Release(bg)
	waitDone(t, lockCtx, 5*time.Second)
	if cause := context.Cause(lockCtx); !errors.Is(cause, reqlock.ErrLockLost) {
		t.Fatalf("the expired lock's context: cause %v, want ErrLockLost", cause)
	}

	ctx := context.WithoutCancel(lockCtx)
	for name, obtain := range map[string]func() (*reqlock.Lock, error){
		"Obtain":    func() (*reqlock.Lock, error) { return locker.Obtain(ctx, "k", time.Second, 0) },
		"ObtainAll": func() (*reqlock.Lock, error) { return locker.ObtainAll(ctx, []string{"k", "j"}, time.Second, 0) },
	} {
		lock, err := obtain()
		if lock != nil || !errors.Is(err, reqlock.ErrLockLost) || !errors.Is(err, reqlock.ErrNotHeld) {
			t.Fatalf("%s: lock %v, err %v; want ErrLockLost and ErrNotHeld while another owner holds the key", name, lock != nil, err)
		}
		if o := reqlock.OutcomeOf(ctx, err); o != reqlock.OutcomeLost {
			t.Fatalf("%s: outcome %q, want lock_lost", name, o)
		}
	}
	if _, err := other.Obtain(bg, "j", time.Second, 0); err != nil {
		t.Fatalf("the failed ObtainAll left j held: %v", err)
	}
}

// ownedStore is a store whose keys never expire (they are set for an hour,
// whatever the TTL), so a lock past its validity is still its owner's; it
// counts refreshes, and fails them while failRefresh is set.
type ownedStore struct {
	stores.Store
	refreshes   atomic.Int32
	failRefresh atomic.Bool
}

func (s *ownedStore) Acquire(ctx context.Context, keys []string, token string, _ time.Duration) (stores.Grant, error) {
	return s.Store.Acquire(ctx, keys, token, time.Hour)
}

func (s *ownedStore) Refresh(ctx context.Context, keys []string, token string, _ time.Duration) error {
	s.refreshes.Add(1)
	if s.failRefresh.Load() {
		return errInjected
	}
	return s.Store.Refresh(ctx, keys, token, time.Hour)
}

// TestReentryRenewsAnUntrustedLock: a lock whose validity is not confirmed
// (a renewal's outcome is unknown) or has run out, but that still owns its
// key, is renewed (owner-checked) and then re-entered, with its fence.
func TestReentryRenewsAnUntrustedLock(t *testing.T) {
	bg := context.Background()
	t.Run("renewal outcome unknown", func(t *testing.T) {
		store := &ownedStore{Store: memstore.New()}
		locker := reqlock.MustNew(store)
		outer, err := locker.Obtain(bg, "k", 10*time.Second, 0)
		if err != nil {
			t.Fatal(err)
		}
		ctx := reqlock.NewContext(bg, outer)
		store.failRefresh.Store(true)
		if err := outer.Refresh(bg, 0); !errors.Is(err, reqlock.ErrStore) {
			t.Fatalf("refresh: %v, want ErrStore", err)
		}
		store.failRefresh.Store(false)
		inner, err := locker.Obtain(ctx, "k", time.Second, 0)
		if err != nil {
			t.Fatal(err)
		}
		if inner.Fence() != outer.Fence() || store.refreshes.Load() != 2 || ctx.Err() != nil {
			t.Fatalf("fence %d vs %d, %d refreshes, context %v; want the same fence after one renewal", inner.Fence(), outer.Fence(), store.refreshes.Load(), ctx.Err())
		}
		mustRelease(t, inner, outer)
	})
	t.Run("validity ran out", func(t *testing.T) {
		store := &ownedStore{Store: memstore.New()}
		locker := reqlock.MustNew(store, quiet)
		outer, err := locker.Obtain(bg, "k", 100*time.Millisecond, 0)
		if err != nil {
			t.Fatal(err)
		}
		lockCtx := reqlock.NewContext(bg, outer)
		waitDone(t, lockCtx, 5*time.Second) // ends when the validity runs out
		inner, err := locker.Obtain(context.WithoutCancel(lockCtx), "k", time.Second, 0)
		if err != nil {
			t.Fatal(err)
		}
		if inner.Fence() != outer.Fence() || validity(outer) <= 0 || store.refreshes.Load() != 1 {
			t.Fatalf("fence %d vs %d, validity %v, %d refreshes; want the same fence after one renewal",
				inner.Fence(), outer.Fence(), validity(outer), store.refreshes.Load())
		}
		mustRelease(t, inner, outer)
	})
}

// TestNestedObtainOfALostLockFailsAtOnce: once the request's own lock is
// known lost, a nested Obtain of its key fails at once with ErrLockLost
// (outcome lock_lost) instead of waiting for itself in the local queue: on
// the lock's own context (which the loss ended) and on a detached one.
func TestNestedObtainOfALostLockFailsAtOnce(t *testing.T) {
	for _, detached := range []bool{false, true} {
		name := "lock's context"
		if detached {
			name = "detached context"
		}
		t.Run(name, func(t *testing.T) {
			store := memstore.New()
			locker := reqlock.MustNew(store, quiet)
			bg := context.Background()
			outer := mustObtain(t, bg, locker, "k")
			defer outer.Release(bg)
			ctx := reqlock.NewContext(bg, outer)
			if detached {
				ctx = context.WithoutCancel(ctx)
			}
			if err := store.Release(bg, []string{"reqlock:k"}, outer.Token(), 0); err != nil {
				t.Fatal(err)
			}
			if err := outer.Refresh(bg, 0); !errors.Is(err, reqlock.ErrNotHeld) {
				t.Fatalf("refresh: %v", err)
			}
			start := time.Now()
			_, err := locker.Obtain(ctx, "k", time.Minute, 5*time.Second)
			if !errors.Is(err, reqlock.ErrLockLost) || time.Since(start) > time.Second {
				t.Fatalf("after %v: %v; want ErrLockLost at once", time.Since(start), err)
			}
			if o := reqlock.OutcomeOf(ctx, err); o != reqlock.OutcomeLost {
				t.Fatalf("outcome %q, want lock_lost", o)
			}
		})
	}
}
