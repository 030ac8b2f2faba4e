package pgstore_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/pgstore"
)

// hammer runs goroutines that each lock keyOf(goroutine, round) rounds
// times through one of lockers (taken in turn) and increment that key's
// counter without atomics inside the lock. It fails the test on any error,
// a serialization failure above all, and on a lost update.
func hammer(t *testing.T, lockers []*reqlock.Locker, goroutines, rounds, nkeys int, keyOf func(g, r int) int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
	defer cancel()
	counters := make([]int, nkeys)
	var (
		wg     sync.WaitGroup
		failed atomic.Int32
	)
	for g := range goroutines {
		locker := lockers[g%len(lockers)]
		wg.Go(func() {
			for r := range rounds {
				k := keyOf(g, r)
				lock, err := locker.Obtain(ctx, fmt.Sprintf("load:%s:%d", t.Name(), k), 10*time.Second, 40*time.Second)
				if err != nil {
					if failed.Add(1) <= 5 {
						t.Errorf("goroutine %d round %d: Obtain: %v", g, r, err)
					}
					return
				}
				v := counters[k]
				runtime.Gosched() // invite a lost update, should the lock fail
				counters[k] = v + 1
				if err := lock.Release(ctx); err != nil {
					if failed.Add(1) <= 5 {
						t.Errorf("goroutine %d round %d: Release: %v", g, r, err)
					}
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	total := 0
	for _, c := range counters {
		total += c
	}
	if want := goroutines * rounds; total != want {
		t.Fatalf("%d increments under the lock, want %d: %d updates lost", total, want, want-total)
	}
}

// lockers returns n Lockers, each over a Store of its own (a pool of its
// own), as n service instances would have.
func lockers(t *testing.T, n int, open func(t testing.TB) stores.Store) []*reqlock.Locker {
	t.Helper()
	ls := make([]*reqlock.Locker, n)
	for i := range ls {
		// Handoff off: every holder goes through the store.
		ls[i] = reqlock.MustNew(open(t), reqlock.WithHandoff(0, 0))
	}
	return ls
}

// TestHotKeyUnderLoad: 300 goroutines in 3 instances take one key in turn:
// no update is lost and no error (no serialization failure) surfaces.
func TestHotKeyUnderLoad(t *testing.T) {
	ls := lockers(t, 3, func(t testing.TB) stores.Store { return open(t, "") })
	hammer(t, ls, 300, 1, 1, func(g, r int) int { return 0 })
}

// TestSpreadUnderLoad: 300 goroutines in 3 instances over 50 keys.
func TestSpreadUnderLoad(t *testing.T) {
	ls := lockers(t, 3, func(t testing.TB) stores.Store { return open(t, "") })
	hammer(t, ls, 300, 2, 50, func(g, r int) int { return (g*7 + r*13) % 50 })
}

// TestSerializableConnections: on connections whose transactions default to
// SERIALIZABLE, where the store's statements do fail with 40001 under
// contention, the store runs them again: none surfaces, no update is lost.
func TestSerializableConnections(t *testing.T) {
	config, err := pgxpool.ParseConfig(testservers.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	config.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
	config.MaxConns = 16
	db, err := pgxpool.NewWithConfig(t.Context(), config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	var level string
	if err := db.QueryRow(t.Context(), `SHOW transaction_isolation`).Scan(&level); err != nil || level != "serializable" {
		t.Fatalf("transaction_isolation %q, %v; want serializable", level, err)
	}
	s, err := pgstore.New(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	ls := []*reqlock.Locker{reqlock.MustNew(s, reqlock.WithHandoff(0, 0)), reqlock.MustNew(s, reqlock.WithHandoff(0, 0))}
	hammer(t, ls, 100, 3, 2, func(g, r int) int { return (g + r) % 2 })
}

// TestOverlappingSetsNeverOverwrite: goroutines of two stores grant
// overlapping sets of keys, one and several at once, and find every key of
// each grant holding their token until they release it: no grant overwrites
// another, however a refusal's lock-free check and a grant interleave.
func TestOverlappingSetsNeverOverwrite(t *testing.T) {
	ss := []*pgstore.Store{open(t, ""), open(t, "")}
	db := pool(t, testservers.PostgresDSN(t))
	names := []string{"a", "b", "c", "d"}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var (
		wg     sync.WaitGroup
		grants atomic.Int64
	)
	for w := range 20 {
		s := ss[w%2]
		wg.Go(func() {
			for r := range 25 {
				var keys []string
				for i, n := range names {
					if (w+r)>>i&1 == 1 || i == (w+r)%len(names) {
						keys = append(keys, "overlap:"+t.Name()+":"+n)
					}
				}
				token := fmt.Sprint("w", w, "r", r)
				g, err := s.Acquire(ctx, keys, token, 10*time.Second)
				if err != nil {
					t.Errorf("Acquire(%q): %v", keys, err)
					return
				}
				if !g.OK {
					runtime.Gosched()
					continue
				}
				grants.Add(1)
				for _, k := range keys {
					var holder []byte
					if err := db.QueryRow(ctx, `SELECT token FROM reqlock_locks WHERE key = $1`, []byte(k)).Scan(&holder); err != nil {
						t.Errorf("reading %q: %v", k, err)
						return
					}
					if string(holder) != token {
						t.Errorf("%q holds %q while %s's grant of %q runs", k, holder, token, keys)
					}
				}
				if err := s.Release(ctx, keys, token, 0); err != nil {
					t.Errorf("Release(%q) of a grant: %v", keys, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if grants.Load() == 0 {
		t.Fatal("no grant at all")
	}
	t.Logf("%d grants", grants.Load())
}
