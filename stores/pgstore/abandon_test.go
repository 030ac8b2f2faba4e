package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/pgstore"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// testCallLimit is the call limit of the stores of the tests below.
const testCallLimit = 300 * time.Millisecond

// testKeySets returns a set of one key and a set of three, of the test's own.
func testKeySets(t *testing.T) [][]string {
	prefix := fmt.Sprintf("abandon:%s:%d:", t.Name(), time.Now().UnixNano())
	return [][]string{{prefix + "1"}, {prefix + "a", prefix + "b", prefix + "c"}}
}

// warm locks and releases a key of its own through s, so that its pool has
// a connection open and the faults that follow catch the acquire itself.
func warm(t *testing.T, s *pgstore.Store) {
	t.Helper()
	k := []string{fmt.Sprintf("warm:%s:%d", t.Name(), time.Now().UnixNano())}
	if g, err := s.Acquire(t.Context(), k, "warm", time.Minute); err != nil || !g.OK {
		t.Fatalf("warm-up Acquire: %+v, %v", g, err)
	}
	if err := s.Release(t.Context(), k, "warm", 0); err != nil {
		t.Fatalf("warm-up Release: %v", err)
	}
}

// expectFreeForGood fails the test unless keys are free, probed by s,
// within limit, and then stay free for a second: nothing the proxied store
// left in flight lands later.
func expectFreeForGood(t *testing.T, s *pgstore.Store, keys []string, limit time.Duration) {
	t.Helper()
	start := time.Now()
	var freeSince time.Time
	for {
		g, err := s.Acquire(t.Context(), keys, "probe", time.Minute)
		if err != nil {
			t.Fatalf("probe Acquire: %v", err)
		}
		now := time.Now()
		switch {
		case g.OK:
			if err := s.Release(t.Context(), keys, "probe", 0); err != nil {
				t.Fatalf("probe Release: %v", err)
			}
			if freeSince.IsZero() {
				freeSince = now
			} else if now.Sub(freeSince) >= time.Second {
				return
			}
		case !freeSince.IsZero():
			t.Fatalf("held again (Wait %v) %v after it was seen free: the abandoned acquire landed after its undo", g.Wait, now.Sub(freeSince))
		case now.Sub(start) > limit:
			t.Fatalf("still held (Wait %v) %v after the fault healed: the abandoned acquire's grant was never undone", g.Wait, limit)
		}
		time.Sleep(20 * time.Millisecond) // between probes of a key the Store frees in the background
	}
}

// TestAbandonedAcquireLongPause: an acquire abandoned on a server that
// stalls for longer than the call limit and the first tries of its undo
// leaves no grant once the server answers again. The Store used to bound
// the statement by 5s and try its undo once, for 5s more: the undo failed
// during the stall, nobody tried it again, and the statement, still queued
// for the server, took the key for its whole TTL when the stall ended.
func TestAbandonedAcquireLongPause(t *testing.T) {
	direct := open(t, "")
	for _, keys := range testKeySets(t) {
		p, s := openProxiedLimited(t, testCallLimit)
		warm(t, s)
		p.Stall(faultproxy.Both)
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		_, err := s.Acquire(ctx, keys, "t1", time.Minute)
		cancel()
		if !errors.Is(err, stores.ErrAbandoned) {
			t.Fatalf("%d keys: Acquire on a stalled server: %v, want stores.ErrAbandoned", len(keys), err)
		}
		<-time.After(5 * testCallLimit) // the stall itself, past the call limit and an undo's try
		p.Heal()
		expectFreeForGood(t, direct, keys, 3*time.Second)
	}
}

// TestCallLimitWithLiveCaller: an acquire whose statement has no answer
// within the call limit while its caller still waits ends with an error
// wrapping stores.ErrAbandoned and context.DeadlineExceeded, not a plain
// error: the Store undoes it (it ends the session that carried the
// statement, so that it cannot apply late, and releases the keys) rather
// than leave the caller's single release to race the statement. The
// caller's context outlasts the stall, so the undo is done when the call
// returns: the keys are free at once, and stay free.
func TestCallLimitWithLiveCaller(t *testing.T) {
	direct := open(t, "")
	for _, keys := range testKeySets(t) {
		p, s := openProxiedLimited(t, testCallLimit)
		warm(t, s)
		p.Stall(faultproxy.Both)
		healed := time.AfterFunc(4*testCallLimit, p.Heal) // the stall itself
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		g, err := s.Acquire(ctx, keys, "t1", time.Minute)
		cancel()
		healed.Stop()
		p.Heal()
		if g.OK || !errors.Is(err, stores.ErrAbandoned) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%d keys: Acquire past the call limit: %+v, %v; want stores.ErrAbandoned and context.DeadlineExceeded", len(keys), g, err)
		}
		expectFreeForGood(t, direct, keys, 0)
	}
}

