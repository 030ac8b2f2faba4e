package reqlock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
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

// faultStore wraps a real store to inject faults.
type faultStore struct {
	stores.Store
	acquireErr   error // every Acquire fails with it, without reaching the store
	loseReply    bool  // Acquire grants, then answers ctx's error once ctx ends
	lateReply    bool  // Acquire grants, then answers the grant once ctx has ended
	blockRelease bool  // Release waits for its context to end
	acquires     atomic.Int32
}

func (s *faultStore) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	s.acquires.Add(1)
	if s.acquireErr != nil {
		return stores.Grant{}, s.acquireErr
	}
	g, err := s.Store.Acquire(ctx, keys, token, ttl)
	switch {
	case s.loseReply:
		<-ctx.Done()
		return stores.Grant{}, ctx.Err()
	case s.lateReply:
		<-ctx.Done()
	}
	return g, err
}

func (s *faultStore) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	if s.blockRelease {
		<-ctx.Done()
		return ctx.Err()
	}
	return s.Store.Release(ctx, keys, token, keep)
}

// NotifyRelease forwards to the wrapped store, so wrapping keeps wake-ups.
func (s *faultStore) NotifyRelease(key, token string) (<-chan struct{}, func()) {
	if n, ok := s.Store.(stores.Notifier); ok {
		return n.NotifyRelease(key, token)
	}
	return nil, func() {}
}

// deafStore is a spyStore that claims release signals but loses every one:
// its channels never fire.
type deafStore struct{ *spyStore }

func (s deafStore) NotifyRelease(key, _ string) (<-chan struct{}, func()) {
	select {
	case s.subscribed <- key:
	default:
	}
	return make(chan struct{}), func() {}
}

// keySets are the lock shapes the acquire loop's tests run on: one key
// (through the local queue) and several (straight to the store). "b" is
// the key another process holds.
var keySets = [][]string{{"b"}, {"c", "b", "a"}}

// obtainAllAsync runs ObtainAll of keys on l in a goroutine of its own, and
// delivers the lock or the error.
func obtainAllAsync(ctx context.Context, l *reqlock.Locker, keys []string, ttl, wait time.Duration) <-chan obtained {
	got := make(chan obtained, 1)
	go func() {
		lock, err := l.ObtainAll(ctx, keys, ttl, wait)
		got <- obtained{lock, err, time.Now()}
	}()
	return got
}

type obtained struct {
	lock *reqlock.Lock
	err  error
	at   time.Time
}

// TestWaiterWakesOnReleaseOfBlockingKey: two Lockers on one store are two
// processes: the waiter contends with the store, sleeps a minute's backoff
// with the holder's hour of TTL ahead, and only the release signal can wake
// it in time.
func TestWaiterWakesOnReleaseOfBlockingKey(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		for _, keys := range keySets {
			ctx := context.Background()
			holder, err := e.other(t).Obtain(ctx, "b", time.Hour, 0)
			if err != nil {
				t.Fatal(err)
			}
			e.spy = newSpyStore(e.real)
			l := e.locker(t, reqlock.WithBackoff(time.Minute, time.Minute))
			got := obtainAllAsync(ctx, l, keys, time.Minute, time.Hour)
			e.awaitSleeping(t, true) // found b held, subscribed, found it held again: now sleeps
			e.subscribedInStore(t, e.prefix+"b")
			start := time.Now()
			mustRelease(t, holder)
			r := within(t, got, 10*time.Second, fmt.Sprintf("%q: the waiter (1 minute backoff) did not wake on the release", keys))
			if r.err != nil {
				t.Fatal(r.err)
			}
			t.Logf("%q: woke %v after the release", keys, time.Since(start))
			if f, _ := r.lock.FenceOf("b"); f <= holder.Fence() {
				t.Fatalf("fence of b %d after the holder's %d", f, holder.Fence())
			}
			e.expectHeld(t, keys...)
			mustRelease(t, r.lock)
			if n := e.spy.subs.Load(); n != 0 {
				t.Fatalf("%d release subscriptions left", n)
			}
			e.expectNoKeysLeft(t)
		}
	})
}

