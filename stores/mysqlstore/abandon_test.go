package mysqlstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// testCallLimit is the call limit of the stores of the tests below.
const testCallLimit = 300 * time.Millisecond

// warm locks and releases keys of its own through s, so that its pool has
// a connection open, with its session known and its statements prepared,
// and the faults that follow catch the acquire itself.
func warm(t *testing.T, s *Store, n int) {
	t.Helper()
	k := testKeys(n)
	mustAcquire(t, s, k, "warm", time.Minute)
	if err := s.Release(t.Context(), k, "warm", 0); err != nil {
		t.Fatalf("warm-up Release: %v", err)
	}
}

// TestAbandonedAcquireLongPause: an acquire abandoned on a server that
// stalls for longer than the call limit and the first tries of its undo
// leaves no grant once the server answers again. The Store used to bound
// the statement by a minute and try its undo once, for 5s: the undo failed
// during the stall, nobody tried it again, and the statement, still queued
// for the server, took the key for its whole TTL when the stall ended.
func TestAbandonedAcquireLongPause(t *testing.T) {
	direct := newStore(t, openDB(t))
	for _, n := range []int{1, 3} {
		p, db := proxiedDB(t)
		s := newStore(t, db, WithCallLimit(testCallLimit))
		warm(t, s, n)
		keys := testKeys(n)
		p.Stall(faultproxy.Both)
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		_, err := s.Acquire(ctx, keys, "t1", 5*time.Minute)
		cancel()
		if !errors.Is(err, stores.ErrAbandoned) {
			t.Fatalf("%d keys: Acquire on a stalled server: %v, want stores.ErrAbandoned", n, err)
		}
		<-time.After(5 * testCallLimit) // the stall itself, past the call limit and an undo's try
		p.Heal()
		expectFreeForGood(t, direct, keys, 3*time.Second)
	}
}

// TestCallLimitWithLiveCaller: an acquire of one key whose statement has no
// answer within the call limit while its caller still waits ends with an
// error wrapping stores.ErrAbandoned and context.DeadlineExceeded, not a
// plain error: the Store undoes it (it ends the session that carried the
// statement, so that it cannot apply late, and releases the key) rather
// than leave the caller's single release to race the statement. The
// caller's context outlasts the stall, so the undo is done when the call
// returns: the key is free at once, and stays free. (An acquire of several
// keys that sent no COMMIT cannot commit later: its error is the plain
// deadline, and the keys are free too.)
func TestCallLimitWithLiveCaller(t *testing.T) {
	direct := newStore(t, openDB(t))
	for _, n := range []int{1, 3} {
		p, db := proxiedDB(t)
		s := newStore(t, db, WithCallLimit(testCallLimit))
		warm(t, s, n)
		keys := testKeys(n)
		p.Stall(faultproxy.Both)
		healed := time.AfterFunc(4*testCallLimit, p.Heal) // the stall itself
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		g, err := s.Acquire(ctx, keys, "t1", 5*time.Minute)
		cancel()
		healed.Stop()
		p.Heal()
		if g.OK || !errors.Is(err, context.DeadlineExceeded) || (n == 1 && !errors.Is(err, stores.ErrAbandoned)) {
			t.Fatalf("%d keys: Acquire past the call limit: %+v, %v; want stores.ErrAbandoned and context.DeadlineExceeded", n, g, err)
		}
		expectFreeForGood(t, direct, keys, 0)
	}
}

// TestOpenCallLimit: Open's call_limit sets the call limit; a duration that
// is not positive is refused.
func TestOpenCallLimit(t *testing.T) {
	_, opts, _, err := parseURL(testURL(t, "call_limit=2s"))
	if err != nil {
		t.Fatalf("parseURL with call_limit=2s: %v", err)
	}
	s := &Store{}
	for _, o := range opts {
		if err := o(s); err != nil {
			t.Fatal(err)
		}
	}
	if s.callLimit != 2*time.Second {
		t.Fatalf("call_limit=2s set the call limit to %v", s.callLimit)
	}
	for _, bad := range []string{"0s", "-1s", "soon"} {
		if _, _, _, err := parseURL(testURL(t, "call_limit="+bad)); err == nil {
			t.Fatalf("parseURL with call_limit=%s succeeded", bad)
		}
	}
}
