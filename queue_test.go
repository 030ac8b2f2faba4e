package reqlock_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores/memstore"
)

// countingStore wraps a real store and counts its calls.
type countingStore struct {
	reqlock.Store
	acquires, grants, releases, refreshes atomic.Int32
}

func (s *countingStore) Acquire(ctx context.Context, key, token string, ttl time.Duration) (reqlock.Grant, error) {
	s.acquires.Add(1)
	g, err := s.Store.Acquire(ctx, key, token, ttl)
	if g.OK {
		s.grants.Add(1)
	}
	return g, err
}

func (s *countingStore) Release(ctx context.Context, key, token string, lastFence int64) error {
	s.releases.Add(1)
	return s.Store.Release(ctx, key, token, lastFence)
}

func (s *countingStore) Refresh(ctx context.Context, key, token string, ttl time.Duration) error {
	s.refreshes.Add(1)
	return s.Store.Refresh(ctx, key, token, ttl)
}

func (s *countingStore) NotifyRelease(key string) (<-chan struct{}, func()) {
	return s.Store.(reqlock.ReleaseNotifier).NotifyRelease(key)
}

// queueWaiters starts n waiters on key, one at a time, each queued before the
// next starts, and returns the channel their locks arrive on, in the order
// they are granted.
func queueWaiters(t *testing.T, l *reqlock.Locker, key string, n int, ttl time.Duration) <-chan waiterResult {
	t.Helper()
	out := make(chan waiterResult, n)
	for i := range n {
		go func() {
			lock, err := l.Obtain(context.Background(), key, ttl, 30*time.Second)
			out <- waiterResult{i, lock, err}
		}()
		waitUntil(t, func() bool { return reqlock.LocalWaiters(l, "reqlock:"+key) == i+1 })
	}
	return out
}

type waiterResult struct {
	arrival int
	lock    *reqlock.Lock
	err     error
}

// drain takes n results in grant order, releasing each lock before taking
// the next, and returns them.
func drain(t *testing.T, results <-chan waiterResult, n int) []waiterResult {
	t.Helper()
	var got []waiterResult
	for range n {
		r := <-results
		if r.err != nil {
			t.Fatalf("waiter %d: %v", r.arrival, r.err)
		}
		got = append(got, r)
		if err := r.lock.Release(context.Background()); err != nil {
			t.Fatalf("waiter %d release: %v", r.arrival, err)
		}
	}
	return got
}

func TestLocalQueueIsFIFO(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []reqlock.Option
	}{
		{"with handoff", nil},
		{"without handoff", []reqlock.Option{reqlock.WithHandoff(0, 0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := reqlock.MustNew(memstore.New(), tc.opts...)
			holder, err := l.Obtain(context.Background(), "k", time.Minute, 0)
			if err != nil {
				t.Fatal(err)
			}
			results := queueWaiters(t, l, "k", 10, time.Minute)
			_ = holder.Release(context.Background())
			for i, r := range drain(t, results, 10) {
				if r.arrival != i {
					t.Fatalf("grant %d went to waiter %d: not arrival order", i, r.arrival)
				}
			}
			if n := reqlock.LocalQueues(l); n != 0 {
				t.Fatalf("%d local queues left", n)
			}
		})
	}
}

