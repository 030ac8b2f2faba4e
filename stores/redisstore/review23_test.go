package redisstore

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores"
)

// TestReview23RecordCallsMapCrossSlot: on a Cluster, ClaimRecord and
// FinishRecord of a key whose sibling keys hash to another slot (a '}'
// and no hash tag) answer ErrCrossSlot, and so stores.ErrInvalid, as
// Acquire of that key does, not Redis's bare CROSSSLOT reply, which the
// Locker would count as a store failure of unknown outcome (issue 23).
func TestReview23RecordCallsMapCrossSlot(t *testing.T) {
	addr := clusterNode(t)
	client := clusterClient(t, addr)
	s := newStore(t, client)
	hidden := newStore(t, scripterOnly{client})
	ctx := context.Background()
	odd := testredis.Prefix(t) + "x{}{y}"
	if slot(fenceKey(odd)) == slot(odd) {
		t.Fatal("the odd key shares a slot with its sibling keys")
	}
	for name, st := range map[string]*Store{"ClusterClient": s, "hidden": hidden} {
		if _, _, err := st.ClaimRecord(ctx, odd, "t", time.Minute); !errors.Is(err, ErrCrossSlot) || !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("ClaimRecord of a key whose sibling keys are in another slot, through the %s: %v, want ErrCrossSlot and ErrInvalid", name, err)
		}
		err := st.FinishRecord(ctx, odd, "t", stores.Record{Fingerprint: "fp"}, time.Minute)
		if !errors.Is(err, ErrCrossSlot) || !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("FinishRecord of a key whose sibling keys are in another slot, through the %s: %v, want ErrCrossSlot and ErrInvalid", name, err)
		}
	}
	if n := client.Exists(ctx, odd).Val(); n != 0 {
		t.Fatalf("a refused call left %q behind", odd)
	}
}

// TestReview23RecordTokenEqualToValue: Release, Refresh and Acquire of a
// token equal to a record's stored value (it starts like one) leave the
// record as it is: the package documentation says no token equals a record,
// and stores.RecordStore that Release and Refresh of any token answer
// ErrNotHeld over a record (issue 23).
func TestReview23RecordTokenEqualToValue(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	ctx := context.Background()
	k := testredis.Prefix(t) + "k"
	g, _, err := s.ClaimRecord(ctx, k, "a", time.Minute)
	if err != nil || !g.OK {
		t.Fatalf("claim: %+v, %v", g, err)
	}
	rec := stores.Record{Fingerprint: "fp", Response: []byte("body"), Fence: g.Fences[0]}
	if err := s.FinishRecord(ctx, k, "a", rec, time.Minute); err != nil {
		t.Fatal(err)
	}
	value := client.Get(ctx, k).Val()
	if err := s.Refresh(ctx, []string{k}, value, time.Hour); err == nil {
		t.Errorf("Refresh of a token equal to the record's value: nil, want an error (it extended the record's retention)")
	}
	if g, err := s.Acquire(ctx, []string{k}, value, time.Minute); err == nil && g.OK {
		t.Errorf("Acquire of a token equal to the record's value: granted over the record")
	}
	if err := s.Release(ctx, []string{k}, value, 0); err == nil {
		t.Errorf("Release of a token equal to the record's value: nil, want an error (it deleted the record)")
	}
	_, got, err := s.ClaimRecord(ctx, k, "b", time.Minute)
	if err != nil || got == nil || got.Fingerprint != "fp" {
		t.Fatalf("the record after Refresh, Acquire and Release of a token equal to its value: %+v, %v; want it kept", got, err)
	}
	if ttl := client.PTTL(ctx, k).Val(); ttl > time.Minute {
		t.Fatalf("the record's retention is %v after the calls, want at most 1m", ttl)
	}
}

// TestReview23LongestRetention: a record kept for math.MaxInt64 (about 292
// years) is kept, not refused by Redis nor overflowed.
func TestReview23LongestRetention(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	ctx := context.Background()
	k := testredis.Prefix(t) + "k"
	g, _, err := s.ClaimRecord(ctx, k, "a", math.MaxInt64)
	if err != nil || !g.OK {
		t.Fatalf("claim with ttl MaxInt64: %+v, %v", g, err)
	}
	if err := s.FinishRecord(ctx, k, "a", stores.Record{Fingerprint: "fp", Fence: g.Fences[0]}, math.MaxInt64); err != nil {
		t.Fatalf("FinishRecord with retention MaxInt64: %v", err)
	}
	if _, got, err := s.ClaimRecord(ctx, k, "b", time.Minute); err != nil || got == nil {
		t.Fatalf("replay: %+v, %v", got, err)
	}
	// PTTL in milliseconds: go-redis's Duration would overflow.
	if ms, err := client.Do(ctx, "PTTL", k).Int64(); err != nil || ms < int64(100*365*24*time.Hour/time.Millisecond) {
		t.Fatalf("the record's PTTL %dms (%v), want about 292 years", ms, err)
	}
	client.Del(ctx, k)
}
