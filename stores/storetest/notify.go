package storetest

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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

// notifyTests are the Notify subtests, for stores.Notifier.
var notifyTests = []subtest{
	{name: "ReleaseSignals", needs: needNotify, run: testNotifyReleaseSignals},
	{name: "OtherKeyNoSignal", needs: needNotify, run: testNotifyOtherKeyNoSignal},
	{name: "Stop", needs: needNotify, run: testNotifyStop},
	{name: "ManySubscribers", needs: needNotify, run: testNotifyManySubscribers},
	{name: "NeverBlocksRelease", needs: needNotify, run: testNotifyNeverBlocksRelease},
	{name: "Concurrent", needs: needNotify, run: testNotifyConcurrent},
	{name: "ReleaseSignalsEveryKey", needs: needNotify, run: testNotifyEveryKey},
	{name: "KeepDoesNotSignal", needs: needNotify, run: testNotifyKeepNoSignal},
	{name: "NonPositiveKeepSignals", needs: needNotify, run: testNotifyNonPositiveKeep},
}

// testNotifyReleaseSignals: a subscriber of k gets a signal after a Release
// of k.
func testNotifyReleaseSignals(t *testing.T, e *env) {
	k := e.key("k")
	ch := e.quietSubscriptions(t, k)[0]
	e.cycle(t, k, "t1")
	expectSignal(t, ch, "after a Release of the key")
}

// testNotifyOtherKeyNoSignal: releases of b do not signal a subscriber of a.
func testNotifyOtherKeyNoSignal(t *testing.T, e *env) {
	a, b := e.key("a"), e.key("b")
	chA, _ := e.subscribe(t, a, "waiter")
	chB, _ := e.subscribe(t, b, "waiter")
	e.prime(t, a, chA)
	e.prime(t, b, chB)
	// Every signal of the priming has been delivered: none is left to
	// arrive late and be mistaken for one of the signals below.
	e.flush(t)
	drain(chA)
	drain(chB)
	e.cycle(t, b, "t1")
	expectSignal(t, chB, "after a Release of b")
	// The second signal is delivered after the first one was delivered to
	// every subscriber it was meant for, so a wrong signal of a is in
	// place by now.
	e.cycle(t, b, "t2")
	expectSignal(t, chB, "after a second Release of b")
	expectNone(t, chA, "subscriber of a after releases of b only")
	e.cycle(t, a, "t3")
	expectSignal(t, chA, "after a Release of a")
}

// testNotifyStop: stop is idempotent, a stopped channel gets no further
// signal while another subscriber of the key still does, and the key can be
// subscribed again after its last subscriber stopped.
func testNotifyStop(t *testing.T, e *env) {
	k := e.key("k")
	ch1, stop1 := e.subscribe(t, k, "waiter1")
	ch2, stop2 := e.subscribe(t, k, "waiter2")
	e.prime(t, k, ch2)
	stop1()
	stop1()
	drain(ch1) // what it got before stop
	e.cycle(t, k, "t1")
	e.flush(t) // the release of k has been delivered
	expectNone(t, ch1, "stopped subscriber after a Release")

	drain(ch2)
	e.cycle(t, k, "t2")
	expectSignal(t, ch2, "remaining subscriber after the other one stopped")

	stop2()
	stop2()
	ch3, _ := e.subscribe(t, k, "waiter3")
	e.prime(t, k, ch3)
}

// testNotifyManySubscribers: every subscriber of a key gets the signal.
func testNotifyManySubscribers(t *testing.T, e *env) {
	k := e.key("k")
	chs := make([]<-chan struct{}, 10)
	for i := range chs {
		chs[i], _ = e.subscribe(t, k, "waiter"+strconv.Itoa(i))
	}
	e.prime(t, k, chs[0])
	e.flush(t)
	for _, ch := range chs {
		drain(ch)
	}
	e.cycle(t, k, "t1")
	for i, ch := range chs {
		expectSignal(t, ch, "subscriber "+strconv.Itoa(i)+" of "+strconv.Itoa(len(chs)))
	}
}

