package reqlock_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testredis"
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

func TestObtainRelease(t *testing.T) {
	l, store := newLocker(t)
	ctx := context.Background()
	first, err := l.Obtain(ctx, "sku:1", time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if first.Key() != "sku:1" || first.StoreKey() != "reqlock:sku:1" || first.Fence() <= 0 || first.TTL() != time.Second {
		t.Fatalf("handle: key %q store key %q fence %d ttl %v", first.Key(), first.StoreKey(), first.Fence(), first.TTL())
	}
	if v := first.Validity(); v <= 900*time.Millisecond || v > time.Second {
		t.Fatalf("validity %v, want just under the TTL", v)
	}
	if _, err := l.Obtain(ctx, "sku:1", time.Second, 0); !errors.Is(err, reqlock.ErrHeld) {
		t.Fatalf("second obtain: %v, want ErrHeld", err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if first.Validity() != 0 || !first.Released() {
		t.Fatal("a released lock still reports validity")
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
	_ = second.Release(ctx)
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
	defer la.Release(context.Background())
	lb, err := b.Obtain(context.Background(), "k", time.Second, 0)
	if err != nil {
		t.Fatalf("another prefix is another key space: %v", err)
	}
	_ = lb.Release(context.Background())
}

func TestInvalidArguments(t *testing.T) {
	l, _ := newLocker(t)
	ctx := context.Background()
	for _, tc := range []struct {
		key       string
		ttl, wait time.Duration
	}{{"", time.Second, 0}, {"k", 0, 0}, {"k", -time.Second, 0}, {"k", time.Second, -1}} {
		if _, err := l.Obtain(ctx, tc.key, tc.ttl, tc.wait); !errors.Is(err, reqlock.ErrInvalid) {
			t.Errorf("Obtain(%q, %v, %v) = %v, want ErrInvalid", tc.key, tc.ttl, tc.wait, err)
		}
	}
	if _, err := reqlock.New(nil); !errors.Is(err, reqlock.ErrInvalid) {
		t.Errorf("New(nil) = %v", err)
	}
	for _, b := range []reqlock.Backoff{
		{Initial: -time.Millisecond},
		{Initial: time.Second, Max: time.Millisecond},
		{Multiplier: 0.5},
		{Jitter: 1},
	} {
		if _, err := reqlock.New(memstore.New(), reqlock.WithBackoff(b)); !errors.Is(err, reqlock.ErrInvalid) {
			t.Errorf("backoff %+v: err = %v, want ErrInvalid", b, err)
		}
	}
	if _, err := reqlock.New(memstore.New(), reqlock.WithReleaseTimeout(0)); !errors.Is(err, reqlock.ErrInvalid) {
		t.Errorf("release timeout 0: err = %v", err)
	}
	if _, err := reqlock.New(memstore.New(), reqlock.WithKeyPrefix("")); !errors.Is(err, reqlock.ErrInvalid) {
		t.Errorf("empty prefix: err = %v", err)
	}
	for _, h := range [][2]int{{-1, 0}, {reqlock.MaxHandoffCount + 1, 0}} {
		if _, err := reqlock.New(memstore.New(), reqlock.WithHandoff(h[0], time.Second)); !errors.Is(err, reqlock.ErrInvalid) {
			t.Errorf("handoff count %d: err = %v", h[0], err)
		}
	}
}

func TestWaitEndsAtLimit(t *testing.T) {
	l, _ := newLocker(t)
	ctx := context.Background()
	held, err := l.Obtain(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	start := time.Now()
	_, err = l.Obtain(ctx, "k", time.Second, 50*time.Millisecond)
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
	held, err := l.Obtain(context.Background(), "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = l.Obtain(ctx, "k", time.Second, time.Minute)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 10*time.Second {
		t.Fatalf("err = %v after %v; the request deadline must bound the wait", err, time.Since(start))
	}
}

func TestCancelStopsStoreWaitAtOnce(t *testing.T) {
	// Another process holds the key, so the waiter contends with the store
	// and sleeps in its backoff (a minute); a cancel must end that sleep.
	// (A waiter in the local queue: TestCancelledWaiterLeavesQueue.)
	store := memstore.New()
	acquires := make(chan struct{}, 16)
	l := reqlock.MustNew(&faultStore{Store: store, acquired: acquires},
		reqlock.WithBackoff(reqlock.Backoff{Initial: time.Minute, Max: time.Minute}))
	held, err := reqlock.MustNew(store).Obtain(context.Background(), "k", time.Hour, 0)
	if err != nil {
		t.Fatal(err)
	}
	baseline := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := l.Obtain(ctx, "k", time.Second, time.Hour)
		errc <- err
	}()
	<-acquires // found the key held
	<-acquires // subscribed to releases, checked again, and now sleeps
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, reqlock.ErrWaitEnded) || !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want ErrWaitEnded joined with Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter (sleeping a 1 minute backoff) did not stop when cancelled")
	}
	waitUntil(t, func() bool { return runtime.NumGoroutine() <= baseline })
	_ = held.Release(context.Background())
	if store.Len() != 0 {
		t.Fatalf("the cancelled waiter left %d entries", store.Len())
	}
}

func TestWaiterObtainsAfterRelease(t *testing.T) {
	// Two Lockers on one store are two processes: the waiter contends with
	// the store, sleeps, and must wake when the other process releases.
	acquires := make(chan struct{}, 16)
	mem := memstore.New()
	a := reqlock.MustNew(mem)
	b := reqlock.MustNew(&faultStore{Store: mem, acquired: acquires},
		reqlock.WithBackoff(reqlock.Backoff{Initial: time.Minute, Max: time.Minute}))
	ctx := context.Background()
	held, err := a.Obtain(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *reqlock.Lock, 1)
	go func() {
		lock, err := b.Obtain(ctx, "k", time.Second, 30*time.Second)
		if err != nil {
			t.Error(err)
		}
		got <- lock
	}()
	<-acquires // found the key held
	<-acquires // subscribed to releases and checked once more
	start := time.Now()
	_ = held.Release(ctx)
	lock := <-got
	if lock == nil || lock.Fence() <= held.Fence() {
		t.Fatalf("waiter got %v", lock)
	}
	// Its backoff is a minute: only the release signal can wake it this soon.
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("waiter woke %v after the release", d)
	}
	_ = lock.Release(ctx)
}

func TestSleepCappedByHolderTTL(t *testing.T) {
	// A backoff of a whole minute would make the waiter miss the lock; the
	// holder's 30ms TTL, returned by the failed attempt, caps the sleep.
	l, _ := newLocker(t, reqlock.WithBackoff(reqlock.Backoff{Initial: time.Minute, Max: time.Minute}))
	ctx := context.Background()
	if _, err := l.Obtain(ctx, "k", 30*time.Millisecond, 0); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	lock, err := l.Obtain(ctx, "k", time.Second, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release(ctx)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v to obtain an expired lock", d)
	}
}

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
	if lock.TTL() != time.Minute || lock.Validity() < 50*time.Second {
		t.Fatalf("after refresh: ttl %v validity %v", lock.TTL(), lock.Validity())
	}
	if err := lock.Refresh(ctx, -1); !errors.Is(err, reqlock.ErrInvalid) {
		t.Fatalf("negative refresh: %v", err)
	}
	if err := lock.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lock.Refresh(ctx, 0); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("refresh after release: %v, want ErrNotHeld", err)
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
	if err := old.Release(ctx); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("stale release: %v, want ErrNotHeld", err)
	}
	if err := old.Refresh(ctx, time.Minute); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("stale refresh: %v, want ErrNotHeld", err)
	}
	if _, err := l.Obtain(ctx, "k", time.Second, 0); !errors.Is(err, reqlock.ErrHeld) {
		t.Fatalf("the stale release freed the new holder's lock: %v", err)
	}
	_ = next.Release(ctx)
}

