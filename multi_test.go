package reqlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/reqlock/reqlock/stores/memstore"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// Store paths of the multi-key tests. A Locker takes its fast paths when the
// store implements MultiStore, KeepReleaser and ReleaseNotifier, and its
// fallbacks (key by key, Refresh for a hold-at-least release, polling) when
// it does not.
const (
	pathFast           = "fast"            // every optional interface of the real store
	pathFallback       = "fallback"        // reqlock.Store only
	pathFallbackNotify = "fallback+notify" // reqlock.Store and ReleaseNotifier
)

var allPaths = []string{pathFast, pathFallback}

// spyStore wraps a real store, tells held of every attempt that found a key
// held, and counts the optional calls the Locker makes. It exposes only the
// Store methods: the wrappers below add the optional interfaces.
type spyStore struct {
	reqlock.Store
	held       chan struct{} // buffered; a send never blocks the store
	subscribed chan string   // each key subscribed to, likewise

	acquireAlls, releaseAlls, refreshAlls, releaseKeeps atomic.Int32
	subs                                                atomic.Int32 // release subscriptions not stopped

	mu     sync.Mutex
	issued map[string]int64 // fence the store issued, by store key and token

	// failAfter, when set, makes an acquire of a store key ending in it
	// (AcquireAll: of any keys) grant, then fail as a lost reply would.
	failAfter string
}

var errLostReply = errors.New("injected: reply lost after the store acted")

// recordGrant notes the fence the store issued for key to token.
func (s *spyStore) recordGrant(key, token string, fence int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.issued == nil {
		s.issued = map[string]int64{}
	}
	s.issued[key+"\x00"+token] = fence
}

// expectFences fails unless lock reports, for each of its keys, the fence
// the store issued for that key to its token.
func (s *spyStore) expectFences(t *testing.T, lock *reqlock.Lock, prefix string) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range lock.Keys() {
		got, _ := lock.FenceOf(k)
		if want, ok := s.issued[prefix+k+"\x00"+lock.Token()]; !ok || got != want {
			t.Fatalf("FenceOf(%q) = %d, but the store issued %d (found %v)", k, got, want, ok)
		}
	}
}

func newSpyStore(real reqlock.Store) *spyStore {
	return &spyStore{Store: real, held: make(chan struct{}, 1<<12), subscribed: make(chan string, 1<<12)}
}

func (s *spyStore) tellHeld() {
	select {
	case s.held <- struct{}{}:
	default:
	}
}

func (s *spyStore) Acquire(ctx context.Context, key, token string, ttl time.Duration) (reqlock.Grant, error) {
	g, err := s.Store.Acquire(ctx, key, token, ttl)
	if s.failAfter != "" && strings.HasSuffix(key, s.failAfter) {
		return reqlock.Grant{}, errLostReply
	}
	if err == nil && !g.OK {
		s.tellHeld()
	}
	if err == nil && g.OK {
		s.recordGrant(key, token, g.Fence)
	}
	return g, err
}

// awaitHeld waits until n attempts have found a key held.
func (s *spyStore) awaitHeld(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		select {
		case <-s.held:
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of %d attempts found a key held within 10s", i, n)
		}
	}
}

// fallbackStore hides MultiStore, KeepReleaser and ReleaseNotifier: the
// Locker takes every key by key, ends a hold-at-least with Refresh, and polls.
type fallbackStore struct{ *spyStore }

// fallbackNotifyStore is a fallbackStore that keeps release signals.
type fallbackNotifyStore struct{ *spyStore }

func (s fallbackNotifyStore) NotifyRelease(key string) (<-chan struct{}, func()) {
	return s.notifyRelease(key)
}

// notifyRelease subscribes through the real store, tells subscribed of the
// key, and counts the subscriptions not yet stopped.
func (s *spyStore) notifyRelease(key string) (<-chan struct{}, func()) {
	ch, stop := s.Store.(reqlock.ReleaseNotifier).NotifyRelease(key)
	s.subs.Add(1)
	select {
	case s.subscribed <- key:
	default:
	}
	var once sync.Once
	return ch, func() {
		once.Do(func() { s.subs.Add(-1) })
		stop()
	}
}

// fastStore forwards every optional interface of the real store.
type fastStore struct{ *spyStore }

func (s fastStore) NotifyRelease(key string) (<-chan struct{}, func()) {
	return s.notifyRelease(key)
}