// testNotifyNeverBlocksRelease: releases go on when nobody drains the
// channel, and signals still flow afterwards.
func testNotifyNeverBlocksRelease(t *testing.T, e *env) {
	k := e.key("k")
	ch, _ := e.subscribe(t, k, "waiter")
	e.prime(t, k, ch)
	const releases = 100
	const limit = 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		for i := range releases {
			if err := e.cycleErr(ctx, k, "t"+strconv.Itoa(i)); err != nil {
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
	e.flush(t) // the store still delivers signals
	drain(ch)
	e.cycle(t, k, "last")
	expectSignal(t, ch, "after releases nobody drained")
}

// testNotifyConcurrent: subscribers come and go on one key from many
// goroutines while it is released; afterwards a new subscriber still gets
// signals.
func testNotifyConcurrent(t *testing.T, e *env) {
	k := e.key("k")
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
				ch, stop := e.n.NotifyRelease(k, "w"+strconv.Itoa(w)+"r"+strconv.Itoa(r))
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
			if err := e.cycleErr(ctx, k, "r"+strconv.Itoa(i)); err != nil {
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
	ch, _ := e.subscribe(t, k, "waiter")
	e.prime(t, k, ch)
}

// testNotifyEveryKey: a Release of several keys signals the subscribers of
// each.
func testNotifyEveryKey(t *testing.T, e *env) {
	keys := e.keys("a", "b", "c")
	chs := e.quietSubscriptions(t, keys...)
	e.mustAcquire(t, keys, "t1", e.long)
	e.refuse(t, keys...)
	e.mustRelease(t, keys, "t1")
	for i, ch := range chs {
		expectSignal(t, ch, fmt.Sprintf("on %q after a Release of %d keys", keys[i], len(keys)))
	}
}

// testNotifyKeepNoSignal: a Release with keep signals nothing, since the
// keys stay held; their final Release does.
func testNotifyKeepNoSignal(t *testing.T, e *env) {
	ctx := t.Context()
	for _, keys := range e.keySets("k") {
		chs := e.quietSubscriptions(t, keys...)
		e.mustAcquire(t, keys, "t1", e.long)
		e.refuse(t, keys...)
		// A keep that outlives the test: an expiry may signal.
		if err := e.s.Release(ctx, keys, "t1", e.long); err != nil {
			t.Fatalf("Release(%q) with keep: %v", keys, err)
		}
		e.flush(t) // a signal of the kept release would have arrived by now
		for i, ch := range chs {
			expectNone(t, ch, fmt.Sprintf("on %q after a Release with keep: the keys stay held", keys[i]))
		}
		e.mustRelease(t, keys, "t1") // the keys still hold the token
		for i, ch := range chs {
			expectSignal(t, ch, fmt.Sprintf("on %q after the final Release", keys[i]))
		}
	}
}

// testNotifyNonPositiveKeep: a Release with a keep of zero or less is a
// plain release, and signals.
func testNotifyNonPositiveKeep(t *testing.T, e *env) {
	ctx := t.Context()
	keys := e.keys("k")
	ch := e.quietSubscriptions(t, keys...)[0]
	for _, keep := range []time.Duration{0, -time.Second} {
		e.mustAcquire(t, keys, "t1", e.long)
		e.refuse(t, keys...)
		if err := e.s.Release(ctx, keys, "t1", keep); err != nil {
			t.Fatalf("Release with keep %v: %v", keep, err)
		}
		expectSignal(t, ch, fmt.Sprintf("after a Release with keep %v, a plain release", keep))
	}
}

// subscribe calls NotifyRelease for a waiter with token and fails the test
// on a nil channel or stop. The subscription is stopped when the test ends.
func (e *env) subscribe(t *testing.T, key, token string) (<-chan struct{}, func()) {
	t.Helper()
	ch, stop := e.n.NotifyRelease(key, token)
	if stop == nil {
		t.Fatalf("NotifyRelease(%q, %q) returned a nil stop", key, token)
	}
	t.Cleanup(stop)
	if ch == nil {
		t.Fatalf("NotifyRelease(%q, %q) returned a nil channel; the suite needs a store that can notify", key, token)
	}
	return ch, stop
}

// quietSubscriptions subscribes to each of keys and returns the channels
// once every subscription is live and none holds a signal.
func (e *env) quietSubscriptions(t *testing.T, keys ...string) []<-chan struct{} {
	t.Helper()
	chs := make([]<-chan struct{}, len(keys))
	for i, k := range keys {
		chs[i], _ = e.subscribe(t, k, "waiter")
		e.prime(t, k, chs[i])
	}
	e.flush(t)
	for _, ch := range chs {
		drain(ch)
	}
	return chs
}

// prime releases key until ch gets a signal, which shows that the
// subscription is live even in a store that subscribes asynchronously. Late
// signals of the priming may still arrive afterwards; see flush.
func (e *env) prime(t *testing.T, key string, ch <-chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(signalWait)
	timer := time.NewTimer(primeRound)
	defer timer.Stop()
	for i := 0; ; i++ {
		e.cycle(t, key, "prime"+strconv.Itoa(i))
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
func (e *env) flush(t *testing.T) {
	t.Helper()
	k := e.key("flush" + strconv.FormatInt(flushSeq.Add(1), 10))
	ch, stop := e.subscribe(t, k, "flush")
	e.prime(t, k, ch)
	stop()
}

// cycle acquires key with token and releases it.
func (e *env) cycle(t *testing.T, key, token string) {
	t.Helper()
	if err := e.cycleErr(context.Background(), key, token); err != nil {
		t.Fatal(err)
	}
}

// cycleErr acquires key with token, has a waiter refused it, and releases it.
func (e *env) cycleErr(ctx context.Context, key, token string) error {
	keys := []string{key}
	g, err := e.s.Acquire(ctx, keys, token, e.long)
	if err != nil {
		return fmt.Errorf("Acquire(%q, %q): %w", key, token, err)
	}
	if !g.OK {
		return fmt.Errorf("Acquire(%q, %q) refused: %+v", key, token, g)
	}
	if err := e.refuseErr(ctx, keys); err != nil {
		return err
	}
	if err := e.s.Release(ctx, keys, token, 0); err != nil {
		return fmt.Errorf("Release(%q, %q): %w", key, token, err)
	}
	return nil
}

// refuse has a waiter refused each of keys, which must be held: a store may
// signal only the releases of keys some caller was refused (see
// stores.Notifier), as a waiter is before it subscribes.
func (e *env) refuse(t *testing.T, keys ...string) {
	t.Helper()
	if err := e.refuseErr(t.Context(), keys); err != nil {
		t.Fatal(err)
	}
}

// refuseErr has a waiter refused each of keys, one by one.
func (e *env) refuseErr(ctx context.Context, keys []string) error {
	for _, k := range keys {
		g, err := e.s.Acquire(ctx, []string{k}, "refused-waiter", e.long)
		if err != nil {
			return fmt.Errorf("Acquire(%q) of a waiter: %w", k, err)
		}
		if g.OK {
			return fmt.Errorf("Acquire(%q) of a waiter was granted a held key", k)
		}
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
