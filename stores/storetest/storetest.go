// Package storetest is the conformance suite every reqlock.Store must pass.
//
// A store's tests call Run with a function that returns a ready store:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) reqlock.Store { return memstore.New() })
//	}
//
// Every subtest uses keys of its own, so stores that share one backend (one
// Redis server) across subtests and test binaries never collide.
//
// The Notify subtests apply to stores that implement reqlock.ReleaseNotifier;
// for other stores they pass and log that the store does not notify. A store
// that implements it must hand the suite a non-nil channel, may subscribe
// asynchronously (the suite releases until a first signal shows the
// subscription is live), and must deliver its signals in release order
// (the suite waits for a signal on a fresh key to know that every earlier
// signal has been delivered).
//
// The optional interfaces have suites of their own, which a store that
// implements the interface runs next to Run: RunFair for reqlock.FairStore,
// RunMulti for reqlock.MultiStore and RunKeep for reqlock.KeepReleaser. Each
// fails when the store does not implement its interface, so a store states
// what it supports by the suites it runs:
//
//	func TestMultiConformance(t *testing.T) {
//		storetest.RunMulti(t, func(t *testing.T) reqlock.Store { return memstore.New() })
//	}
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
)

// longTTL outlives every subtest, so only the expiry subtest sees a lock
// expire.
const longTTL = 10 * time.Second

// Run runs the conformance suite as subtests of t. newStore is called once
// per subtest and returns the store under test.
func Run(t *testing.T, newStore func(t *testing.T) reqlock.Store) {
	cases := []struct {
		name string
		run  func(t *testing.T, s reqlock.Store, key func(string) string)
	}{
		{"AcquireGrantsFence", testAcquireGrantsFence},
		{"HeldKeyRefusesOtherToken", testHeldKeyRefusesOtherToken},
		{"RetriedAcquireIsGranted", testRetriedAcquireIsGranted},
		{"ReleaseThenReacquireRaisesFence", testReleaseThenReacquire},
		{"ReleaseWrongTokenKeepsLock", testReleaseWrongToken},
		{"DoubleRelease", testDoubleRelease},
		{"RefreshWrongToken", testRefreshWrongToken},
		{"RefreshExtendsTTL", testRefreshExtendsTTL},
		{"Expiry", testExpiry},
		{"FencesIncrease", testFencesIncrease},
		{"ReleaseRaisesFenceFloor", testReleaseRaisesFenceFloor},
		{"KeysIndependent", testKeysIndependent},
		{"RaceOneWinner", testRaceOneWinner},
		{"MutualExclusion", testMutualExclusion},
		{"CancelledContext", testCancelledContext},
		{"NotifyReleaseSignals", notifier(testNotifyReleaseSignals)},
		{"NotifyOtherKeyNoSignal", notifier(testNotifyOtherKeyNoSignal)},
		{"NotifyStop", notifier(testNotifyStop)},
		{"NotifyManySubscribers", notifier(testNotifyManySubscribers)},
		{"NotifyNeverBlocksRelease", notifier(testNotifyNeverBlocksRelease)},
		{"NotifyConcurrent", notifier(testNotifyConcurrent)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t)
			prefix := uniquePrefix(t)
			c.run(t, s, func(name string) string { return prefix + name })
		})
	}
}

// suiteCase is a subtest of the suite of an optional interface I: it gets
// the store both as a reqlock.Store and as an I.
type suiteCase[I any] struct {
	name string
	run  func(t *testing.T, s reqlock.Store, i I, key func(string) string)
}

// runSuite runs cases as subtests of t, each on a store of its own from
// newStore, which fails the subtest unless it implements I, and with keys of
// its own: a unique prefix, then infix, then the name the subtest gives.
func runSuite[I any](t *testing.T, newStore func(t *testing.T) reqlock.Store, infix string, cases []suiteCase[I]) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t)
			i, ok := s.(I)
			if !ok {
				t.Fatalf("%T does not implement %v", s, reflect.TypeFor[I]())
			}
			prefix := uniquePrefix(t) + infix
			c.run(t, s, i, func(name string) string { return prefix + name })
		})
	}
}

// withNotifier adapts a signal subtest of the suite of I: stores without
// ReleaseNotifier pass with a log line.
func withNotifier[I any](f func(t *testing.T, s reqlock.Store, i I, n reqlock.ReleaseNotifier, key func(string) string)) func(t *testing.T, s reqlock.Store, i I, key func(string) string) {
	return func(t *testing.T, s reqlock.Store, i I, key func(string) string) {
		n, ok := s.(reqlock.ReleaseNotifier)
		if !ok {
			t.Logf("%T does not implement reqlock.ReleaseNotifier: nothing to check", s)
			return
		}
		f(t, s, i, n, key)
	}
}

