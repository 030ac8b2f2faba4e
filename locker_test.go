package reqlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
	"github.com/reqlock/reqlock/stores/redisstore"
)

func newLocker(t *testing.T, opts ...reqlock.Option) (*reqlock.Locker, *memstore.Store) {
	t.Helper()
	store := memstore.New()
	l, err := reqlock.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l, store
}

// heldInStore reports whether storeKey refuses another token, asking the
// store itself (not a Locker, which may answer from its local queue).
func heldInStore(t *testing.T, store stores.Store, storeKey string) bool {
	t.Helper()
	g, err := store.Acquire(context.Background(), []string{storeKey}, "probe-token", time.Minute)
	if err != nil {
		t.Fatalf("probe acquire of %q: %v", storeKey, err)
	}
	if g.OK {
		// Undo the probe's grant so the test's own cleanup is not confused.
		_ = store.Release(context.Background(), []string{storeKey}, "probe-token", 0)
	}
	return !g.OK
}

func TestObtainRelease(t *testing.T) {
	l, store := newLocker(t)
	ctx := context.Background()
	first, err := l.Obtain(ctx, "sku:1", time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if first.Key() != "sku:1" || first.Fence() <= 0 || first.TTL() != time.Second {
		t.Fatalf("lock: key %q fence %d ttl %v", first.Key(), first.Fence(), first.TTL())
	}
	if !heldInStore(t, store, "reqlock:sku:1") {
		t.Fatal("the store does not hold the key under the default prefix")
	}
	if v := validity(first); v <= 900*time.Millisecond || v > time.Second {
		t.Fatalf("validity %v, want just under the TTL", v)
	}
	if _, err := l.Obtain(ctx, "sku:1", time.Second, 0); !errors.Is(err, reqlock.ErrHeld) || errors.Is(err, reqlock.ErrWaitEnded) {
		t.Fatalf("second obtain: %v, want ErrHeld alone", err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !first.Released() {
		t.Fatal("Released() is false after Release")
	}
	if err := first.Release(ctx); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("double release: %v, want ErrNotHeld", err)
	}
	second, err := l.Obtain(ctx, "sku:1", time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if second.Fence() <= first.Fence() || second.Token() == first.Token() {
		t.Fatalf("fence %d after %d, tokens equal: %v", second.Fence(), first.Fence(), second.Token() == first.Token())
	}
	mustRelease(t, second)
	if store.Len() != 0 {
		t.Fatalf("store keeps %d entries", store.Len())
	}
}

func TestKeyPrefix(t *testing.T) {
	store := memstore.New()
	a := reqlock.MustNew(store, reqlock.WithKeyPrefix("a:"))
	b := reqlock.MustNew(store, reqlock.WithKeyPrefix("b:"))
	la, err := a.Obtain(context.Background(), "k", time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := b.Obtain(context.Background(), "k", time.Second, 0)
	if err != nil {
		t.Fatalf("another prefix is another key space: %v", err)
	}
	for _, k := range []string{"a:k", "b:k"} {
		if !heldInStore(t, store, k) {
			t.Fatalf("the store does not hold %q", k)
		}
	}
	mustRelease(t, la, lb)
}

func TestInvalidArguments(t *testing.T) {
	l, store := newLocker(t)
	ctx := context.Background()
	for _, tc := range []struct {
		key       string
		ttl, wait time.Duration
	}{{"", time.Second, 0}, {"k", 0, 0}, {"k", -time.Second, 0}, {"k", time.Second, -1}} {
		if lock, err := l.Obtain(ctx, tc.key, tc.ttl, tc.wait); !errors.Is(err, reqlock.ErrInvalid) || lock != nil {
			t.Errorf("Obtain(%q, %v, %v) = %v, %v; want ErrInvalid", tc.key, tc.ttl, tc.wait, lock, err)
		}
	}
	if store.Len() != 0 {
		t.Fatalf("invalid calls left %d keys", store.Len())
	}
}

// TestNewRefusesMeaninglessOptions: an option given a value that means
// nothing makes New fail with ErrInvalid, naming the option, and MustNew
// panic; the boundary values are accepted.
func TestNewRefusesMeaninglessOptions(t *testing.T) {
	if _, err := reqlock.New(nil); !errors.Is(err, reqlock.ErrInvalid) {
		t.Errorf("New(nil) = %v, want ErrInvalid", err)
	}
	for _, tc := range []struct {
		name string
		opt  reqlock.Option
	}{
		{"WithBackoff", reqlock.WithBackoff(-time.Millisecond, time.Second)},
		{"WithBackoff", reqlock.WithBackoff(0, time.Second)},
		{"WithBackoff", reqlock.WithBackoff(time.Second, time.Millisecond)},
		{"WithReleaseTimeout", reqlock.WithReleaseTimeout(0)},
		{"WithReleaseTimeout", reqlock.WithReleaseTimeout(-time.Second)},
		{"WithKeyPrefix", reqlock.WithKeyPrefix("")},
		{"WithHandoff", reqlock.WithHandoff(-1, 0)},
		{"WithHandoff", reqlock.WithHandoff(stores.FenceStride, time.Second)},
		{"WithHandoff", reqlock.WithHandoff(1, -time.Second)},
		{"WithLogger", reqlock.WithLogger(nil)},
		{"WithMetrics", reqlock.WithMetrics(nil)},
		{"WithFairness", reqlock.WithFairness(0)},
	} {
		_, err := reqlock.New(memstore.New(), tc.opt)
		if !errors.Is(err, reqlock.ErrInvalid) || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s: New = %v, want ErrInvalid naming the option", tc.name, err)
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: MustNew did not panic", tc.name)
				}
			}()
			reqlock.MustNew(memstore.New(), tc.opt)
		}()
	}
	for _, opt := range []reqlock.Option{
		reqlock.WithBackoff(time.Millisecond, time.Millisecond),
		reqlock.WithHandoff(stores.FenceStride-1, time.Hour),
		reqlock.WithHandoff(0, 0),
		reqlock.WithKeyPrefix("x"),
	} {
		if _, err := reqlock.New(memstore.New(), opt); err != nil {
			t.Errorf("a boundary value was refused: %v", err)
		}
	}
}

func TestWaitEndsAtLimit(t *testing.T) {
	l, _ := newLocker(t)
	ctx := context.Background()
	held := mustObtain(t, ctx, l, "k")
	defer held.Release(ctx)
	start := time.Now()
	_, err := l.Obtain(ctx, "k", time.Second, 50*time.Millisecond)
	elapsed := time.Since(start)
	if !errors.Is(err, reqlock.ErrWaitEnded) || !errors.Is(err, reqlock.ErrHeld) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrWaitEnded joined with ErrHeld and DeadlineExceeded", err)
	}
	if elapsed < 50*time.Millisecond {
		t.Fatalf("gave up after %v, before the 50ms wait", elapsed)
	}
}

