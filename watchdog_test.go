package reqlock_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores/memstore"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// wdTTL is the TTL of the watchdog tests: renewals every 100ms, retries every
// 30ms, leaving 200ms for scheduling delays of a loaded -race run.
const (
	wdTTL      = 300 * time.Millisecond
	wdInterval = wdTTL / 3
	wdRetry    = wdTTL / 10
	// wdSlack absorbs scheduling delays of a loaded -race run.
	wdSlack = 150 * time.Millisecond
)

// wdBackend is a real store, with backdoors that act on a key behind the
// lock's back the way another process (or an operator) would.
type wdBackend struct {
	store  reqlock.Store
	prefix string
	// remove deletes key, which holds token.
	remove func(t *testing.T, key, token string)
	// overwrite makes key hold another token.
	overwrite func(t *testing.T, key, token string)
}

// forEachStore runs f against memstore and against a real Redis.
func forEachStore(t *testing.T, f func(t *testing.T, b wdBackend)) {
	t.Run("memstore", func(t *testing.T) {
		mem := memstore.New()
		f(t, wdBackend{
			store:  mem,
			prefix: reqlock.DefaultKeyPrefix,
			remove: func(t *testing.T, key, token string) {
				if err := mem.Release(context.Background(), key, token, 0); err != nil {
					t.Fatalf("deleting %q: %v", key, err)
				}
			},
			overwrite: func(t *testing.T, key, token string) {
				if err := mem.Release(context.Background(), key, token, 0); err != nil {
					t.Fatalf("deleting %q: %v", key, err)
				}
				g, err := mem.Acquire(context.Background(), key, "someone-else", time.Minute)
				if err != nil || !g.OK {
					t.Fatalf("taking %q over: %+v %v", key, g, err)
				}
			},
		})
	})
	t.Run("redis", func(t *testing.T) {
		client := testredis.Client(t)
		store, err := redisstore.New(client)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close() })
		f(t, wdBackend{
			store:  store,
			prefix: testredis.Prefix(t),
			remove: func(t *testing.T, key, _ string) {
				if n, err := client.Del(context.Background(), key).Result(); err != nil || n != 1 {
					t.Fatalf("DEL %q: %d %v", key, n, err)
				}
			},
			overwrite: func(t *testing.T, key, _ string) {
				if err := client.Set(context.Background(), key, "someone-else", time.Minute).Err(); err != nil {
					t.Fatalf("SET %q: %v", key, err)
				}
			},
		})
	})
}

// wdStore passes calls to a real store and can make Refresh fail or stall.
type wdStore struct {
	reqlock.Store

	mu   sync.Mutex // held across a passed-through Refresh: setMode waits for it
	mode wdMode

	calls    atomic.Int32
	faulty   atomic.Int32 // calls that saw a mode other than refreshOK
	failures atomic.Int32
	inflight atomic.Int32
	events   chan error // each finished Refresh, when there is room
	entered  chan struct{}
}

type wdMode int

const (
	refreshOK    wdMode = iota
	refreshFail         // answer an injected error
	refreshStall        // block until the call's context ends
)

var errInjected = errors.New("injected store failure")

func newWDStore(store reqlock.Store) *wdStore {
	return &wdStore{Store: store, events: make(chan error, 256), entered: make(chan struct{}, 256)}
}

func (s *wdStore) setMode(m wdMode) {
	s.mu.Lock()
	s.mode = m
	s.mu.Unlock()
}

func (s *wdStore) Refresh(ctx context.Context, key, token string, ttl time.Duration) error {
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	s.calls.Add(1)
	select {
	case s.entered <- struct{}{}:
	default:
	}
	s.mu.Lock()
	mode := s.mode
	if mode != refreshOK {
		s.faulty.Add(1)
	}
	var err error
	switch mode {
	case refreshOK:
		err = s.Store.Refresh(ctx, key, token, ttl)
	case refreshFail:
		err = errInjected
	}
	s.mu.Unlock()
	if mode == refreshStall {
		<-ctx.Done()
		err = ctx.Err()
	}
	if err != nil {
		s.failures.Add(1)
	}
	select {
	case s.events <- err:
	default:
	}
	return err
}

// waitRefresh waits for the next finished Refresh and returns its error.
func (s *wdStore) waitRefresh(t *testing.T) error {
	t.Helper()
	select {
	case err := <-s.events:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal within 5s")
		return nil
	}
}

type wdFixture struct {
	b      wdBackend
	store  *wdStore
	locker *reqlock.Locker
	logs   *syncBuffer
}

