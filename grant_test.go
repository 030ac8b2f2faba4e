package reqlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
)

// refreshFaults wraps a real store: a Refresh may be held until released
// (started reports that it began), or may reach the store and then report
// failure, as a reply lost after the store applied the call would.
type refreshFaults struct {
	stores.Store
	mu           sync.Mutex
	holdNext     chan struct{} // the next Refresh waits for it to close
	started      chan struct{} // receives when a held Refresh began
	failAfterRun error         // every Refresh runs, then returns this
}

func (s *refreshFaults) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	s.mu.Lock()
	hold, fail := s.holdNext, s.failAfterRun
	s.holdNext = nil
	s.mu.Unlock()
	if hold != nil {
		s.started <- struct{}{}
		<-hold
	}
	err := s.Store.Refresh(ctx, keys, token, ttl)
	if fail != nil {
		return fail
	}
	return err
}

// NotifyRelease forwards to the wrapped store, so wrapping keeps wake-ups.
func (s *refreshFaults) NotifyRelease(key, token string) (<-chan struct{}, func()) {
	return s.Store.(stores.Notifier).NotifyRelease(key, token)
}

// obtainAsync starts an Obtain and returns where its outcome arrives.
func obtainAsync(l *reqlock.Locker, key string, ttl time.Duration) <-chan *reqlock.Lock {
	got := make(chan *reqlock.Lock, 1)
	go func() {
		lock, err := l.Obtain(context.Background(), key, ttl, 10*time.Second)
		if err != nil {
			lock = nil
		}
		got <- lock
	}()
	return got
}

// awaitLocalWaiters polls until n requests wait in l's local queue for key.
func awaitLocalWaiters(t *testing.T, l *reqlock.Locker, key string, n int) {
	t.Helper()
	pollUntil(t, func() bool { return reqlock.LocalWaiters(l, "reqlock:"+key) == n })
}

func receiveLock(t *testing.T, got <-chan *reqlock.Lock, who string) *reqlock.Lock {
	t.Helper()
	select {
	case lock := <-got:
		if lock == nil {
			t.Fatalf("%s did not get the lock", who)
		}
		return lock
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not get the lock within 10s", who)
	}
	return nil
}

