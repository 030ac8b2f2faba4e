package reqlock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
)

// TestSharedLocksRunTogether: shared locks of one key are granted at once,
// each with its own token and a higher fence; an exclusive Obtain of the
// key is refused while they hold it, and its fence is above theirs.
func TestSharedLocksRunTogether(t *testing.T) {
	l, store := newLocker(t)
	ctx := context.Background()
	a, err := l.ObtainShared(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.ObtainShared(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatalf("second shared lock: %v", err)
	}
	if a.Token() == b.Token() || b.Fence() <= a.Fence() {
		t.Fatalf("shared locks share a token or fences do not grow: %q %d, %q %d", a.Token(), a.Fence(), b.Token(), b.Fence())
	}
	if n := store.Holders("reqlock:k"); n != 2 {
		t.Fatalf("the store has %d holders, want 2", n)
	}
	if _, err := l.Obtain(ctx, "k", time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
		t.Fatalf("exclusive Obtain over shared holders: %v, want ErrHeld", err)
	}
	mustRelease(t, a, b)
	w := mustObtain(t, ctx, l, "k")
	if w.Fence() <= b.Fence() {
		t.Fatalf("the writer's fence %d is not above the reader's %d", w.Fence(), b.Fence())
	}
	mustRelease(t, w)
	if n := store.Len(); n != 0 {
		t.Fatalf("%d grants left in the store", n)
	}
}

// TestWriterNotStarvedByReaders: two Lockers (two processes) keep a key read
// by overlapping readers; a writer that waits gets the key within a
// bounded time, and no reader runs while it writes.
func TestWriterNotStarvedByReaders(t *testing.T) {
	l1, store := newLocker(t)
	l2, err := reqlock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	var (
		readers atomic.Int64
		writing atomic.Bool
		bad     atomic.Int64
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	for i := range 10 {
		l := []*reqlock.Locker{l1, l2}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				lock, err := l.ObtainShared(context.Background(), "report", time.Minute, 10*time.Second)
				if err != nil {
					bad.Add(1)
					return
				}
				readers.Add(1)
				if writing.Load() {
					bad.Add(1)
				}
				<-time.After(20 * time.Millisecond) // the reader's work
				readers.Add(-1)
				_ = lock.Release(context.Background())
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
		if n := bad.Load(); n != 0 {
			t.Errorf("%d readers failed or ran during the write", n)
		}
	}()
	eventually(t, "readers overlap", func() bool { return readers.Load() >= 2 })
	start := time.Now()
	w, err := l1.Obtain(context.Background(), "report", time.Minute, 10*time.Second)
	if err != nil {
		t.Fatalf("the writer among readers: %v", err)
	}
	took := time.Since(start)
	writing.Store(true)
	if n := readers.Load(); n != 0 {
		t.Errorf("the writer runs with %d readers", n)
	}
	<-time.After(20 * time.Millisecond) // the writer's work
	writing.Store(false)
	mustRelease(t, w)
	// The readers hold 20ms each: the writer waits for those in, about
	// one hold, plus its retries. 2s is generous on a loaded machine.
	if took > 2*time.Second {
		t.Fatalf("the writer waited %v among readers of 20ms", took)
	}
	t.Logf("the writer waited %v among 10 readers of 20ms on two Lockers", took)
}

// TestLimitNeverExceeded: 24 goroutines on two Lockers share a limit of 3;
// never more than 3 run at once, and 3 do.
func TestLimitNeverExceeded(t *testing.T) {
	l1, store := newLocker(t)
	l2, err := reqlock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	const limit = 3
	var (
		active, peak, over atomic.Int64
		wg                 sync.WaitGroup
	)
	for i := range 24 {
		l := []*reqlock.Locker{l1, l2}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				lock, err := l.ObtainLimited(context.Background(), "tenant", limit, time.Minute, 20*time.Second)
				if err != nil {
					t.Errorf("ObtainLimited: %v", err)
					return
				}
				a := active.Add(1)
				for p := peak.Load(); a > p && !peak.CompareAndSwap(p, a); p = peak.Load() {
				}
				if a > limit {
					over.Add(1)
				}
				<-time.After(2 * time.Millisecond) // the holder's work
				active.Add(-1)
				if err := lock.Release(context.Background()); err != nil {
					t.Errorf("Release: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	if over.Load() != 0 || peak.Load() != limit {
		t.Fatalf("peak %d holders, %d times over the limit %d", peak.Load(), over.Load(), limit)
	}
	if n := store.Len(); n != 0 {
		t.Fatalf("%d grants left in the store", n)
	}
}

// TestLimitedWaitEndsLeavesNoPlace: a limited Obtain whose wait ends on a
// full key fails with ErrHeld and leaves no place behind.
func TestLimitedWaitEndsLeavesNoPlace(t *testing.T) {
	l, store := newLocker(t)
	a, err := l.ObtainLimited(context.Background(), "k", 1, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.ObtainLimited(context.Background(), "k", 1, time.Minute, 50*time.Millisecond)
	if !errors.Is(err, reqlock.ErrHeld) || !errors.Is(err, reqlock.ErrWaitEnded) {
		t.Fatalf("a limited Obtain on a full key: %v, want ErrWaitEnded and ErrHeld", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := l.ObtainLimited(ctx, "k", 1, time.Minute, time.Minute)
		done <- err
	}()
	cancel()
	if err := within(t, done, 5*time.Second, "a cancelled limited Obtain returned"); err == nil {
		t.Fatal("a cancelled limited Obtain was granted")
	}
	mustRelease(t, a)
	if n := store.Holders("reqlock:k"); n != 0 {
		t.Fatalf("%d holders left after the only one released", n)
	}
	b, err := l.ObtainLimited(context.Background(), "k", 1, time.Minute, 0)
	if err != nil {
		t.Fatalf("the free place: %v", err)
	}
	mustRelease(t, b)
}

// TestSharedLockKeptAlive: a shared lock's context renews its own place
// past its TTL, and its release frees that place alone. The TTL leaves a
// renewal (due every third of it) 667ms of lateness on a loaded machine:
// at 100ms, a -race run under load lost the place now and then.
func TestSharedLockKeptAlive(t *testing.T) {
	l, store := newLocker(t)
	ttl := time.Second
	a, err := l.ObtainShared(context.Background(), "k", ttl, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.ObtainShared(context.Background(), "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx := a.KeepAlive(context.Background())
	<-time.After(4 * ttl) // past the TTL: only renewals keep a
	if err := ctx.Err(); err != nil {
		t.Fatalf("the kept-alive shared lock's context ended: %v", context.Cause(ctx))
	}
	if n := store.Holders("reqlock:k"); n != 2 {
		t.Fatalf("%d holders after 4 TTLs of the renewed one, want 2", n)
	}
	mustRelease(t, a)
	if n := store.Holders("reqlock:k"); n != 1 {
		t.Fatalf("%d holders after one release, want 1", n)
	}
	if err := a.Release(context.Background()); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("a second Release: %v, want ErrNotHeld", err)
	}
	mustRelease(t, b)
}

// TestSharedReentry: a request that holds a key exclusively takes it shared
// or limited with no store call; one that holds it shared or limited is
// refused an exclusive or other-mode lock at once, with ErrInvalid.
func TestSharedReentry(t *testing.T) {
	l, store := newLocker(t)
	w := mustObtain(t, context.Background(), l, "k")
	ctx := reqlock.NewContext(context.Background(), w)
	r := obtainWithin(t, func() (*reqlock.Lock, error) { return l.ObtainShared(ctx, "k", time.Minute, time.Hour) })
	if r.Fence() != w.Fence() || store.Holders("reqlock:k") != 0 {
		t.Fatalf("the shared lock inside the exclusive one: fence %d (outer %d), %d holders in the store", r.Fence(), w.Fence(), store.Holders("reqlock:k"))
	}
	mustRelease(t, r, w)

	s, err := l.ObtainShared(context.Background(), "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx = reqlock.NewContext(context.Background(), s)
	inner := obtainWithin(t, func() (*reqlock.Lock, error) { return l.ObtainShared(ctx, "k", time.Minute, time.Hour) })
	mustRelease(t, inner)
	for name, obtain := range map[string]func() (*reqlock.Lock, error){
		"exclusive": func() (*reqlock.Lock, error) { return l.Obtain(ctx, "k", time.Minute, time.Hour) },
		"limited":   func() (*reqlock.Lock, error) { return l.ObtainLimited(ctx, "k", 2, time.Minute, time.Hour) },
	} {
		got := make(chan error, 1)
		go func() {
			_, err := obtain()
			got <- err
		}()
		if err := within(t, got, 5*time.Second, name+" Obtain inside a shared lock returned"); !errors.Is(err, reqlock.ErrInvalid) {
			t.Fatalf("%s Obtain inside a shared lock: %v, want ErrInvalid", name, err)
		}
	}
	mustRelease(t, s)
}

// exclusiveOnly is a real store seen through the plain stores.Store
// interface alone: a store without shared locks (a store of your own).
type exclusiveOnly struct{ stores.Store }

// TestSharedNeedsSharedStore: a Locker on a store without stores.SharedStore
// refuses shared and limited locks with ErrInvalid naming the store, before
// any store call; bad limits too.
func TestSharedNeedsSharedStore(t *testing.T) {
	l, err := reqlock.New(exclusiveOnly{memstore.New()})
	if err != nil {
		t.Fatal(err)
	}
	err = l.CheckShared()
	if !errors.Is(err, reqlock.ErrInvalid) || !strings.Contains(err.Error(), "exclusiveOnly") {
		t.Fatalf("CheckShared on a store without shared locks: %v, want ErrInvalid naming the store", err)
	}
	if _, err := l.ObtainShared(context.Background(), "k", time.Minute, 0); !errors.Is(err, reqlock.ErrInvalid) {
		t.Fatalf("ObtainShared on a store without shared locks: %v, want ErrInvalid", err)
	}
	if _, err := l.ObtainLimited(context.Background(), "k", 2, time.Minute, 0); !errors.Is(err, reqlock.ErrInvalid) {
		t.Fatalf("ObtainLimited on a store without shared locks: %v, want ErrInvalid", err)
	}
	mem, _ := newLocker(t)
	if err := mem.CheckShared(); err != nil {
		t.Fatalf("CheckShared on memstore: %v", err)
	}
	if _, err := mem.ObtainLimited(context.Background(), "k", 0, time.Minute, 0); !errors.Is(err, reqlock.ErrInvalid) {
		t.Fatalf("ObtainLimited with limit 0: %v, want ErrInvalid", err)
	}
}

// writerCounter wraps a memstore and counts Release calls, and tells when an
// Acquire was refused by shared holders (the store recorded a writer).
type writerCounter struct {
	*memstore.Store
	releases atomic.Int64
	refused  chan struct{} // receives after each refusal by shared holders
}

func (c *writerCounter) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	g, err := c.Store.Acquire(ctx, keys, token, ttl)
	if g.SharedHeld {
		select {
		case c.refused <- struct{}{}:
		default:
		}
	}
	return g, err
}

func (c *writerCounter) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	c.releases.Add(1)
	return c.Store.Release(ctx, keys, token, keep)
}

// TestWriterGivingUpWithdraws: an exclusive Obtain refused by readers that
// ends without a grant (try-once, wait ended) withdraws its waiting-writer
// record with one Release before it returns, so a new reader gets in at
// once; a cancelled one withdraws it too (in the background when the
// cancellation cut a store call short). An Obtain refused by an exclusive
// holder, and an uncontended one, make no such call.
func TestWriterGivingUpWithdraws(t *testing.T) {
	c := &writerCounter{Store: memstore.New(), refused: make(chan struct{}, 1)}
	l := reqlock.MustNew(c)
	ctx := context.Background()
	calls := func(what string, want int64, f func()) {
		t.Helper()
		before := c.releases.Load()
		f()
		if n := c.releases.Load() - before; n != want {
			t.Fatalf("%s: %d Release calls, want %d", what, n, want)
		}
	}
	calls("an uncontended exclusive lock", 1, func() {
		lock, err := l.Obtain(ctx, "k", time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		mustRelease(t, lock)
	})
	w, err := l.Obtain(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	calls("a try-once writer refused by a writer", 0, func() {
		if _, err := l.Obtain(ctx, "k", time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
			t.Fatalf("a try-once writer over a writer: %v, want ErrHeld", err)
		}
	})
	mustRelease(t, w)

	for _, name := range []string{"try-once", "wait ended"} {
		wait := time.Duration(0)
		if name == "wait ended" {
			wait = 50 * time.Millisecond
		}
		r, err := l.ObtainShared(ctx, "k", time.Minute, 0)
		if err != nil {
			t.Fatalf("%s: a reader: %v", name, err)
		}
		calls(name+" writer refused by a reader", 1, func() {
			if _, err := l.Obtain(ctx, "k", time.Minute, wait); !errors.Is(err, reqlock.ErrHeld) {
				t.Fatalf("%s writer over a reader: %v, want ErrHeld", name, err)
			}
		})
		mustRelease(t, r)
		r2, err := l.ObtainShared(ctx, "k", time.Minute, 0)
		if err != nil {
			t.Fatalf("a reader of a free key after a %s writer gave up: %v", name, err)
		}
		mustRelease(t, r2)
	}

	r, err := l.ObtainShared(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.refused: // a report of an earlier case
	default:
	}
	before := c.releases.Load()
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := l.Obtain(cctx, "k", time.Minute, time.Minute)
		done <- err
	}()
	within(t, c.refused, 5*time.Second, "the writer refused by the reader")
	cancel()
	if err := within(t, done, 5*time.Second, "the cancelled writer returned"); err == nil {
		t.Fatal("a cancelled writer was granted over a reader")
	}
	gaveUp := time.Now()
	mustRelease(t, r)
	eventually(t, "a reader of a free key after a cancelled writer", func() bool {
		r2, err := l.ObtainShared(ctx, "k", time.Minute, 0)
		if err != nil {
			return false
		}
		mustRelease(t, r2)
		return true
	})
	if took := time.Since(gaveUp); took >= stores.WriterWindow/2 {
		t.Fatalf("a reader got in %v after the cancelled writer gave up: its record was not withdrawn", took)
	}
	if c.releases.Load() == before {
		t.Fatal("the cancelled writer made no Release call")
	}
}
