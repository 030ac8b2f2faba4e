package pgstore_test

import (
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// randomKey returns a key of n random bytes, which PostgreSQL cannot
// compress.
func randomKey(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return string(b)
}

// TestLongKeys (issue 18, defect 19): a random key too long for the
// primary key's btree (an index entry holds at most 2704 bytes) is refused
// with ErrInvalid before any statement, alone or with a short key, and the
// longest key the store states in its Bounds is honoured. A 3000-byte key
// used to fail as a store failure (SQLSTATE 54000), which the Locker counts
// as an outage: a 503, or an unlocked run on a fail-open route.
func TestLongKeys(t *testing.T) {
	s := open(t, "")
	b := s.Bounds()
	if b.MaxKeyBytes != 2692 || b.Reason == "" {
		t.Fatalf("Bounds() = %+v, want MaxKeyBytes 2692 (8 kB pages) and a reason", b)
	}
	short := "short:" + t.Name()
	for _, n := range []int{b.MaxKeyBytes + 1, 3000} {
		long := randomKey(n)
		for _, keys := range [][]string{{long}, sortedPair(long, short)} {
			g, err := s.Acquire(t.Context(), keys, "t1", time.Minute)
			if !errors.Is(err, stores.ErrInvalid) || g.OK {
				t.Fatalf("Acquire of a %d-byte key among %d: %+v, %v; want stores.ErrInvalid", n, len(keys), g, err)
			}
			if err := s.Refresh(t.Context(), keys, "t1", time.Minute); !errors.Is(err, stores.ErrInvalid) {
				t.Fatalf("Refresh of a %d-byte key: %v; want stores.ErrInvalid", n, err)
			}
			if err := s.Release(t.Context(), keys, "t1", 0); !errors.Is(err, stores.ErrInvalid) {
				t.Fatalf("Release of a %d-byte key: %v; want stores.ErrInvalid", n, err)
			}
		}
	}
	for _, keys := range [][]string{{randomKey(b.MaxKeyBytes)}, sortedPair(randomKey(b.MaxKeyBytes), short)} {
		if g, err := s.Acquire(t.Context(), keys, "t1", time.Minute); err != nil || !g.OK {
			t.Fatalf("Acquire of a key of MaxKeyBytes among %d: %+v, %v; want granted", len(keys), g, err)
		}
		if g, err := s.Acquire(t.Context(), keys, "t2", time.Minute); err != nil || g.OK {
			t.Fatalf("second token: %+v, %v; want refused", g, err)
		}
		if err := s.Refresh(t.Context(), keys, "t1", time.Minute); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		if err := s.Release(t.Context(), keys, "t1", 0); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
}

// sortedPair returns a and b in order.
func sortedPair(a, b string) []string {
	if a < b {
		return []string{a, b}
	}
	return []string{b, a}
}

// TestMultiKeyRefusalWait (issue 18, defect 20): a refusal of several keys
// reports the remaining TTL of the key it names as held, not another's. The
// first key is held for 10s, the second for an hour: the refusal names the
// first, with a Wait of at most 10s; it used to give the hour of the last
// holder it read.
func TestMultiKeyRefusalWait(t *testing.T) {
	s := open(t, "")
	keys := []string{"wait:" + t.Name() + ":a", "wait:" + t.Name() + ":b"}
	for i, ttl := range []time.Duration{10 * time.Second, time.Hour} {
		if g, err := s.Acquire(t.Context(), keys[i:i+1], "holder", ttl); err != nil || !g.OK {
			t.Fatalf("Acquire(%q): %+v, %v", keys[i], g, err)
		}
	}
	t.Cleanup(func() { _ = s.Release(t.Context(), keys, "holder", 0) })
	g, err := s.Acquire(t.Context(), keys, "waiter", time.Minute)
	if err != nil || g.OK || g.Held != 0 || g.Wait <= 0 || g.Wait > 10*time.Second {
		t.Fatalf("Acquire of both: %+v, %v; want refused on the first key, with its Wait of at most 10s", g, err)
	}
}
