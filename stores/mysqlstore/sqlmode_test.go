package mysqlstore

import (
	"bytes"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/reqlock/reqlock/stores"
)

// sqlModes are session sql_modes a user may set on the connections of a
// *sql.DB given to New: each flag that changes how a statement reads
// (EMPTY_STRING_IS_NULL reads an empty string as NULL, ANSI_QUOTES reads
// "..." as a name, NO_BACKSLASH_ESCAPES changes string escapes, ...),
// MariaDB's combinations of them, none at all (no strict mode), and all at
// once.
var sqlModes = []struct{ name, mode string }{
	{"none", ""},
	{"EMPTY_STRING_IS_NULL", "EMPTY_STRING_IS_NULL"},
	{"ANSI_QUOTES", "ANSI_QUOTES"},
	{"NO_BACKSLASH_ESCAPES", "NO_BACKSLASH_ESCAPES"},
	{"PAD_CHAR_TO_FULL_LENGTH", "PAD_CHAR_TO_FULL_LENGTH"},
	{"SIMULTANEOUS_ASSIGNMENT", "SIMULTANEOUS_ASSIGNMENT"},
	{"operators", "HIGH_NOT_PRECEDENCE,PIPES_AS_CONCAT,IGNORE_SPACE,NO_UNSIGNED_SUBTRACTION,TIME_ROUND_FRACTIONAL,REAL_AS_FLOAT"},
	{"ANSI", "ANSI"},
	{"TRADITIONAL", "TRADITIONAL"},
	{"ORACLE", "ORACLE"},
	{"all", "EMPTY_STRING_IS_NULL,ANSI_QUOTES,NO_BACKSLASH_ESCAPES,PAD_CHAR_TO_FULL_LENGTH,SIMULTANEOUS_ASSIGNMENT," +
		"HIGH_NOT_PRECEDENCE,PIPES_AS_CONCAT,IGNORE_SPACE,NO_UNSIGNED_SUBTRACTION,TIME_ROUND_FRACTIONAL,REAL_AS_FLOAT," +
		"STRICT_ALL_TABLES,NO_ZERO_DATE,NO_ZERO_IN_DATE,ERROR_FOR_DIVISION_BY_ZERO,ONLY_FULL_GROUP_BY"},
}

// modeDB returns a *sql.DB whose connections run at the session sql_mode
// mode, with the driver interpolating arguments into the statements (as
// Open has it) or sending them to statements prepared on the server.
func modeDB(t *testing.T, mode string, interpolate bool) *sql.DB {
	t.Helper()
	db := openDB(t, withParam("sql_mode", "'"+mode+"'"), func(cfg *mysql.Config) { cfg.InterpolateParams = interpolate })
	var got string
	if err := db.QueryRowContext(t.Context(), "SELECT @@SESSION.sql_mode").Scan(&got); err != nil {
		t.Fatalf("sql_mode %q: %v", mode, err)
	}
	if first, _, _ := strings.Cut(mode, ","); !strings.Contains(got, first) {
		t.Fatalf("session sql_mode %q, want %q", got, mode)
	}
	return db
}

// TestSQLModes (issue 18, defect 17): every statement of the store is right
// under any session sql_mode, with arguments interpolated or prepared, for
// keys holding quotes, backslashes, NUL and bytes that are not UTF-8: grants,
// refusals, refreshes, kept and plain releases, and the purge, which under
// EMPTY_STRING_IS_NULL used to compare lock_key with an empty string, read
// as NULL, and delete nothing, ever; and the idempotency records'
// statements (claim, finish, replay, purge; issue 23).
func TestSQLModes(t *testing.T) {
	for _, m := range sqlModes {
		for _, interpolate := range []bool{true, false} {
			name := m.name + "/prepared"
			if interpolate {
				name = m.name + "/interpolated"
			}
			t.Run(name, func(t *testing.T) { checkSQLMode(t, modeDB(t, m.mode, interpolate)) })
		}
	}
}