func TestHandoffFencesIncreaseWithoutRoundTrips(t *testing.T) {
	store := &countingStore{Store: memstore.New()}
	l := reqlock.MustNew(store)
	holder, err := l.Obtain(context.Background(), "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	results := queueWaiters(t, l, "k", 10, time.Minute)
	_ = holder.Release(context.Background())
	last := holder.Fence()
	for _, r := range drain(t, results, 10) {
		if r.lock.Fence() <= last {
			t.Fatalf("handoff fence %d after %d", r.lock.Fence(), last)
		}
		if r.lock.Token() != holder.Token() {
			t.Fatal("a handoff changed the grant's token: it went through the store")
		}
		last = r.lock.Fence()
	}
	if g, rel := store.grants.Load(), store.releases.Load(); g != 1 || rel != 1 {
		t.Fatalf("11 locks cost %d store grants and %d releases, want 1 and 1", g, rel)
	}
	// The store learned the highest handoff fence: the next grant exceeds it.
	next, err := l.Obtain(context.Background(), "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	if next.Fence() <= last {
		t.Fatalf("store grant fence %d does not exceed the last handoff fence %d", next.Fence(), last)
	}
	_ = next.Release(context.Background())
}

func TestHandoffBoundedByCount(t *testing.T) {
	store := &countingStore{Store: memstore.New()}
	l := reqlock.MustNew(store, reqlock.WithHandoff(3, time.Hour))
	holder, err := l.Obtain(context.Background(), "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	results := queueWaiters(t, l, "k", 10, time.Minute)
	_ = holder.Release(context.Background())
	drain(t, results, 10)
	// 11 locks in chains of at most 1 grant + 3 handoffs: 3 store grants.
	if g := store.grants.Load(); g != 3 {
		t.Fatalf("%d store grants, want 3", g)
	}
}

func TestHandoffBoundedByTime(t *testing.T) {
	store := &countingStore{Store: memstore.New()}
	l := reqlock.MustNew(store, reqlock.WithHandoff(100, time.Nanosecond))
	holder, err := l.Obtain(context.Background(), "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	results := queueWaiters(t, l, "k", 5, time.Minute)
	_ = holder.Release(context.Background())
	drain(t, results, 5)
	if g := store.grants.Load(); g != 6 {
		t.Fatalf("%d store grants, want 6: the time bound allows no handoff", g)
	}
}

func TestHandoffRefreshesAShortLease(t *testing.T) {
	store := &countingStore{Store: memstore.New()}
	l := reqlock.MustNew(store, reqlock.WithHandoff(16, time.Hour))
	holder, err := l.Obtain(context.Background(), "k", 200*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	results := queueWaiters(t, l, "k", 1, 200*time.Millisecond)
	waitUntil(t, func() bool { return holder.Validity() < 90*time.Millisecond })
	_ = holder.Release(context.Background())
	r := <-results
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.lock.Release(context.Background())
	if r.lock.Token() != holder.Token() {
		t.Fatal("the lock went through the store, not a handoff")
	}
	if store.refreshes.Load() != 1 || r.lock.Validity() < 150*time.Millisecond {
		t.Fatalf("refreshes %d, validity %v: a short lease was handed off as is", store.refreshes.Load(), r.lock.Validity())
	}
}

func TestCancelledWaiterLeavesQueue(t *testing.T) {
	l := reqlock.MustNew(memstore.New())
	holder, err := l.Obtain(context.Background(), "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	baseline := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := l.Obtain(ctx, "k", time.Minute, time.Minute)
		errc <- err
	}()
	waitUntil(t, func() bool { return reqlock.LocalWaiters(l, "reqlock:k") == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, reqlock.ErrWaitEnded) || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if n := reqlock.LocalWaiters(l, "reqlock:k"); n != 0 {
		t.Fatalf("%d waiters left in the queue", n)
	}
	_ = holder.Release(context.Background())
	if n := reqlock.LocalQueues(l); n != 0 {
		t.Fatalf("%d local queues left", n)
	}
	waitUntil(t, func() bool { return runtime.NumGoroutine() <= baseline })
}

func TestManyCancelledWaitersLeaveNothing(t *testing.T) {
	l := reqlock.MustNew(memstore.New())
	holder, err := l.Obtain(context.Background(), "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if lock, err := l.Obtain(ctx, "k", time.Minute, time.Minute); err == nil {
				_ = lock.Release(context.Background()) // won its turn before the cancel
			}
		})
	}
	waitUntil(t, func() bool { return reqlock.LocalWaiters(l, "reqlock:k") == 20 })
	// Cancel while the holder hands over, so some waiters race their turn.
	go cancel()
	_ = holder.Release(context.Background())
	wg.Wait()
	if n := reqlock.LocalQueues(l); n != 0 {
		t.Fatalf("%d local queues left", n)
	}
	lock, err := l.Obtain(context.Background(), "k", time.Second, 0)
	if err != nil {
		t.Fatalf("the key is stuck after the waiters left: %v", err)
	}
	_ = lock.Release(context.Background())
}

func TestTryOnceWithLocalHolderSkipsTheStore(t *testing.T) {
	store := &countingStore{Store: memstore.New()}
	l := reqlock.MustNew(store)
	holder, err := l.Obtain(context.Background(), "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(context.Background())
	before := store.acquires.Load()
	if _, err := l.Obtain(context.Background(), "k", time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
		t.Fatalf("err = %v, want ErrHeld", err)
	}
	if store.acquires.Load() != before {
		t.Fatal("a try-once request went to the store while a local request held the key")
	}
}

func TestLeakedLockDoesNotBlockLocalWaiters(t *testing.T) {
	l := reqlock.MustNew(memstore.New())
	leaked, err := l.Obtain(context.Background(), "k", 50*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	lock, err := l.Obtain(context.Background(), "k", time.Minute, 10*time.Second)
	if err != nil {
		t.Fatalf("a local waiter stayed blocked after the leaked lock's lease ended: %v", err)
	}
	if lock.Fence() <= leaked.Fence() {
		t.Fatalf("fence %d after %d", lock.Fence(), leaked.Fence())
	}
	// The late release of the leaked lock must not free the new holder.
	if err := leaked.Release(context.Background()); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("late release: %v, want ErrNotHeld", err)
	}
	if _, err := l.Obtain(context.Background(), "k", time.Second, 0); !errors.Is(err, reqlock.ErrHeld) {
		t.Fatalf("the late release disturbed the new holder: %v", err)
	}
	_ = lock.Release(context.Background())
	if n := reqlock.LocalQueues(l); n != 0 {
		t.Fatalf("%d local queues left", n)
	}
}

// deafStore loses every release signal: its notification channel never fires.
type deafStore struct {
	reqlock.Store
	subscribed chan struct{}
}

func (d deafStore) NotifyRelease(string) (<-chan struct{}, func()) {
	select {
	case d.subscribed <- struct{}{}:
	default:
	}
	return make(chan struct{}), func() {}
}

func TestLostWakeUpIsRecoveredByPolling(t *testing.T) {
	mem := memstore.New()
	holder := reqlock.MustNew(mem)
	subscribed := make(chan struct{}, 1)
	waiter := reqlock.MustNew(deafStore{Store: mem, subscribed: subscribed},
		reqlock.WithBackoff(reqlock.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}))
	ctx := context.Background()
	held, err := holder.Obtain(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan waiterResult, 1)
	go func() {
		lock, err := waiter.Obtain(ctx, "k", time.Minute, 10*time.Second)
		got <- waiterResult{0, lock, err}
	}()
	<-subscribed // the waiter waits for a signal that will never come
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("the waiter did not recover the lost wake-up by polling: %v", r.err)
	}
	if r.lock.Fence() <= held.Fence() {
		t.Fatalf("fence %d after %d", r.lock.Fence(), held.Fence())
	}
	_ = r.lock.Release(ctx)
}

func TestLostLockIsNotHandedOff(t *testing.T) {
	mem := memstore.New()
	l := reqlock.MustNew(mem, reqlock.WithHandoff(16, time.Hour))
	ctx := context.Background()
	holder, err := l.Obtain(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan waiterResult, 1)
	go func() {
		lock, err := l.Obtain(ctx, "k", time.Minute, 300*time.Millisecond)
		got <- waiterResult{0, lock, err}
	}()
	waitUntil(t, func() bool { return reqlock.LocalWaiters(l, "reqlock:k") == 1 })
	// The grant vanishes behind the holder's back and another process takes
	// the key; the holder learns it from a refresh.
	if err := mem.Release(ctx, holder.StoreKey(), holder.Token(), 0); err != nil {
		t.Fatal(err)
	}
	intruder, err := reqlock.MustNew(mem).Obtain(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer intruder.Release(ctx)
	if err := holder.Refresh(ctx, 0); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("refresh: %v, want ErrNotHeld", err)
	}
	if err := holder.Release(ctx); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("release of a lost lock: %v, want ErrNotHeld", err)
	}
	r := <-got
	if r.err == nil {
		_ = r.lock.Release(ctx)
		t.Fatal("the waiter got the lost grant while another process holds the key")
	}
	if !errors.Is(r.err, reqlock.ErrWaitEnded) || !errors.Is(r.err, reqlock.ErrHeld) {
		t.Fatalf("waiter: %v, want ErrWaitEnded with ErrHeld", r.err)
	}
}