func TestWaitBoundedByContextDeadline(t *testing.T) {
	l, _ := newLocker(t)
	held := mustObtain(t, context.Background(), l, "k")
	defer held.Release(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := l.Obtain(ctx, "k", time.Second, time.Minute)
	if !errors.Is(err, reqlock.ErrWaitEnded) || !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 10*time.Second {
		t.Fatalf("err = %v after %v; the request deadline must bound the wait", err, time.Since(start))
	}
}

func TestObtainOnAnEndedContext(t *testing.T) {
	l, store := newLocker(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, wait := range []time.Duration{0, time.Minute} {
		if _, err := l.Obtain(ctx, "k", time.Second, wait); !errors.Is(err, reqlock.ErrWaitEnded) || !errors.Is(err, context.Canceled) {
			t.Fatalf("wait %v: err = %v, want ErrWaitEnded joined with Canceled", wait, err)
		}
	}
	if store.Len() != 0 || reqlock.LocalQueues(l) != 0 {
		t.Fatalf("an ended context left %d keys and %d local queues", store.Len(), reqlock.LocalQueues(l))
	}
}

func TestConcurrentWaitersExclusive(t *testing.T) {
	l, _ := newLocker(t)
	var inside, overlaps atomic.Int32
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			for range 10 {
				lock, err := l.Obtain(context.Background(), "k", time.Second, 10*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				runtime.Gosched()
				inside.Add(-1)
				_ = lock.Release(context.Background())
			}
		})
	}
	wg.Wait()
	if overlaps.Load() != 0 {
		t.Fatalf("%d overlapping holders", overlaps.Load())
	}
}