// checkSQLMode runs the store's statements on db.
func checkSQLMode(t *testing.T, db *sql.DB) {
	s := newStore(t, db, WithTable("reqlock_sqlmode"), WithPurge(0, MinRetention))
	keys := testKeys(3)
	for i := range keys {
		keys[i] += "'\"\\%_\x00\xff\xfe`"
	}
	one, two := keys[:1], keys[1:]

	first := mustAcquire(t, s, one, "t1", time.Minute)
	if g, err := s.Acquire(t.Context(), one, "t2", time.Minute); err != nil || g.OK || g.Wait < 50*time.Second || g.Wait > time.Minute {
		t.Fatalf("Acquire of a held key: %+v, %v; want refused with about a minute left", g, err)
	}
	mustAcquire(t, s, two, "t1", time.Minute)
	if g, err := s.Acquire(t.Context(), keys, "t2", time.Minute); err != nil || g.OK || g.Held != 0 {
		t.Fatalf("Acquire of held keys: %+v, %v; want refused on the first", g, err)
	}
	if err := s.Refresh(t.Context(), one, "t1", 2*time.Minute); err != nil {
		t.Fatalf("Refresh of one key: %v", err)
	}
	if err := s.Refresh(t.Context(), two, "t1", 2*time.Minute); err != nil {
		t.Fatalf("Refresh of two keys: %v", err)
	}
	if err := s.Refresh(t.Context(), one, "t2", time.Minute); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("Refresh by another token: %v, want ErrNotHeld", err)
	}
	if g, err := s.Acquire(t.Context(), one, "t2", time.Minute); err != nil || g.OK || g.Wait < time.Minute {
		t.Fatalf("Acquire after a Refresh to 2 minutes: %+v, %v; want refused with over a minute left", g, err)
	}
	if err := s.Release(t.Context(), two, "t1", time.Hour); err != nil {
		t.Fatalf("Release keeping the keys: %v", err)
	}
	if g, err := s.Acquire(t.Context(), two, "t2", time.Minute); err != nil || g.OK || g.Wait < 59*time.Minute {
		t.Fatalf("Acquire of keys kept for an hour: %+v, %v; want refused with about an hour left", g, err)
	}
	if err := s.Release(t.Context(), one, "t1", 0); err != nil {
		t.Fatalf("Release: %v", err)
	}
	next := mustAcquire(t, s, one, "t2", time.Minute)
	if next.Fences[0]-first.Fences[0] < stores.FenceStride {
		t.Fatalf("fence %d after %d, want a stride above", next.Fences[0], first.Fences[0])
	}
	if err := s.Release(t.Context(), one, "t2", 0); err != nil {
		t.Fatalf("Release: %v", err)
	}

	// The released row goes once its fence is behind the clock by the
	// retention; waiting for that is the behaviour under test.
	const retention = 200 * time.Millisecond
	rowExists := func() bool {
		t.Helper()
		var n int
		if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM reqlock_sqlmode WHERE lock_key = ?", []byte(one[0])).Scan(&n); err != nil {
			t.Fatalf("count rows: %v", err)
		}
		return n == 1
	}
	if !rowExists() {
		t.Fatal("the released key has no row")
	}
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for rowExists() {
		if time.Now().After(deadline) {
			t.Fatal("the released row was never purged")
		}
		<-tick.C
		if _, err := s.purge(t.Context(), retention); err != nil {
			t.Fatalf("purge: %v", err)
		}
	}
	if g, err := s.Acquire(t.Context(), two, "t3", time.Minute); err != nil || g.OK {
		t.Fatalf("Acquire of the kept keys after a purge: %+v, %v; want refused", g, err)
	}
	checkSharedSQLMode(t, s, keys[2]+":shared")
	checkRecordSQLMode(t, s, db, keys[2]+":record")
}

// checkRecordSQLMode runs the idempotency records' statements on s with
// key (issue 23): a claim, a claim refused by it, a finish of a record of
// empty and of escaped bytes, a retried finish, another token's finish, a
// replay byte for byte, a Release of the finished claim, and, once the
// record's retention has passed, a new claim and the purge of the record.
func checkRecordSQLMode(t *testing.T, s *Store, db *sql.DB, key string) {
	ctx := t.Context()
	for i, rec := range []stores.Record{
		{Fingerprint: "", Response: []byte{}, Fence: 0},
		{Fingerprint: "fp'\"\\%_\x00", Response: []byte("body '\"\\\x00\xff\xfe\n\r\x1a || NULL"), Fence: -3},
	} {
		k := key + strconv.Itoa(i)
		g, got, err := s.ClaimRecord(ctx, k, "a", time.Minute)
		if err != nil || !g.OK || got != nil {
			t.Fatalf("ClaimRecord of a new key: %+v, %+v, %v", g, got, err)
		}
		if g, got, err := s.ClaimRecord(ctx, k, "b", time.Minute); err != nil || g.OK || got != nil || g.Wait < 50*time.Second {
			t.Fatalf("ClaimRecord of a claimed key: %+v, %+v, %v; want refused with about a minute left", g, got, err)
		}
		rec.Fence = g.Fences[0] + rec.Fence
		if err := s.FinishRecord(ctx, k, "b", rec, time.Minute); !errors.Is(err, stores.ErrNotHeld) {
			t.Fatalf("FinishRecord by another token: %v, want ErrNotHeld", err)
		}
		if err := s.FinishRecord(ctx, k, "a", rec, 300*time.Millisecond); err != nil {
			t.Fatalf("FinishRecord: %v", err)
		}
		if err := s.FinishRecord(ctx, k, "a", rec, 300*time.Millisecond); err != nil {
			t.Fatalf("a retried FinishRecord: %v, want nil", err)
		}
		if err := s.FinishRecord(ctx, k, "b", rec, time.Minute); !errors.Is(err, stores.ErrNotHeld) {
			t.Fatalf("FinishRecord by another token over the record: %v, want ErrNotHeld", err)
		}
		g, got, err = s.ClaimRecord(ctx, k, "b", time.Minute)
		if err != nil || g.OK || got == nil || got.Fingerprint != rec.Fingerprint || !bytes.Equal(got.Response, rec.Response) || got.Fence != rec.Fence {
			t.Fatalf("replay: %+v, %+v, %v; want %+v", g, got, err, rec)
		}
		if err := s.Release(ctx, []string{k}, "a", 0); !errors.Is(err, stores.ErrNotHeld) {
			t.Fatalf("Release of the finished claim: %v, want ErrNotHeld", err)
		}
	}
	// The record's retention running out is the behaviour under test.
	k := key + "1"
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		g, got, err := s.ClaimRecord(ctx, k, "c", time.Minute)
		if err != nil {
			t.Fatalf("ClaimRecord after the retention: %v", err)
		}
		if g.OK && got == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the record of 300ms retention still replayed after 10s: %+v, %+v", g, got)
		}
		<-tick.C
	}
	records := func() int {
		t.Helper()
		var n int
		q := "SELECT COUNT(*) FROM " + quoteTable(recordsTable(s.table)) + " WHERE lock_key IN (?, ?)"
		if err := db.QueryRowContext(ctx, q, []byte(key+"0"), []byte(key+"1")).Scan(&n); err != nil {
			t.Fatalf("count records: %v", err)
		}
		return n
	}
	if n := records(); n == 0 {
		t.Fatal("the expired records are gone before the purge")
	}
	if _, err := s.purgeRecords(ctx); err != nil {
		t.Fatalf("purgeRecords: %v", err)
	}
	if n := records(); n != 0 {
		t.Fatalf("%d expired records left after the purge", n)
	}
	if err := s.Release(ctx, []string{k}, "c", 0); err != nil {
		t.Fatalf("Release of the new claim: %v", err)
	}
}

