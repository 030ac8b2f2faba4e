package mysqlstore

import (
	"strconv"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// TestRecordsPurged: the purge deletes expired records, and later their
// lease rows, so that records do not grow without bound; a live record
// stays, and still answers.
func TestRecordsPurged(t *testing.T) {
	const table = "reqlock_test_records"
	db := openDB(t)
	s := newStore(t, db, WithTable(table), WithPurge(0, MinRetention))
	count := func(q string) int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(t.Context(), q).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n
	}
	finish := func(k string, retention time.Duration) stores.Record {
		t.Helper()
		g, _, err := s.ClaimRecord(t.Context(), k, "a", time.Minute)
		if err != nil || !g.OK {
			t.Fatalf("ClaimRecord(%s): %+v, %v", k, g, err)
		}
		rec := stores.Record{Fingerprint: "fp", Response: []byte("r"), Fence: g.Fences[0]}
		if err := s.FinishRecord(t.Context(), k, "a", rec, retention); err != nil {
			t.Fatalf("FinishRecord(%s): %v", k, err)
		}
		return rec
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36) // keys of this run alone, on a server kept between runs
	const expired = 5
	for i := range expired {
		finish(run+":k"+strconv.Itoa(i), 20*time.Millisecond)
	}
	live := finish(run+":live", time.Hour)
	deadline := time.Now().Add(10 * time.Second)
	for count("SELECT COUNT(*) FROM "+table+"_records WHERE expires_at > UTC_TIMESTAMP(6)") > 1 {
		if time.Now().After(deadline) {
			t.Fatal("records of 20ms retention still unexpired after 10s")
		}
		<-time.After(10 * time.Millisecond) // the retention itself
	}
	if n := count("SELECT COUNT(*) FROM " + table + "_records WHERE lock_key LIKE '" + run + ":%'"); n != expired+1 {
		t.Fatalf("%d records before the purge, want %d", n, expired+1)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		if _, err := s.purge(t.Context(), time.Millisecond); err != nil {
			t.Fatalf("purge: %v", err)
		}
		if count("SELECT COUNT(*) FROM "+table+" WHERE lock_key LIKE '"+run+":k%'") == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lease rows of expired records still there after 10s of purges")
		}
		<-time.After(10 * time.Millisecond) // the purge's retention of 1ms, past the rows' expiry and fence
	}
	if n := count("SELECT COUNT(*) FROM " + table + "_records"); n != 1 {
		t.Fatalf("%d records after the purge, want the live one", n)
	}
	_, rec, err := s.ClaimRecord(t.Context(), run+":live", "b", time.Minute)
	if err != nil || rec == nil || string(rec.Response) != string(live.Response) || rec.Fence != live.Fence {
		t.Fatalf("the live record after the purge: %+v, %v; want %+v", rec, err, live)
	}
}
