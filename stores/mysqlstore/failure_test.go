package mysqlstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// promptly bounds how long a call may take to return once its context
// ends, on a loaded machine.
const promptly = time.Second

// testKeys returns n sorted keys of the test's own.
func testKeys(n int) []string {
	prefix := "mysqlstore-test:" + rand.Text() + ":"
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + string(rune('a'+i))
	}
	slices.Sort(keys)
	return keys
}

// proxiedDB returns a fault proxy in front of the test MariaDB and a
// *sql.DB that reaches the server through it, closed when the test ends.
func proxiedDB(t testing.TB) (*faultproxy.Proxy, *sql.DB) {
	t.Helper()
	cfg, err := mysql.ParseDSN(testservers.MySQLDSN(t))
	if err != nil {
		t.Fatalf("ParseDSN: %v", err)
	}
	p := faultproxy.New(t, cfg.Addr)
	return p, openDB(t, func(cfg *mysql.Config) { cfg.Addr = p.Addr() })
}

// isCommit reports whether chunk is a COM_QUERY packet of COMMIT, as
// database/sql's Tx.Commit sends it through go-sql-driver/mysql.
func isCommit(chunk []byte) bool {
	return len(chunk) >= 5 && chunk[4] == 0x03 && bytes.EqualFold(bytes.TrimSpace(chunk[5:]), []byte("COMMIT"))
}

// errIsNot fails the test when err wraps any of targets.
func errIsNot(t *testing.T, err error, what string, targets ...error) {
	t.Helper()
	for _, target := range targets {
		if errors.Is(err, target) {
			t.Fatalf("%s: %v, which wraps %v", what, err, target)
		}
	}
}

// mustAcquire acquires keys for token and fails the test unless granted.
func mustAcquire(t *testing.T, s stores.Store, keys []string, token string, ttl time.Duration) stores.Grant {
	t.Helper()
	g, err := s.Acquire(t.Context(), keys, token, ttl)
	if err != nil || !g.OK {
		t.Fatalf("Acquire(%q, %q): %+v, %v; want granted", keys, token, g, err)
	}
	return g
}

// TestAbandonedAcquireIsUndone: an Acquire whose server stalls returns at
// once when its context ends, with ErrAbandoned and the context's error.
// Once the server answers, the store undoes the grant (one key: a release
// after the statement granted) or rolls it back (several keys: the
// transaction sees its caller leave before the COMMIT), and the keys are
// free for another token.
func TestAbandonedAcquireIsUndone(t *testing.T) {
	direct := newStore(t, openDB(t))
	for _, n := range []int{1, 3} {
		p, db := proxiedDB(t)
		s := newStore(t, db)
		keys := testKeys(n)
		// A grant and release first: the table exists, the statements are
		// prepared, and each key has a fence to compare with.
		before := mustAcquire(t, s, keys, "warm-up", time.Minute)
		if err := s.Release(t.Context(), keys, "warm-up", 0); err != nil {
			t.Fatalf("Release: %v", err)
		}

		p.Stall(faultproxy.Both)
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		start := time.Now()
		g, err := s.Acquire(ctx, keys, "abandoned", time.Minute)
		took := time.Since(start)
		cancel()
		if !errors.Is(err, stores.ErrAbandoned) || !errors.Is(err, context.DeadlineExceeded) || g.OK {
			t.Fatalf("%d keys: Acquire on a stalled server: %+v, %v; want ErrAbandoned joined with context.DeadlineExceeded", n, g, err)
		}
		if took > 200*time.Millisecond+promptly {
			t.Fatalf("%d keys: Acquire returned %v after it began, want about 200ms", n, took)
		}
		p.Heal()
		// Close waits for the call left in flight and its undo.
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		// One key: the statement ran, granted, and was released. Several:
		// the transaction saw its caller leave and rolled back instead of
		// committing, so there was nothing to undo.
		wantUndos := int64(0)
		if n == 1 {
			wantUndos = 1
		}
		if got := s.undos.Load(); got != wantUndos {
			t.Errorf("%d keys: %d undos of the abandoned Acquire, want %d", n, got, wantUndos)
		}
		after := mustAcquire(t, direct, keys, "after", time.Minute)
		for i, k := range keys {
			if after.Fences[i]-before.Fences[i] < stores.FenceStride {
				t.Errorf("%q: fence %d after %d, want at least a stride above", k, after.Fences[i], before.Fences[i])
			}
		}
		if err := direct.Release(t.Context(), keys, "after", 0); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
}

// TestCallsReturnWhenContextEnds: Release and Refresh on a stalled server
// return once their context ends, with its error and not ErrAbandoned
// (there is nothing for the store to undo), and act once the server
// answers: the lease is refreshed or released as asked.
func TestCallsReturnWhenContextEnds(t *testing.T) {
	p, db := proxiedDB(t)
	s := newStore(t, db)
	keys := testKeys(2)
	mustAcquire(t, s, keys, "t1", time.Minute)
	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Refresh", func(ctx context.Context) error { return s.Refresh(ctx, keys, "t1", time.Minute) }},
		{"Release", func(ctx context.Context) error { return s.Release(ctx, keys, "t1", 0) }},
	}
	for _, c := range calls {
		p.Stall(faultproxy.Both)
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		go func() { errc <- c.call(ctx) }()
		time.AfterFunc(50*time.Millisecond, cancel)
		select {
		case err := <-errc:
			if !errors.Is(err, context.Canceled) || errors.Is(err, stores.ErrAbandoned) {
				t.Fatalf("%s on a stalled server: %v, want context.Canceled without ErrAbandoned", c.name, err)
			}
		case <-time.After(promptly):
			t.Fatalf("%s on a stalled server: not returned %v after its context ended", c.name, promptly)
		}
		p.Heal()
	}
	direct := newStore(t, openDB(t))
	// The Release left in flight ran once the server answered.
	deadline := time.Now().Add(5 * time.Second)
	for {
		g, err := direct.Acquire(t.Context(), keys, "t2", time.Minute)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if g.OK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Release left in flight never ran: %+v", g)
		}
		time.Sleep(10 * time.Millisecond) // polls for the background Release
	}
}

