package memstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Suite{New: func(t *testing.T) stores.Store { return New() }, Notify: true, Fair: true, Shared: true, Records: true, InProcess: true})
}

// one returns key as the keys of a one-key call.
func one(key string) []string { return []string{key} }

func TestFloodOfKeysIsFreed(t *testing.T) {
	s := New()
	ctx := context.Background()
	const n = 20000
	for i := range n {
		g, err := s.Acquire(ctx, one("flood:"+strconv.Itoa(i)), "t", time.Millisecond)
		if err != nil || !g.OK {
			t.Fatalf("Acquire %d: %+v, %v", i, g, err)
		}
	}
	waitFor(t, 3*time.Second, func() bool { return s.Len() == 0 })

	// One more operation finds the structures compacted, not just emptied.
	if g, err := s.Acquire(ctx, one("after"), "t", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire after the flood: %+v, %v", g, err)
	}
	s.mu.Lock()
	entries, inHeap, capacity := len(s.entries), len(s.expiry), cap(s.expiry)
	s.mu.Unlock()
	if entries != 1 || inHeap != 1 {
		t.Fatalf("after the flood: %d entries, %d in heap, want 1 and 1", entries, inHeap)
	}
	if capacity > minCompact {
		t.Fatalf("heap capacity %d after the flood drained, want <= %d", capacity, minCompact)
	}
	if err := checkInvariants(s); err != nil {
		t.Fatal(err)
	}
}

func TestHeapConsistentUnderConcurrency(t *testing.T) {
	s := New()
	ctx := context.Background()
	const workers, rounds, keys = 8, 300, 16
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			token := "w" + strconv.Itoa(w)
			for r := range rounds {
				key := "k" + strconv.Itoa((w*rounds+r)%keys)
				// Mixed TTLs, some expiring during the run, reorder the heap.
				ttl := time.Duration(1+r%5) * time.Millisecond
				if r%3 == 0 {
					ttl = time.Minute
				}
				g, err := s.Acquire(ctx, one(key), token, ttl)
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				if !g.OK {
					continue
				}
				for i := range 3 {
					err := s.Refresh(ctx, one(key), token, time.Duration(r%7+i)*time.Millisecond+time.Microsecond)
					if err != nil && !errors.Is(err, stores.ErrNotHeld) {
						t.Errorf("Refresh: %v", err)
					}
				}
				if err := s.Release(ctx, one(key), token, 0); err != nil && !errors.Is(err, stores.ErrNotHeld) {
					t.Errorf("Release: %v", err)
				}
				if r%50 == 0 {
					if err := checkInvariants(s); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if err := checkInvariants(s); err != nil {
		t.Fatal(err)
	}
}

func TestInvalidTTL(t *testing.T) {
	s := New()
	ctx := context.Background()
	if _, err := s.Acquire(ctx, one("k"), "t", 0); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("Acquire with ttl 0: got %v, want ErrInvalid", err)
	}
	if g, err := s.Acquire(ctx, one("k"), "t", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	if err := s.Refresh(ctx, one("k"), "t", -time.Second); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("Refresh with a negative ttl: got %v, want ErrInvalid", err)
	}
}

// TestFencesShareOneCounter: every grant of a key, in one call or in
// several, takes the next fence of one counter, a stride on, so fences grow
// across keys and past the expiry of a lock whose entry is gone.
func TestFencesShareOneCounter(t *testing.T) {
	s := New()
	ctx := context.Background()
	var want int64
	grant := func(keys []string, ttl time.Duration) {
		t.Helper()
		g, err := s.Acquire(ctx, keys, "t", ttl)
		if err != nil || !g.OK {
			t.Fatalf("Acquire(%q): %+v, %v", keys, g, err)
		}
		for i, f := range g.Fences {
			want += stores.FenceStride
			if f != want {
				t.Fatalf("Acquire(%q): fence of %q is %d, want %d", keys, keys[i], f, want)
			}
		}
	}
	grant([]string{"a", "b", "c"}, time.Minute)
	grant(one("d"), time.Millisecond)
	// Waiting for the TTL to run out is what this checks: the lock of d is
	// freed and its entry dropped.
	waitFor(t, 3*time.Second, func() bool { return s.Len() == 3 })
	grant(one("d"), time.Minute)
	if err := s.Release(ctx, []string{"a", "b", "c", "d"}, "t", 0); err != nil {
		t.Fatalf("Release: %v", err)
	}
	grant([]string{"a", "d"}, time.Minute)
}

// checkInvariants reports whether the map and the heap hold the same
// entries, every entry knows its heap index, and the heap is ordered.
func checkInvariants(s *Store) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.entries) != len(s.expiry) {
		return fmt.Errorf("%d entries in map, %d in heap", len(s.entries), len(s.expiry))
	}
	for i, e := range s.expiry {
		if e.index != i {
			return fmt.Errorf("heap[%d] has index %d", i, e.index)
		}
		if s.entries[e.key] != e {
			return fmt.Errorf("heap[%d] (%q) is not the map's entry", i, e.key)
		}
		if i > 0 && e.expiresAt.Before(s.expiry[(i-1)/2].expiresAt) {
			return fmt.Errorf("heap[%d] expires before its parent", i)
		}
	}
	return nil
}

