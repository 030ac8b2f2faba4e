package reqlock_test

// The stores the Locker's tests run on: memstore and a real Redis (through
// internal/testredis), reached through a spy that counts the Locker's calls
// and can inject a lost reply, and the probes that look at a key behind the
// Locker's back, as another process would. Also the waiting helpers every
// test file uses.

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
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

// spyStore wraps a real store: it counts the calls the Locker makes,
// records the fences the store issued, tells when an attempt found a key
// held, and can make an acquire lose its reply. It exposes stores.Store
// alone: signalling adds the real store's release signals.
type spyStore struct {
	stores.Store
	held       chan struct{} // an attempt found a key held; a send never blocks the store
	subscribed chan string   // a release subscription began, by store key; likewise

	acquires, grants, releases, keepReleases, refreshes atomic.Int32
	subs                                                atomic.Int32 // release subscriptions not stopped

	// failAfter, when set (before the Locker uses the store), makes an
	// acquire of keys of which one ends in it run, then fail as a lost
	// reply would.
	failAfter string

	mu     sync.Mutex
	issued map[string]int64 // fence the store issued, by store key and token
}

var errLostReply = errors.New("injected: reply lost after the store acted")

func newSpyStore(real stores.Store) *spyStore {
	return &spyStore{Store: real, held: make(chan struct{}, 1<<12), subscribed: make(chan string, 1<<12)}
}

func (s *spyStore) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	s.acquires.Add(1)
	g, err := s.Store.Acquire(ctx, keys, token, ttl)
	if s.failAfter != "" && slices.ContainsFunc(keys, func(k string) bool { return strings.HasSuffix(k, s.failAfter) }) {
		return stores.Grant{}, errLostReply
	}
	switch {
	case err == nil && g.OK:
		s.grants.Add(1)
		s.mu.Lock()
		if s.issued == nil {
			s.issued = map[string]int64{}
		}
		for i, k := range keys {
			if i < len(g.Fences) {
				s.issued[k+"\x00"+token] = g.Fences[i]
			}
		}
		s.mu.Unlock()
	case err == nil:
		select {
		case s.held <- struct{}{}:
		default:
		}
	}
	return g, err
}

func (s *spyStore) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	s.releases.Add(1)
	if keep > 0 {
		s.keepReleases.Add(1)
	}
	return s.Store.Release(ctx, keys, token, keep)
}

func (s *spyStore) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	s.refreshes.Add(1)
	return s.Store.Refresh(ctx, keys, token, ttl)
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

// signalling is a spyStore with the real store's release signals, and it
// counts the subscriptions.
type signalling struct{ *spyStore }