func TestReleaseIgnoresCancelledContext(t *testing.T) {
	l, store := newLocker(t)
	lock, err := l.Obtain(context.Background(), "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := lock.Release(ctx); err != nil {
		t.Fatalf("release on a cancelled context: %v", err)
	}
	if store.Len() != 0 {
		t.Fatal("lock left behind")
	}
}

// faultStore wraps a real store to inject faults.
type faultStore struct {
	reqlock.Store
	acquireErr   error
	loseReply    bool          // grant, then behave as if the reply never came
	errAfter     error         // grant, then fail with this error
	blockRelease bool          // Release waits for its context to end
	acquired     chan struct{} // if set, told of every attempt
	acquires     atomic.Int32
}

func (s *faultStore) Acquire(ctx context.Context, key, token string, ttl time.Duration) (reqlock.Grant, error) {
	s.acquires.Add(1)
	if s.acquireErr != nil {
		return reqlock.Grant{}, s.acquireErr
	}
	g, err := s.Store.Acquire(ctx, key, token, ttl)
	if s.acquired != nil {
		s.acquired <- struct{}{}
	}
	if s.loseReply {
		<-ctx.Done()
		return reqlock.Grant{}, ctx.Err()
	}
	if s.errAfter != nil {
		return reqlock.Grant{}, s.errAfter
	}
	return g, err
}