func TestWaiterWakesWhenTheBlockingKeyChanges(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
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
		l := e.locker(t, reqlock.WithBackoff(time.Minute, time.Minute))
		got := obtainAllAsync(ctx, l, []string{"a", "b"}, time.Minute, time.Hour)
		// a blocks it first; once a is released, b does.
		e.awaitSubscribed(t, e.prefix+"a")
		mustRelease(t, holderA)
		e.awaitSubscribed(t, e.prefix+"b")
		mustRelease(t, holderB)
		r := within(t, got, 10*time.Second, "the waiter (1 minute backoff) did not wake on the release of the key that blocked it")
		if r.err != nil {
			t.Fatal(r.err)
		}
		mustRelease(t, r.lock)
		if n := e.spy.subs.Load(); n != 0 {
			t.Fatalf("%d release subscriptions left", n)
		}
		e.expectNoKeysLeft(t)
	})
}

// TestWaiterPollsWithoutReleaseSignals: a waiter whose store cannot notify,
// or whose signals are lost, still obtains the keys by polling.
func TestWaiterPollsWithoutReleaseSignals(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		for _, deaf := range []bool{false, true} {
			for _, keys := range keySets {
				ctx := context.Background()
				holder, err := e.other(t).Obtain(ctx, "b", time.Hour, 0)
				if err != nil {
					t.Fatal(err)
				}
				e.spy = newSpyStore(e.real)
				backoff := reqlock.WithBackoff(10*time.Millisecond, 50*time.Millisecond)
				l := e.pollingLocker(t, backoff)
				if deaf {
					l = e.lockerOn(t, deafStore{e.spy}, backoff)
				}
				got := obtainAllAsync(ctx, l, keys, time.Minute, 10*time.Second)
				// The waiter waits for a signal that never comes.
				e.awaitSleeping(t, deaf)
				mustRelease(t, holder)
				r := within(t, got, 10*time.Second, fmt.Sprintf("deaf %v, %q: the polling waiter did not obtain the keys after the release", deaf, keys))
				if r.err != nil {
					t.Fatalf("deaf %v, %q: %v", deaf, keys, r.err)
				}
				if f, _ := r.lock.FenceOf("b"); f <= holder.Fence() {
					t.Fatalf("fence of b %d after the holder's %d", f, holder.Fence())
				}
				mustRelease(t, r.lock)
				e.expectNoKeysLeft(t)
			}
		}
	})
}

// TestSleepCappedByHolderTTL: a backoff of a whole minute would make the
// waiter miss the lock; the holder's remaining TTL, returned by each failed
// attempt, caps the sleep, down to its last millisecond. The holder never
// releases, and an expiry is not signalled (memstore signals it only when
// an operation frees it). Several rounds, so that an attempt lands in the
// holder's last millisecond now and then.
func TestSleepCappedByHolderTTL(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		ctx := context.Background()
		l := e.locker(t, reqlock.WithBackoff(time.Minute, time.Minute))
		for round := range 8 {
			for _, keys := range keySets {
				leaked, err := e.other(t).Obtain(ctx, "b", time.Duration(20+round)*time.Millisecond, 0)
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				lock, err := l.ObtainAll(ctx, keys, time.Second, 5*time.Second)
				if err != nil {
					t.Fatalf("%q: %v after %v: the waiter slept its minute's backoff past the holder's TTL", keys, err, time.Since(start))
				}
				if f, _ := lock.FenceOf("b"); f <= leaked.Fence() {
					t.Fatalf("fence of b %d after the leaked lock's %d", f, leaked.Fence())
				}
				mustRelease(t, lock)
			}
		}
		e.expectNoKeysLeft(t)
	})
}

