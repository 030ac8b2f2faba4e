package reqlock_test

import (
	"context"
	"errors"
	"fmt"
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
	label   string
	outcome reqlock.Outcome
	wait    time.Duration
}

type heldEvent struct {
	label string
	held  time.Duration
}

func (m *recMetrics) Obtained(label string, outcome reqlock.Outcome, wait time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.obtained = append(m.obtained, obtainedEvent{label, outcome, wait})
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

// outcomes returns the label and outcome of every Obtained event since the
// last call, and forgets them.
func (m *recMetrics) outcomes() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, e := range m.obtained {
		out = append(out, e.label+" "+string(e.outcome))
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

// takeLost returns the Lost events since the last call, and forgets them.
func (m *recMetrics) takeLost() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := m.lost
	m.lost = nil
	return out
}

func (m *recMetrics) snapshot() (lost, handedOff []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.lost), slices.Clone(m.handedOff)
}

// expectOutcomes fails unless the Obtained events since the last check are
// want, in order.
func (m *recMetrics) expectOutcomes(t *testing.T, want ...string) {
	t.Helper()
	if got := m.outcomes(); !slices.Equal(got, want) {
		t.Fatalf("Obtained events %q, want %q", got, want)
	}
}

const route = "POST /skus/{id}/deduct"

