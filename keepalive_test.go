package reqlock_test

import (
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
	"github.com/reqlock/reqlock/stores"
)

// wdTTL is the TTL of the watchdog tests: renewals every 100ms, retries every
// 30ms, leaving 200ms for scheduling delays of a loaded -race run.
const (
	wdTTL      = 300 * time.Millisecond
	wdInterval = wdTTL / 3
	wdRetry    = wdTTL / 10
	// wdSlack absorbs scheduling delays of a loaded -race run.
	wdSlack = 150 * time.Millisecond
	// renewTTL is the TTL of the tests that a renewal late by a TTL's
	// two thirds fails (a key another token may take): renewals every
	// 333ms, late by up to 667ms on a loaded machine. At wdTTL, a loaded
	// -race run delays one by 200ms now and then.
	renewTTL = time.Second
)

var errInjected = errors.New("injected store failure")

// wdStore passes calls to a real store and can make Refresh fail or stall.
type wdStore struct {
	stores.Store

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

func newWDStore(store stores.Store) *wdStore {
	return &wdStore{Store: store, events: make(chan error, 256), entered: make(chan struct{}, 256)}
}

func (s *wdStore) setMode(m wdMode) {
	s.mu.Lock()
	s.mode = m
	s.mu.Unlock()
}

func (s *wdStore) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
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
		err = s.Store.Refresh(ctx, keys, token, ttl)
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
	e      *storeEnv
	store  *wdStore
	locker *reqlock.Locker
	logs   *syncBuffer
}