func (s *faultStore) Release(ctx context.Context, key, token string, lastFence int64) error {
	if s.blockRelease {
		<-ctx.Done()
		return ctx.Err()
	}
	return s.Store.Release(ctx, key, token, lastFence)
}

func TestStoreFailureIsNotRetried(t *testing.T) {
	cause := errors.New("connection refused")
	fs := &faultStore{Store: memstore.New(), acquireErr: cause}
	l := reqlock.MustNew(fs)
	_, err := l.Obtain(context.Background(), "k", time.Second, time.Second)
	if !errors.Is(err, reqlock.ErrStore) || !errors.Is(err, cause) {
		t.Fatalf("err = %v, want ErrStore wrapping the cause", err)
	}
	if n := fs.acquires.Load(); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}
}

func TestGrantWithFailedReplyIsReleased(t *testing.T) {
	// A read timeout after Redis ran the script: the outcome is unknown, so
	// the grant must not be left for its TTL (1h), on a try-once route too.
	mem := memstore.New()
	cause := errors.New("i/o timeout")
	l := reqlock.MustNew(&faultStore{Store: mem, errAfter: cause})
	_, err := l.Obtain(context.Background(), "k", time.Hour, 0)
	if !errors.Is(err, reqlock.ErrStore) || !errors.Is(err, cause) {
		t.Fatalf("err = %v, want ErrStore wrapping the cause", err)
	}
	waitUntil(t, func() bool { return mem.Len() == 0 })
}

func TestAbandonedGrantIsReleased(t *testing.T) {
	mem := memstore.New()
	l := reqlock.MustNew(&faultStore{Store: mem, loseReply: true})
	_, err := l.Obtain(context.Background(), "k", time.Hour, 30*time.Millisecond)
	if !errors.Is(err, reqlock.ErrWaitEnded) || errors.Is(err, reqlock.ErrHeld) {
		t.Fatalf("err = %v, want ErrWaitEnded without ErrHeld", err)
	}
	// Released in the background, bounded by the release timeout.
	waitUntil(t, func() bool { return mem.Len() == 0 })
}

func TestReleaseHasItsOwnTimeout(t *testing.T) {
	fs := &faultStore{Store: memstore.New(), blockRelease: true}
	l := reqlock.MustNew(fs, reqlock.WithReleaseTimeout(30*time.Millisecond))
	lock, err := l.Obtain(context.Background(), "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = lock.Release(context.Background())
	if !errors.Is(err, reqlock.ErrStore) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrStore after the release timeout", err)
	}
}

func TestContextCarriesLock(t *testing.T) {
	l, _ := newLocker(t)
	lock, err := l.Obtain(context.Background(), "k", time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release(context.Background())
	if _, ok := reqlock.FromContext(context.Background()); ok {
		t.Fatal("empty context has a lock")
	}
	got, ok := reqlock.FromContext(reqlock.NewContext(context.Background(), lock))
	if !ok || got != lock {
		t.Fatal("lock not found in its context")
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

// waitUntil polls cond until it holds, failing after a deadline.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 5s")
		}
		time.Sleep(time.Millisecond) // poll interval inside a deadline
	}
}

// NotifyRelease forwards to the wrapped store, so wrapping keeps wake-ups.
func (s *faultStore) NotifyRelease(key string) (<-chan struct{}, func()) {
	if n, ok := s.Store.(reqlock.ReleaseNotifier); ok {
		return n.NotifyRelease(key)
	}
	return nil, func() {}
}

