package storetest

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
)

const (
	// signalWait bounds every wait for a signal that must arrive, and every
	// priming of a subscription.
	signalWait = 5 * time.Second

	// primeRound is how long a priming round waits for a signal before it
	// releases the key again.
	primeRound = 50 * time.Millisecond
)

// flushSeq numbers the keys of flush, so that each one is fresh.
var flushSeq atomic.Int64

// notifyTest is a Notify subtest, given the store as a ReleaseNotifier too.
type notifyTest func(t *testing.T, s reqlock.Store, n reqlock.ReleaseNotifier, key func(string) string)

// notifier adapts a Notify subtest to Run. A store that does not implement
// reqlock.ReleaseNotifier passes with a log line: notification is optional.
func notifier(f notifyTest) func(t *testing.T, s reqlock.Store, key func(string) string) {
	return func(t *testing.T, s reqlock.Store, key func(string) string) {
		n, ok := s.(reqlock.ReleaseNotifier)
		if !ok {
			t.Logf("%T does not implement reqlock.ReleaseNotifier (its waiters poll): nothing to check", s)
			return
		}
		f(t, s, n, key)
	}
}

// testNotifyReleaseSignals: a subscriber of k gets a signal after a Release
// of k.
func testNotifyReleaseSignals(t *testing.T, s reqlock.Store, n reqlock.ReleaseNotifier, key func(string) string) {
	k := key("k")
	ch := quietSubscriptions(t, s, n, key, k)[0]
	cycle(t, s, k, "t1")
	expectSignal(t, ch, "after a Release of the key")
}

// testNotifyOtherKeyNoSignal: releases of b do not signal a subscriber of a.
func testNotifyOtherKeyNoSignal(t *testing.T, s reqlock.Store, n reqlock.ReleaseNotifier, key func(string) string) {
	a, b := key("a"), key("b")
	chA, _ := subscribe(t, n, a)
	chB, _ := subscribe(t, n, b)
	prime(t, s, a, chA)
	prime(t, s, b, chB)
	// Every signal of the priming has been delivered: none is left to
	// arrive late and be mistaken for one of the signals below.
	flush(t, s, n, key)
	drain(chA)
	drain(chB)
	cycle(t, s, b, "t1")
	expectSignal(t, chB, "after a Release of b")
	// The second signal is delivered after the first one was delivered to
	// every subscriber it was meant for, so a wrong signal of a is in
	// place by now.
	cycle(t, s, b, "t2")
	expectSignal(t, chB, "after a second Release of b")
	expectNone(t, chA, "subscriber of a after releases of b only")
	cycle(t, s, a, "t3")
	expectSignal(t, chA, "after a Release of a")
}

// testNotifyStop: stop is idempotent, a stopped channel gets no further
// signal while another subscriber of the key still does, and the key can be
// subscribed again after its last subscriber stopped.
func testNotifyStop(t *testing.T, s reqlock.Store, n reqlock.ReleaseNotifier, key func(string) string) {
	k := key("k")
	ch1, stop1 := subscribe(t, n, k)
	ch2, stop2 := subscribe(t, n, k)
	prime(t, s, k, ch2)
	stop1()
	stop1()
	drain(ch1) // what it got before stop
	cycle(t, s, k, "t1")
	flush(t, s, n, key) // the release of k has been delivered
	expectNone(t, ch1, "stopped subscriber after a Release")

	drain(ch2)
	cycle(t, s, k, "t2")
	expectSignal(t, ch2, "remaining subscriber after the other one stopped")

	stop2()
	stop2()
	ch3, _ := subscribe(t, n, k)
	prime(t, s, k, ch3)
}

// testNotifyManySubscribers: every subscriber of a key gets the signal.
func testNotifyManySubscribers(t *testing.T, s reqlock.Store, n reqlock.ReleaseNotifier, key func(string) string) {
	k := key("k")
	chs := make([]<-chan struct{}, 10)
	for i := range chs {
		chs[i], _ = subscribe(t, n, k)
	}
	prime(t, s, k, chs[0])
	flush(t, s, n, key)
	for _, ch := range chs {
		drain(ch)
	}
	cycle(t, s, k, "t1")
	for i, ch := range chs {
		expectSignal(t, ch, "subscriber "+strconv.Itoa(i)+" of "+strconv.Itoa(len(chs)))
	}
}

// testNotifyNeverBlocksRelease: releases go on when nobody drains the
// channel, and signals still flow afterwards.
func testNotifyNeverBlocksRelease(t *testing.T, s reqlock.Store, n reqlock.ReleaseNotifier, key func(string) string) {
	k := key("k")
	ch, _ := subscribe(t, n, k)
	prime(t, s, k, ch)
	const releases = 100
	const limit = 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		for i := range releases {
			if err := cycleErr(ctx, s, k, "t"+strconv.Itoa(i)); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-timer.C:
		// Drain until the releases end, so that a release blocked on the
		// channel can return and the test's cleanup can stop the
		// subscription.
		timer.Reset(limit)
	drainLoop:
		for {
			select {
			case <-ch:
			case <-done:
				break drainLoop
			case <-timer.C:
				break drainLoop
			}
		}
		t.Fatalf("%d releases with an undrained subscriber did not finish within %v", releases, limit)
	}
	flush(t, s, n, key) // the store still delivers signals
	drain(ch)
	cycle(t, s, k, "last")
	expectSignal(t, ch, "after releases nobody drained")
}