func newWDFixture(t *testing.T, b wdBackend) *wdFixture {
	t.Helper()
	f := &wdFixture{b: b, store: newWDStore(b.store), logs: &syncBuffer{}}
	logger := slog.New(slog.NewTextHandler(f.logs, nil))
	var err error
	f.locker, err = reqlock.New(f.store, reqlock.WithKeyPrefix(b.prefix), reqlock.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *wdFixture) obtain(t *testing.T, key string) *reqlock.Lock {
	t.Helper()
	lock, err := f.locker.Obtain(context.Background(), key, wdTTL, 0)
	if err != nil {
		t.Fatalf("obtain %q: %v", key, err)
	}
	// A failed test must not leave a watchdog running into the next one.
	t.Cleanup(func() { _ = lock.Release(context.Background()) })
	return lock
}

// heldInStore reports whether key still refuses another token, asking the
// store itself (not the Locker, which may answer from its local queue).
func (f *wdFixture) heldInStore(t *testing.T, lock *reqlock.Lock) bool {
	t.Helper()
	g, err := f.b.store.Acquire(context.Background(), lock.StoreKey(), "another-token", time.Minute)
	if err != nil {
		t.Fatalf("probe acquire: %v", err)
	}
	if g.OK {
		// Undo the probe's grant so the test's own cleanup is not confused.
		_ = f.b.store.Release(context.Background(), lock.StoreKey(), "another-token", g.Fence)
	}
	return !g.OK
}

// lossLogs counts the watchdog's loss warnings.
func (f *wdFixture) lossLogs() int { return strings.Count(f.logs.String(), "lock lost while") }

// waitDone waits up to limit for ctx to end and returns how long it took.
func waitDone(t *testing.T, ctx context.Context, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-ctx.Done():
		return time.Since(start)
	case <-time.After(limit):
		t.Fatalf("keep-alive context not done within %v", limit)
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

// eventually polls cond until it holds or 5s have passed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s\n%s", what, stacks())
		}
		<-tick.C
	}
}

// goroutinesBackTo polls until the goroutine count is at most n.
func goroutinesBackTo(t *testing.T, n int) {
	t.Helper()
	eventually(t, "goroutine count back to baseline", func() bool { return runtime.NumGoroutine() <= n })
}

func expectLost(t *testing.T, ctx context.Context, also error) {
	t.Helper()
	cause := context.Cause(ctx)
	if !errors.Is(cause, reqlock.ErrLockLost) || !errors.Is(cause, also) {
		t.Fatalf("cause = %v, want ErrLockLost and %v", cause, also)
	}
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("ctx.Err() = %v, want context.Canceled", ctx.Err())
	}
}

func TestKeepAliveRenews(t *testing.T) {
	forEachStore(t, func(t *testing.T, b wdBackend) {
		f := newWDFixture(t, b)
		lock := f.obtain(t, "sku:renew")
		ctx := lock.KeepAlive(context.Background())
		end := time.Now().Add(4 * wdTTL)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for time.Now().Before(end) {
			<-tick.C
			if err := ctx.Err(); err != nil {
				t.Fatalf("keep-alive context ended: %v", context.Cause(ctx))
			}
			if !f.heldInStore(t, lock) {
				t.Fatal("another token acquired the key while the watchdog ran")
			}
		}
		if n := f.store.calls.Load(); n < 8 || f.store.failures.Load() != 0 {
			t.Fatalf("%d renewals (%d failed) in 4×TTL, want about 12", n, f.store.failures.Load())
		}
		if err := lock.Release(context.Background()); err != nil {
			t.Fatalf("release: %v", err)
		}
		// Release ended the keep-alive context, and not as a loss.
		if cause := context.Cause(ctx); !errors.Is(cause, reqlock.ErrNotHeld) || errors.Is(cause, reqlock.ErrLockLost) {
			t.Fatalf("cause after release = %v, want ErrNotHeld without ErrLockLost", cause)
		}
		if f.heldInStore(t, lock) || f.lossLogs() != 0 || lock.Lost() != nil {
			t.Fatalf("after release: held %v, Lost %v, loss logs %q", f.heldInStore(t, lock), lock.Lost(), f.logs.String())
		}
	})
}