// contentionLockers builds n Lockers with opts on one store: memstore
// shared in memory, or n Redis stores on one server (n processes, as far as
// the lock can tell).
func contentionLockers(t *testing.T, backend string, n int, opts ...reqlock.Option) []*reqlock.Locker {
	t.Helper()
	var lockers []*reqlock.Locker
	mem := memstore.New()
	prefix := "reqlock:" + testredis.Prefix(t)
	for range n {
		var store stores.Store = mem
		if backend == "redis" {
			rs, err := redisstore.New(testredis.Client(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = rs.Close() })
			store = rs
		}
		lockers = append(lockers, reqlock.MustNew(store, append([]reqlock.Option{reqlock.WithKeyPrefix(prefix)}, opts...)...))
	}
	return lockers
}

// A burst on one hot key, with waits shorter than the queue: every request
// that does not get the lock ran out of time while the key was held by
// someone, so each failure is a timeout (ErrHeld joined), never what the
// middleware answers 503 or runs unlocked for (a store failure).
func TestContentionIsNeverAStoreFailure(t *testing.T) {
	for _, backend := range []string{"memstore", "redis"} {
		for _, n := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/%d lockers", backend, n), func(t *testing.T) {
				lockers := contentionLockers(t, backend, n)
				var granted, timedOut atomic.Int32
				errs := make(chan error, 200)
				var wg sync.WaitGroup
				for i := range 200 {
					l := lockers[i%n]
					wg.Go(func() {
						// 200ms: a loaded machine answers the first store call within it.
						lock, err := l.Obtain(context.Background(), "hot", time.Second, 200*time.Millisecond)
						switch {
						case err == nil:
							granted.Add(1)
							time.Sleep(2 * time.Millisecond) // the work under the lock
							if err := lock.Release(context.Background()); err != nil {
								errs <- err
							}
						case errors.Is(err, reqlock.ErrHeld) && errors.Is(err, reqlock.ErrWaitEnded):
							timedOut.Add(1)
							if o := reqlock.OutcomeOf(context.Background(), err); o != reqlock.OutcomeTimeout {
								errs <- fmt.Errorf("outcome %q of %w", o, err)
							}
						default:
							errs <- err
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Errorf("a request on a busy key failed with %v, want a timeout (ErrWaitEnded joined with ErrHeld)", err)
				}
				if granted.Load() == 0 || timedOut.Load() == 0 {
					t.Fatalf("granted %d, timed out %d: the burst must produce both", granted.Load(), timedOut.Load())
				}
				// A grant that came as a wait ended is released in the
				// background: let that finish while the store is open.
				eventually(t, "the hot key free again", func() bool {
					lock, err := lockers[0].Obtain(context.Background(), "hot", time.Second, 0)
					if err != nil {
						return false
					}
					return lock.Release(context.Background()) == nil
				})
			})
		}
	}
}

