package pgstore_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
)

// TestRecordsPurged: expired records are deleted by later FinishRecords
// (up to 4 each), so that records do not grow without bound, and the lease
// rows that still hold them by the lease purge; a key claimed again after
// its record expired keeps its row (the claim) and loses the record; a
// purged key's next claim draws a fence above its record's.
func TestRecordsPurged(t *testing.T) {
	const table = "reqlock_test_records"
	s := open(t, table)
	db := pool(t, testservers.PostgresDSN(t))
	if _, err := db.Exec(t.Context(), `TRUNCATE `+table+`, `+table+`_records`); err != nil {
		t.Fatal(err)
	}
	count := func(q string) int {
		t.Helper()
		var n int
		if err := db.QueryRow(t.Context(), q).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n
	}
	const expired = 10
	fences := make([]int64, expired)
	for i := range expired {
		k := "k" + strconv.Itoa(i)
		g, _, err := s.ClaimRecord(t.Context(), k, "a", time.Minute)
		if err != nil || !g.OK {
			t.Fatalf("ClaimRecord(%s): %+v, %v", k, g, err)
		}
		fences[i] = g.Fences[0]
		if err := s.FinishRecord(t.Context(), k, "a", stores.Record{Fingerprint: "fp", Response: []byte("r"), Fence: g.Fences[0]}, 20*time.Millisecond); err != nil {
			t.Fatalf("FinishRecord(%s): %v", k, err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for count(`SELECT count(*) FROM `+table+`_records WHERE expires_at > clock_timestamp()`) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("records of 20ms retention still unexpired after 10s")
		}
		<-time.After(10 * time.Millisecond) // the retention itself
	}
	// k0 is claimed again: its row holds the claim, its record is stale.
	if g, rec, err := s.ClaimRecord(t.Context(), "k0", "b", time.Minute); err != nil || !g.OK || rec != nil {
		t.Fatalf("ClaimRecord of an expired record's key: %+v, %+v, %v", g, rec, err)
	}
	const live = 3 // each deletes up to 4 expired records: 12 >= 10
	for i := range live {
		k := "live" + strconv.Itoa(i)
		g, _, err := s.ClaimRecord(t.Context(), k, "a", time.Minute)
		if err != nil || !g.OK {
			t.Fatalf("ClaimRecord(%s): %+v, %v", k, g, err)
		}
		if err := s.FinishRecord(t.Context(), k, "a", stores.Record{Fence: g.Fences[0]}, time.Hour); err != nil {
			t.Fatalf("FinishRecord(%s): %v", k, err)
		}
	}
	if n := count(`SELECT count(*) FROM ` + table + `_records`); n != live {
		t.Fatalf("%d records after %d finishes, want the %d live ones: the expired were not purged", n, live, live)
	}
	// The finishes leave the lease rows, which hold expired owners, to the
	// lease purge: it deletes them once their fences are behind the clock
	// by its retention (here 1ms, past the rows' fences and expiries).
	if n := count(`SELECT count(*) FROM ` + table + ` WHERE key LIKE 'k%'`); n != expired {
		t.Fatalf("%d lease rows of expired records' keys before the purge, want %d", n, expired)
	}
	if _, err := s.PurgeShort(t.Context(), time.Millisecond); err != nil {
		t.Fatalf("purge: %v", err)
	}
	if n := count(`SELECT count(*) FROM ` + table + ` WHERE key LIKE 'k%'`); n != 1 {
		t.Fatalf("%d lease rows of expired records' keys after the purge, want 1 (k0, claimed again)", n)
	}
	if n := count(`SELECT count(*) FROM ` + table + `_records`); n != live {
		t.Fatalf("%d records after the purge, want the %d live ones", n, live)
	}
	if n := count(`SELECT count(*) FROM ` + table + ` WHERE key = 'k0' AND token = 'b'`); n != 1 {
		t.Fatal("k0's row does not hold its new claim after the purge")
	}
	g, rec, err := s.ClaimRecord(t.Context(), "k1", "c", time.Minute)
	if err != nil || !g.OK || rec != nil {
		t.Fatalf("ClaimRecord of a purged key: %+v, %+v, %v", g, rec, err)
	}
	if g.Fences[0] < fences[1]+stores.FenceStride {
		t.Fatalf("fence %d of a purged key's claim, %d before the purge: want a stride above", g.Fences[0], fences[1])
	}
}
