package memstore

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// TestReview23LongestRetention: a claim of ttl math.MaxInt64 and a record
// kept for math.MaxInt64 neither overflow nor expire at once (issue 23).
func TestReview23LongestRetention(t *testing.T) {
	s := New()
	ctx := context.Background()
	g, _, err := s.ClaimRecord(ctx, "k", "a", math.MaxInt64)
	if err != nil || !g.OK {
		t.Fatalf("claim with ttl MaxInt64: %+v, %v", g, err)
	}
	if g, rec, _ := s.ClaimRecord(ctx, "k", "b", time.Minute); g.OK || rec != nil || g.Wait < 100*365*24*time.Hour {
		t.Fatalf("a claim by b: %+v, record %+v; want refused with a Wait of about 292 years", g, rec)
	}
	if err := s.FinishRecord(ctx, "k", "a", stores.Record{Fingerprint: "fp", Fence: g.Fences[0]}, math.MaxInt64); err != nil {
		t.Fatalf("FinishRecord with retention MaxInt64: %v", err)
	}
	if _, rec, err := s.ClaimRecord(ctx, "k", "b", time.Minute); err != nil || rec == nil || rec.Fingerprint != "fp" {
		t.Fatalf("replay after a finish of retention MaxInt64: %+v, %v", rec, err)
	}
	if err := checkInvariants(s); err != nil {
		t.Fatal(err)
	}
}