func TestKeepAliveLostWhenKeyDeleted(t *testing.T) {
	forEachStore(t, func(t *testing.T, b wdBackend) {
		f := newWDFixture(t, b)
		lock := f.obtain(t, "sku:deleted")
		ctx := lock.KeepAlive(context.Background())
		if err := f.store.waitRefresh(t); err != nil {
			t.Fatalf("first renewal: %v", err)
		}
		b.remove(t, lock.StoreKey(), lock.Token())
		took := waitDone(t, ctx, 5*time.Second)
		expectLost(t, ctx, reqlock.ErrNotHeld)
		if took > wdInterval+wdSlack {
			t.Fatalf("loss noticed after %v, want within about one renewal interval (%v)", took, wdInterval)
		}
		eventually(t, "loss logged", func() bool { return f.lossLogs() == 1 })
		eventually(t, "watchdog exited", func() bool { return watchdogs() == 0 })
		logs := f.logs.String()
		for _, want := range []string{"level=WARN", "key=sku:deleted", "fence=", "reason="} {
			if !strings.Contains(logs, want) {
				t.Errorf("loss log lacks %q: %s", want, logs)
			}
		}
		if err := lock.Release(context.Background()); !errors.Is(err, reqlock.ErrNotHeld) {
			t.Fatalf("release of a lost lock: %v, want ErrNotHeld", err)
		}
		// Still lost, never relabelled as released; logged exactly once.
		expectLost(t, ctx, reqlock.ErrNotHeld)
		if lost := lock.Lost(); !errors.Is(lost, reqlock.ErrLockLost) || lost != context.Cause(ctx) {
			t.Fatalf("Lost() = %v, want the context's cause", lost)
		}
		if n := f.lossLogs(); n != 1 {
			t.Fatalf("loss logged %d times: %s", n, f.logs.String())
		}
	})
}

func TestKeepAliveLostWhenKeyOverwritten(t *testing.T) {
	forEachStore(t, func(t *testing.T, b wdBackend) {
		f := newWDFixture(t, b)
		lock := f.obtain(t, "sku:overwritten")
		ctx := lock.KeepAlive(context.Background())
		b.overwrite(t, lock.StoreKey(), lock.Token())
		took := waitDone(t, ctx, 5*time.Second)
		expectLost(t, ctx, reqlock.ErrNotHeld)
		if took > wdInterval+wdSlack {
			t.Fatalf("loss noticed after %v, want within about one renewal interval (%v)", took, wdInterval)
		}
		eventually(t, "watchdog exited", func() bool { return watchdogs() == 0 })
		// The watchdog never touched the new owner's key.
		if !f.heldInStore(t, lock) {
			t.Fatal("the new owner's key is gone")
		}
		if err := lock.Release(context.Background()); !errors.Is(err, reqlock.ErrNotHeld) {
			t.Fatalf("release: %v, want ErrNotHeld", err)
		}
		if !f.heldInStore(t, lock) {
			t.Fatal("releasing the lost lock freed the new owner's key")
		}
	})
}

func TestKeepAliveLostWhenRenewalsFailUntilValidityEnds(t *testing.T) {
	for _, mode := range []struct {
		name string
		mode wdMode
		also error
	}{
		{"store errors", refreshFail, errInjected},
		{"store stalls", refreshStall, context.DeadlineExceeded},
	} {
		t.Run(mode.name, func(t *testing.T) {
			forEachStore(t, func(t *testing.T, b wdBackend) {
				f := newWDFixture(t, b)
				lock := f.obtain(t, "sku:failing")
				ctx := lock.KeepAlive(context.Background())
				if err := f.store.waitRefresh(t); err != nil {
					t.Fatalf("first renewal: %v", err)
				}
				f.store.setMode(mode.mode)
				// Once a renewal has seen the fault, the last successful
				// one has finished updating the lock: ValidUntil is final.
				eventually(t, "a renewal met the fault", func() bool { return f.store.faulty.Load() > 0 })
				validUntil := lock.ValidUntil()
				failuresBefore := f.store.failures.Load()
				select {
				case <-ctx.Done():
					if now := time.Now(); now.Before(validUntil) {
						t.Fatalf("lost %v before the validity ran out: %v", validUntil.Sub(now), context.Cause(ctx))
					}
				case <-time.After(time.Until(validUntil) + 5*time.Second):
					t.Fatal("not lost 5s after the validity ran out")
				}
				if late := time.Since(validUntil); late > wdRetry+wdSlack {
					t.Fatalf("lost %v after the validity ran out, want within about one retry (%v)", late, wdRetry)
				}
				expectLost(t, ctx, reqlock.ErrStore)
				if cause := context.Cause(ctx); !errors.Is(cause, mode.also) {
					t.Fatalf("cause %v does not wrap %v", cause, mode.also)
				}
				if mode.mode == refreshFail {
					if n := f.store.failures.Load() - failuresBefore; n < 2 {
						t.Fatalf("%d failed renewals before giving up, want retries", n)
					}
				}
				eventually(t, "watchdog exited", func() bool { return watchdogs() == 0 })
				if n := f.lossLogs(); n != 1 {
					t.Fatalf("loss logged %d times: %s", n, f.logs.String())
				}
				_ = lock.Release(context.Background())
			})
		})
	}
}