func TestObtainAllGrantsEveryKeyWithItsFence(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		ctx := context.Background()
		// Unsorted, with a repeated key: locked once each, in sorted order.
		lock, err := l.ObtainAll(ctx, []string{"sku:3", "sku:1", "sku:2", "sku:1"}, time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"sku:1", "sku:2", "sku:3"}
		if got := lock.Keys(); !slices.Equal(got, want) {
			t.Fatalf("Keys() = %q, want %q", got, want)
		}
		if lock.Key() != "sku:1" {
			t.Fatalf("Key() %q, want the first key", lock.Key())
		}
		for _, k := range want {
			if f, ok := lock.FenceOf(k); !ok || f <= 0 {
				t.Fatalf("FenceOf(%q) = %d, %v", k, f, ok)
			}
		}
		e.spy.expectFences(t, lock, e.prefix)
		if f, _ := lock.FenceOf("sku:1"); lock.Fence() != f {
			t.Fatalf("Fence() %d, want FenceOf(Key()) %d", lock.Fence(), f)
		}
		if f, ok := lock.FenceOf("sku:4"); ok || f != 0 {
			t.Fatalf("FenceOf a key the lock lacks = %d, %v", f, ok)
		}
		lock.Keys()[0] = "changed"
		if lock.Keys()[0] != "sku:1" {
			t.Fatal("Keys() returns the lock's own slice")
		}
		if n := e.left(t); n != 3 {
			t.Fatalf("store holds %d keys, want 3 (the repeated key once)", n)
		}
		// All keys in one store call each way: one round trip.
		if n := e.spy.acquires.Load(); n != 1 {
			t.Fatalf("%d Acquire calls for 3 keys, want 1", n)
		}
		e.expectHeld(t, want...)
		if err := lock.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if !lock.Released() {
			t.Fatal("Released() is false after Release")
		}
		if n := e.spy.releases.Load(); n != 1 {
			t.Fatalf("%d Release calls for 3 keys, want 1", n)
		}
		if n := e.left(t); n != 0 {
			t.Fatalf("store holds %d keys after release", n)
		}
		if err := lock.Release(ctx); !errors.Is(err, reqlock.ErrNotHeld) {
			t.Fatalf("double release: %v, want ErrNotHeld", err)
		}
	})
}

func TestObtainAllHeldKeyLeavesNoPartialGrant(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		ctx := context.Background()
		// The held key sorts in the middle of the keys asked for.
		holder := mustObtain(t, ctx, e.other(t), "c")
		l := e.locker(t)
		_, err := l.ObtainAll(ctx, []string{"e", "a", "c", "b", "d"}, time.Minute, 0)
		if !errors.Is(err, reqlock.ErrHeld) || errors.Is(err, reqlock.ErrWaitEnded) {
			t.Fatalf("err = %v, want ErrHeld alone", err)
		}
		if n := e.left(t); n != 1 {
			t.Fatalf("store holds %d keys, want only the holder's", n)
		}
		e.expectFree(t, "a", "b", "d", "e")
		mustRelease(t, holder)
		// And the Locker itself can take them all now: nothing of its
		// failed attempt is left in its own state either.
		lock, err := l.ObtainAll(ctx, []string{"a", "b", "c", "d", "e"}, time.Minute, 0)
		if err != nil {
			t.Fatalf("after the holder let go: %v", err)
		}
		mustRelease(t, lock)
		e.expectNoKeysLeft(t)
	})
}

func TestObtainAllWaitEnds(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		ctx := context.Background()
		holder := mustObtain(t, ctx, e.other(t), "b")
		defer holder.Release(ctx)
		l := e.locker(t)
		start := time.Now()
		_, err := l.ObtainAll(ctx, []string{"a", "b"}, time.Minute, 50*time.Millisecond)
		if !errors.Is(err, reqlock.ErrWaitEnded) || !errors.Is(err, reqlock.ErrHeld) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want ErrWaitEnded joined with ErrHeld and DeadlineExceeded", err)
		}
		if d := time.Since(start); d < 50*time.Millisecond {
			t.Fatalf("gave up after %v, before the 50ms wait", d)
		}
		// The caller's own deadline bounds a longer wait too.
		dctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		defer cancel()
		_, err = l.ObtainAll(dctx, []string{"a", "b"}, time.Minute, time.Hour)
		if !errors.Is(err, reqlock.ErrWaitEnded) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want ErrWaitEnded joined with DeadlineExceeded", err)
		}
		// An attempt cut off by the deadline may have been granted; the
		// Locker releases such a grant in the background.
		eventually(t, "a free again", func() bool { return e.free(t, "a") })
	})
}