func TestMetricsObtainOutcomes(t *testing.T) {
	mem := memstore.New()
	m := &recMetrics{}
	l := reqlock.MustNew(mem, reqlock.WithMetrics(m), quiet)
	bg := context.Background()
	ctx := reqlock.WithLabel(bg, route)
	labelled := func(o reqlock.Outcome) string { return route + " " + string(o) }

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
	m.expectOutcomes(t, labelled(reqlock.OutcomeAcquired))

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
	timeout := labelled(reqlock.OutcomeTimeout)
	m.expectOutcomes(t, timeout, timeout, timeout, timeout, timeout)

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
	eventually(t, "the waiter queued", func() bool { return reqlock.LocalWaiters(l, "reqlock:k") == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	canceled := labelled(reqlock.OutcomeCanceled)
	m.expectOutcomes(t, canceled, canceled)

	// Invalid arguments.
	_, err1 := l.Obtain(ctx, "", time.Minute, 0)
	_, err2 := l.ObtainAll(ctx, []string{"a", ""}, time.Minute, 0)
	_, err3 := l.ObtainAll(ctx, nil, time.Minute, 0)
	if !errors.Is(err1, reqlock.ErrInvalid) || !errors.Is(err2, reqlock.ErrInvalid) || !errors.Is(err3, reqlock.ErrInvalid) {
		t.Fatal(err1, err2, err3)
	}
	invalid := labelled(reqlock.OutcomeInvalid)
	m.expectOutcomes(t, invalid, invalid, invalid)

	// A failing store.
	failing := reqlock.MustNew(&faultStore{Store: mem, acquireErr: errors.New("connection refused")}, reqlock.WithMetrics(m))
	if _, err := failing.Obtain(ctx, "s", time.Minute, time.Second); !errors.Is(err, reqlock.ErrStore) {
		t.Fatal(err)
	}
	if _, err := failing.ObtainAll(ctx, []string{"s", "t"}, time.Minute, 0); !errors.Is(err, reqlock.ErrStore) {
		t.Fatal(err)
	}
	storeError := labelled(reqlock.OutcomeStoreError)
	m.expectOutcomes(t, storeError, storeError)

	// The request's own lock, lost, asked for again.
	lost := mustObtain(t, ctx, l, "gone")
	if err := mem.Release(bg, []string{"reqlock:gone"}, lost.Token(), 0); err != nil {
		t.Fatal(err)
	}
	if err := lost.Refresh(bg, 0); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatal(err)
	}
	if _, err := l.Obtain(context.WithoutCancel(reqlock.NewContext(ctx, lost)), "gone", time.Minute, time.Second); !errors.Is(err, reqlock.ErrLockLost) {
		t.Fatal(err)
	}
	m.expectOutcomes(t, labelled(reqlock.OutcomeAcquired), labelled(reqlock.OutcomeLost))
	_ = lost.Release(bg)
	m.takeHeld()

	mustRelease(t, lock)
	if held := m.takeHeld(); len(held) != 1 || held[0].label != route {
		t.Fatalf("Held events %v, want one for %q", held, route)
	}
	if m.outcomes() != nil {
		t.Fatal("Release reported an Obtained event")
	}
}

func TestMetricsLabels(t *testing.T) {
	m := &recMetrics{}
	l := reqlock.MustNew(memstore.New(), reqlock.WithMetrics(m))
	if l.Metrics() != m {
		t.Fatal("Metrics() does not return the Locker's Metrics")
	}
	bg := context.Background()
	for _, ctx := range []context.Context{bg, reqlock.WithLabel(bg, "")} {
		lock := mustObtain(t, ctx, l, "k")
		if _, err := l.Obtain(ctx, "k", time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
			t.Fatalf("second Obtain of a held key: %v, want ErrHeld", err)
		}
		mustRelease(t, lock)
		m.expectOutcomes(t, reqlock.UnlabeledRoute+" acquired", reqlock.UnlabeledRoute+" timeout")
		if held := m.takeHeld(); len(held) != 1 || held[0].label != reqlock.UnlabeledRoute {
			t.Fatalf("Held events %v, want one for %q", held, reqlock.UnlabeledRoute)
		}
	}

	// A context that carries a lock labels further locks with that lock's
	// label, unless WithLabel says otherwise.
	outer := mustObtain(t, reqlock.WithLabel(bg, "outer"), l, "a")
	ctx := reqlock.NewContext(bg, outer)
	inherited := mustObtain(t, ctx, l, "b")
	relabelled := mustObtain(t, reqlock.WithLabel(ctx, "other"), l, "c")
	m.expectOutcomes(t, "outer acquired", "outer acquired", "other acquired")
	mustRelease(t, inherited, relabelled, outer)
	var labels []string
	for _, h := range m.takeHeld() {
		labels = append(labels, h.label)
	}
	if want := []string{"outer", "other", "outer"}; !slices.Equal(labels, want) {
		t.Fatalf("Held for %q, want %q", labels, want)
	}
}

func TestMetricsHeldOncePerGrant(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
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
			mustRelease(t, lock)
			after := time.Since(before)
			if err := lock.Release(bg); !errors.Is(err, reqlock.ErrNotHeld) { // a second release is no release
				t.Fatalf("%q: second release: %v, want ErrNotHeld", keys, err)
			}
			held := m.takeHeld()
			if len(held) != 1 || held[0].label != "outer" {
				t.Fatalf("%q: Held events %v, want one for outer", keys, held)
			}
			if d := held[0].held; d < releasing.Sub(obtained) || d > after {
				t.Fatalf("%q: held for between %v and %v, reported %v", keys, releasing.Sub(obtained), after, d)
			}
		}
		m.expectOutcomes(t, "outer acquired", "outer acquired")

		// Reentrant calls count as acquired, under their own label; Held
		// comes once per grant, under the label of the lock that obtained
		// it, whichever hold ends last.
		for _, outerFirst := range []bool{true, false} {
			outer := mustObtain(t, outerCtx, l, "k")
			inner := reqlock.WithLabel(reqlock.NewContext(bg, outer), "inner")
			v1 := mustObtain(t, inner, l, "k")
			v2, err := l.ObtainAll(reqlock.NewContext(inner, v1), []string{"k", "n"}, time.Minute, 0)
			if err != nil {
				t.Fatal(err)
			}
			m.expectOutcomes(t, "outer acquired", "inner acquired", "inner acquired")
			order := []*reqlock.Lock{v2, v1, outer}
			if outerFirst {
				order = []*reqlock.Lock{outer, v1, v2}
			}
			mustRelease(t, order...)
			// v2 obtained n, a grant of its own.
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
		lock := mustObtain(t, outerCtx, l, "h")
		lock.HoldAtLeast(time.Hour)
		mustRelease(t, lock)
		if held := m.takeHeld(); len(held) != 1 || held[0].label != "outer" {
			t.Fatalf("hold-at-least: Held events %v, want one for outer", held)
		}
	})
}

func TestMetricsHandedOff(t *testing.T) {
	m := &recMetrics{}
	l := reqlock.MustNew(memstore.New(), reqlock.WithMetrics(m))
	bg := context.Background()
	holder := mustObtain(t, reqlock.WithLabel(bg, "holder"), l, "k")
	got := make(chan obtained, 3)
	for i := range 3 {
		go func() {
			lock, err := l.Obtain(reqlock.WithLabel(bg, fmt.Sprintf("waiter%d", i)), "k", time.Minute, 10*time.Second)
			got <- obtained{lock, err, time.Now()} // reported by the test, never after it ends
		}()
		eventually(t, "the waiter queued", func() bool { return reqlock.LocalWaiters(l, "reqlock:k") == i+1 })
	}
	mustRelease(t, holder)
	for i := range 3 {
		r := <-got
		if r.err != nil {
			t.Fatalf("waiter: %v", r.err)
		}
		if r.lock.Token() != holder.Token() {
			t.Fatal("the waiter did not get the grant by handoff")
		}
		if _, handedOff := m.snapshot(); !slices.Equal(handedOff, []string{"waiter0", "waiter1", "waiter2"}[:i+1]) {
			t.Fatalf("HandedOff events %q after %d handoffs", handedOff, i+1)
		}
		mustRelease(t, r.lock)
	}
	// Held at each handoff, under the label of the holder that let go.
	var labels []string
	for _, h := range m.takeHeld() {
		labels = append(labels, h.label)
	}
	if want := []string{"holder", "waiter0", "waiter1", "waiter2"}; !slices.Equal(labels, want) {
		t.Fatalf("Held for %q, want %q", labels, want)
	}
	m.expectOutcomes(t, "holder acquired", "waiter0 acquired", "waiter1 acquired", "waiter2 acquired")
	if lost, _ := m.snapshot(); lost != nil {
		t.Fatalf("Lost events %q", lost)
	}
}