// TestAcquireRacingClose: Close while Acquires run returns, without the
// panic of a WaitGroup reused before its Wait returned, and every call
// after it returns ErrClosed. Acquire used to count itself in without
// looking whether the Store was closed.
func TestAcquireRacingClose(t *testing.T) {
	db := pool(t, testservers.PostgresDSN(t))
	for i := range 20 {
		s, err := pgstore.New(t.Context(), db)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for g := range 8 {
			wg.Go(func() {
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					// Bounded as the Store bounds a call, with room: eight
					// callers share the pool's few connections, and on a
					// loaded machine one waited past 1s for its turn.
					ctx, cancel := context.WithTimeout(context.Background(), 2*pgstore.DefaultCallLimit)
					k := []string{fmt.Sprintf("close:%d:%d:%d:%d", time.Now().UnixNano(), i, g, n)}
					_, err := s.Acquire(ctx, k, "t", time.Second)
					cancel()
					if err != nil && !errors.Is(err, pgstore.ErrClosed) {
						t.Errorf("Acquire racing Close: %v, want nil or pgstore.ErrClosed", err)
						return
					}
				}
			})
		}
		<-time.After(20 * time.Millisecond) // let the Acquires run
		closed := make(chan struct{})
		go func() {
			_ = s.Close()
			close(closed)
		}()
		select {
		case <-closed:
		case <-time.After(2 * pgstore.DefaultCallLimit):
			t.Fatal("Close racing Acquires never returned")
		}
		close(stop)
		wg.Wait()
		k := []string{"close:after"}
		if _, err := s.Acquire(t.Context(), k, "t", time.Second); !errors.Is(err, pgstore.ErrClosed) {
			t.Fatalf("Acquire after Close: %v, want pgstore.ErrClosed", err)
		}
		if err := s.Refresh(t.Context(), k, "t", time.Second); !errors.Is(err, pgstore.ErrClosed) {
			t.Fatalf("Refresh after Close: %v, want pgstore.ErrClosed", err)
		}
		if err := s.Release(t.Context(), k, "t", 0); !errors.Is(err, pgstore.ErrClosed) {
			t.Fatalf("Release after Close: %v, want pgstore.ErrClosed", err)
		}
	}
}

// TestCloseGivesUpAnUndoThatCannotLand: Close gives an undo that cannot
// reach the server one more try, within the call limit, and returns. (The
// Store is on a pool of the test's: pgxpool's own Close waits up to 15s for
// connections to a server that does not answer.)
func TestCloseGivesUpAnUndoThatCannotLand(t *testing.T) {
	u, err := url.Parse(testservers.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	p := faultproxy.New(t, u.Host)
	u.Host = p.Addr()
	s, err := pgstore.New(t.Context(), pool(t, u.String()), pgstore.WithCallLimit(testCallLimit))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	warm(t, s)
	keys := testKeySets(t)[0]
	p.Blackhole(faultproxy.Both)
	defer p.Heal() // before the pool closes
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	_, err = s.Acquire(ctx, keys, "t1", time.Minute)
	cancel()
	if !errors.Is(err, stores.ErrAbandoned) {
		t.Fatalf("Acquire on a blackholed server: %v, want stores.ErrAbandoned", err)
	}
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// The acquire's statement (one call limit), then one more try of its
	// undo (one more), and a margin for a loaded machine.
	if took := time.Since(start); took > 2*testCallLimit+2*time.Second {
		t.Fatalf("Close took %v with an undo that cannot land, want about %v", took, 2*testCallLimit)
	}
}

// TestOpenCallLimit: Open takes the call limit out of its URL, and refuses
// one that is not a positive duration.
func TestOpenCallLimit(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
	for _, bad := range []string{"0s", "-1s", "soon"} {
		if s, err := pgstore.Open(t.Context(), dsn+"&call_limit="+bad); !errors.Is(err, stores.ErrInvalid) {
			if err == nil {
				_ = s.Close()
			}
			t.Fatalf("Open with call_limit=%s: %v, want stores.ErrInvalid", bad, err)
		}
	}
	s, err := pgstore.Open(t.Context(), dsn+"&call_limit=2s")
	if err != nil {
		t.Fatalf("Open with call_limit=2s: %v", err)
	}
	_ = s.Close()
}