func testAcquireGrantsFence(t *testing.T, s reqlock.Store, key func(string) string) {
	g := mustAcquire(t, s, key("k"), "t1", longTTL)
	if !g.OK {
		t.Fatalf("Acquire on a free key: got %+v, want OK", g)
	}
	if g.Fence <= 0 {
		t.Fatalf("Acquire: fence %d, want > 0", g.Fence)
	}
}

func testHeldKeyRefusesOtherToken(t *testing.T, s reqlock.Store, key func(string) string) {
	k := key("k")
	if g := mustAcquire(t, s, k, "t1", longTTL); !g.OK {
		t.Fatalf("first Acquire: got %+v, want OK", g)
	}
	g := mustAcquire(t, s, k, "t2", longTTL)
	if g.OK {
		t.Fatalf("second token on a held key: got %+v, want refused", g)
	}
	if g.Fence != 0 {
		t.Errorf("refused grant: fence %d, want 0", g.Fence)
	}
	if g.HolderTTL <= 0 || g.HolderTTL > longTTL {
		t.Errorf("refused grant: HolderTTL %v, want in (0, %v]", g.HolderTTL, longTTL)
	}
}

// A token is used for one acquisition only, so a key that already holds
// the caller's token was set by this very call, run before: a client that
// retried after the reply was lost. The retry is granted, with a fresh
// fence and TTL, instead of waiting for itself.
func testRetriedAcquireIsGranted(t *testing.T, s reqlock.Store, key func(string) string) {
	k := key("k")
	first := mustAcquire(t, s, k, "t1", time.Second)
	if !first.OK {
		t.Fatalf("first Acquire: got %+v, want OK", first)
	}
	retry := mustAcquire(t, s, k, "t1", longTTL)
	if !retry.OK || retry.Fence <= first.Fence {
		t.Fatalf("retried Acquire with the holder's token: got %+v, want granted with a fence above %d", retry, first.Fence)
	}
	if g := mustAcquire(t, s, k, "t2", longTTL); g.OK || g.HolderTTL <= time.Second {
		t.Fatalf("other token after the retry: got %+v, want refused with the retry's TTL (above 1s) left", g)
	}
	if err := s.Release(context.Background(), k, "t1", 0); err != nil {
		t.Fatalf("Release after the retry: %v", err)
	}
}

func testReleaseThenReacquire(t *testing.T, s reqlock.Store, key func(string) string) {
	k := key("k")
	g1 := mustAcquire(t, s, k, "t1", longTTL)
	if !g1.OK {
		t.Fatalf("Acquire: got %+v, want OK", g1)
	}
	if err := s.Release(context.Background(), k, "t1", 0); err != nil {
		t.Fatalf("Release by owner: %v", err)
	}
	g2 := mustAcquire(t, s, k, "t2", longTTL)
	if !g2.OK {
		t.Fatalf("Acquire after release: got %+v, want OK", g2)
	}
	if g2.Fence <= g1.Fence {
		t.Fatalf("fence after re-acquire %d, want > %d", g2.Fence, g1.Fence)
	}
}

func testReleaseWrongToken(t *testing.T, s reqlock.Store, key func(string) string) {
	k := key("k")
	if g := mustAcquire(t, s, k, "t1", longTTL); !g.OK {
		t.Fatalf("Acquire: got %+v, want OK", g)
	}
	if err := s.Release(context.Background(), k, "t2", 0); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("Release with a wrong token: got %v, want ErrNotHeld", err)
	}
	if g := mustAcquire(t, s, k, "t3", longTTL); g.OK {
		t.Fatal("a wrong-token Release removed the lock")
	}
	if err := s.Release(context.Background(), key("absent"), "t1", 0); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("Release of an absent key: got %v, want ErrNotHeld", err)
	}
}

func testDoubleRelease(t *testing.T, s reqlock.Store, key func(string) string) {
	k := key("k")
	if g := mustAcquire(t, s, k, "t1", longTTL); !g.OK {
		t.Fatalf("Acquire: got %+v, want OK", g)
	}
	if err := s.Release(context.Background(), k, "t1", 0); err != nil {
		t.Fatalf("first Release: %v", err)
	}
	if err := s.Release(context.Background(), k, "t1", 0); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("second Release: got %v, want ErrNotHeld", err)
	}
}

func testRefreshWrongToken(t *testing.T, s reqlock.Store, key func(string) string) {
	k := key("k")
	if g := mustAcquire(t, s, k, "t1", time.Second); !g.OK {
		t.Fatalf("Acquire: got %+v, want OK", g)
	}
	if err := s.Refresh(context.Background(), k, "t2", longTTL); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("Refresh with a wrong token: got %v, want ErrNotHeld", err)
	}
	g := mustAcquire(t, s, k, "t2", longTTL)
	if g.OK || g.HolderTTL > time.Second {
		t.Fatalf("after a wrong-token Refresh: got %+v, want refused with HolderTTL <= 1s", g)
	}
	if err := s.Refresh(context.Background(), key("absent"), "t1", longTTL); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("Refresh of an absent key: got %v, want ErrNotHeld", err)
	}
}