func TestFencesExceedAnUnreleasedHandoff(t *testing.T) {
	// A grant handed on and then never released: the store never learns the
	// handoff fence, yet the next grant must exceed it.
	l := reqlock.MustNew(memstore.New(), reqlock.WithHandoff(16, time.Hour))
	ctx := context.Background()
	holder, err := l.Obtain(ctx, "k", 80*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	results := queueWaiters(t, l, "k", 1, 80*time.Millisecond)
	_ = holder.Release(ctx)
	stuck := <-results // handed off, then stuck past its TTL: never released
	if stuck.err != nil || stuck.lock.Token() != holder.Token() {
		t.Fatalf("expected a handoff: %v", stuck.err)
	}
	next, err := l.Obtain(ctx, "k", time.Second, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	if next.Fence() <= stuck.lock.Fence() {
		t.Fatalf("store grant fence %d does not exceed the unreleased handoff fence %d", next.Fence(), stuck.lock.Fence())
	}
}

func TestLeakedLockDoesNotBlockTryOnce(t *testing.T) {
	l := reqlock.MustNew(memstore.New())
	ctx := context.Background()
	if _, err := l.Obtain(ctx, "k", 30*time.Millisecond, 0); err != nil { // leaked
		t.Fatal(err)
	}
	var lock *reqlock.Lock
	waitUntil(t, func() bool {
		lock, _ = l.Obtain(ctx, "k", time.Second, 0)
		return lock != nil
	})
	_ = lock.Release(ctx)
	if n := reqlock.LocalQueues(l); n != 0 {
		t.Fatalf("%d local queues left", n)
	}
}