func TestKeepAliveSurvivesTransientStoreFailures(t *testing.T) {
	forEachStore(t, func(t *testing.T, b wdBackend) {
		f := newWDFixture(t, b)
		lock := f.obtain(t, "sku:flaky")
		ctx := lock.KeepAlive(context.Background())
		if err := f.store.waitRefresh(t); err != nil {
			t.Fatalf("first renewal: %v", err)
		}
		f.store.setMode(refreshFail)
		for range 2 {
			if err := f.store.waitRefresh(t); !errors.Is(err, errInjected) {
				t.Fatalf("renewal: %v, want the injected failure", err)
			}
		}
		f.store.setMode(refreshOK)
		if err := f.store.waitRefresh(t); err != nil {
			t.Fatalf("renewal after recovery: %v", err)
		}
		end := time.Now().Add(2 * wdTTL)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for time.Now().Before(end) {
			<-tick.C
			if ctx.Err() != nil || !f.heldInStore(t, lock) {
				t.Fatalf("lock lost after the store recovered: %v", context.Cause(ctx))
			}
		}
		if err := lock.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		if f.lossLogs() != 0 {
			t.Fatalf("a loss was logged: %s", f.logs.String())
		}
	})
}

func TestReleaseStopsWatchdog(t *testing.T) {
	forEachStore(t, func(t *testing.T, b wdBackend) {
		f := newWDFixture(t, b)
		// Warm up the store's connections so they do not count as leaks.
		_ = f.obtain(t, "sku:warmup").Release(context.Background())
		baseline := runtime.NumGoroutine()

		lock := f.obtain(t, "sku:release")
		ctx := lock.KeepAlive(context.Background())
		if err := f.store.waitRefresh(t); err != nil {
			t.Fatalf("renewal: %v", err)
		}
		if err := lock.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		// The goroutine has done its last work when Release returns; it may
		// still be returning from its function for an instant.
		eventually(t, "watchdog exited", func() bool { return watchdogs() == 0 })
		if ctx.Err() == nil {
			t.Fatal("keep-alive context still live after Release")
		}
		// Nothing to observe: give a renewal three intervals to show up.
		calls := f.store.calls.Load()
		<-time.After(3 * wdInterval)
		if n := f.store.calls.Load(); n != calls {
			t.Fatalf("%d renewals after Release", n-calls)
		}
		goroutinesBackTo(t, baseline)
	})
}

func TestReleaseStopsRenewalInFlight(t *testing.T) {
	mem := memstore.New()
	f := newWDFixture(t, wdBackend{store: mem, prefix: reqlock.DefaultKeyPrefix})
	lock := f.obtain(t, "sku:inflight")
	f.store.setMode(refreshStall)
	ctx := lock.KeepAlive(context.Background())
	select {
	case <-f.store.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal started")
	}
	start := time.Now()
	if err := lock.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Release waited for the renewal to end: checked at once, not polled.
	if n := f.store.inflight.Load(); n != 0 {
		t.Fatalf("%d renewals still in flight after Release returned", n)
	}
	eventually(t, "watchdog exited", func() bool { return watchdogs() == 0 })
	// Release cancelled the stalled renewal instead of waiting it out.
	if d := time.Since(start); d > wdInterval/2+wdSlack {
		t.Fatalf("Release took %v", d)
	}
	if cause := context.Cause(ctx); errors.Is(cause, reqlock.ErrLockLost) || f.lossLogs() != 0 {
		t.Fatalf("release was reported as a loss: %v", cause)
	}
	if mem.Len() != 0 {
		t.Fatal("lock left in the store")
	}
}

func TestKeepAliveStopsWhenItsContextEnds(t *testing.T) {
	forEachStore(t, func(t *testing.T, b wdBackend) {
		f := newWDFixture(t, b)
		_ = f.obtain(t, "sku:warmup").Release(context.Background())
		baseline := runtime.NumGoroutine()

		lock := f.obtain(t, "sku:request-ends")
		request, endRequest := context.WithCancel(context.Background())
		ctx := lock.KeepAlive(request)
		if err := f.store.waitRefresh(t); err != nil {
			t.Fatalf("renewal: %v", err)
		}
		endRequest()
		if cause := context.Cause(ctx); !errors.Is(cause, context.Canceled) || errors.Is(cause, reqlock.ErrLockLost) {
			t.Fatalf("cause = %v, want the request's", cause)
		}
		eventually(t, "watchdog exited", func() bool { return watchdogs() == 0 })
		goroutinesBackTo(t, baseline)
		// The lock is still held until released; the watchdog just stopped.
		if !f.heldInStore(t, lock) {
			t.Fatal("lock gone when only the watchdog stopped")
		}
		if err := lock.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		if f.lossLogs() != 0 {
			t.Fatalf("a loss was logged: %s", f.logs.String())
		}
	})
}

