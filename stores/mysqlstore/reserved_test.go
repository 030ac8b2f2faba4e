package mysqlstore

import (
	"errors"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/holders"
	"github.com/reqlock/reqlock/stores"
)

// TestReservedTokens (issue 23): a token that starts with a NUL byte, such
// as one equal to a record's owner or to the marker of a key held shared,
// is refused by Acquire and ClaimRecord (stores.ErrInvalid) and holds
// nothing for Release and Refresh (stores.ErrNotHeld), which leave the
// record and the holders as they are.
func TestReservedTokens(t *testing.T) {
	s := newStore(t, openDB(t))
	ctx := t.Context()
	k := "reserved:" + t.Name()
	_ = s.Release(ctx, []string{k}, "a", 0)
	g, _, err := s.ClaimRecord(ctx, k, "a", time.Minute)
	if err != nil || !g.OK {
		t.Fatalf("claim: %+v, %v", g, err)
	}
	if err := s.FinishRecord(ctx, k, "a", stores.Record{Fingerprint: "fp", Response: []byte("body"), Fence: g.Fences[0]}, time.Minute); err != nil {
		t.Fatal(err)
	}
	owner := holders.RecordOwner("a")
	if err := s.Refresh(ctx, []string{k}, owner, time.Hour); !errors.Is(err, stores.ErrNotHeld) {
		t.Errorf("Refresh of the record's owner: %v, want ErrNotHeld", err)
	}
	if g, err := s.Acquire(ctx, []string{k}, owner, time.Minute); !errors.Is(err, stores.ErrInvalid) {
		t.Errorf("Acquire of the record's owner: %+v, %v, want ErrInvalid", g, err)
	}
	if err := s.Release(ctx, []string{k}, owner, 0); !errors.Is(err, stores.ErrNotHeld) {
		t.Errorf("Release of the record's owner: %v, want ErrNotHeld", err)
	}
	if _, _, err := s.ClaimRecord(ctx, k, "\x00x", time.Minute); !errors.Is(err, stores.ErrInvalid) {
		t.Errorf("ClaimRecord of a token that starts with a NUL byte: %v, want ErrInvalid", err)
	}
	if g, rec, err := s.ClaimRecord(ctx, k, "b", time.Minute); err != nil || g.OK || rec == nil || rec.Fingerprint != "fp" {
		t.Fatalf("the record after the calls of its owner's token: %+v, %+v, %v; want it kept", g, rec, err)
	}

	shared := k + ":shared"
	if g, err := s.AcquireShared(ctx, shared, "h", 2, time.Minute); err != nil || !g.OK {
		t.Fatalf("AcquireShared: %+v, %v", g, err)
	}
	t.Cleanup(func() { _ = s.ReleaseShared(ctx, shared, "h", 0) })
	if g, err := s.Acquire(ctx, []string{shared}, holders.Marker, time.Minute); !errors.Is(err, stores.ErrInvalid) {
		t.Errorf("Acquire of the holders' marker: %+v, %v, want ErrInvalid", g, err)
	}
	if err := s.Refresh(ctx, []string{shared}, holders.Marker, time.Hour); !errors.Is(err, stores.ErrNotHeld) {
		t.Errorf("Refresh of the holders' marker: %v, want ErrNotHeld", err)
	}
	if err := s.Release(ctx, []string{shared}, holders.Marker, 0); !errors.Is(err, stores.ErrNotHeld) {
		t.Errorf("Release of the holders' marker: %v, want ErrNotHeld", err)
	}
	if g, err := s.Acquire(ctx, []string{shared}, "w", time.Minute); err != nil || g.OK || !g.SharedHeld {
		t.Fatalf("Acquire of the key held shared, after the marker's calls: %+v, %v; want refused by its holder", g, err)
	}
}