// contentionLockers builds n Lockers on one store: memstore shared in
// memory, or n Redis stores on one server (n processes, as far as the
// lock can tell).
func contentionLockers(t *testing.T, backend string, n int) []*reqlock.Locker {
	t.Helper()
	var lockers []*reqlock.Locker
	mem := memstore.New()
	prefix := "reqlock:" + testredis.Prefix(t)
	for range n {
		var store reqlock.Store = mem
		if backend == "redis" {
			rs, err := redisstore.New(testredis.Client(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = rs.Close() })
			store = rs
		}
		lockers = append(lockers, reqlock.MustNew(store, reqlock.WithKeyPrefix(prefix)))
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
						lock, err := l.Obtain(context.Background(), "hot", time.Second, 60*time.Millisecond)
						switch {
						case err == nil:
							granted.Add(1)
							time.Sleep(2 * time.Millisecond) // the work under the lock
							if err := lock.Release(context.Background()); err != nil {
								errs <- err
							}
						case errors.Is(err, reqlock.ErrHeld) && errors.Is(err, reqlock.ErrWaitEnded):
							timedOut.Add(1)
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
				waitUntil(t, func() bool {
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

// proxiedRedisStore returns a Store on the test Redis behind a fault proxy,
// with go-redis's default retries, its scripts loaded and its connection
// open, so that the next reply through the proxy is a script's.
func proxiedRedisStore(t *testing.T) (*redisstore.Store, *testredis.Proxy) {
	t.Helper()
	proxy := testredis.NewProxy(t)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	store, err := redisstore.New(client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	if err := store.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	return store, proxy
}

// go-redis retries a command whose reply was lost (MaxRetries, default 3).
// The retried acquire finds the key holding the caller's own token: it is
// the caller's grant, not a holder to wait for. Nothing is left behind.
func TestRetriedAcquireAfterLostReplyIsGranted(t *testing.T) {
	for _, mode := range []string{"plain", "fair", "multi"} {
		t.Run(mode, func(t *testing.T) {
			store, proxy := proxiedRedisStore(t)
			opts := []reqlock.Option{reqlock.WithKeyPrefix(testredis.Prefix(t))}
			if mode == "fair" {
				opts = append(opts, reqlock.WithFairness(reqlock.FairOptions{}))
			}
			l := reqlock.MustNew(store, opts...)
			ctx := context.Background()
			obtain := func() (*reqlock.Lock, error) {
				if mode == "multi" {
					return l.ObtainAll(ctx, []string{"{k}:a", "{k}:b"}, time.Minute, 0)
				}
				return l.Obtain(ctx, "k", time.Minute, 0)
			}
			proxy.DropNextReply()
			lock, err := obtain()
			if err != nil {
				t.Fatalf("acquire whose first reply was lost: %v, want the lock (the retry is the caller's own grant)", err)
			}
			if err := lock.Release(ctx); err != nil {
				t.Fatalf("release: %v", err)
			}
			again, err := obtain()
			if err != nil {
				t.Fatalf("the key was left behind: %v", err)
			}
			_ = again.Release(ctx)
		})
	}
}

// go-redis bounds a call by its context's deadline, not by its
// cancellation: a waiter whose client leaves while Redis is frozen must
// still stop at once, and the call it left in flight is cleaned up once it
// returns, owner-checked, so nothing stays locked.
func TestCancelStopsStalledStoreCallAtOnce(t *testing.T) {
	for _, mode := range []string{"plain", "fair", "multi"} {
		t.Run(mode, func(t *testing.T) {
			store, proxy := proxiedRedisStore(t)
			opts := []reqlock.Option{reqlock.WithKeyPrefix(testredis.Prefix(t))}
			if mode == "fair" {
				opts = append(opts, reqlock.WithFairness(reqlock.FairOptions{}))
			}
			l := reqlock.MustNew(store, opts...)
			keys := []string{"{k}:a", "{k}:b"}
			obtain := func(ctx context.Context, wait time.Duration) (*reqlock.Lock, error) {
				if mode == "multi" {
					return l.ObtainAll(ctx, keys, time.Minute, wait)
				}
				return l.Obtain(ctx, keys[0], time.Minute, wait)
			}
			proxy.Freeze()
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			start := time.Now()
			go func() {
				_, err := obtain(ctx, 2*time.Second)
				errc <- err
			}()
			time.AfterFunc(50*time.Millisecond, cancel) // the client leaves mid-call
			err := <-errc
			if took := time.Since(start); took > time.Second {
				t.Fatalf("Obtain returned after %v; a cancelled waiter must stop at once, not at its 2s wait", took)
			}
			if !errors.Is(err, reqlock.ErrWaitEnded) || !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v, want ErrWaitEnded joined with Canceled", err)
			}
			proxy.Thaw() // the frozen call reaches Redis and may set the key
			waitUntil(t, func() bool {
				lock, err := obtain(context.Background(), 0)
				if err != nil {
					return false
				}
				_ = lock.Release(context.Background())
				return true
			})
		})
	}
}