func (s signalling) NotifyRelease(key, token string) (<-chan struct{}, func()) {
	ch, stop := s.Store.(stores.Notifier).NotifyRelease(key, token)
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

// storeEnv is one real store, with the spy the Locker under test reaches
// it through and backdoors that act on a key behind the lock's back, as
// another process (or an operator) would.
type storeEnv struct {
	real   stores.Store // as another process sees it
	spy    *spyStore
	prefix string
	client *redis.Client // nil on memstore

	// remove deletes storeKey, which holds token.
	remove func(t *testing.T, storeKey, token string)
	// overwrite makes storeKey, which holds token, hold another token.
	overwrite func(t *testing.T, storeKey, token string)
	// left counts the lock keys under prefix that the store still holds.
	left func(t *testing.T) int
	// subscribedInStore waits until a release subscription on storeKey has
	// reached the store, so that a release from now on is signalled.
	subscribedInStore func(t *testing.T, storeKey string)
}

// forEachEnv runs f on memstore and on a real Redis.
func forEachEnv(t *testing.T, f func(t *testing.T, e *storeEnv)) {
	t.Run("memstore", func(t *testing.T) { f(t, memEnv()) })
	t.Run("redis", func(t *testing.T) { f(t, redisEnv(t)) })
}

// memEnv returns a storeEnv on a new memstore, with the default prefix.
func memEnv() *storeEnv {
	mem := memstore.New()
	release := func(t *testing.T, key, token string) {
		if err := mem.Release(context.Background(), []string{key}, token, 0); err != nil {
			t.Fatalf("deleting %q: %v", key, err)
		}
	}
	return &storeEnv{
		real: mem, spy: newSpyStore(mem), prefix: "reqlock:",
		remove: release,
		overwrite: func(t *testing.T, key, token string) {
			release(t, key, token)
			if g, err := mem.Acquire(context.Background(), []string{key}, "someone-else", time.Minute); err != nil || !g.OK {
				t.Fatalf("taking %q over: %+v %v", key, g, err)
			}
		},
		left:              func(*testing.T) int { return mem.Len() },
		subscribedInStore: func(*testing.T, string) {}, // memstore subscribes at once
	}
}

// redisEnv returns a storeEnv on the test Redis, with a prefix of its own.
func redisEnv(t *testing.T) *storeEnv {
	t.Helper()
	client := testredis.Client(t)
	store, err := redisstore.New(client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	e := &storeEnv{real: store, spy: newSpyStore(store), prefix: testredis.Prefix(t), client: client}
	e.remove = func(t *testing.T, key, _ string) {
		if n, err := client.Del(context.Background(), key).Result(); err != nil || n != 1 {
			t.Fatalf("DEL %q: %d %v", key, n, err)
		}
	}
	e.overwrite = func(t *testing.T, key, _ string) {
		if err := client.Set(context.Background(), key, "someone-else", time.Minute).Err(); err != nil {
			t.Fatalf("SET %q: %v", key, err)
		}
	}
	e.left = func(t *testing.T) int { return len(redisKeys(t, client, e.prefix)) }
	e.subscribedInStore = func(t *testing.T, key string) {
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

// redisKeys SCANs the lock keys under prefix (fence and fair-queue keys
// start with '{' and are not among them).
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

// quiet is a logger for tests where lost locks are expected.
var quiet = reqlock.WithLogger(slog.New(slog.DiscardHandler))

// locker returns a Locker over the spy, with the store's release signals.
func (e *storeEnv) locker(t *testing.T, opts ...reqlock.Option) *reqlock.Locker {
	t.Helper()
	return e.lockerOn(t, signalling{e.spy}, opts...)
}

// pollingLocker returns a Locker over the spy without release signals: the
// store cannot notify, and waiters poll.
func (e *storeEnv) pollingLocker(t *testing.T, opts ...reqlock.Option) *reqlock.Locker {
	t.Helper()
	return e.lockerOn(t, e.spy, opts...)
}

func (e *storeEnv) lockerOn(t *testing.T, store stores.Store, opts ...reqlock.Option) *reqlock.Locker {
	t.Helper()
	l, err := reqlock.New(store, append([]reqlock.Option{reqlock.WithKeyPrefix(e.prefix), quiet}, opts...)...)
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

// expectNoKeysLeft polls until the store holds no lock key of the test.
func (e *storeEnv) expectNoKeysLeft(t *testing.T) {
	t.Helper()
	eventually(t, "no lock key left in the store", func() bool { return e.left(t) == 0 })
}

// awaitSleeping waits until a waiter of the Locker under test sleeps in its
// backoff: after its first attempt found a key held or, with release
// signals, after it subscribed and tried once more.
func (e *storeEnv) awaitSleeping(t *testing.T, signals bool) {
	t.Helper()
	if signals {
		e.spy.awaitHeld(t, 2)
		return
	}
	e.spy.awaitHeld(t, 1)
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
			e.subscribedInStore(t, storeKey)
			return
		case <-deadline:
			t.Fatalf("no subscription to releases of %s within 10s", storeKey)
		}
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

// validity is how long lock is surely held from now.
func validity(lock *reqlock.Lock) time.Duration { return time.Until(lock.ValidUntil()) }

// eventually polls cond until it holds, and fails the test, saying what
// did not happen, after 5s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s\n%s", what, stacks())
		}
		<-tick.C
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

// waitDone waits up to limit for ctx to end and returns how long it took.
func waitDone(t *testing.T, ctx context.Context, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-ctx.Done():
		return time.Since(start)
	case <-time.After(limit):
		t.Fatalf("context not done within %v", limit)
		return 0
	}
}

// stacks returns the stacks of all goroutines.
func stacks() string {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

// watchdogs counts the running watchdog goroutines.
func watchdogs() int { return strings.Count(stacks(), "reqlock.(*watchdog).run(") }

// goroutinesBackTo polls until the goroutine count is at most n.
func goroutinesBackTo(t *testing.T, n int) {
	t.Helper()
	eventually(t, "goroutine count back to baseline", func() bool { return runtime.NumGoroutine() <= n })
}

// syncBuffer is a bytes.Buffer safe for concurrent use: a logger's output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