// TestCancelStopsWaitAtOnce: another process holds a key, so the waiter
// contends with the store and sleeps in its backoff (a minute); a cancel must
// end that sleep, and leave no goroutine, subscription or key behind. (A
// waiter in the local queue: TestCancelledWaiterLeavesQueue.)
func TestCancelStopsWaitAtOnce(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		ctx := context.Background()
		// Start the store's notification machinery, which outlives any wait,
		// before counting goroutines.
		if n, ok := e.real.(stores.Notifier); ok {
			_, stop := n.NotifyRelease(e.prefix+"warm-up", "")
			stop()
		}
		for _, signals := range []bool{true, false} {
			for _, keys := range keySets {
				holder, err := e.other(t).Obtain(ctx, "b", time.Hour, 0)
				if err != nil {
					t.Fatal(err)
				}
				e.spy = newSpyStore(e.real)
				baseline := runtime.NumGoroutine()
				l := e.pollingLocker(t, reqlock.WithBackoff(time.Minute, time.Minute))
				if signals {
					l = e.locker(t, reqlock.WithBackoff(time.Minute, time.Minute))
				}
				wctx, cancel := context.WithCancel(ctx)
				got := obtainAllAsync(wctx, l, keys, time.Minute, time.Hour)
				e.awaitSleeping(t, signals)
				cancel()
				r := within(t, got, 5*time.Second, "the waiter (1 minute backoff) did not stop on the cancel")
				// ErrHeld may be missing: a cancel that lands while an attempt is in
				// flight ends the wait before that attempt's answer is known.
				if !errors.Is(r.err, reqlock.ErrWaitEnded) || !errors.Is(r.err, context.Canceled) {
					t.Fatalf("signals %v, %q: err = %v, want ErrWaitEnded joined with Canceled", signals, keys, r.err)
				}
				goroutinesBackTo(t, baseline)
				if n := e.spy.subs.Load(); n != 0 {
					t.Fatalf("%d release subscriptions left", n)
				}
				if n := reqlock.LocalQueues(l); n != 0 {
					t.Fatalf("%d local queues left", n)
				}
				e.expectFree(t, "a", "c")
				mustRelease(t, holder)
				e.expectNoKeysLeft(t)
			}
		}
	})
}

func TestStoreFailureIsNotRetried(t *testing.T) {
	cause := errors.New("connection refused")
	for _, keys := range keySets {
		fs := &faultStore{Store: memstore.New(), acquireErr: cause}
		l := reqlock.MustNew(fs)
		_, err := l.ObtainAll(context.Background(), keys, time.Second, time.Second)
		if !errors.Is(err, reqlock.ErrStore) || !errors.Is(err, cause) {
			t.Fatalf("%q: err = %v, want ErrStore wrapping the cause", keys, err)
		}
		if n := fs.acquires.Load(); n != 1 {
			t.Fatalf("%q: %d attempts, want 1", keys, n)
		}
		if n := reqlock.LocalQueues(l); n != 0 {
			t.Fatalf("%q: %d local queues left", keys, n)
		}
	}
}

// TestGrantWithFailedReplyIsReleased: a read timeout after the store ran the
// acquire: the outcome is unknown, so the grant must not be left for its TTL
// (an hour), on a try-once route too; the error is the store's.
func TestGrantWithFailedReplyIsReleased(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		e.spy.failAfter = "b"
		for _, keys := range keySets {
			for _, wait := range []time.Duration{0, time.Second} {
				_, err := l.ObtainAll(context.Background(), keys, time.Hour, wait)
				if !errors.Is(err, reqlock.ErrStore) || !errors.Is(err, errLostReply) {
					t.Fatalf("%q, wait %v: err = %v, want ErrStore wrapping the store's error", keys, wait, err)
				}
				e.expectNoKeysLeft(t)
			}
		}
	})
}

// TestAbandonedGrantIsReleased: the store granted the keys but the wait
// ended before its answer came, or before the Locker could use it: the
// grant is released in the background, bounded by the release timeout, and
// the error says the store did not answer in time (no ErrHeld).
func TestAbandonedGrantIsReleased(t *testing.T) {
	for _, lose := range []bool{true, false} {
		for _, keys := range keySets {
			mem := memstore.New()
			l := reqlock.MustNew(&faultStore{Store: mem, loseReply: lose, lateReply: !lose})
			ctx := context.Background()
			_, err := l.ObtainAll(ctx, keys, time.Hour, 30*time.Millisecond)
			if !errors.Is(err, reqlock.ErrWaitEnded) || errors.Is(err, reqlock.ErrHeld) {
				t.Fatalf("lost reply %v, %q: err = %v, want ErrWaitEnded without ErrHeld", lose, keys, err)
			}
			if o := reqlock.OutcomeOf(ctx, err); o != reqlock.OutcomeStoreError {
				t.Fatalf("lost reply %v, %q: outcome %q, want store_error", lose, keys, o)
			}
			eventually(t, "the abandoned grant released", func() bool { return mem.Len() == 0 })
		}
	}
}