func newWDFixture(t *testing.T, e *storeEnv, opts ...reqlock.Option) *wdFixture {
	t.Helper()
	f := &wdFixture{e: e, store: newWDStore(e.real), logs: &syncBuffer{}}
	logger := slog.New(slog.NewTextHandler(f.logs, nil))
	var err error
	f.locker, err = reqlock.New(f.store, append([]reqlock.Option{reqlock.WithKeyPrefix(e.prefix), reqlock.WithLogger(logger)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *wdFixture) obtain(t *testing.T, key string) *reqlock.Lock {
	t.Helper()
	return f.obtainFor(t, key, wdTTL)
}

// obtainFor is obtain with a TTL of ttl.
func (f *wdFixture) obtainFor(t *testing.T, key string, ttl time.Duration) *reqlock.Lock {
	t.Helper()
	lock, err := f.locker.Obtain(context.Background(), key, ttl, 0)
	if err != nil {
		t.Fatalf("obtain %q: %v", key, err)
	}
	// A failed test must not leave a watchdog running into the next one.
	t.Cleanup(func() { _ = lock.Release(context.Background()) })
	return lock
}

// heldInStore reports whether lock's key still refuses another token.
func (f *wdFixture) heldInStore(t *testing.T, lock *reqlock.Lock) bool {
	t.Helper()
	return heldInStore(t, f.e.real, f.e.prefix+lock.Key())
}

// lossLogs counts the loss warnings.
func (f *wdFixture) lossLogs() int { return strings.Count(f.logs.String(), "lock lost while") }

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
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		f := newWDFixture(t, e)
		lock := f.obtainFor(t, "sku:renew", renewTTL)
		ctx := lock.KeepAlive(context.Background())
		end := time.Now().Add(4 * renewTTL)
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
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		f := newWDFixture(t, e)
		lock := f.obtain(t, "sku:deleted")
		ctx := lock.KeepAlive(context.Background())
		if err := f.store.waitRefresh(t); err != nil {
			t.Fatalf("first renewal: %v", err)
		}
		e.remove(t, e.prefix+lock.Key(), lock.Token())
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
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		f := newWDFixture(t, e)
		lock := f.obtain(t, "sku:overwritten")
		ctx := lock.KeepAlive(context.Background())
		e.overwrite(t, e.prefix+lock.Key(), lock.Token())
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
			forEachEnv(t, func(t *testing.T, e *storeEnv) {
				f := newWDFixture(t, e)
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
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		f := newWDFixture(t, e)
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
		if f.lossLogs() != 0 || lock.Lost() != nil {
			t.Fatalf("a loss was reported (Lost %v): %s", lock.Lost(), f.logs.String())
		}
	})
}

func TestReleaseStopsWatchdog(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		f := newWDFixture(t, e)
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
	e := memEnv()
	f := newWDFixture(t, e)
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
	if cause := context.Cause(ctx); errors.Is(cause, reqlock.ErrLockLost) || f.lossLogs() != 0 || lock.Lost() != nil {
		t.Fatalf("release was reported as a loss: %v", cause)
	}
	if e.left(t) != 0 {
		t.Fatal("lock left in the store")
	}
}

func TestKeepAliveStopsWhenItsContextEnds(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		f := newWDFixture(t, e)
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
	e := memEnv()
	f := newWDFixture(t, e)
	lock := f.obtain(t, "sku:twice")
	first := lock.KeepAlive(context.Background())
	second := lock.KeepAlive(context.Background())
	// A goroutine not yet scheduled shows no frames: poll.
	eventually(t, "the watchdog runs", func() bool { return watchdogs() == 1 })
	if n := watchdogs(); n != 1 {
		t.Fatalf("%d watchdogs, want 1", n)
	}
	e.remove(t, e.prefix+lock.Key(), lock.Token())
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
	f := newWDFixture(t, memEnv())
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
	f := newWDFixture(t, memEnv())
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
	f := newWDFixture(t, memEnv())
	lock := f.obtain(t, "sku:late")
	eventually(t, "most of the TTL passed", func() bool { return validity(lock) < wdTTL/4 })
	ctx := lock.KeepAlive(context.Background())
	if err := f.store.waitRefresh(t); err != nil {
		t.Fatalf("renewal: %v", err)
	}
	// The store answered; the lock records the new validity just after.
	eventually(t, "validity renewed", func() bool { return validity(lock) > wdTTL/2 })
	if ctx.Err() != nil {
		t.Fatal(context.Cause(ctx))
	}
	if err := lock.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestObtainAllKeepAliveRenewsEveryKey(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		ctx := context.Background()
		keys := []string{"a", "b", "c"}
		lock, err := l.ObtainAll(ctx, keys, renewTTL, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lock.Release(context.Background()) })
		kctx := lock.KeepAlive(ctx)
		end := time.Now().Add(4 * renewTTL)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for time.Now().Before(end) {
			<-tick.C
			if err := kctx.Err(); err != nil {
				t.Fatalf("keep-alive context ended: %v", context.Cause(kctx))
			}
			e.expectHeld(t, keys...)
		}
		// One store call per renewal, for all the keys.
		if n := e.spy.refreshes.Load(); n < 4 {
			t.Fatalf("%d Refresh calls in 4×TTL, want about 12", n)
		}
		mustRelease(t, lock)
		if cause := context.Cause(kctx); !errors.Is(cause, reqlock.ErrNotHeld) || errors.Is(cause, reqlock.ErrLockLost) {
			t.Fatalf("cause after release = %v, want ErrNotHeld without ErrLockLost", cause)
		}
		e.expectNoKeysLeft(t)
	})
}

