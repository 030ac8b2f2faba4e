package reqlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores/memstore"
)

// recMetrics records every Metrics event.
type recMetrics struct {
	mu        sync.Mutex
	obtained  []obtainedEvent
	held      []heldEvent
	lost      []string
	handedOff []string
}

type obtainedEvent struct {
	label  string
	result reqlock.Result
	wait   time.Duration
}

type heldEvent struct {
	label string
	held  time.Duration
}

func (m *recMetrics) Obtained(label string, result reqlock.Result, wait time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.obtained = append(m.obtained, obtainedEvent{label, result, wait})
}

func (m *recMetrics) Held(label string, held time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.held = append(m.held, heldEvent{label, held})
}

func (m *recMetrics) Lost(label string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lost = append(m.lost, label)
}

func (m *recMetrics) HandedOff(label string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.handedOff = append(m.handedOff, label)
}

// results returns the label and result of every Obtained event since the
// last call, and forgets them.
func (m *recMetrics) results() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, e := range m.obtained {
		out = append(out, e.label+" "+string(e.result))
	}
	m.obtained = nil
	return out
}

// takeHeld returns the Held events since the last call, and forgets them.
func (m *recMetrics) takeHeld() []heldEvent {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := m.held
	m.held = nil
	return out
}

func (m *recMetrics) snapshot() (lost, handedOff []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.lost), slices.Clone(m.handedOff)
}

// expectResults fails unless the Obtained events since the last check are
// want, in order.
func (m *recMetrics) expectResults(t *testing.T, want ...string) {
	t.Helper()
	if got := m.results(); !slices.Equal(got, want) {
		t.Fatalf("Obtained events %q, want %q", got, want)
	}
}

const route = "POST /skus/{id}/deduct"