// refusingStore refuses every multi-key acquire before acting, as
// redisstore does for Redis Cluster keys in different slots.
type refusingStore struct {
	stores.Store
	acquires atomic.Int32
}

var errSlots = errors.New("keys in different slots")

func (s *refusingStore) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	s.acquires.Add(1)
	if len(keys) > 1 {
		return stores.Grant{}, fmt.Errorf("%w: %w", reqlock.ErrInvalid, errSlots)
	}
	return s.Store.Acquire(ctx, keys, token, ttl)
}

// TestStoreRefusalIsNotAStoreFailure: a refusal of the keys (a
// configuration mistake) comes back as ErrInvalid, never ErrStore, so a
// fail-open route cannot run unlocked on it; no retry helps, so none is made.
func TestStoreRefusalIsNotAStoreFailure(t *testing.T) {
	store := &refusingStore{Store: memstore.New()}
	locker := reqlock.MustNew(store)
	ctx := context.Background()
	_, err := locker.ObtainAll(ctx, []string{"a", "b"}, time.Second, time.Second)
	if !errors.Is(err, reqlock.ErrInvalid) || !errors.Is(err, errSlots) || errors.Is(err, reqlock.ErrStore) {
		t.Fatalf("err = %v, want ErrInvalid wrapping the refusal, not ErrStore", err)
	}
	if o := reqlock.OutcomeOf(ctx, err); o != reqlock.OutcomeInvalid {
		t.Fatalf("outcome %q, want invalid", o)
	}
	if n := store.acquires.Load(); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}
}

