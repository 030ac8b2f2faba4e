package pgstore_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/pgstore"
)

// purgeStore returns a pool and a Store with opts on table, whose tables
// are dropped first, closed when the test ends (the Store first).
func purgeStore(t *testing.T, table string, opts ...pgstore.Option) (*pgxpool.Pool, *pgstore.Store) {
	t.Helper()
	db := pool(t, testservers.PostgresDSN(t))
	if _, err := db.Exec(t.Context(), `DROP TABLE IF EXISTS `+table+`, `+table+`_holders, `+table+`_records`); err != nil {
		t.Fatal(err)
	}
	s, err := pgstore.New(t.Context(), db, append([]pgstore.Option{pgstore.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return db, s
}

// count runs a count(*) query.
func count(t *testing.T, db *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(t.Context(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// TestPurge: a purge deletes the lease rows free for the retention whose
// fence the clock has passed by it, expired records, and the expired
// holders and writer records of keys held shared, also under a key held
// since; it keeps held rows, rows with live holders, watched rows, live
// claims and records, and rows granted or expired within the retention. A
// purged key's next grant, exclusive or shared, has a fence a stride above
// every fence it had.
func TestPurge(t *testing.T) {
	const table = "reqlock_test_purge"
	db, s := purgeStore(t, table, pgstore.WithPurge(0, pgstore.MinRetention))
	ctx := t.Context()
	last := map[string]int64{} // each key's latest fence
	grant := func(g stores.Grant, err error, what string) int64 {
		t.Helper()
		if err != nil || !g.OK {
			t.Fatalf("%s: %+v, %v", what, g, err)
		}
		return g.Fences[0]
	}
	acquire := func(key, token string, ttl time.Duration) {
		t.Helper()
		g, err := s.Acquire(ctx, []string{key}, token, ttl)
		last[key] = grant(g, err, "Acquire "+key)
	}
	shared := func(key, token string, ttl time.Duration) {
		t.Helper()
		g, err := s.AcquireShared(ctx, key, token, 0, ttl)
		last[key] = max(last[key], grant(g, err, "AcquireShared "+key))
	}

	for range 3 { // fences grown by a few grants
		acquire("released", "a", time.Minute)
		if err := s.Release(ctx, []string{"released"}, "a", 0); err != nil {
			t.Fatal(err)
		}
	}
	acquire("expired", "a", time.Millisecond)
	acquire("held", "a", time.Minute)
	// Holders that expire within a second (both of shared-gone's must be
	// live when the second comes, lest it delete the first).
	shared("shared-gone", "r1", time.Second) // expired holders, the key not used again
	shared("shared-gone", "r2", time.Second)
	shared("shared-live", "r1", time.Minute) // a live holder
	shared("shared-then-held", "r1", time.Second)
	// A writer refused by shared-live's holder leaves a writer record,
	// which ends after stores.WriterWindow.
	if g, err := s.Acquire(ctx, []string{"shared-live"}, "w", time.Minute); err != nil || g.OK || !g.SharedHeld {
		t.Fatalf("Acquire of a key held shared: %+v, %v; want refused by holders", g, err)
	}
	// watched: expired, but a refusal while it was held marks it watched
	// for 30s.
	acquire("watched", "a", time.Second)
	if g, err := s.Acquire(ctx, []string{"watched"}, "b", time.Minute); err != nil || g.OK {
		t.Fatalf("Acquire of a held key: %+v, %v; want refused", g, err)
	}
	claim := func(key, token string) int64 {
		t.Helper()
		g, rec, err := s.ClaimRecord(ctx, key, token, time.Minute)
		if rec != nil {
			t.Fatalf("ClaimRecord %s: a record %+v", key, rec)
		}
		f := grant(g, err, "ClaimRecord "+key)
		last[key] = f
		return f
	}
	claim("claim", "a")
	finish := func(key string, retention time.Duration) {
		t.Helper()
		f := claim(key, "a")
		if err := s.FinishRecord(ctx, key, "a", stores.Record{Fingerprint: "fp", Response: []byte("r"), Fence: f}, retention); err != nil {
			t.Fatalf("FinishRecord %s: %v", key, err)
		}
	}
	finish("record-live", time.Hour)
	finish("record-gone", time.Millisecond)

	// Every row is younger than MinRetention: only the expired records,
	// holders and writer records may go.
	deadline := time.Now().Add(10 * time.Second)
	for count(t, db, `SELECT count(*) FROM `+table+`_holders WHERE expires_at <= clock_timestamp()`) < 4 {
		if time.Now().After(deadline) {
			t.Fatal("the short holders and the writer record did not expire in 10s")
		}
		<-time.After(10 * time.Millisecond) // their own expiry (a second at most)
	}
	acquire("shared-then-held", "x", time.Minute) // exclusive: it keeps the expired holder
	n, err := s.Purge(ctx, pgstore.MinRetention)
	if err != nil {
		t.Fatalf("Purge: %v", err)
	}
	if n != 5 { // record-gone's record, 2+1 expired holders, 1 writer record
		t.Errorf("Purge at MinRetention deleted %d rows, want 5 (a record, 3 holders, a writer record)", n)
	}
	if c := count(t, db, `SELECT count(*) FROM `+table); c != 10 {
		t.Fatalf("%d lease rows after a purge at MinRetention, want all 10", c)
	}
	if c := count(t, db, `SELECT count(*) FROM `+table+`_holders`); c != 1 {
		t.Fatalf("%d holders-table rows after a purge, want shared-live's live holder alone", c)
	}
	if c := count(t, db, `SELECT count(*) FROM `+table+`_records`); c != 1 {
		t.Fatalf("%d records after a purge, want record-live's alone", c)
	}

	// With a retention of 200ms, the free rows go once their fence is 200ms
	// behind the clock; waiting for that is the behaviour under test.
	gone := []string{"released", "expired", "shared-gone", "record-gone"}
	kept := []string{"held", "shared-live", "shared-then-held", "watched", "claim", "record-live"}
	rows := func(keys []string) int {
		return count(t, db, `SELECT count(*) FROM `+table+` WHERE key = ANY($1::bytea[])`, bytesOf(keys))
	}
	for rows(gone) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the free rows still there after 10s of purges", rows(gone))
		}
		<-time.After(50 * time.Millisecond)
		if _, err := s.PurgeShort(ctx, 200*time.Millisecond); err != nil {
			t.Fatalf("purge: %v", err)
		}
	}
	if c := rows(kept); c != len(kept) {
		t.Fatalf("%d of the %d rows that must stay are left: %v", c, len(kept), kept)
	}
	if c := count(t, db, `SELECT count(*) FROM `+table+`_holders`); c != 1 {
		t.Fatalf("%d holders-table rows after the purges, want shared-live's live holder alone", c)
	}

	// The held keys are still held, the live record still answers.
	if g, err := s.Acquire(ctx, []string{"held"}, "b", time.Minute); err != nil || g.OK {
		t.Fatalf("Acquire of the held key after a purge: %+v, %v; want refused", g, err)
	}
	if g, err := s.AcquireShared(ctx, "shared-live", "r2", 1, time.Minute); err != nil || g.OK {
		t.Fatalf("AcquireShared at a limit of 1 after a purge: %+v, %v; want refused by the live holder", g, err)
	}
	if _, rec, err := s.ClaimRecord(ctx, "record-live", "b", time.Minute); err != nil || rec == nil || string(rec.Response) != "r" {
		t.Fatalf("ClaimRecord of the live record after a purge: %+v, %v; want the record", rec, err)
	}

	// The next grants of purged keys: fences a stride above their last.
	for _, key := range gone {
		before := last[key]
		if key == "shared-gone" {
			shared(key, "r3", time.Minute)
		} else {
			acquire(key, "c", time.Minute)
		}
		if last[key]-before < stores.FenceStride {
			t.Errorf("fence of purged %s: %d after %d, want a stride above", key, last[key], before)
		}
	}
}

// bytesOf returns keys as bytea values.
func bytesOf(keys []string) [][]byte {
	b := make([][]byte, len(keys))
	for i, k := range keys {
		b[i] = []byte(k)
	}
	return b
}

// TestPurgeOptions: New refuses a negative purge interval and a retention
// below MinRetention, and Purge a retention below it, with
// stores.ErrInvalid naming the problem; Purge after Close returns
// ErrClosed.
func TestPurgeOptions(t *testing.T) {
	db := pool(t, testservers.PostgresDSN(t))
	for _, c := range []struct {
		name string
		opt  pgstore.Option
		want string
	}{
		{"negative interval", pgstore.WithPurge(-time.Hour, time.Hour), "purge interval -1h0m0s is negative"},
		{"short retention", pgstore.WithPurge(time.Hour, pgstore.MinRetention-time.Second), "purge retention 59s is below 1m0s"},
	} {
		s, err := pgstore.New(t.Context(), db, c.opt)
		if err == nil {
			_ = s.Close()
		}
		if !errors.Is(err, stores.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New with a %s: %v; want stores.ErrInvalid saying %q", c.name, err, c.want)
		}
	}
	// No goroutine: the retention is not used, so any is accepted.
	s, err := pgstore.New(t.Context(), db, pgstore.WithPurge(0, 0))
	if err != nil {
		t.Fatalf("New with WithPurge(0, 0), the purge goroutine off: %v", err)
	}
	if _, err := s.Purge(t.Context(), pgstore.MinRetention-time.Second); !errors.Is(err, stores.ErrInvalid) || !strings.Contains(err.Error(), "retention") {
		t.Errorf("Purge with a short retention: %v; want stores.ErrInvalid naming the retention", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Purge(t.Context(), pgstore.MinRetention); !errors.Is(err, pgstore.ErrClosed) {
		t.Errorf("Purge after Close: %v; want ErrClosed", err)
	}
}

// TestPurgeGoroutine: the Store's purge goroutine deletes a released row;
// Close ends a purge stuck behind a lock at once, and leaves no goroutine.
func TestPurgeGoroutine(t *testing.T) {
	const table = "reqlock_test_purge_goroutine"
	db := pool(t, testservers.PostgresDSN(t))
	if _, err := db.Exec(t.Context(), `DROP TABLE IF EXISTS `+table+`, `+table+`_holders, `+table+`_records`); err != nil {
		t.Fatal(err)
	}
	base := runtime.NumGoroutine()
	s, err := pgstore.New(t.Context(), db, pgstore.WithTable(table), pgstore.WithShortPurge(20*time.Millisecond, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if g, err := s.Acquire(t.Context(), []string{"k"}, "a", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	if err := s.Release(t.Context(), []string{"k"}, "a", 0); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for count(t, db, `SELECT count(*) FROM `+table) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the purge goroutine did not delete a released row in 10s")
		}
		<-time.After(10 * time.Millisecond) // the goroutine's interval
	}

	// Lock the table: the next purge waits for the lock.
	tx, err := db.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(t.Context())) //nolint:errcheck // ends the lock
	if _, err := tx.Exec(t.Context(), `LOCK TABLE `+table+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	for count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`, "%"+table+"%") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no purge waiting for the table's lock after 10s")
		}
		<-time.After(10 * time.Millisecond)
	}
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Close took %v with a purge waiting for a lock; want it ended at once", d)
	}
	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline.Add(5 * time.Second)) {
			t.Fatalf("%d goroutines after Close, %d before New", runtime.NumGoroutine(), base)
		}
		time.Sleep(5 * time.Millisecond) // polling the goroutine count, which no channel reports
	}
}