func TestObtainAllKeepAliveLostWhenOneKeyDeleted(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
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

// TestLockContextEndsWhenARenewalFindsItGone: without a watchdog, a Refresh
// that finds the lock gone ends the lock's contexts as a loss, which Lost
// reports and the Locker logs once.
func TestLockContextEndsWhenARenewalFindsItGone(t *testing.T) {
	e := memEnv()
	f := newWDFixture(t, e)
	lock, err := f.locker.Obtain(context.Background(), "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx := reqlock.NewContext(context.Background(), lock)
	e.remove(t, e.prefix+"k", lock.Token())
	if lock.Lost() != nil || ctx.Err() != nil {
		t.Fatal("a loss was found before anything looked")
	}
	if err := lock.Refresh(context.Background(), 0); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("refresh: %v, want ErrNotHeld", err)
	}
	expectLost(t, ctx, reqlock.ErrNotHeld)
	if lost := lock.Lost(); lost != context.Cause(ctx) {
		t.Fatalf("Lost() = %v, want the context's cause %v", lost, context.Cause(ctx))
	}
	if n := f.lossLogs(); n != 1 {
		t.Fatalf("loss logged %d times: %s", n, f.logs.String())
	}
	// A context made after the loss has ended with it; the release does not
	// relabel it.
	after := reqlock.NewContext(context.Background(), lock)
	expectLost(t, after, reqlock.ErrNotHeld)
	if err := lock.Release(context.Background()); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("release of a lost lock: %v, want ErrNotHeld", err)
	}
	expectLost(t, ctx, reqlock.ErrNotHeld)
	if n := f.lossLogs(); n != 1 {
		t.Fatalf("loss logged %d times: %s", n, f.logs.String())
	}
}

// TestLockContextEndsWithItsParent: the lock's context ends with the
// context it was made from, with that context's cause: no loss, and the
// lock stays held until released. A context made on a released lock has
// ended already.
func TestLockContextEndsWithItsParent(t *testing.T) {
	e := memEnv()
	f := newWDFixture(t, e)
	lock, err := f.locker.Obtain(context.Background(), "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	parent, cancel := context.WithCancelCause(context.Background())
	errClientLeft := errors.New("client left")
	ctx := reqlock.NewContext(parent, lock)
	cancel(errClientLeft)
	if cause := context.Cause(ctx); !errors.Is(cause, errClientLeft) || errors.Is(cause, reqlock.ErrLockLost) {
		t.Fatalf("cause %v, want the parent's", cause)
	}
	if lock.Lost() != nil || !heldInStore(t, e.real, e.prefix+"k") {
		t.Fatalf("the parent's end touched the lock: Lost %v", lock.Lost())
	}
	mustRelease(t, lock)
	after := reqlock.NewContext(context.Background(), lock)
	if cause := context.Cause(after); after.Err() == nil || !errors.Is(cause, reqlock.ErrNotHeld) || errors.Is(cause, reqlock.ErrLockLost) {
		t.Fatalf("NewContext after Release: err %v cause %v, want ended with ErrNotHeld", after.Err(), cause)
	}
	if f.lossLogs() != 0 {
		t.Fatalf("a loss was logged: %s", f.logs.String())
	}
}

// TestLockLostByValidityIsLoggedOnce: a lock whose validity runs out
// unrenewed, with no watchdog, is lost: its contexts end, and the loss is
// logged once whatever the number of contexts.
func TestLockLostByValidityIsLoggedOnce(t *testing.T) {
	f := newWDFixture(t, memEnv())
	lock, err := f.locker.Obtain(context.Background(), "k", 50*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctxs := []context.Context{
		reqlock.NewContext(context.Background(), lock),
		reqlock.NewContext(context.Background(), lock),
	}
	for _, ctx := range ctxs {
		waitDone(t, ctx, 5*time.Second)
		if cause := context.Cause(ctx); !errors.Is(cause, reqlock.ErrLockLost) || errors.Is(cause, reqlock.ErrNotHeld) {
			t.Fatalf("cause %v, want ErrLockLost (the validity ran out; nobody said the key was gone)", cause)
		}
	}
	if lost := lock.Lost(); lost != context.Cause(ctxs[0]) {
		t.Fatalf("Lost() = %v, want the contexts' cause", lost)
	}
	eventually(t, "loss logged", func() bool { return f.lossLogs() == 1 })
	_ = lock.Release(context.Background())
	if n := f.lossLogs(); n != 1 {
		t.Fatalf("loss logged %d times: %s", n, f.logs.String())
	}
}