func testRefreshExtendsTTL(t *testing.T, s reqlock.Store, key func(string) string) {
	k := key("k")
	if g := mustAcquire(t, s, k, "t1", 200*time.Millisecond); !g.OK {
		t.Fatalf("Acquire: got %+v, want OK", g)
	}
	if err := s.Refresh(context.Background(), k, "t1", 5*time.Second); err != nil {
		t.Fatalf("Refresh by owner: %v", err)
	}
	g := mustAcquire(t, s, k, "t2", longTTL)
	if g.OK {
		t.Fatal("lock lost right after Refresh")
	}
	if g.HolderTTL <= time.Second {
		t.Fatalf("HolderTTL after Refresh to 5s: %v, want > 1s", g.HolderTTL)
	}
}

func testExpiry(t *testing.T, s reqlock.Store, key func(string) string) {
	k := key("k")
	const ttl = 50 * time.Millisecond
	start := time.Now()
	g1 := mustAcquire(t, s, k, "t1", ttl)
	if !g1.OK {
		t.Fatalf("Acquire: got %+v, want OK", g1)
	}
	g2 := pollAcquire(t, s, k, "t2", longTTL, 3*time.Second)
	if elapsed := time.Since(start); elapsed < ttl-10*time.Millisecond {
		t.Fatalf("expired lock re-granted after %v, want >= %v", elapsed, ttl-10*time.Millisecond)
	}
	if g2.Fence <= g1.Fence {
		t.Fatalf("fence after expiry %d, want > %d", g2.Fence, g1.Fence)
	}
	if err := s.Release(context.Background(), k, "t1", 0); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("Release by the expired owner: got %v, want ErrNotHeld", err)
	}
	if err := s.Refresh(context.Background(), k, "t1", longTTL); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("Refresh by the expired owner: got %v, want ErrNotHeld", err)
	}
	if g := mustAcquire(t, s, k, "t3", longTTL); g.OK {
		t.Fatal("the expired owner's Release or Refresh removed the new holder")
	}
	if err := s.Release(context.Background(), k, "t2", 0); err != nil {
		t.Fatalf("Release by the new holder: %v", err)
	}
}

func testFencesIncrease(t *testing.T, s reqlock.Store, key func(string) string) {
	k := key("k")
	var last int64
	for i := range 100 {
		g := mustAcquire(t, s, k, "t", longTTL)
		if !g.OK {
			t.Fatalf("cycle %d: Acquire refused: %+v", i, g)
		}
		if g.Fence <= last {
			t.Fatalf("cycle %d: fence %d, want > %d", i, g.Fence, last)
		}
		last = g.Fence
		if err := s.Release(context.Background(), k, "t", 0); err != nil {
			t.Fatalf("cycle %d: Release: %v", i, err)
		}
	}
}

func testKeysIndependent(t *testing.T, s reqlock.Store, key func(string) string) {
	a, b := key("a"), key("b")
	if g := mustAcquire(t, s, a, "t1", longTTL); !g.OK {
		t.Fatalf("Acquire a: got %+v, want OK", g)
	}
	if g := mustAcquire(t, s, b, "t2", longTTL); !g.OK {
		t.Fatalf("Acquire b while a is held: got %+v, want OK", g)
	}
	if err := s.Release(context.Background(), b, "t1", 0); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("Release of b with a's token: got %v, want ErrNotHeld", err)
	}
	if err := s.Release(context.Background(), a, "t1", 0); err != nil {
		t.Fatalf("Release a: %v", err)
	}
	if g := mustAcquire(t, s, b, "t3", longTTL); g.OK {
		t.Fatal("releasing a freed b")
	}
	if g := mustAcquire(t, s, a, "t3", longTTL); !g.OK {
		t.Fatalf("Acquire a after its release: got %+v, want OK", g)
	}
}

