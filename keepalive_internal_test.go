package reqlock

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
)

// faultyRefreshStore runs every Refresh, then, while fail is set, reports a
// failure as a reply lost after the store acted would.
type faultyRefreshStore struct {
	stores.Store
	fail      atomic.Bool
	refreshes atomic.Int32
}

func (s *faultyRefreshStore) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	s.refreshes.Add(1)
	err := s.Store.Refresh(ctx, keys, token, ttl)
	if s.fail.Load() {
		return errors.New("injected: reply lost")
	}
	return err
}

var quietLogger = WithLogger(slog.New(slog.DiscardHandler))

// expire pops a lock whose watched validity passed, checks it, and watches
// it again: a renewal that shrinks the validity, or a Release, between the
// check and the watch must be seen, or the context outlives the validity,
// or a released lock stays in the expiries heap.
func TestExpiryRecheckSeesRenewalsAndReleases(t *testing.T) {
	ctx := context.Background()
	// setup returns a lock with a context whose watch is stale: a
	// reentrant lock renewed the shared grant to a minute, which moves
	// nobody's watch, so expire checks the outer lock after 100ms and
	// finds it valid; in the window, inWindow runs.
	setup := func(t *testing.T, inWindow func(lock *Lock)) (*Locker, *Lock, context.Context, chan struct{}) {
		s := &faultyRefreshStore{Store: memstore.New()}
		l := MustNew(s, quietLogger)
		lock, err := l.Obtain(ctx, "k", 100*time.Millisecond, 0)
		if err != nil {
			t.Fatal(err)
		}
		lctx := NewContext(ctx, lock)
		inner, err := l.Obtain(lctx, "k", time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := inner.Refresh(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := inner.Release(ctx); err != nil {
			t.Fatal(err)
		}
		ran := make(chan struct{})
		l.expiries.mu.Lock()
		l.expiries.checked = func(checked *Lock) {
			if checked == lock {
				inWindow(lock)
				close(ran)
			}
		}
		l.expiries.mu.Unlock()
		_ = s
		return l, lock, lctx, ran
	}

	t.Run("ShrinkSeen", func(t *testing.T) {
		var s *faultyRefreshStore
		_, lock, lctx, ran := setup(t, func(lock *Lock) {
			// A renewal to 50ms whose outcome is unknown.
			s = lock.locker.store.(*faultyRefreshStore)
			s.fail.Store(true)
			if err := lock.Refresh(ctx, 50*time.Millisecond); !errors.Is(err, ErrStore) {
				t.Errorf("refresh: %v", err)
			}
		})
		<-ran
		select {
		case <-lctx.Done():
		case <-time.After(2 * time.Second):
			t.Fatalf("validity ran out %v ago, context still live", -time.Until(lock.ValidUntil()))
		}
	})

	t.Run("ReleaseSeen", func(t *testing.T) {
		l, _, _, ran := setup(t, func(lock *Lock) {
			if err := lock.Release(ctx); err != nil {
				t.Error(err)
			}
		})
		<-ran
		l.expiries.mu.Lock()
		n := len(l.expiries.locks)
		l.expiries.mu.Unlock()
		if n != 0 {
			t.Fatalf("released lock still in the expiries heap (%d locks watched)", n)
		}
	})
}

// A grant keeps only the locks whose contexts live among its watchers, not
// every reentrant lock that ever had a context.
func TestGrantForgetsEndedWatchers(t *testing.T) {
	ctx := context.Background()
	l := MustNew(memstore.New(), quietLogger)
	outer, err := l.Obtain(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Release(ctx)
	octx := NewContext(ctx, outer)
	for range 1000 {
		inner, err := l.Obtain(octx, "k", time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		_ = NewContext(octx, inner)
		if err := inner.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	g := outer.holds[0].g
	g.mu.Lock()
	n := len(g.watchers)
	g.mu.Unlock()
	if n > 1 {
		t.Fatalf("grant keeps %d watchers, 1 of them live", n)
	}
}

// After a renewal of unknown outcome with a TTL below the lock's, every
// later validity is capped at that TTL: the watchdog paces its renewals by
// it, not by the lock's TTL, which would make them due at once, back to
// back.
func TestWatchdogPacesByTrustedTTL(t *testing.T) {
	ctx := context.Background()
	s := &faultyRefreshStore{Store: memstore.New()}
	l := MustNew(s, quietLogger)
	lock, err := l.Obtain(ctx, "k", 3*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release(ctx)
	s.fail.Store(true)
	_ = lock.Refresh(ctx, 600*time.Millisecond) // e.g. a handler's short Refresh whose reply was lost
	s.fail.Store(false)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	lock.KeepAlive(wctx)
	before := s.refreshes.Load()
	time.Sleep(time.Second) // the span whose renewals are counted
	// Due every third of the trusted 600ms: about 5 in a second. Paced by
	// the lock's 3s TTL, they were due at once, every millisecond.
	if n := s.refreshes.Load() - before; n < 2 || n > 12 {
		t.Fatalf("%d renewals in 1s, want about 5: one per third of the trusted 600ms", n)
	}
	if err := lock.Lost(); err != nil {
		t.Fatalf("lock lost while the watchdog renewed it: %v", err)
	}
}

// A reentrant lock's renewal finds the shared grant gone: the outer lock,
// on the same grant, is lost too, and its context ends at once rather than
// when the validity runs out.
func TestGrantLossEndsEveryLocksContexts(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New()
	l := MustNew(mem, quietLogger)
	outer, err := l.Obtain(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	octx := NewContext(ctx, outer)
	inner, err := l.Obtain(octx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	ictx := NewContext(octx, inner)
	if err := mem.Release(ctx, []string{"reqlock:k"}, outer.Token(), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := mem.Acquire(ctx, []string{"reqlock:k"}, "someone-else", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := inner.Refresh(ctx, 0); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("refresh: %v", err)
	}
	<-ictx.Done()
	select {
	case <-octx.Done():
	case <-time.After(200 * time.Millisecond):
		t.Fatalf("the grant is known gone (someone else holds k) but the outer lock's context lives on; Lost() = %v", outer.Lost())
	}
}