func TestMetricsObtainResults(t *testing.T) {
	mem := memstore.New()
	m := &recMetrics{}
	l := reqlock.MustNew(mem, reqlock.WithMetrics(m))
	bg := context.Background()
	ctx := reqlock.WithLabel(bg, route)
	acquired := route + " " + string(reqlock.ResultAcquired)
	timeout := route + " " + string(reqlock.ResultTimeout)

	start := time.Now()
	lock, err := l.Obtain(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	m.mu.Lock()
	e := m.obtained[0]
	m.mu.Unlock()
	if e.wait < 0 || e.wait > took {
		t.Fatalf("acquired after %v, reported %v", took, e.wait)
	}
	m.expectResults(t, acquired)

	// Held: try once (local holder, and another process through the
	// store), for one key and several; a wait that runs out; the caller's
	// deadline.
	other := reqlock.MustNew(mem, reqlock.WithMetrics(m))
	if _, err := l.Obtain(ctx, "k", time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
		t.Fatal(err)
	}
	if _, err := other.Obtain(ctx, "k", time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
		t.Fatal(err)
	}
	if _, err := other.ObtainAll(ctx, []string{"j", "k"}, time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
		t.Fatal(err)
	}
	if _, err := other.Obtain(ctx, "k", time.Minute, 20*time.Millisecond); !errors.Is(err, reqlock.ErrWaitEnded) {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := other.Obtain(dctx, "k", time.Minute, time.Hour); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	m.expectResults(t, timeout, timeout, timeout, timeout, timeout)

	// Canceled: before the call, and while waiting in the local queue.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.Obtain(cctx, "k", time.Minute, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	cctx, cancel = context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := l.Obtain(cctx, "k", time.Minute, time.Hour)
		errc <- err
	}()
	waitUntil(t, func() bool { return reqlock.LocalWaiters(l, "reqlock:k") == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	canceled := route + " " + string(reqlock.ResultCanceled)
	m.expectResults(t, canceled, canceled)

	// Bad arguments.
	_, err1 := l.Obtain(ctx, "", time.Minute, 0)
	_, err2 := l.ObtainAll(ctx, []string{"a", ""}, time.Minute, 0)
	_, err3 := l.ObtainAll(ctx, nil, time.Minute, 0)
	if !errors.Is(err1, reqlock.ErrInvalid) || !errors.Is(err2, reqlock.ErrInvalid) || !errors.Is(err3, reqlock.ErrInvalid) {
		t.Fatal(err1, err2, err3)
	}
	badKey := route + " " + string(reqlock.ResultBadKey)
	m.expectResults(t, badKey, badKey, badKey)

	// A failing store.
	failing := reqlock.MustNew(&faultStore{Store: mem, acquireErr: errors.New("connection refused")}, reqlock.WithMetrics(m))
	if _, err := failing.Obtain(ctx, "s", time.Minute, time.Second); !errors.Is(err, reqlock.ErrStore) {
		t.Fatal(err)
	}
	if _, err := failing.ObtainAll(ctx, []string{"s", "t"}, time.Minute, 0); !errors.Is(err, reqlock.ErrStore) {
		t.Fatal(err)
	}
	storeError := route + " " + string(reqlock.ResultStoreError)
	m.expectResults(t, storeError, storeError)

	if err := lock.Release(bg); err != nil {
		t.Fatal(err)
	}
	if held := m.takeHeld(); len(held) != 1 || held[0].label != route {
		t.Fatalf("Held events %v, want one for %q", held, route)
	}
	if m.results() != nil {
		t.Fatal("Release reported an Obtained event")
	}
}

func TestMetricsUnlabeledRoute(t *testing.T) {
	m := &recMetrics{}
	l := reqlock.MustNew(memstore.New(), reqlock.WithMetrics(m))
	bg := context.Background()
	for _, ctx := range []context.Context{bg, reqlock.WithLabel(bg, "")} {
		lock, err := l.Obtain(ctx, "k", time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Obtain(ctx, "k", time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
			t.Fatalf("second Obtain of a held key: %v, want ErrHeld", err)
		}
		if err := lock.Release(bg); err != nil {
			t.Fatal(err)
		}
		m.expectResults(t, reqlock.UnlabeledRoute+" acquired", reqlock.UnlabeledRoute+" timeout")
		if held := m.takeHeld(); len(held) != 1 || held[0].label != reqlock.UnlabeledRoute {
			t.Fatalf("Held events %v, want one for %q", held, reqlock.UnlabeledRoute)
		}
	}
	if got := reqlock.LabelFrom(bg); got != reqlock.UnlabeledRoute {
		t.Fatalf("LabelFrom(no label) = %q", got)
	}
	if l.Metrics() != m {
		t.Fatal("Metrics() does not return the Locker's Metrics")
	}
}

func TestMetricsHeldOncePerRealRelease(t *testing.T) {
	forEachEnv(t, []string{pathFast}, func(t *testing.T, e *storeEnv) {
		m := &recMetrics{}
		l := e.locker(t, reqlock.WithMetrics(m))
		bg := context.Background()
		outerCtx := reqlock.WithLabel(bg, "outer")

		// One key, and several: Held once, for at least the time held.
		for _, keys := range [][]string{{"k"}, {"a", "b", "c"}} {
			before := time.Now()
			lock, err := l.ObtainAll(outerCtx, keys, time.Minute, 0)
			if err != nil {
				t.Fatal(err)
			}
			obtained := time.Now()
			_ = e.free(t, "other") // some work under the lock
			releasing := time.Now()
			if err := lock.Release(bg); err != nil {
				t.Fatal(err)
			}
			after := time.Since(before)
			if err := lock.Release(bg); !errors.Is(err, reqlock.ErrNotHeld) { // a second release is no release
				t.Fatalf("%q: second release: %v, want ErrNotHeld", keys, err)
			}
			held := m.takeHeld()
			if len(held) != 1 || held[0].label != "outer" {
				t.Fatalf("%q: Held events %v, want one for outer", keys, held)
			}
			if d := held[0].held; d < releasing.Sub(obtained) || d > after {
				t.Fatalf("%q: held for %v (between %v and %v), reported %v", keys, releasing.Sub(obtained), releasing.Sub(obtained), after, d)
			}
		}
		m.expectResults(t, "outer acquired", "outer acquired")

		// Reentrant calls count as acquired, under their own label; Held
		// comes once, for the real lock, under its label, whichever hold
		// ends last.
		for _, outerFirst := range []bool{true, false} {
			outer, err := l.Obtain(outerCtx, "k", time.Minute, 0)
			if err != nil {
				t.Fatal(err)
			}
			inner := reqlock.WithLabel(reqlock.NewContext(bg, outer), "inner")
			v1, err := l.Obtain(inner, "k", time.Minute, 0)
			if err != nil {
				t.Fatal(err)
			}
			v2, err := l.ObtainAll(reqlock.NewContext(inner, v1), []string{"k", "n"}, time.Minute, 0)
			if err != nil {
				t.Fatal(err)
			}
			m.expectResults(t, "outer acquired", "inner acquired", "inner acquired")
			order := []*reqlock.Lock{v2, v1, outer}
			if outerFirst {
				order = []*reqlock.Lock{outer, v1, v2}
			}
			for _, lock := range order {
				if err := lock.Release(bg); err != nil {
					t.Fatal(err)
				}
			}
			// v2 owned n, a real lock of its own.
			var labels []string
			for _, h := range m.takeHeld() {
				labels = append(labels, h.label)
			}
			slices.Sort(labels)
			if want := []string{"inner", "outer"}; !slices.Equal(labels, want) {
				t.Fatalf("outer first %v: Held for %q, want %q", outerFirst, labels, want)
			}
		}
		e.expectNoKeysLeft(t)

		// A hold-at-least release is one release too.
		lock, err := l.Obtain(outerCtx, "h", time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		lock.HoldAtLeast(time.Hour)
		if err := lock.Release(bg); err != nil {
			t.Fatal(err)
		}
		if held := m.takeHeld(); len(held) != 1 || held[0].label != "outer" {
			t.Fatalf("hold-at-least: Held events %v, want one for outer", held)
		}
	})
}

func TestMetricsHandedOff(t *testing.T) {
	m := &recMetrics{}
	l := reqlock.MustNew(memstore.New(), reqlock.WithMetrics(m))
	bg := context.Background()
	holder, err := l.Obtain(reqlock.WithLabel(bg, "holder"), "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lock *reqlock.Lock
		err  error
	}
	got := make(chan result, 3)
	for i := range 3 {
		go func() {
			lock, err := l.Obtain(reqlock.WithLabel(bg, fmt.Sprintf("waiter%d", i)), "k", time.Minute, 10*time.Second)
			got <- result{lock, err} // reported by the test, never after it ends
		}()
		waitUntil(t, func() bool { return reqlock.LocalWaiters(l, "reqlock:k") == i+1 })
	}
	if err := holder.Release(bg); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		r := <-got
		if r.err != nil {
			t.Fatalf("waiter: %v", r.err)
		}
		lock := r.lock
		if lock.Token() != holder.Token() {
			t.Fatal("the waiter did not get the grant by handoff")
		}
		if _, handedOff := m.snapshot(); !slices.Equal(handedOff, []string{"waiter0", "waiter1", "waiter2"}[:i+1]) {
			t.Fatalf("HandedOff events %q after %d handoffs", handedOff, i+1)
		}
		if err := lock.Release(bg); err != nil {
			t.Fatal(err)
		}
	}
	var labels []string
	for _, h := range m.takeHeld() {
		labels = append(labels, h.label)
	}
	if want := []string{"holder", "waiter0", "waiter1", "waiter2"}; !slices.Equal(labels, want) {
		t.Fatalf("Held for %q, want %q", labels, want)
	}
	m.expectResults(t, "holder acquired", "waiter0 acquired", "waiter1 acquired", "waiter2 acquired")
	if lost, _ := m.snapshot(); lost != nil {
		t.Fatalf("Lost events %q", lost)
	}
}

func TestMetricsLost(t *testing.T) {
	forEachEnv(t, []string{pathFast}, func(t *testing.T, e *storeEnv) {
		m := &recMetrics{}
		l := e.locker(t, reqlock.WithMetrics(m))
		bg := context.Background()
		for _, keys := range [][]string{{"k"}, {"a", "b"}} {
			lock, err := l.ObtainAll(reqlock.WithLabel(bg, "lost"), keys, wdTTL, 0)
			if err != nil {
				t.Fatal(err)
			}
			kctx := lock.KeepAlive(bg)
			e.remove(t, e.prefix+keys[len(keys)-1], lock.Token())
			waitDone(t, kctx, 5*time.Second)
			eventually(t, "loss reported", func() bool { lost, _ := m.snapshot(); return len(lost) > 0 })
			if err := lock.Release(bg); !errors.Is(err, reqlock.ErrNotHeld) {
				t.Fatalf("%q: release of a lost lock: %v, want ErrNotHeld", keys, err)
			}
			if lost, _ := m.snapshot(); !slices.Equal(lost, []string{"lost"}) {
				t.Fatalf("Lost events %q, want one for lost", lost)
			}
			m.mu.Lock()
			m.lost = nil
			m.mu.Unlock()
		}
		// A lock released in time is not lost.
		lock, err := l.Obtain(bg, "fine", wdTTL, 0)
		if err != nil {
			t.Fatal(err)
		}
		lock.KeepAlive(bg)
		if err := lock.Release(bg); err != nil {
			t.Fatal(err)
		}
		if lost, _ := m.snapshot(); lost != nil {
			t.Fatalf("Lost events %q for a released lock", lost)
		}
	})
}

// blockingLost is a Metrics whose Lost waits until release is closed.
type blockingLost struct {
	recMetrics
	entered chan struct{}
	release chan struct{}
}

func (m *blockingLost) Lost(label string) {
	m.recMetrics.Lost(label)
	close(m.entered)
	<-m.release
}

// TestLostAgreesWithKeepAliveContext: once the keep-alive context has ended
// with ErrLockLost, Lost reports the loss, even while the watchdog is still
// on its way out (here: held up in Metrics.Lost).
func TestLostAgreesWithKeepAliveContext(t *testing.T) {
	mem := memstore.New()
	m := &blockingLost{entered: make(chan struct{}), release: make(chan struct{})}
	l := reqlock.MustNew(mem, reqlock.WithMetrics(m), reqlock.WithLogger(slog.New(slog.DiscardHandler)))
	bg := context.Background()
	lock, err := l.Obtain(bg, "k", wdTTL, 0)
	if err != nil {
		t.Fatal(err)
	}
	kctx := lock.KeepAlive(bg)
	if err := mem.Release(bg, lock.StoreKey(), lock.Token(), 0); err != nil {
		t.Fatal(err)
	}
	waitDone(t, kctx, 5*time.Second)
	select {
	case <-m.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the watchdog never reported the loss to Metrics")
	}
	lost := lock.Lost()
	close(m.release)
	expectLost(t, kctx, reqlock.ErrNotHeld)
	if !errors.Is(lost, reqlock.ErrLockLost) || lost != context.Cause(kctx) {
		t.Fatalf("Lost() = %v once the keep-alive context ended with %v", lost, context.Cause(kctx))
	}
	if err := lock.Release(bg); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("release of a lost lock: %v, want ErrNotHeld", err)
	}
	if lost := lock.Lost(); lost != context.Cause(kctx) {
		t.Fatalf("Lost() after Release = %v", lost)
	}
}