// testNotifyConcurrent: subscribers come and go on one key from many
// goroutines while it is released; afterwards a new subscriber still gets
// signals.
func testNotifyConcurrent(t *testing.T, s reqlock.Store, n reqlock.ReleaseNotifier, key func(string) string) {
	k := key("k")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const workers, rounds = 8, 50
	var (
		wg   sync.WaitGroup
		errs = make(chan error, workers+1)
	)
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				ch, stop := n.NotifyRelease(k)
				if ch == nil || stop == nil {
					errs <- fmt.Errorf("worker %d round %d: NotifyRelease returned a nil channel or stop", w, r)
					return
				}
				if r%2 == 0 {
					stop()
				} else {
					drain(ch)
					stop()
					stop()
				}
			}
		})
	}
	wg.Go(func() {
		for i := range rounds {
			if err := cycleErr(ctx, s, k, "r"+strconv.Itoa(i)); err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	ch, _ := subscribe(t, n, k)
	prime(t, s, k, ch)
}

// subscribe calls NotifyRelease and fails the test on a nil channel or stop.
// The subscription is stopped when the test ends.
func subscribe(t *testing.T, n reqlock.ReleaseNotifier, key string) (<-chan struct{}, func()) {
	t.Helper()
	ch, stop := n.NotifyRelease(key)
	if stop == nil {
		t.Fatalf("NotifyRelease(%q) returned a nil stop", key)
	}
	t.Cleanup(stop)
	if ch == nil {
		t.Fatalf("NotifyRelease(%q) returned a nil channel; the suite needs a store that can notify", key)
	}
	return ch, stop
}

// quietSubscriptions subscribes to each of keys and returns the channels
// once every subscription is live and none holds a signal.
func quietSubscriptions(t *testing.T, s reqlock.Store, n reqlock.ReleaseNotifier, key func(string) string, keys ...string) []<-chan struct{} {
	t.Helper()
	chs := make([]<-chan struct{}, len(keys))
	for i, k := range keys {
		chs[i], _ = subscribe(t, n, k)
		prime(t, s, k, chs[i])
	}
	flush(t, s, n, key)
	for _, ch := range chs {
		drain(ch)
	}
	return chs
}

// prime releases key until ch gets a signal, which shows that the
// subscription is live even in a store that subscribes asynchronously. Late
// signals of the priming may still arrive afterwards; see flush.
func prime(t *testing.T, s reqlock.Store, key string, ch <-chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(signalWait)
	timer := time.NewTimer(primeRound)
	defer timer.Stop()
	for i := 0; ; i++ {
		cycle(t, s, key, "prime"+strconv.Itoa(i))
		timer.Reset(primeRound)
		select {
		case <-ch:
			return
		case <-timer.C:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no signal on %q within %v of releasing it every %v", key, signalWait, primeRound)
		}
	}
}

// flush returns once every signal of the releases made so far has been
// delivered. It primes a fresh key: its first signal comes from a release
// made after all earlier ones, and a store delivers signals in release
// order.
func flush(t *testing.T, s reqlock.Store, n reqlock.ReleaseNotifier, key func(string) string) {
	t.Helper()
	k := key("flush" + strconv.FormatInt(flushSeq.Add(1), 10))
	ch, stop := subscribe(t, n, k)
	prime(t, s, k, ch)
	stop()
}

// cycle acquires key with token and releases it.
func cycle(t *testing.T, s reqlock.Store, key, token string) {
	t.Helper()
	if err := cycleErr(context.Background(), s, key, token); err != nil {
		t.Fatal(err)
	}
}

// cycleErr acquires key with token and releases it.
func cycleErr(ctx context.Context, s reqlock.Store, key, token string) error {
	g, err := s.Acquire(ctx, key, token, longTTL)
	if err != nil {
		return fmt.Errorf("Acquire(%q, %q): %w", key, token, err)
	}
	if !g.OK {
		return fmt.Errorf("Acquire(%q, %q) refused: %+v", key, token, g)
	}
	if err := s.Release(ctx, key, token, 0); err != nil {
		return fmt.Errorf("Release(%q, %q): %w", key, token, err)
	}
	return nil
}

// drain empties ch of the one signal its buffer may hold.
func drain(ch <-chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

// expectSignal fails the test unless ch gets a signal within signalWait.
func expectSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	timer := time.NewTimer(signalWait)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		t.Fatalf("no signal %s within %v", what, signalWait)
	}
}

// expectNone fails the test when ch holds a signal.
func expectNone(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("unexpected signal: %s", what)
	default:
	}
}