// TestLostConnectionKeepsTheLease: the lease is a row, not a session, so a
// holder whose connections are all cut (the server sees its clients leave)
// still holds the key, and refreshes it over a new connection.
func TestLostConnectionKeepsTheLease(t *testing.T) {
	p, db := proxiedDB(t)
	s := newStore(t, db)
	direct := newStore(t, openDB(t))
	keys := testKeys(1)
	mustAcquire(t, s, keys, "t1", time.Minute)
	p.Cut()
	// A statement sent on a connection whose cut the driver has not seen
	// yet fails (its outcome unknown to the client, as the contract
	// allows), and database/sql drops that connection: a watchdog's next
	// renewal gets a new one. The lease is never found lost.
	var err error
	for range 3 {
		if err = s.Refresh(t.Context(), keys, "t1", time.Minute); err == nil || errors.Is(err, stores.ErrNotHeld) {
			break
		}
		t.Logf("Refresh on a connection cut under it: %v", err)
	}
	if err != nil {
		t.Fatalf("Refresh after the connections were cut: %v", err)
	}
	if g, err := direct.Acquire(t.Context(), keys, "t2", time.Minute); err != nil || g.OK {
		t.Fatalf("Acquire by another token after the holder's connections were cut: %+v, %v; want refused", g, err)
	}
	if err := s.Release(t.Context(), keys, "t1", 0); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// TestUnreachableServerLosesTheLock: once the server cannot be reached,
// Refresh fails with ErrUnreachable, and a Locker's watchdog cancels the
// holder's context with ErrLockLost when the lock's validity runs out.
func TestUnreachableServerLosesTheLock(t *testing.T) {
	p, db := proxiedDB(t)
	s := newStore(t, db)
	locker, err := reqlock.New(s)
	if err != nil {
		t.Fatalf("reqlock.New: %v", err)
	}
	const ttl = 500 * time.Millisecond
	lock, err := locker.Obtain(t.Context(), testKeys(1)[0], ttl, 0)
	if err != nil {
		t.Fatalf("Obtain: %v", err)
	}
	held := lock.KeepAlive(t.Context())
	p.Refuse() // the port now refuses connections
	p.Cut()
	select {
	case <-held.Done():
		if cause := context.Cause(held); !errors.Is(cause, reqlock.ErrLockLost) {
			t.Fatalf("the holder's context ended with %v, want reqlock.ErrLockLost", cause)
		}
	case <-time.After(ttl + 5*time.Second):
		t.Fatal("the holder's context still lives after the server went away and the TTL passed")
	}
	err = s.Refresh(t.Context(), []string{lock.Key()}, lock.Token(), ttl)
	if !errors.Is(err, stores.ErrUnreachable) {
		t.Fatalf("Refresh with the server unreachable: %v, want stores.ErrUnreachable", err)
	}
}

// TestUnknownCommit: a connection lost while a multi-key grant's COMMIT is
// on its way leaves the outcome unknown, whether the server saw the COMMIT
// or not. The Store undoes it before Acquire returns: it ends the session
// that carried the COMMIT (so that it cannot commit later) and releases the
// keys; Acquire's error wraps stores.ErrAbandoned, so that the caller does
// not release them once more, and the keys are free at once, and stay free.
func TestUnknownCommit(t *testing.T) {
	direct := newStore(t, openDB(t))
	for _, c := range []struct {
		name    string
		forward bool // the COMMIT reaches the server before the cut
	}{
		{"COMMIT cut before the server", false},
		{"COMMIT's reply cut", true},
	} {
		p, db := proxiedDB(t)
		s := newStore(t, db)
		keys := testKeys(3)
		mustAcquire(t, s, keys, "warm-up", time.Minute)
		if err := s.Release(t.Context(), keys, "warm-up", 0); err != nil {
			t.Fatalf("Release: %v", err)
		}
		p.CutWhen(faultproxy.ToServer, isCommit, c.forward)
		g, err := s.Acquire(t.Context(), keys, "t1", time.Minute)
		if g.OK || !errors.Is(err, stores.ErrAbandoned) {
			t.Fatalf("%s: Acquire with its COMMIT cut: %+v, %v; want an error wrapping stores.ErrAbandoned", c.name, g, err)
		}
		errIsNot(t, err, c.name, stores.ErrNotHeld, stores.ErrInvalid, stores.ErrUnreachable)
		expectFreeForGood(t, direct, keys, 0)
	}
}

// expectFreeForGood fails the test unless keys are free, probed by s,
// within limit, and then stay free for a second: nothing a store left in
// flight lands later.
func expectFreeForGood(t *testing.T, s *Store, keys []string, limit time.Duration) {
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
			t.Fatalf("held again (Wait %v) %v after it was seen free: an acquire left in flight landed after its undo", g.Wait, now.Sub(freeSince))
		case now.Sub(start) > limit:
			t.Fatalf("still held (Wait %v) %v after the fault healed: an acquire's grant was never undone", g.Wait, limit)
		}
		time.Sleep(20 * time.Millisecond) // between probes of a key the Store frees in the background
	}
}