// checkSharedSQLMode runs the shared grants' statements on s with key:
// holders up to a limit, a writer recorded and withdrawn, a refresh, kept
// and plain releases.
func checkSharedSQLMode(t *testing.T, s *Store, key string) {
	ctx := t.Context()
	for _, h := range []string{"a", "b"} {
		if g, err := s.AcquireShared(ctx, key, h, 2, time.Minute); err != nil || !g.OK {
			t.Fatalf("AcquireShared(%s): %+v, %v", h, g, err)
		}
	}
	if g, err := s.AcquireShared(ctx, key, "c", 2, time.Minute); err != nil || g.OK || g.Wait < 50*time.Second {
		t.Fatalf("a third holder under a limit of 2: %+v, %v; want refused with about a minute", g, err)
	}
	if g, err := s.Acquire(ctx, []string{key}, "w", time.Minute); err != nil || g.OK || !g.SharedHeld {
		t.Fatalf("Acquire over holders: %+v, %v; want refused with SharedHeld", g, err)
	}
	if err := s.ReleaseShared(ctx, key, "b", 0); err != nil {
		t.Fatalf("ReleaseShared(b): %v", err)
	}
	if g, err := s.AcquireShared(ctx, key, "c", 2, time.Minute); err != nil || g.OK {
		t.Fatalf("a new holder while a writer waits: %+v, %v; want refused", g, err)
	}
	if err := s.Release(ctx, []string{key}, "w", 0); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("the writer's withdrawal: %v, want ErrNotHeld", err)
	}
	if g, err := s.AcquireShared(ctx, key, "c", 2, time.Minute); err != nil || !g.OK {
		t.Fatalf("a new holder after the writer withdrew: %+v, %v", g, err)
	}
	if err := s.RefreshShared(ctx, key, "a", 2*time.Minute); err != nil {
		t.Fatalf("RefreshShared(a): %v", err)
	}
	if err := s.ReleaseShared(ctx, key, "a", time.Millisecond); err != nil {
		t.Fatalf("ReleaseShared(a) with keep: %v", err)
	}
	if err := s.ReleaseShared(ctx, key, "c", 0); err != nil {
		t.Fatalf("ReleaseShared(c): %v", err)
	}
}

// TestSimultaneousAssignment: with MariaDB's sql_mode
// SIMULTANEOUS_ASSIGNMENT, where every assignment of an UPDATE sees the row
// as it was, a key taken over after its holder's expiry still gets the new
// holder's expiry, so a third token is refused.
func TestSimultaneousAssignment(t *testing.T) {
	s := newStore(t, modeDB(t, "STRICT_TRANS_TABLES,SIMULTANEOUS_ASSIGNMENT", true))
	for _, n := range []int{1, 3} {
		keys := testKeys(n)
		mustAcquire(t, s, keys, "t1", 20*time.Millisecond)
		// Waiting for the TTL to run out is the behaviour under test.
		deadline := time.Now().Add(5 * time.Second)
		tick := time.NewTicker(5 * time.Millisecond)
		for {
			g, err := s.Acquire(t.Context(), keys, "t2", time.Minute)
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			if g.OK {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d keys: never free after a 20ms TTL", n)
			}
			<-tick.C
		}
		tick.Stop()
		if g, err := s.Acquire(t.Context(), keys, "t3", time.Minute); err != nil || g.OK || g.Wait <= 50*time.Second {
			t.Fatalf("%d keys: Acquire by a third token after a takeover: %+v, %v; want refused with the new holder's minute left", n, g, err)
		}
		if err := s.Release(t.Context(), keys, "t2", 0); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
}