func TestKeepAliveTwiceRunsOneWatchdog(t *testing.T) {
	f := newWDFixture(t, wdBackend{store: memstore.New(), prefix: reqlock.DefaultKeyPrefix})
	mem := f.store.Store.(*memstore.Store)
	lock := f.obtain(t, "sku:twice")
	first := lock.KeepAlive(context.Background())
	second := lock.KeepAlive(context.Background())
	// A goroutine not yet scheduled shows no frames: poll.
	eventually(t, "the watchdog runs", func() bool { return watchdogs() == 1 })
	if n := watchdogs(); n != 1 {
		t.Fatalf("%d watchdogs, want 1", n)
	}
	if err := mem.Release(context.Background(), lock.StoreKey(), lock.Token(), 0); err != nil {
		t.Fatal(err)
	}
	waitDone(t, first, 5*time.Second)
	waitDone(t, second, 5*time.Second)
	expectLost(t, first, reqlock.ErrNotHeld)
	expectLost(t, second, reqlock.ErrNotHeld)
	// After the loss, KeepAlive answers the loss at once.
	third := lock.KeepAlive(context.Background())
	if third.Err() == nil {
		t.Fatal("KeepAlive on a lost lock returned a live context")
	}
	expectLost(t, third, reqlock.ErrNotHeld)
	eventually(t, "watchdog exited", func() bool { return watchdogs() == 0 })
	if n := f.lossLogs(); n != 1 {
		t.Fatalf("loss logged %d times", n)
	}
}

func TestKeepAliveRestartsAfterItsContextEnded(t *testing.T) {
	f := newWDFixture(t, wdBackend{store: memstore.New(), prefix: reqlock.DefaultKeyPrefix})
	lock := f.obtain(t, "sku:restart")
	request, endRequest := context.WithCancel(context.Background())
	_ = lock.KeepAlive(request)
	endRequest()
	eventually(t, "first watchdog exited", func() bool { return watchdogs() == 0 })
	ctx := lock.KeepAlive(context.Background())
	for range 3 {
		if err := f.store.waitRefresh(t); err != nil {
			t.Fatalf("renewal by the second watchdog: %v", err)
		}
	}
	if ctx.Err() != nil {
		t.Fatal(context.Cause(ctx))
	}
	if err := lock.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "watchdog exited", func() bool { return watchdogs() == 0 })
}

func TestKeepAliveOnReleasedLock(t *testing.T) {
	f := newWDFixture(t, wdBackend{store: memstore.New(), prefix: reqlock.DefaultKeyPrefix})
	lock := f.obtain(t, "sku:released")
	if err := lock.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := lock.KeepAlive(context.Background())
	if cause := context.Cause(ctx); ctx.Err() == nil || !errors.Is(cause, reqlock.ErrNotHeld) || errors.Is(cause, reqlock.ErrLockLost) {
		t.Fatalf("KeepAlive after Release: err %v cause %v", ctx.Err(), cause)
	}
	if n, calls := watchdogs(), f.store.calls.Load(); n != 0 || calls != 0 {
		t.Fatalf("a watchdog started on a released lock: %d watchdogs, %d renewals\n%s", n, calls, stacks())
	}
}

// TestKeepAliveRenewsALateStart checks that a watchdog started when most of
// the TTL has already passed renews at once rather than a third of the TTL
// later, after the lock would have expired.
func TestKeepAliveRenewsALateStart(t *testing.T) {
	f := newWDFixture(t, wdBackend{store: memstore.New(), prefix: reqlock.DefaultKeyPrefix})
	lock := f.obtain(t, "sku:late")
	eventually(t, "most of the TTL passed", func() bool { return lock.Validity() < wdTTL/4 })
	ctx := lock.KeepAlive(context.Background())
	if err := f.store.waitRefresh(t); err != nil {
		t.Fatalf("renewal: %v", err)
	}
	// The store answered; the lock records the new validity just after.
	eventually(t, "validity renewed", func() bool { return lock.Validity() > wdTTL/2 })
	if ctx.Err() != nil {
		t.Fatal(context.Cause(ctx))
	}
	if err := lock.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

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
