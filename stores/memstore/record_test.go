package memstore

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
)

func TestRecordLifecycle(t *testing.T) {
	s := New()
	ctx := context.Background()
	g, rec, err := s.ClaimRecord(ctx, "idem:k", "a", time.Minute)
	if err != nil || !g.OK || rec != nil || len(g.Fences) != 1 {
		t.Fatalf("first claim: %+v, %v, %v", g, rec, err)
	}
	if g2, rec, err := s.ClaimRecord(ctx, "idem:k", "b", time.Minute); err != nil || g2.OK || rec != nil || g2.Wait <= 0 {
		t.Fatalf("claim of another token while claimed: %+v, %v, %v; want refused with a Wait", g2, rec, err)
	}
	released, stop := s.NotifyRelease("idem:k", "b")
	defer stop()

	body := []byte{0, 1, 0xff, 'x'}
	if err := s.FinishRecord(ctx, "idem:k", "a", stores.Record{Fingerprint: "fp", Response: body, Fence: g.Fences[0]}, time.Minute); err != nil {
		t.Fatalf("FinishRecord: %v", err)
	}
	body[0] = 9 // the store kept its own copy
	select {
	case <-released:
	default:
		t.Fatal("FinishRecord did not signal the key's waiters")
	}
	for _, token := range []string{"a", "b"} {
		g2, rec, err := s.ClaimRecord(ctx, "idem:k", token, time.Minute)
		if err != nil || g2.OK || rec == nil {
			t.Fatalf("claim by %s after finish: %+v, %v, %v; want the record", token, g2, rec, err)
		}
		if rec.Fingerprint != "fp" || !bytes.Equal(rec.Response, []byte{0, 1, 0xff, 'x'}) || rec.Fence != g.Fences[0] {
			t.Fatalf("record %+v", rec)
		}
		rec.Response[0] = 7 // a copy too
	}
	if err := s.FinishRecord(ctx, "idem:k", "a", stores.Record{Fingerprint: "other"}, time.Minute); err != nil {
		t.Fatalf("FinishRecord retried by the same token: %v, want nil", err)
	}
	if err := s.FinishRecord(ctx, "idem:k", "b", stores.Record{Fingerprint: "other"}, time.Minute); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("FinishRecord of another token over a record: %v, want ErrNotHeld", err)
	}
	for _, token := range []string{"a", "b"} {
		if err := s.Release(ctx, one("idem:k"), token, 0); !errors.Is(err, stores.ErrNotHeld) {
			t.Fatalf("Release of %s over a record: %v, want ErrNotHeld", token, err)
		}
		if err := s.Refresh(ctx, one("idem:k"), token, time.Minute); !errors.Is(err, stores.ErrNotHeld) {
			t.Fatalf("Refresh of %s over a record: %v, want ErrNotHeld", token, err)
		}
		if g, err := s.Acquire(ctx, one("idem:k"), token, time.Minute); err != nil || g.OK {
			t.Fatalf("Acquire of %s over a record: %+v, %v; want refused", token, g, err)
		}
	}
	_, rec, _ = s.ClaimRecord(ctx, "idem:k", "c", time.Minute)
	if rec == nil || rec.Fingerprint != "fp" || rec.Response[0] != 0 {
		t.Fatalf("record after the refused calls: %+v", rec)
	}
}

func TestRecordExpires(t *testing.T) {
	s := New()
	ctx := context.Background()
	if g, _, err := s.ClaimRecord(ctx, "k", "a", time.Minute); err != nil || !g.OK {
		t.Fatalf("claim: %+v, %v", g, err)
	}
	if err := s.FinishRecord(ctx, "k", "a", stores.Record{Fingerprint: "fp"}, 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Second, func() bool { return s.Len() == 0 })
	g, rec, err := s.ClaimRecord(ctx, "k", "b", time.Minute)
	if err != nil || !g.OK || rec != nil {
		t.Fatalf("claim after the retention: %+v, %v, %v; want granted", g, rec, err)
	}
	if err := checkInvariants(s); err != nil {
		t.Fatal(err)
	}
}

func TestRecordReleasedClaimLeavesNothing(t *testing.T) {
	s := New()
	ctx := context.Background()
	if g, _, err := s.ClaimRecord(ctx, "k", "a", time.Minute); err != nil || !g.OK {
		t.Fatalf("claim: %+v, %v", g, err)
	}
	if err := s.Release(ctx, one("k"), "a", 0); err != nil {
		t.Fatalf("Release of the claim: %v", err)
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("Len %d after the claim's release, want 0", n)
	}
	if err := s.FinishRecord(ctx, "k", "a", stores.Record{}, time.Minute); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("FinishRecord after Release: %v, want ErrNotHeld", err)
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("Len %d after a refused FinishRecord, want 0", n)
	}
}

func TestRecordInvalid(t *testing.T) {
	s := New()
	ctx := context.Background()
	if _, _, err := s.ClaimRecord(ctx, "", "a", time.Minute); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("claim of an empty key: %v", err)
	}
	if _, _, err := s.ClaimRecord(ctx, "k", "a", 0); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("claim with ttl 0: %v", err)
	}
	if g, _, err := s.ClaimRecord(ctx, "k", "a", time.Minute); err != nil || !g.OK {
		t.Fatalf("claim: %+v, %v", g, err)
	}
	if err := s.FinishRecord(ctx, "k", "a", stores.Record{}, 0); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("finish with retention 0: %v", err)
	}
	if err := s.Refresh(ctx, one("k"), "a", time.Minute); err != nil {
		t.Fatalf("the claim did not stay after a refused finish: %v", err)
	}
}