// TestMetricsLost: Lost comes once per lost lock, under its label, whoever
// found the loss: the watchdog, a Refresh, or the validity running out.
func TestMetricsLost(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		m := &recMetrics{}
		l := e.locker(t, reqlock.WithMetrics(m))
		bg := context.Background()
		lostCtx := reqlock.WithLabel(bg, "lost")
		for _, keys := range [][]string{{"k"}, {"a", "b"}} {
			lock, err := l.ObtainAll(lostCtx, keys, wdTTL, 0)
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
			if lost := m.takeLost(); !slices.Equal(lost, []string{"lost"}) {
				t.Fatalf("%q: Lost events %q, want one for lost", keys, lost)
			}
		}

		// Found by a Refresh, without a watchdog.
		lock := mustObtain(t, lostCtx, l, "r")
		e.remove(t, e.prefix+"r", lock.Token())
		if err := lock.Refresh(bg, 0); !errors.Is(err, reqlock.ErrNotHeld) {
			t.Fatalf("refresh: %v, want ErrNotHeld", err)
		}
		_ = lock.Refresh(bg, 0)
		_ = lock.Release(bg)
		if lost := m.takeLost(); !slices.Equal(lost, []string{"lost"}) {
			t.Fatalf("refresh: Lost events %q, want one for lost", lost)
		}

		// The validity running out, with the lock's context watching it.
		lock, err := l.Obtain(lostCtx, "v", 50*time.Millisecond, 0)
		if err != nil {
			t.Fatal(err)
		}
		waitDone(t, reqlock.NewContext(bg, lock), 5*time.Second)
		_ = lock.Release(bg)
		if lost := m.takeLost(); !slices.Equal(lost, []string{"lost"}) {
			t.Fatalf("validity: Lost events %q, want one for lost", lost)
		}

		// A lock released in time is not lost.
		lock = mustObtain(t, bg, l, "fine")
		lock.KeepAlive(bg)
		_ = reqlock.NewContext(bg, lock)
		mustRelease(t, lock)
		if lost := m.takeLost(); lost != nil {
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

// TestLostAgreesWithKeepAliveContext: by the time Metrics.Lost is told of a
// loss, Lost reports it, and the keep-alive context ends with that same
// cause once Metrics has been told: whoever sees the context end sees the
// loss counted.
func TestLostAgreesWithKeepAliveContext(t *testing.T) {
	mem := memstore.New()
	m := &blockingLost{entered: make(chan struct{}), release: make(chan struct{})}
	l := reqlock.MustNew(mem, reqlock.WithMetrics(m), quiet)
	bg := context.Background()
	lock, err := l.Obtain(bg, "k", wdTTL, 0)
	if err != nil {
		t.Fatal(err)
	}
	kctx := lock.KeepAlive(bg)
	if err := mem.Release(bg, []string{"reqlock:k"}, lock.Token(), 0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.entered:
	case <-time.After(5 * time.Second):
		close(m.release)
		t.Fatal("the watchdog never reported the loss to Metrics")
	}
	lost := lock.Lost()
	close(m.release)
	if !errors.Is(lost, reqlock.ErrLockLost) || !errors.Is(lost, reqlock.ErrNotHeld) {
		t.Fatalf("Lost() = %v while Metrics.Lost ran, want ErrLockLost and ErrNotHeld", lost)
	}
	waitDone(t, kctx, 5*time.Second)
	expectLost(t, kctx, reqlock.ErrNotHeld)
	if lost != context.Cause(kctx) {
		t.Fatalf("Lost() = %v, but the keep-alive context ended with %v", lost, context.Cause(kctx))
	}
	if err := lock.Release(bg); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("release of a lost lock: %v, want ErrNotHeld", err)
	}
	if lost := lock.Lost(); lost != context.Cause(kctx) {
		t.Fatalf("Lost() after Release = %v", lost)
	}
	if events, _ := m.snapshot(); len(events) != 1 {
		t.Fatalf("Lost events %q, want one", events)
	}
}
