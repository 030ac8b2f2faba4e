package mysqlstore

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"
)

// TestReleaseOwedAfterCallerLeft: a Release that loses to row lock
// contention after its caller left tries again: the release is owed. It
// used to give up after its first loss once the caller had gone, leaving
// the key held for its TTL.
func TestReleaseOwedAfterCallerLeft(t *testing.T) {
	s := newStore(t, openDB(t, withParam("innodb_lock_wait_timeout", "1")))
	direct := newStore(t, openDB(t))
	keys := testKeys(1)
	mustAcquire(t, s, keys, "t1", time.Minute)
	// Another transaction holds the key's row lock for longer than one
	// lock wait: the Release's first attempt loses.
	blocker, err := openDB(t).BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blocker.Rollback() }()
	if _, err := blocker.ExecContext(t.Context(), "SELECT 1 FROM reqlock_locks WHERE lock_key = ? FOR UPDATE", keys[0]); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	if err := s.Release(ctx, keys, "t1", 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Release behind a row lock: %v, want context.DeadlineExceeded", err)
	}
	cancel()
	<-time.After(1500 * time.Millisecond) // past the first lock wait (1s): the loss to contention itself
	if err := blocker.Rollback(); err != nil {
		t.Fatal(err)
	}
	expectFreeForGood(t, direct, keys, 3*time.Second)
}

// TestContentionRefuses: an Acquire whose every attempt loses to row lock
// contention refuses, with a short Wait: the key is busy, if not held, and
// nothing changed. It used to fail with ErrContention, which the Locker
// counts as a store failure (503, or an unlocked run on a fail-open route).
func TestContentionRefuses(t *testing.T) {
	s := newStore(t, openDB(t, withParam("innodb_lock_wait_timeout", "1")))
	s.attempts = 2 // two lock waits of a second, not ten
	keys := testKeys(1)
	warm(t, s, 1)
	mustAcquire(t, s, keys, "t0", time.Minute)
	if err := s.Release(t.Context(), keys, "t0", 0); err != nil {
		t.Fatal(err)
	}
	blocker, err := openDB(t).BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blocker.Rollback() }()
	if _, err := blocker.ExecContext(t.Context(), "SELECT 1 FROM reqlock_locks WHERE lock_key = ? FOR UPDATE", keys[0]); err != nil {
		t.Fatal(err)
	}
	g, err := s.Acquire(t.Context(), keys, "t1", time.Minute)
	if err != nil || g.OK || g.Held != 0 || g.Wait <= 0 || g.Wait > time.Second {
		t.Fatalf("Acquire losing every attempt to contention: %+v, %v; want refused with a short Wait", g, err)
	}
	if n := s.Retries(); n < 1 {
		t.Fatalf("%d attempts made again: the test caught no contention", n)
	}
	if err := blocker.Rollback(); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, keys, "t2", time.Minute) // nothing changed: the key is free
}

// TestContendedKeyOfLongestTTL: a key refused with the longest Wait counts
// as contended; the deadline of its mark used to overflow into the past.
func TestContendedKeyOfLongestTTL(t *testing.T) {
	var c contendedKeys
	c.mark("k", math.MaxInt64)
	if !c.contended("k") {
		t.Fatal("a key refused with a Wait of math.MaxInt64 does not count as contended")
	}
}
