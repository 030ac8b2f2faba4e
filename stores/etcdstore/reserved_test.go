package etcdstore_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// TestReservedTokens (issue 23): a token that starts with a NUL byte, as a
// finished record's value does, is refused by Acquire, AcquireFair and
// ClaimRecord (stores.ErrInvalid) and holds nothing for Release and Refresh
// (stores.ErrNotHeld, as on the other stores), which leave the record as it
// is.
func TestReservedTokens(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	k := "reserved:" + strconv.FormatInt(time.Now().UnixNano(), 10)
	g, _, err := s.ClaimRecord(ctx, k, "a", time.Minute)
	if err != nil || !g.OK {
		t.Fatalf("claim: %+v, %v", g, err)
	}
	if err := s.FinishRecord(ctx, k, "a", stores.Record{Fingerprint: "fp", Response: []byte("body"), Fence: g.Fences[0]}, time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{"\x00", "\x00a\x00", "\x00a\x0060000\x00r1\x00"} {
		if err := s.Refresh(ctx, []string{k}, token, time.Hour); !errors.Is(err, stores.ErrNotHeld) {
			t.Errorf("Refresh of %q: %v, want ErrNotHeld", token, err)
		}
		if err := s.Release(ctx, []string{k}, token, 0); !errors.Is(err, stores.ErrNotHeld) {
			t.Errorf("Release of %q: %v, want ErrNotHeld", token, err)
		}
		if g, err := s.Acquire(ctx, []string{k}, token, time.Minute); !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("Acquire of %q: %+v, %v, want ErrInvalid", token, g, err)
		}
		if g, err := s.AcquireFair(ctx, k, token, time.Minute, 0); !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("AcquireFair of %q: %+v, %v, want ErrInvalid", token, g, err)
		}
		if _, _, err := s.ClaimRecord(ctx, k, token, time.Minute); !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("ClaimRecord of %q: %v, want ErrInvalid", token, err)
		}
	}
	if g, rec, err := s.ClaimRecord(ctx, k, "b", time.Minute); err != nil || g.OK || rec == nil || rec.Fingerprint != "fp" {
		t.Fatalf("the record after the calls: %+v, %+v, %v; want it kept", g, rec, err)
	}
}