func testRaceOneWinner(t *testing.T, s reqlock.Store, key func(string) string) {
	k := key("k")
	const n = 50
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		granted atomic.Int32
		errs    = make(chan error, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			g, err := s.Acquire(context.Background(), k, "t"+strconv.Itoa(i), longTTL)
			if err != nil {
				errs <- err
				return
			}
			if g.OK {
				granted.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Acquire: %v", err)
	}
	if got := granted.Load(); got != 1 {
		t.Fatalf("%d goroutines racing on one key: %d granted, want 1", n, got)
	}
}

func testMutualExclusion(t *testing.T, s reqlock.Store, key func(string) string) {
	k := key("k")
	const workers, cycles = 8, 50
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var (
		wg        sync.WaitGroup
		inside    atomic.Int32
		lastFence atomic.Int64
		failed    atomic.Bool
	)
	fail := func(format string, args ...any) {
		failed.Store(true)
		t.Errorf(format, args...)
	}
	for w := range workers {
		wg.Go(func() {
			token := "w" + strconv.Itoa(w)
			for c := 0; c < cycles && !failed.Load(); c++ {
				var g reqlock.Grant
				for {
					var err error
					g, err = s.Acquire(ctx, k, token, longTTL)
					if err != nil {
						fail("worker %d cycle %d: Acquire: %v", w, c, err)
						return
					}
					if g.OK {
						break
					}
				}
				if n := inside.Add(1); n != 1 {
					fail("worker %d cycle %d: %d holders inside the lock", w, c, n)
				}
				if prev := lastFence.Swap(g.Fence); g.Fence <= prev {
					fail("worker %d cycle %d: fence %d, want > %d", w, c, g.Fence, prev)
				}
				inside.Add(-1)
				if err := s.Release(ctx, k, token, 0); err != nil {
					fail("worker %d cycle %d: Release: %v", w, c, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func testCancelledContext(t *testing.T, s reqlock.Store, key func(string) string) {
	k := key("k")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	g, err := s.Acquire(ctx, k, "t1", longTTL)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire on a cancelled context: got %v, want context.Canceled", err)
	}
	if g.OK {
		t.Fatalf("Acquire on a cancelled context granted %+v", g)
	}
	if g := mustAcquire(t, s, k, "t2", longTTL); !g.OK {
		t.Fatalf("Acquire after a cancelled attempt: got %+v, want OK (nothing granted)", g)
	}
	if err := s.Release(ctx, k, "t2", 0); err == nil {
		t.Fatal("Release on a cancelled context succeeded")
	}
	if err := s.Refresh(ctx, k, "t2", longTTL); err == nil {
		t.Fatal("Refresh on a cancelled context succeeded")
	}
	if g := mustAcquire(t, s, k, "t3", longTTL); g.OK {
		t.Fatal("Release on a cancelled context removed the lock")
	}
}

func mustAcquire(t *testing.T, s reqlock.Store, key, token string, ttl time.Duration) reqlock.Grant {
	t.Helper()
	g, err := s.Acquire(context.Background(), key, token, ttl)
	if err != nil {
		t.Fatalf("Acquire(%q, %q): %v", key, token, err)
	}
	return g
}

// pollAcquire retries Acquire until it is granted or limit passes.
func pollAcquire(t *testing.T, s reqlock.Store, key, token string, ttl, limit time.Duration) reqlock.Grant {
	t.Helper()
	deadline := time.Now().Add(limit)
	ticker := time.NewTicker(5 * time.Millisecond)
	defer ticker.Stop()
	for {
		if g := mustAcquire(t, s, key, token, ttl); g.OK {
			return g
		}
		if time.Now().After(deadline) {
			t.Fatalf("Acquire(%q) not granted within %v", key, limit)
		}
		<-ticker.C
	}
}

// uniquePrefix returns a key prefix of this test's name and a random suffix.
// Braces are replaced so the keys carry no Redis Cluster hash tag.
func uniquePrefix(t *testing.T) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := strings.Map(func(r rune) rune {
		if r == '{' || r == '}' || r == ' ' {
			return '_'
		}
		return r
	}, t.Name())
	return "storetest:" + name + ":" + hex.EncodeToString(b[:]) + ":"
}

// testReleaseRaisesFenceFloor: a Release that reports a higher fence used
// under its grant (a local handoff's) makes the next grant exceed it, while
// a lower report never lowers the next fence.
func testReleaseRaisesFenceFloor(t *testing.T, s reqlock.Store, key func(string) string) {
	ctx := context.Background()
	k := key("k")
	g1 := mustAcquire(t, s, k, "t1", longTTL)
	raised := g1.Fence + 1000
	if err := s.Release(ctx, k, "t1", raised); err != nil {
		t.Fatalf("Release: %v", err)
	}
	g2 := mustAcquire(t, s, k, "t2", longTTL)
	if g2.Fence <= raised {
		t.Fatalf("fence after a release reporting %d is %d, want higher", raised, g2.Fence)
	}
	if err := s.Release(ctx, k, "t2", 1); err != nil {
		t.Fatalf("Release: %v", err)
	}
	g3 := mustAcquire(t, s, k, "t3", longTTL)
	if g3.Fence <= g2.Fence {
		t.Fatalf("a release reporting a low fence lowered the next one: %d after %d", g3.Fence, g2.Fence)
	}
	_ = s.Release(ctx, k, "t3", 0)
}