// proxiedRedisStore returns a Store on the test Redis behind a fault proxy,
// with go-redis's default retries unless configure changes the client's
// options, its scripts loaded and its connection open, so that the next
// reply through the proxy is a script's.
func proxiedRedisStore(t *testing.T, configure ...func(*redis.Options)) (*redisstore.Store, *testredis.Proxy) {
	t.Helper()
	proxy := testredis.NewProxy(t)
	opts := &redis.Options{Addr: proxy.Addr(), ContextTimeoutEnabled: true}
	for _, c := range configure {
		c(opts)
	}
	client := redis.NewClient(opts)
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

// proxiedModes are the acquire paths of TestRetriedAcquireAfterLostReply and
// TestCancelStopsStalledStoreCallAtOnce: one key plain and fair, and
// several keys (which share a hash tag, as Redis Cluster needs).
var proxiedModes = []string{"plain", "fair", "multi"}

func proxiedLocker(t *testing.T, store *redisstore.Store, mode string) (*reqlock.Locker, func(ctx context.Context, wait time.Duration) (*reqlock.Lock, error)) {
	t.Helper()
	opts := []reqlock.Option{reqlock.WithKeyPrefix(testredis.Prefix(t))}
	if mode == "fair" {
		opts = append(opts, reqlock.WithFairness(2*time.Second))
	}
	l := reqlock.MustNew(store, opts...)
	keys := []string{"{k}:a", "{k}:b"}
	return l, func(ctx context.Context, wait time.Duration) (*reqlock.Lock, error) {
		if mode == "multi" {
			return l.ObtainAll(ctx, keys, time.Minute, wait)
		}
		return l.Obtain(ctx, keys[0], time.Minute, wait)
	}
}

// go-redis retries a command whose reply was lost (MaxRetries, default 3).
// The retried acquire finds the key holding the caller's own token: it is
// the caller's grant, not a holder to wait for. Nothing is left behind.
func TestRetriedAcquireAfterLostReplyIsGranted(t *testing.T) {
	for _, mode := range proxiedModes {
		t.Run(mode, func(t *testing.T) {
			store, proxy := proxiedRedisStore(t)
			_, obtain := proxiedLocker(t, store, mode)
			ctx := context.Background()
			proxy.DropNextReply()
			lock, err := obtain(ctx, 0)
			if err != nil {
				t.Fatalf("acquire whose first reply was lost: %v, want the lock (the retry is the caller's own grant)", err)
			}
			if err := lock.Release(ctx); err != nil {
				t.Fatalf("release: %v", err)
			}
			again, err := obtain(ctx, 0)
			if err != nil {
				t.Fatalf("the key was left behind: %v", err)
			}
			mustRelease(t, again)
		})
	}
}

// go-redis bounds a call by its context's deadline, not by its
// cancellation: a waiter whose client leaves while Redis is frozen must
// still stop at once, and the call it left in flight is cleaned up once it
// returns, owner-checked, so nothing stays locked.
func TestCancelStopsStalledStoreCallAtOnce(t *testing.T) {
	for _, mode := range proxiedModes {
		t.Run(mode, func(t *testing.T) {
			store, proxy := proxiedRedisStore(t)
			_, obtain := proxiedLocker(t, store, mode)
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
			eventually(t, "the key free again", func() bool {
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

// A Redis that cannot be reached fails the request at once (ErrStore,
// wrapping stores.ErrUnreachable) and logs no failed release of an
// abandoned grant: a call that never reached Redis granted nothing.
func TestUnreachableStoreLeavesNoAbandonedGrant(t *testing.T) {
	store, err := redisstore.New(testredis.DownClient(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
	l := reqlock.MustNew(store, reqlock.WithLogger(logger), reqlock.WithReleaseTimeout(200*time.Millisecond))
	_, err = l.Obtain(context.Background(), "k", time.Second, time.Second)
	if !errors.Is(err, reqlock.ErrStore) || !errors.Is(err, stores.ErrUnreachable) {
		t.Fatalf("Obtain on a Redis that refuses connections: %v, want ErrStore wrapping stores.ErrUnreachable", err)
	}
	// Anything the Locker would log of a background release would come
	// within its release timeout.
	time.Sleep(400 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(logs.String(), "abandoned") {
		t.Fatalf("a grant that cannot have existed was released and its failure logged: %s", logs.String())
	}
}

// A store whose connections hang (a host that drops packets) outlasts a
// short wait: the acquire is left in flight, and the store, which undoes an
// abandoned call itself (stores.ErrAbandoned), finds that it never reached
// Redis. The Locker must not release it a second time: that release would
// dial again and log a WARN per request for a grant that never existed.
func TestSlowDialStoreLogsNoAbandonedGrant(t *testing.T) {
	dials := make(chan struct{}, 16)
	client := redis.NewClient(&redis.Options{
		Addr:        "127.0.0.1:1", // never dialled: the dialer hangs instead
		DialTimeout: 300 * time.Millisecond,
		MaxRetries:  -1,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			select {
			case dials <- struct{}{}:
			default:
			}
			<-ctx.Done() // as a dial to a host that drops packets
			return nil, &net.OpError{Op: "dial", Net: network, Err: ctx.Err()}
		},
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = client.Close() })
	store, err := redisstore.New(client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
	const releaseTimeout = 200 * time.Millisecond
	l := reqlock.MustNew(store, reqlock.WithLogger(logger), reqlock.WithReleaseTimeout(releaseTimeout))
	_, err = l.Obtain(context.Background(), "k", time.Second, 50*time.Millisecond)
	if !errors.Is(err, reqlock.ErrStore) && !errors.Is(err, reqlock.ErrWaitEnded) {
		t.Fatalf("Obtain on a Redis whose dials hang: %v, want ErrStore or ErrWaitEnded", err)
	}
	<-dials // the acquire's own dial, cut off by the wait
	// A release by the Locker would fail within its release timeout and
	// log (go-redis dials again by itself, so a dial proves nothing).
	// Nothing signals that no log line comes: wait twice that timeout.
	time.Sleep(2 * releaseTimeout)
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(logs.String(), "abandoned") {
		t.Fatalf("a grant that cannot have existed was released and its failure logged: %s", logs.String())
	}
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