func TestObtainAllInvalidArguments(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		ctx := context.Background()
		for _, tc := range []struct {
			keys      []string
			ttl, wait time.Duration
		}{
			{nil, time.Second, 0},
			{[]string{}, time.Second, 0},
			{[]string{""}, time.Second, 0},
			{[]string{"a", ""}, time.Second, 0},
			{[]string{"a", "b"}, 0, 0},
			{[]string{"a", "b"}, -time.Second, 0},
			{[]string{"a", "b"}, time.Second, -1},
		} {
			if lock, err := l.ObtainAll(ctx, tc.keys, tc.ttl, tc.wait); !errors.Is(err, reqlock.ErrInvalid) || lock != nil {
				t.Errorf("ObtainAll(%q, %v, %v) = %v, %v; want ErrInvalid", tc.keys, tc.ttl, tc.wait, lock, err)
			}
		}
		if n := e.spy.acquires.Load(); n != 0 {
			t.Fatalf("invalid calls reached the store %d times", n)
		}
		if n := e.left(t); n != 0 {
			t.Fatalf("invalid calls left %d keys", n)
		}
	})
}

// TestObtainAllConcurrentCarts has 50 requests lock overlapping carts of 3 to
// 6 keys out of 10 and update a counter per key without atomicity: every
// request must finish, every count must be exact, and no two holders of a key
// may ever overlap.
func TestObtainAllConcurrentCarts(t *testing.T) {
	e := redisEnv(t)
	const (
		workers  = 50
		rounds   = 4
		poolSize = 10
	)
	pool := make([]string, poolSize)
	for i := range pool {
		pool[i] = fmt.Sprintf("sku:%d", i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	carts := make([][][]string, workers)
	want := map[string]int64{}
	for w := range carts {
		for range rounds {
			cart := slices.Clone(pool)
			rng.Shuffle(len(cart), func(i, j int) { cart[i], cart[j] = cart[j], cart[i] })
			cart = cart[:3+rng.IntN(4)]
			for _, k := range cart {
				want[k]++
			}
			if rng.IntN(4) == 0 {
				cart = append(cart, cart[0]) // a repeated key counts once
			}
			carts[w] = append(carts[w], cart)
		}
	}
	// Five processes of ten requests each.
	lockers := make([]*reqlock.Locker, 5)
	for i := range lockers {
		lockers[i] = e.locker(t)
	}
	var (
		counters = map[string]*atomic.Int64{}
		mu       sync.Mutex
		owner    = map[string]int{}
		overlaps []string
	)
	for _, k := range pool {
		counters[k] = new(atomic.Int64)
	}
	enter := func(id int, keys []string) {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range keys {
			if o := owner[k]; o != 0 {
				overlaps = append(overlaps, fmt.Sprintf("%s: %d entered while %d held it", k, id, o-1))
			}
			owner[k] = id + 1
		}
	}
	leave := func(id int, keys []string) {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range keys {
			if owner[k] == id+1 {
				delete(owner, k)
			}
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers*rounds)
	for w := range workers {
		wg.Go(func() {
			l := lockers[w%len(lockers)]
			for _, cart := range carts[w] {
				lock, err := l.ObtainAll(context.Background(), cart, 10*time.Second, 30*time.Second)
				if err != nil {
					errs <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
				keys := lock.Keys()
				enter(w, keys)
				for _, k := range keys {
					v := counters[k].Load() // read, yield, write: not atomic
					runtime.Gosched()
					counters[k].Store(v + 1)
				}
				leave(w, keys)
				if err := lock.Release(context.Background()); err != nil {
					errs <- fmt.Errorf("worker %d release: %w", w, err)
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("not every request finished within 60s (deadlock?)\n%s", stacks())
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(overlaps) > 0 {
		t.Fatalf("%d overlapping holders, e.g. %s", len(overlaps), overlaps[0])
	}
	for _, k := range pool {
		if got := counters[k].Load(); got != want[k] {
			t.Errorf("counter %s = %d, want %d", k, got, want[k])
		}
	}
	if left := redisKeys(t, e.client, e.prefix); len(left) != 0 {
		t.Fatalf("keys left in Redis: %s", strings.Join(left, " "))
	}
}

// A Redis that stalls: the request at the head of the local queue spends its
// wait in its own store call, a store failure; the one queued behind it
// gets its turn with a sliver of its wait left, and inherits that evidence:
// a store failure too, not a timeout, or a stalled store would hide behind
// 423s (and fail-open routes would never run) for as long as requests keep
// arriving.
func TestQueuedWaitersReportAStalledStore(t *testing.T) {
	store, proxy := proxiedRedisStore(t, func(o *redis.Options) { o.MaxRetries = -1 })
	prefix := testredis.Prefix(t)
	l := reqlock.MustNew(store, reqlock.WithKeyPrefix(prefix), quiet)
	proxy.Freeze()
	t.Cleanup(proxy.Thaw)
	obtain := func(wait time.Duration) <-chan reqlock.Outcome {
		done := make(chan reqlock.Outcome, 1)
		go func() {
			lock, err := l.Obtain(context.Background(), "k", time.Minute, wait)
			if err == nil {
				_ = lock.Release(context.Background())
			}
			done <- reqlock.OutcomeOf(context.Background(), err)
		}()
		return done
	}

	t.Run("HeadAndFollower", func(t *testing.T) {
		head := obtain(100 * time.Millisecond)
		pollUntil(t, func() bool { return reqlock.LocalQueues(l) == 1 })
		follower := obtain(160 * time.Millisecond) // its turn comes with ~60ms left
		pollUntil(t, func() bool { return reqlock.LocalWaiters(l, prefix+"k") == 1 })
		if o := <-head; o != reqlock.OutcomeStoreError {
			t.Fatalf("head, whose own store call took its whole wait: %v, want store_error", o)
		}
		if o := <-follower; o != reqlock.OutcomeStoreError {
			t.Fatalf("follower, queued behind a store that never answered: %v, want store_error", o)
		}
	})

	t.Run("SteadyArrivals", func(t *testing.T) {
		const (
			wait     = 200 * time.Millisecond
			interval = 10 * time.Millisecond
			n        = 40 // twice the wait's worth of arrivals
		)
		outcomes := make([]<-chan reqlock.Outcome, n)
		for i := range n {
			outcomes[i] = obtain(wait)
			time.Sleep(interval) // the arrival rate under test
		}
		count := map[reqlock.Outcome]int{}
		for _, o := range outcomes {
			count[<-o]++
		}
		// A waiter whose wait runs out while still queued (the machine
		// slow to hand on a turn) is a timeout; nearly all must report
		// the outage. The rule this replaced answered 1 of 40.
		if count[reqlock.OutcomeStoreError] < n*3/4 {
			t.Fatalf("a frozen Redis under steady arrivals: %v, want (nearly) every request a store failure", count)
		}
	})
}

// A try-once Obtain (wait 0) on a stalled Redis returns within the release
// timeout, as a store failure, instead of sitting out the client's own
// timeouts and retries.
func TestTryOnceIsBoundedWhenTheStoreStalls(t *testing.T) {
	store, proxy := proxiedRedisStore(t, func(o *redis.Options) { o.ReadTimeout = 10 * time.Second })
	const bound = 200 * time.Millisecond
	l := reqlock.MustNew(store, reqlock.WithKeyPrefix(testredis.Prefix(t)), reqlock.WithReleaseTimeout(bound), quiet)
	proxy.Freeze()
	t.Cleanup(proxy.Thaw)
	start := time.Now()
	_, err := l.Obtain(context.Background(), "k", time.Minute, 0)
	if took := time.Since(start); took > 5*bound {
		t.Fatalf("try-once Obtain on a stalled Redis took %v, want about the release timeout %v", took, bound)
	}
	if got := reqlock.OutcomeOf(context.Background(), err); got != reqlock.OutcomeStoreError {
		t.Fatalf("try-once Obtain on a stalled Redis: %v (outcome %v), want a store failure", err, got)
	}
	if !errors.Is(err, reqlock.ErrWaitEnded) || errors.Is(err, reqlock.ErrHeld) {
		t.Fatalf("try-once Obtain on a stalled Redis: %v, want ErrWaitEnded without ErrHeld", err)
	}
}
