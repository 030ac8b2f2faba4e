package mysqlstore

import (
	"context"
	"database/sql"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores"
)

// TestHotKeyNoLostUpdates: 200 goroutines, each with a Locker of its own (as
// 200 processes would be), increment a plain int under one key's lock. No
// increment is lost, no two hold the lock at once, and the fences grow by
// a stride from grant to grant.
func TestHotKeyNoLostUpdates(t *testing.T) {
	const goroutines, rounds = 200, 3
	db := openDB(t)
	// A pool for the concurrency, as the package documentation advises:
	// with fewer idle connections kept, calls would dial and log in anew,
	// slowly on a loaded machine.
	db.SetMaxIdleConns(goroutines)
	warmUp(t, db, goroutines)
	s := newStore(t, db)
	key := testKeys(1)[0]
	ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
	defer cancel()
	var (
		wg        sync.WaitGroup
		counter   int // deliberately not atomic: the lock guards it
		inside    atomic.Int32
		lastFence int64 // guarded by the lock too
		grants    atomic.Int64
		start     = make(chan struct{})
	)
	for g := range goroutines {
		// The release timeout allows for a loaded test machine.
		locker, err := reqlock.New(s, reqlock.WithHandoff(0, 0), reqlock.WithReleaseTimeout(10*time.Second))
		if err != nil {
			t.Fatalf("reqlock.New: %v", err)
		}
		wg.Go(func() {
			<-start
			for r := range rounds {
				lock, err := locker.Obtain(ctx, key, 10*time.Second, 40*time.Second)
				if err != nil {
					t.Errorf("goroutine %d round %d: Obtain: %v", g, r, err)
					return
				}
				if n := inside.Add(1); n != 1 {
					t.Errorf("goroutine %d round %d: %d holders inside the lock", g, r, n)
				}
				if f := lock.Fence(); f-lastFence < stores.FenceStride {
					t.Errorf("goroutine %d round %d: fence %d after %d, want a stride above", g, r, f, lastFence)
				}
				lastFence = lock.Fence()
				v := counter
				runtime.Gosched() // invite a lost update, should the lock fail
				counter = v + 1
				grants.Add(1)
				inside.Add(-1)
				if err := lock.Release(ctx); err != nil {
					t.Errorf("goroutine %d round %d: Release: %v", g, r, err)
					return
				}
			}
		})
	}
	began := time.Now()
	close(start)
	wg.Wait()
	if n := grants.Load(); int64(counter) != n || n != goroutines*rounds {
		t.Fatalf("counter %d after %d grants of %d: %d updates lost", counter, n, goroutines*rounds, n-int64(counter))
	}
	t.Logf("%d grants in %v; attempts made again after a loss to contention: %d",
		counter, time.Since(began).Round(time.Millisecond), s.Retries())
}

// TestRacesOnNewKeys: 200 goroutines race for each of several keys that
// have no row yet, where concurrent INSERTs of one key are prone to
// deadlock in InnoDB; and for overlapping sets of three new keys. Exactly
// one wins each single key, no two grants of sets share a key, and no call
// fails: the store retries what the server rolled back.
func TestRacesOnNewKeys(t *testing.T) {
	s := newStore(t, openDB(t))
	const goroutines = 200
	race := func(t *testing.T, sets [][]string) []int {
		t.Helper()
		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			mu    sync.Mutex
			won   []int // indexes of the sets granted
		)
		for g := range goroutines {
			set := sets[g%len(sets)]
			wg.Go(func() {
				<-start
				gr, err := s.Acquire(t.Context(), set, "g"+strconv.Itoa(g), time.Minute)
				if err != nil {
					t.Errorf("goroutine %d: Acquire(%q): %v", g, set, err)
					return
				}
				if gr.OK {
					mu.Lock()
					won = append(won, g%len(sets))
					mu.Unlock()
				}
			})
		}
		close(start)
		wg.Wait()
		return won
	}
	for range 3 {
		key := testKeys(1)
		if won := race(t, [][]string{key}); len(won) != 1 {
			t.Fatalf("%d goroutines racing for a new key: %d granted, want 1", goroutines, len(won))
		}
	}
	// Sets {a,b,c}, {b,c,d}, {c,d,e}, ... of new keys: every two of them
	// within distance 2 overlap.
	keys := testKeys(8)
	var sets [][]string
	for i := 0; i+3 <= len(keys); i++ {
		sets = append(sets, keys[i:i+3])
	}
	won := race(t, sets)
	if len(won) == 0 {
		t.Fatal("no set granted")
	}
	owner := map[string]int{}
	for _, w := range won {
		for _, k := range sets[w] {
			if prev, ok := owner[k]; ok {
				t.Fatalf("%q granted within set %d and set %d", k, prev, w)
			}
			owner[k] = w
		}
	}
	t.Logf("sets granted: %v; attempts made again after a loss to contention: %d", won, s.Retries())
}

// warmUp opens n connections of db at once and returns them to its pool,
// as a running service's pool would be: the test then measures locking, not
// 200 logins at once.
func warmUp(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	conns := make([]*sql.Conn, 0, n)
	for range n {
		c, err := db.Conn(t.Context())
		if err != nil {
			t.Fatalf("warm-up: %v", err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		_ = c.Close()
	}
}

// TestContendedKeyRefusesWithoutRowLock: once a Store has found a key held,
// its next attempts refuse on a read that takes no row lock, so they neither
// wait for nor hold up a transaction that has the row locked (here a
// SELECT ... FOR UPDATE standing in for a holder's Release in flight).
func TestContendedKeyRefusesWithoutRowLock(t *testing.T) {
	db := openDB(t)
	s := newStore(t, db)
	key := testKeys(1)
	mustAcquire(t, s, key, "holder", time.Minute)
	if g, err := s.Acquire(t.Context(), key, "waiter", time.Minute); err != nil || g.OK {
		t.Fatalf("first attempt of a waiter: %+v, %v; want refused", g, err)
	}
	tx, err := db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatalf("BeginTx: %v", err)
	}
	defer func() { _ = tx.Rollback() }()
	var token string
	if err := tx.QueryRowContext(t.Context(), "SELECT token FROM reqlock_locks WHERE lock_key = ? FOR UPDATE", key[0]).Scan(&token); err != nil {
		t.Fatalf("lock the row: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	start := time.Now()
	g, err := s.Acquire(ctx, key, "waiter", time.Minute)
	if err != nil || g.OK || g.Wait <= 0 {
		t.Fatalf("next attempt while the row is locked: %+v, %v after %v; want refused with the holder's TTL, without waiting for the row lock",
			g, err, time.Since(start))
	}
}