// A grant handed from a long-TTL holder to a short-TTL one carries no more
// validity than the recipient's TTL confirms; after a renewal whose outcome
// is unknown (the store applied it, the reply failed) the validity is the
// shorter of the two possible ends, and the grant is not handed on again:
// the next waiter gets a grant of its own from the store.
func TestGrantValidityAfterHandoffAndUnknownRenewal(t *testing.T) {
	mem := memstore.New()
	faults := &refreshFaults{Store: mem}
	l := reqlock.MustNew(faults)
	ctx := context.Background()
	long, err := l.Obtain(ctx, "k", 10*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	const shortTTL = 300 * time.Millisecond
	gotShort := obtainAsync(l, "k", shortTTL)
	awaitLocalWaiters(t, l, "k", 1)
	gotNext := obtainAsync(l, "k", 10*time.Second)
	awaitLocalWaiters(t, l, "k", 2)

	if err := long.Release(ctx); err != nil {
		t.Fatal(err)
	}
	short := receiveLock(t, gotShort, "the short-TTL waiter")
	if short.Token() != long.Token() {
		t.Fatal("the short-TTL waiter did not get the grant by handoff; this test needs the handoff")
	}
	if left := time.Until(short.ValidUntil()); left > shortTTL {
		t.Fatalf("handed-off validity %v exceeds the recipient's TTL %v: the store was never told that TTL", left, shortTTL)
	}

	faults.mu.Lock()
	faults.failAfterRun = errors.New("i/o timeout after the store applied the renewal")
	faults.mu.Unlock()
	before := time.Now()
	if err := short.Refresh(ctx, 0); !errors.Is(err, reqlock.ErrStore) {
		t.Fatalf("renewal whose reply failed: %v, want ErrStore", err)
	}
	if bound := before.Add(shortTTL); short.ValidUntil().After(bound) {
		t.Fatalf("after an unknown renewal the validity ends %v after the call began, want at most the TTL %v",
			short.ValidUntil().Sub(before), shortTTL)
	}
	faults.mu.Lock()
	faults.failAfterRun = nil
	faults.mu.Unlock()

	if err := short.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next := receiveLock(t, gotNext, "the next waiter")
	defer next.Release(ctx)
	if next.Token() == short.Token() {
		t.Fatal("a grant whose validity was unknown after a failed renewal was handed on")
	}
	if next.Fence() <= short.Fence() {
		t.Fatalf("next fence %d, want above %d", next.Fence(), short.Fence())
	}
}

// A lock's context ends when the lock's validity runs out without a
// renewal, with a cause wrapping ErrLockLost, and a renewal moves that end.
func TestLockContextEndsWhenValidityRunsOut(t *testing.T) {
	l := reqlock.MustNew(memstore.New())
	ctx := context.Background()
	const ttl = 150 * time.Millisecond
	lock, err := l.Obtain(ctx, "k", ttl, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release(ctx)
	lctx := reqlock.NewContext(ctx, lock)
	time.Sleep(ttl / 2) // part of the lease goes by
	if err := lock.Refresh(ctx, 0); err != nil {
		t.Fatal(err)
	}
	renewedUntil := lock.ValidUntil()
	select {
	case <-lctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lock's context did not end when its validity ran out")
	}
	if early := time.Until(renewedUntil); early > 5*time.Millisecond {
		t.Fatalf("the context ended %v before the renewed validity", early)
	}
	if cause := context.Cause(lctx); !errors.Is(cause, reqlock.ErrLockLost) {
		t.Fatalf("cause %v, want ErrLockLost", cause)
	}
	if lost := lock.Lost(); !errors.Is(lost, reqlock.ErrLockLost) {
		t.Fatalf("Lost() = %v, want ErrLockLost", lost)
	}
}

// A lock's context ends with the release, with a cause wrapping ErrNotHeld,
// not ErrLockLost.
func TestLockContextEndsAtRelease(t *testing.T) {
	l := reqlock.MustNew(memstore.New())
	ctx := context.Background()
	lock, err := l.Obtain(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	lctx := reqlock.NewContext(ctx, lock)
	if lctx.Err() != nil {
		t.Fatal("a held lock's context has ended")
	}
	if err := lock.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if cause := context.Cause(lctx); !errors.Is(cause, reqlock.ErrNotHeld) || errors.Is(cause, reqlock.ErrLockLost) {
		t.Fatalf("cause %v, want ErrNotHeld without ErrLockLost", cause)
	}
	if lock.Lost() != nil {
		t.Fatalf("Lost() = %v after a plain release", lock.Lost())
	}
}

// pollUntil polls cond until it holds, failing after 5s.
func pollUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 5s")
		}
		time.Sleep(time.Millisecond) // poll interval inside a deadline
	}
}

// awaitContextEnd waits for ctx to end, failing after limit, and checks that
// it ended with ErrLockLost no later than slack after until.
func awaitContextEnd(t *testing.T, ctx context.Context, until time.Time, limit time.Duration) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(limit):
		t.Fatalf("the lock's context did not end within %v, though its validity ran out %v ago",
			limit, time.Since(until))
	}
	const slack = 300 * time.Millisecond // the timer's goroutine under -race, on a loaded machine
	if late := time.Since(until); late > slack {
		t.Fatalf("the lock's context ended %v after the validity ran out, want at most %v", late, slack)
	}
	if cause := context.Cause(ctx); !errors.Is(cause, reqlock.ErrLockLost) {
		t.Fatalf("cause %v, want ErrLockLost", cause)
	}
}