func (s fastStore) AcquireAll(ctx context.Context, keys []string, token string, ttl time.Duration) (reqlock.MultiGrant, error) {
	s.acquireAlls.Add(1)
	g, err := s.Store.(reqlock.MultiStore).AcquireAll(ctx, keys, token, ttl)
	if s.failAfter != "" {
		return reqlock.MultiGrant{}, errLostReply
	}
	if err == nil && !g.OK {
		s.tellHeld()
	}
	if err == nil && g.OK && len(g.Fences) == len(keys) {
		for i, k := range keys {
			s.recordGrant(k, token, g.Fences[i])
		}
	}
	return g, err
}

func (s fastStore) ReleaseAll(ctx context.Context, keys []string, token string, lastFences []int64, keep time.Duration) error {
	s.releaseAlls.Add(1)
	return s.Store.(reqlock.MultiStore).ReleaseAll(ctx, keys, token, lastFences, keep)
}

func (s fastStore) RefreshAll(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	s.refreshAlls.Add(1)
	return s.Store.(reqlock.MultiStore).RefreshAll(ctx, keys, token, ttl)
}

func (s fastStore) ReleaseKeep(ctx context.Context, key, token string, lastFence int64, keep time.Duration) error {
	s.releaseKeeps.Add(1)
	return s.Store.(reqlock.KeepReleaser).ReleaseKeep(ctx, key, token, lastFence, keep)
}

// storeEnv is one real store seen through one store path.
type storeEnv struct {
	path   string
	real   reqlock.Store // the real store, as another process sees it
	store  reqlock.Store // real seen through path, for the Locker under test
	spy    *spyStore
	prefix string
	client *redis.Client // nil on memstore

	// remove deletes storeKey, which holds token, behind the lock's back.
	remove func(t *testing.T, storeKey, token string)
	// left counts the lock keys under prefix that the store still holds.
	left func(t *testing.T) int
	// subscribed waits until a release subscription on storeKey has reached
	// the store, so that a release from now on is signalled.
	subscribed func(t *testing.T, storeKey string)
}