func waitFor(t *testing.T, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	ticker := time.NewTicker(5 * time.Millisecond)
	defer ticker.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", limit)
		}
		<-ticker.C
	}
}

func TestNotifyStopEmptiesMap(t *testing.T) {
	s := New()
	ch1, stop1 := s.NotifyRelease("a", "w")
	_, stop2 := s.NotifyRelease("a", "w")
	_, stop3 := s.NotifyRelease("b", "w")
	if n := subsLen(s); n != 2 {
		t.Fatalf("%d keys subscribed, want 2", n)
	}
	stop1()
	stop1()
	if n := subsLen(s); n != 2 {
		t.Fatalf("after one of two subscribers of a stopped: %d keys subscribed, want 2", n)
	}
	if g, err := s.Acquire(context.Background(), one("a"), "t", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	if err := s.Release(context.Background(), one("a"), "t", 0); err != nil {
		t.Fatalf("Release: %v", err)
	}
	select {
	case <-ch1:
		t.Fatal("a stopped subscriber got a signal")
	default:
	}
	stop2()
	stop3()
	stop3()
	if n := subsLen(s); n != 0 {
		t.Fatalf("after every stop: %d keys subscribed, want 0", n)
	}
	// A stop from before does not remove a later subscriber of the key.
	ch, stop := s.NotifyRelease("a", "w")
	defer stop()
	stop1()
	if g, err := s.Acquire(context.Background(), one("a"), "t", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	if err := s.Release(context.Background(), one("a"), "t", 0); err != nil {
		t.Fatalf("Release: %v", err)
	}
	select {
	case <-ch:
	default:
		t.Fatal("Release did not signal the subscriber before returning")
	}
}

func TestNotifyOnExpiry(t *testing.T) {
	s := New()
	ctx := context.Background()
	if g, err := s.Acquire(ctx, one("k"), "t", time.Millisecond); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	ch, stop := s.NotifyRelease("k", "w")
	defer stop()
	// Len sweeps, as every operation does; the sweep that frees k signals.
	waitFor(t, 3*time.Second, func() bool { return s.Len() == 0 })
	select {
	case <-ch:
	default:
		t.Fatal("freeing the expired lock did not signal its subscriber")
	}
}

func TestNotifySubsMapShrinks(t *testing.T) {
	s := New()
	const n = 20000
	stops := make([]func(), 0, n)
	for i := range n {
		_, stop := s.NotifyRelease("flood:"+strconv.Itoa(i), "w")
		stops = append(stops, stop)
	}
	for _, stop := range stops {
		stop()
	}
	s.mu.Lock()
	keys, peak := len(s.subs), s.subsPeak
	s.mu.Unlock()
	if keys != 0 || peak > minCompact {
		t.Fatalf("after the flood: %d keys subscribed, peak %d; want 0 and at most %d", keys, peak, minCompact)
	}
}

func subsLen(s *Store) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.subs)
}