// A renewal to a shorter TTL whose outcome is unknown (the store applied it,
// the reply was lost) leaves the lock valid only until the shorter end, and
// the lock's context ends then, not at the longer validity it had before.
func TestUnknownShorterRenewalEndsContextAtShorterValidity(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		faults := &refreshFaults{Store: e.real}
		l := e.lockerOn(t, faults)
		ctx := context.Background()
		lock, err := l.Obtain(ctx, "k", time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer lock.Release(ctx)
		lctx := reqlock.NewContext(ctx, lock)

		faults.mu.Lock()
		faults.failAfterRun = errors.New("i/o timeout after the store applied the renewal")
		faults.mu.Unlock()
		const short = 200 * time.Millisecond
		if err := lock.Refresh(ctx, short); !errors.Is(err, reqlock.ErrStore) {
			t.Fatalf("renewal whose reply failed: %v, want ErrStore", err)
		}
		until := lock.ValidUntil()
		if left := time.Until(until); left > short {
			t.Fatalf("validity %v after an unknown renewal to %v, want at most that TTL", left, short)
		}
		// Before the fix the context ended a minute later.
		awaitContextEnd(t, lctx, until, 5*time.Second)
	})
}

// A reentrant lock that renews the shared grant to a shorter TTL moves the
// end of the outer lock's context, the handler's, to the shorter validity.
func TestReentrantShorterRenewalEndsOuterContext(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		l := e.locker(t)
		ctx := context.Background()
		outer, err := l.Obtain(ctx, "k", time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer outer.Release(ctx)
		octx := reqlock.NewContext(ctx, outer)
		inner, err := l.Obtain(octx, "k", time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer inner.Release(ctx)
		if inner.Token() != outer.Token() {
			t.Fatal("the nested Obtain did not re-enter the outer lock's grant")
		}
		const short = 200 * time.Millisecond
		if err := inner.Refresh(ctx, short); err != nil {
			t.Fatal(err)
		}
		until := outer.ValidUntil()
		if left := time.Until(until); left > short {
			t.Fatalf("outer validity %v after the shared grant was renewed to %v", left, short)
		}
		// Before the fix the outer context ended a minute later.
		awaitContextEnd(t, octx, until, 5*time.Second)
	})
}

// A renewal of unknown outcome may still land after a later one succeeded:
// the lock then trusts no more than the shorter TTL from each renewal on,
// and its grant is not handed on, so a waiter of this process gets a grant
// (and token) of its own.
func TestUnknownRenewalCapsLaterValidity(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *storeEnv) {
		faults := &refreshFaults{Store: e.real}
		l := e.lockerOn(t, faults)
		ctx := context.Background()
		lock, err := l.Obtain(ctx, "k", time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		const short = 200 * time.Millisecond
		faults.mu.Lock()
		faults.failAfterRun = errors.New("i/o timeout: the renewal may still land")
		faults.mu.Unlock()
		if err := lock.Refresh(ctx, short); !errors.Is(err, reqlock.ErrStore) {
			t.Fatalf("renewal whose reply failed: %v, want ErrStore", err)
		}
		faults.mu.Lock()
		faults.failAfterRun = nil
		faults.mu.Unlock()
		before := time.Now()
		if err := lock.Refresh(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		if left := lock.ValidUntil().Sub(before); left > short {
			t.Fatalf("validity %v after a confirmed renewal to 1m, want at most %v: the earlier renewal to %v may land after it",
				left, short, short)
		}
		got := obtainAsync(l, "k", time.Minute)
		pollUntil(t, func() bool { return reqlock.LocalWaiters(l, e.prefix+"k") == 1 })
		if err := lock.Release(ctx); err != nil {
			t.Fatal(err)
		}
		next := receiveLock(t, got, "the waiter")
		defer next.Release(ctx)
		if next.Token() == lock.Token() {
			t.Fatal("a grant with a renewal of unknown outcome was handed on: that renewal may still shorten it")
		}
	})
}