// locker returns a Locker over the store path under test.
func (e *storeEnv) locker(t *testing.T, opts ...reqlock.Option) *reqlock.Locker {
	t.Helper()
	quiet := reqlock.WithLogger(slog.New(slog.DiscardHandler)) // lost locks are expected
	l, err := reqlock.New(e.store, append([]reqlock.Option{reqlock.WithKeyPrefix(e.prefix), quiet}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// other returns a Locker of another process: on the real store, with no
// local queue or context shared with the Locker under test.
func (e *storeEnv) other(t *testing.T) *reqlock.Locker {
	t.Helper()
	return reqlock.MustNew(e.real, reqlock.WithKeyPrefix(e.prefix))
}

// free reports whether another process can obtain key at once; it gives the
// key back when it could.
func (e *storeEnv) free(t *testing.T, key string) bool {
	t.Helper()
	lock, err := e.other(t).Obtain(context.Background(), key, time.Minute, 0)
	switch {
	case errors.Is(err, reqlock.ErrHeld):
		return false
	case err != nil:
		t.Fatalf("probe of %q: %v", key, err)
	}
	if err := lock.Release(context.Background()); err != nil {
		t.Fatalf("probe release of %q: %v", key, err)
	}
	return true
}

// expectHeld fails unless every key is held in the store.
func (e *storeEnv) expectHeld(t *testing.T, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if e.free(t, k) {
			t.Fatalf("%q is free in the store, want held", k)
		}
	}
}

// expectFree fails unless another process can obtain every key.
func (e *storeEnv) expectFree(t *testing.T, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if !e.free(t, k) {
			t.Fatalf("%q is held in the store, want free", k)
		}
	}
}

// withPath wraps real for path.
func withPath(real reqlock.Store, path string) (reqlock.Store, *spyStore) {
	spy := newSpyStore(real)
	switch path {
	case pathFast:
		return fastStore{spy}, spy
	case pathFallback:
		return fallbackStore{spy}, spy
	case pathFallbackNotify:
		return fallbackNotifyStore{spy}, spy
	}
	panic("unknown store path " + path)
}

// forEachEnv runs f on memstore and on a real Redis, each through every one
// of paths.
func forEachEnv(t *testing.T, paths []string, f func(t *testing.T, e *storeEnv)) {
	for _, path := range paths {
		t.Run("memstore/"+path, func(t *testing.T) {
			mem := memstore.New()
			e := &storeEnv{path: path, real: mem, prefix: reqlock.DefaultKeyPrefix}
			e.store, e.spy = withPath(mem, path)
			e.remove = func(t *testing.T, key, token string) {
				if err := mem.Release(context.Background(), key, token, 0); err != nil {
					t.Fatalf("deleting %q: %v", key, err)
				}
			}
			e.left = func(*testing.T) int { return mem.Len() }
			e.subscribed = func(*testing.T, string) {} // memstore subscribes at once
			f(t, e)
		})
		t.Run("redis/"+path, func(t *testing.T) {
			e := redisEnv(t, path)
			f(t, e)
		})
	}
}

// redisEnv returns a storeEnv on the test Redis with a prefix of its own.
func redisEnv(t *testing.T, path string) *storeEnv {
	t.Helper()
	client := testredis.Client(t)
	store, err := redisstore.New(client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	e := &storeEnv{path: path, real: store, prefix: testredis.Prefix(t), client: client}
	e.store, e.spy = withPath(store, path)
	e.remove = func(t *testing.T, key, _ string) {
		if n, err := client.Del(context.Background(), key).Result(); err != nil || n != 1 {
			t.Fatalf("DEL %q: %d %v", key, n, err)
		}
	}
	e.left = func(t *testing.T) int { return len(redisKeys(t, client, e.prefix)) }
	e.subscribed = func(t *testing.T, key string) {
		eventually(t, "release subscription of "+key+" in Redis", func() bool {
			n, err := client.PubSubNumSub(context.Background(), key).Result()
			if err != nil {
				t.Fatalf("PUBSUB NUMSUB: %v", err)
			}
			return n[key] > 0
		})
	}
	return e
}

// redisKeys SCANs the lock keys under prefix (fence keys start with '{' and
// are not among them).
func redisKeys(t *testing.T, client *redis.Client, prefix string) []string {
	t.Helper()
	var keys []string
	iter := client.Scan(context.Background(), 0, prefix+"*", 100).Iterator()
	for iter.Next(context.Background()) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("SCAN %s*: %v", prefix, err)
	}
	return keys
}

// awaitSleeping waits until a waiter of the Locker under test sleeps in its
// backoff: after its first attempt found a key held or, when the path has
// release signals, after it subscribed and tried once more.
func (e *storeEnv) awaitSleeping(t *testing.T) {
	t.Helper()
	if _, ok := e.store.(reqlock.ReleaseNotifier); ok {
		e.spy.awaitHeld(t, 2)
		return
	}
	e.spy.awaitHeld(t, 1)
}

// expectNoKeysLeft polls until the store holds no lock key of the test.
func (e *storeEnv) expectNoKeysLeft(t *testing.T) {
	t.Helper()
	eventually(t, "no lock key left in the store", func() bool { return e.left(t) == 0 })
}

func TestObtainAllGrantsEveryKeyWithItsFence(t *testing.T) {
	forEachEnv(t, allPaths, func(t *testing.T, e *storeEnv) {
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
		if lock.Key() != "sku:1" || lock.StoreKey() != e.prefix+"sku:1" {
			t.Fatalf("Key() %q StoreKey() %q, want the first key", lock.Key(), lock.StoreKey())
		}
		seen := map[int64]bool{}
		for _, k := range want {
			f, ok := lock.FenceOf(k)
			if !ok || f <= 0 {
				t.Fatalf("FenceOf(%q) = %d, %v", k, f, ok)
			}
			seen[f] = true
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
		if e.path == pathFast && e.spy.acquireAlls.Load() != 1 {
			t.Fatalf("%d AcquireAll calls, want 1: the fast path was not taken", e.spy.acquireAlls.Load())
		}
		e.expectHeld(t, want...)
		if err := lock.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if !lock.Released() || lock.Validity() != 0 {
			t.Fatalf("after release: Released %v, Validity %v", lock.Released(), lock.Validity())
		}
		if e.path == pathFast && e.spy.releaseAlls.Load() != 1 {
			t.Fatalf("%d ReleaseAll calls, want 1", e.spy.releaseAlls.Load())
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
	forEachEnv(t, allPaths, func(t *testing.T, e *storeEnv) {
		ctx := context.Background()
		// The held key sorts in the middle: the fallback has taken the keys
		// before it when it finds it held.
		holder, err := e.other(t).Obtain(ctx, "c", time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		l := e.locker(t)
		_, err = l.ObtainAll(ctx, []string{"e", "a", "c", "b", "d"}, time.Minute, 0)
		if !errors.Is(err, reqlock.ErrHeld) || errors.Is(err, reqlock.ErrWaitEnded) {
			t.Fatalf("err = %v, want ErrHeld alone", err)
		}
		if n := e.left(t); n != 1 {
			t.Fatalf("store holds %d keys, want only the holder's", n)
		}
		e.expectFree(t, "a", "b", "d", "e")
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		// And the Locker itself can take them all now: nothing of its
		// failed attempt is left in its own state either.
		lock, err := l.ObtainAll(ctx, []string{"a", "b", "c", "d", "e"}, time.Minute, 0)
		if err != nil {
			t.Fatalf("after the holder let go: %v", err)
		}
		if err := lock.Release(ctx); err != nil {
			t.Fatal(err)
		}
		e.expectNoKeysLeft(t)
	})
}

func TestObtainAllWakesOnReleaseOfBlockingKey(t *testing.T) {
	forEachEnv(t, []string{pathFast, pathFallbackNotify}, func(t *testing.T, e *storeEnv) {
		ctx := context.Background()
		holder, err := e.other(t).Obtain(ctx, "b", time.Hour, 0)
		if err != nil {
			t.Fatal(err)
		}
		// A minute's backoff and an hour's TTL: only the release signal can
		// wake the waiter in time.
		l := e.locker(t, reqlock.WithBackoff(reqlock.Backoff{Initial: time.Minute, Max: time.Minute}))
		type result struct {
			lock *reqlock.Lock
			err  error
		}
		got := make(chan result, 1)
		go func() {
			lock, err := l.ObtainAll(ctx, []string{"c", "b", "a"}, time.Minute, time.Hour)
			got <- result{lock, err}
		}()
		e.spy.awaitHeld(t, 2) // found b held, subscribed, found it held again: now sleeps
		e.subscribed(t, holder.StoreKey())
		start := time.Now()
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r := within(t, got, 10*time.Second, "the waiter (1 minute backoff) did not wake on the release")
		if r.err != nil {
			t.Fatal(r.err)
		}
		t.Logf("woke %v after the release", time.Since(start))
		if f, _ := r.lock.FenceOf("b"); f <= holder.Fence() {
			t.Fatalf("fence of b %d after the holder's %d", f, holder.Fence())
		}
		e.expectHeld(t, "a", "b", "c")
		if err := r.lock.Release(ctx); err != nil {
			t.Fatal(err)
		}
		e.expectNoKeysLeft(t)
	})
}

// awaitSubscribed waits until the Locker under test subscribes to releases
// of storeKey, and the subscription has reached the store.
func (e *storeEnv) awaitSubscribed(t *testing.T, storeKey string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case k := <-e.spy.subscribed:
			if k != storeKey {
				continue
			}
			e.subscribed(t, storeKey)
			return
		case <-deadline:
			t.Fatalf("no subscription to releases of %s within 10s", storeKey)
		}
	}
}

// within waits for ch to deliver, and fails the test, saying what did not
// happen, unless it does within d.
func within[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s within %v", what, d)
		panic("unreachable")
	}
}

// obtainAllAndRelease runs ObtainAll of keys on l, waiting up to an hour,
// in a goroutine of its own, releases the lock it gets, and delivers the
// error of either.
func obtainAllAndRelease(l *reqlock.Locker, keys ...string) <-chan error {
	got := make(chan error, 1)
	go func() {
		lock, err := l.ObtainAll(context.Background(), keys, time.Minute, time.Hour)
		if err == nil {
			err = lock.Release(context.Background())
		}
		got <- err
	}()
	return got
}

func TestObtainAllWakesWhenTheBlockingKeyChanges(t *testing.T) {
	forEachEnv(t, []string{pathFast, pathFallbackNotify}, func(t *testing.T, e *storeEnv) {
		ctx := context.Background()
		other := e.other(t)
		holderA, err := other.Obtain(ctx, "a", time.Hour, 0)
		if err != nil {
			t.Fatal(err)
		}
		holderB, err := other.Obtain(ctx, "b", time.Hour, 0)
		if err != nil {
			t.Fatal(err)
		}
		l := e.locker(t, reqlock.WithBackoff(reqlock.Backoff{Initial: time.Minute, Max: time.Minute}))
		got := obtainAllAndRelease(l, "a", "b")
		// a blocks it first; once a is released, b does.
		e.awaitSubscribed(t, holderA.StoreKey())
		if err := holderA.Release(ctx); err != nil {
			t.Fatal(err)
		}
		e.awaitSubscribed(t, holderB.StoreKey())
		if err := holderB.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := within(t, got, 10*time.Second, "the waiter (1 minute backoff) did not wake on the release of the key that blocked it"); err != nil {
			t.Fatal(err)
		}
		if n := e.spy.subs.Load(); n != 0 {
			t.Fatalf("%d release subscriptions left", n)
		}
		e.expectNoKeysLeft(t)
	})
}

func TestObtainAllWaitsByPollingWithoutSignals(t *testing.T) {
	forEachEnv(t, []string{pathFallback}, func(t *testing.T, e *storeEnv) {
		ctx := context.Background()
		holder, err := e.other(t).Obtain(ctx, "b", time.Hour, 0)
		if err != nil {
			t.Fatal(err)
		}
		l := e.locker(t, reqlock.WithBackoff(reqlock.Backoff{Initial: time.Millisecond, Max: 10 * time.Millisecond}))
		got := obtainAllAndRelease(l, "a", "b")
		e.spy.awaitHeld(t, 2)
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := within(t, got, 10*time.Second, "the polling waiter did not obtain the keys after the release"); err != nil {
			t.Fatal(err)
		}
		e.expectNoKeysLeft(t)
	})
}

func TestObtainAllCancelStopsWaitAtOnce(t *testing.T) {
	forEachEnv(t, append(allPaths, pathFallbackNotify), func(t *testing.T, e *storeEnv) {
		ctx := context.Background()
		holder, err := e.other(t).Obtain(ctx, "b", time.Hour, 0)
		if err != nil {
			t.Fatal(err)
		}
		// Start the store's notification machinery, which outlives any wait,
		// before counting goroutines.
		if n, ok := e.real.(reqlock.ReleaseNotifier); ok {
			_, stop := n.NotifyRelease(e.prefix + "warm-up")
			stop()
		}
		baseline := runtime.NumGoroutine()
		l := e.locker(t, reqlock.WithBackoff(reqlock.Backoff{Initial: time.Minute, Max: time.Minute}))
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		errc := make(chan error, 1)
		go func() {
			_, err := l.ObtainAll(wctx, []string{"a", "b", "c"}, time.Minute, time.Hour)
			errc <- err
		}()
		e.awaitSleeping(t)
		cancel()
		err = within(t, errc, 5*time.Second, "the waiter (1 minute backoff) did not stop on the cancel")
		// ErrHeld may be missing: a cancel that lands while an attempt is in
		// flight ends the wait before that attempt's answer is known.
		if !errors.Is(err, reqlock.ErrWaitEnded) || !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want ErrWaitEnded joined with Canceled", err)
		}
		goroutinesBackTo(t, baseline)
		if n := e.spy.subs.Load(); n != 0 {
			t.Fatalf("%d release subscriptions left", n)
		}
		e.expectFree(t, "a", "c")
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		e.expectNoKeysLeft(t)
	})
}

func TestObtainAllStoreFailureLeavesNothing(t *testing.T) {
	forEachEnv(t, allPaths, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		// The store acts on b (and, key by key, has taken a), then the
		// reply is lost: the error is the store's, and nothing is left.
		e.spy.failAfter = ":b"
		for _, wait := range []time.Duration{0, time.Second} {
			_, err := l.ObtainAll(context.Background(), []string{"c", "b", "a"}, time.Hour, wait)
			if !errors.Is(err, reqlock.ErrStore) || !errors.Is(err, errLostReply) {
				t.Fatalf("wait %v: err = %v, want ErrStore wrapping the store's error", wait, err)
			}
			e.expectNoKeysLeft(t)
		}
	})
}

func TestObtainAllWaitEnds(t *testing.T) {
	forEachEnv(t, allPaths, func(t *testing.T, e *storeEnv) {
		ctx := context.Background()
		holder, err := e.other(t).Obtain(ctx, "b", time.Hour, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Release(ctx)
		l := e.locker(t)
		start := time.Now()
		_, err = l.ObtainAll(ctx, []string{"a", "b"}, time.Minute, 50*time.Millisecond)
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
		waitUntil(t, func() bool { return e.free(t, "a") })
	})
}

func TestObtainAllInvalidArguments(t *testing.T) {
	forEachEnv(t, allPaths, func(t *testing.T, e *storeEnv) {
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
		if n := e.left(t); n != 0 {
			t.Fatalf("invalid calls left %d keys", n)
		}
	})
}

func TestObtainAllRefreshRenewsEveryKey(t *testing.T) {
	forEachEnv(t, allPaths, func(t *testing.T, e *storeEnv) {
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
		if lock.TTL() != 50*time.Millisecond || lock.Validity() > 50*time.Millisecond {
			t.Fatalf("after refresh: TTL %v, validity %v", lock.TTL(), lock.Validity())
		}
		if e.path == pathFast && e.spy.refreshAlls.Load() != 1 {
			t.Fatalf("%d RefreshAll calls, want 1", e.spy.refreshAlls.Load())
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
		if lock.TTL() != time.Hour || lock.Validity() < 50*time.Minute {
			t.Fatalf("after a refresh to an hour: TTL %v, validity %v", lock.TTL(), lock.Validity())
		}
		if e.client != nil {
			for _, k := range keys {
				if ttl := e.client.PTTL(ctx, e.prefix+k).Val(); ttl < 50*time.Minute {
					t.Fatalf("PTTL %q = %v after a refresh to an hour", k, ttl)
				}
			}
		}
		if err := lock.Release(ctx); err != nil {
			t.Fatal(err)
		}
		e.expectNoKeysLeft(t)
	})
}

func TestObtainAllKeepAliveRenewsEveryKey(t *testing.T) {
	forEachEnv(t, allPaths, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		ctx := context.Background()
		keys := []string{"a", "b", "c"}
		lock, err := l.ObtainAll(ctx, keys, wdTTL, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lock.Release(context.Background()) })
		kctx := lock.KeepAlive(ctx)
		end := time.Now().Add(4 * wdTTL)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for time.Now().Before(end) {
			<-tick.C
			if err := kctx.Err(); err != nil {
				t.Fatalf("keep-alive context ended: %v", context.Cause(kctx))
			}
			e.expectHeld(t, keys...)
		}
		if e.path == pathFast && e.spy.refreshAlls.Load() < 4 {
			t.Fatalf("%d RefreshAll calls in 4×TTL, want about 12", e.spy.refreshAlls.Load())
		}
		if err := lock.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if cause := context.Cause(kctx); !errors.Is(cause, reqlock.ErrNotHeld) || errors.Is(cause, reqlock.ErrLockLost) {
			t.Fatalf("cause after release = %v, want ErrNotHeld without ErrLockLost", cause)
		}
		e.expectNoKeysLeft(t)
	})
}

func TestObtainAllKeepAliveLostWhenOneKeyDeleted(t *testing.T) {
	forEachEnv(t, allPaths, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		ctx := context.Background()
		lock, err := l.ObtainAll(ctx, []string{"a", "b", "c"}, wdTTL, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lock.Release(context.Background()) })
		kctx := lock.KeepAlive(ctx)
		e.remove(t, e.prefix+"b", lock.Token())
		waitDone(t, kctx, 5*time.Second)
		expectLost(t, kctx, reqlock.ErrNotHeld)
		eventually(t, "watchdog exited", func() bool { return watchdogs() == 0 })
		if lost := lock.Lost(); !errors.Is(lost, reqlock.ErrLockLost) {
			t.Fatalf("Lost() = %v, want ErrLockLost", lost)
		}
		if err := lock.Release(ctx); !errors.Is(err, reqlock.ErrNotHeld) {
			t.Fatalf("release of a lost lock: %v, want ErrNotHeld", err)
		}
		// The keys still held were released with it.
		e.expectNoKeysLeft(t)
	})
}

func TestObtainAllFencesIncreasePerKey(t *testing.T) {
	forEachEnv(t, allPaths, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		other := e.other(t)
		ctx := context.Background()
		// Single-key grants, a different number per key, so that stores
		// that count fences per key are at a different fence on each.
		last := map[string]int64{}
		grant := func(key string) int64 {
			t.Helper()
			lock, err := other.Obtain(ctx, key, time.Minute, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := lock.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if lock.Fence() <= last[key] {
				t.Fatalf("single-key fence of %q: %d after %d", key, lock.Fence(), last[key])
			}
			last[key] = lock.Fence()
			return lock.Fence()
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
			if err := lock.Release(ctx); err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				grant(k)
			}
		}
		e.expectNoKeysLeft(t)
	})
}

// TestObtainAllConcurrentCarts has 50 requests lock overlapping carts of 3 to
// 6 keys out of 10 and update a counter per key without atomicity: every
// request must finish, every count must be exact, and no two holders of a key
// may ever overlap.
func TestObtainAllConcurrentCarts(t *testing.T) {
	for _, path := range []string{pathFast, pathFallbackNotify} {
		t.Run("redis/"+path, func(t *testing.T) {
			e := redisEnv(t, path)
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
		})
	}
}
