package mysqlstore

import (
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/reqlock/reqlock/internal/holders"
	"github.com/reqlock/reqlock/stores"
)

// ownTable returns a Store on its own table (dropped first), so that
// the rows the test counts are its own.
func ownTable(t *testing.T, db *sql.DB, name string) *Store {
	t.Helper()
	for _, tb := range []string{name, holdersTable(name), recordsTable(name)} {
		if _, err := db.ExecContext(t.Context(), "DROP TABLE IF EXISTS "+quoteTable(tb)); err != nil {
			t.Fatal(err)
		}
	}
	s := newStore(t, db, WithTable(name), WithPurge(0, MinRetention))
	if _, err := s.Acquire(t.Context(), testKeys(1), "setup", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	return s
}

func countRows(t *testing.T, db *sql.DB, table string) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM "+quoteTable(table)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPurgeBatches: more than two batches of stale holder rows
// (digests full of quote, backslash, NUL and space bytes) and of
// purgeable lease rows with expired holders are all deleted by one purge,
// whose count is the rows it deleted; both with prepared statements and
// with the driver interpolating arguments (as Open's does).
func TestPurgeBatches(t *testing.T) {
	for _, interp := range []bool{false, true} {
		t.Run(fmt.Sprintf("interpolate=%v", interp), func(t *testing.T) {
			db := openDB(t, func(c *mysql.Config) { c.InterpolateParams = interp })
			s := ownTable(t, db, "reqlock_review_batches")
			ht := quoteTable(holdersTable(s.Table()))
			ctx := t.Context()
			// Orphans: 2*purgeBatch+1 keys, the first purgeBatch with two
			// rows each; special bytes.
			specials := []byte{0, '\'', '\\', ' ', '"', 0xff, '%', '_'}
			var want int64
			for i := range 2*purgeBatch + 1 {
				sum := make([]byte, 32)
				_, _ = rand.Read(sum)
				sum[i%32] = specials[i%len(specials)]
				sum[31] = specials[(i/3)%len(specials)]
				rowsPer := 1
				if i < purgeBatch {
					rowsPer = 2
				}
				for w := range rowsPer {
					if _, err := db.ExecContext(ctx, "INSERT INTO "+ht+" (key_sum, writer, token_sum, expires_at) VALUES (?, ?, ?, UTC_TIMESTAMP(6) - INTERVAL 1 HOUR)",
						sum, w, sum); err != nil {
						t.Fatal(err)
					}
					want++
				}
			}
			// Lease rows: purgeBatch+1 released long ago, each with an
			// expired holder (expired, not for the retention: only purgeKeys
			// deletes it).
			for i := range purgeBatch + 1 {
				key := fmt.Sprintf("review:%04d:'\\ %c", i, rune('a'+i%26))
				if _, err := db.ExecContext(ctx, "INSERT INTO "+quoteTable(s.Table())+" (lock_key, token, expires_at, fence) VALUES (?, 't', '1970-01-01 00:00:00', 1024)", key); err != nil {
					t.Fatal(err)
				}
				if _, err := db.ExecContext(ctx, "INSERT INTO "+ht+" (key_sum, writer, token_sum, expires_at) VALUES (?, 0, ?, UTC_TIMESTAMP(6))",
					holders.Digest(key), holders.Digest("x")); err != nil {
					t.Fatal(err)
				}
				want += 2
			}
			before := countRows(t, db, s.Table()) + countRows(t, db, holdersTable(s.Table()))
			n, err := s.purge(ctx, time.Minute)
			if err != nil {
				t.Fatalf("purge: %v", err)
			}
			after := countRows(t, db, s.Table()) + countRows(t, db, holdersTable(s.Table()))
			if n != before-after {
				t.Errorf("purge returned %d, deleted %d rows", n, before-after)
			}
			if h := countRows(t, db, holdersTable(s.Table())); h != 0 {
				t.Errorf("%d holder rows left after a purge, want 0", h)
			}
			if l := countRows(t, db, s.Table()); l != 1 { // the setup key's, expired less than a minute ago
				t.Errorf("%d lease rows left after a purge, want 1", l)
			}
			if n < want {
				t.Errorf("purge returned %d, want at least %d", n, want)
			}
		})
	}
}

// TestPurgeRacesHolders: while purges (of two Stores) run with a
// tiny retention, holders that reuse a few tokens (so that their rows
// expire, go stale and are revived by the upsert) take places under a
// limit, refresh and release them: no committed count of live holders
// exceeds the limit, no holder that holds its place is told ErrNotHeld,
// fences grow, no call or purge fails, and once the traffic stops the
// keys' expired holders are purged.
func TestPurgeRacesHolders(t *testing.T) {
	t.Run("read-committed", func(t *testing.T) { racesHolders(t, false) })
	t.Run("repeatable-read", func(t *testing.T) { racesHolders(t, true) })
}

func racesHolders(t *testing.T, rr bool) {
	db := openDB(t)
	s := newStore(t, db)
	s2 := newStore(t, openDB(t))
	ctx := t.Context()
	if rr { // as under log_bin with binlog_format STATEMENT
		for _, st := range []*Store{s, s2} {
			if err := st.setup(ctx); err != nil {
				t.Fatal(err)
			}
			st.holdersTx = &sql.TxOptions{Isolation: sql.LevelRepeatableRead}
		}
	}
	const (
		limit   = 2
		workers = 10
		run     = 4 * time.Second
	)
	keys := testKeys(12)
	stop := make(chan struct{})
	errs := make(chan error, 64)
	report := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	var wg sync.WaitGroup
	var grants, refreshes, purged atomic.Int64
	var fenceMu sync.Mutex
	lastFence := map[string]int64{}
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := keys[mrand.IntN(len(keys))]
				token := fmt.Sprintf("w%d-%d", w, i%3) // reused tokens
				ttl := 2 * time.Second
				if i%2 == 0 {
					ttl = time.Millisecond // abandoned at once
				}
				fenceMu.Lock()
				before := lastFence[key]
				fenceMu.Unlock()
				g, err := s.AcquireShared(ctx, key, token, limit, ttl)
				if err != nil {
					report(fmt.Errorf("AcquireShared: %w", err))
					return
				}
				if !g.OK {
					continue
				}
				grants.Add(1)
				fenceMu.Lock()
				if g.Fences[0] <= before {
					report(fmt.Errorf("fence %d of %s after %d", g.Fences[0], key, before))
				}
				lastFence[key] = max(lastFence[key], g.Fences[0])
				fenceMu.Unlock()
				var live int
				if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+quoteTable(holdersTable(s.Table()))+
					" WHERE key_sum = ? AND writer = 0 AND expires_at > UTC_TIMESTAMP(6)", holders.Digest(key)).Scan(&live); err != nil {
					report(err)
					return
				}
				if live > limit {
					report(fmt.Errorf("%d live holders of %s under a limit of %d", live, key, limit))
				}
				if ttl < time.Second {
					continue
				}
				for range 2 {
					if err := s.RefreshShared(ctx, key, token, 2*time.Second); err != nil {
						report(fmt.Errorf("RefreshShared of a live holder: %w", err))
						return
					}
					refreshes.Add(1)
				}
				if err := s.ReleaseShared(ctx, key, token, 0); err != nil {
					report(fmt.Errorf("ReleaseShared of a live holder: %w", err))
					return
				}
			}
		})
	}
	for _, st := range []*Store{s, s2} {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				n, err := st.purge(ctx, time.Microsecond)
				if err != nil {
					report(fmt.Errorf("purge: %w", err))
					return
				}
				purged.Add(n)
			}
		})
	}
	select {
	case err := <-errs:
		close(stop)
		wg.Wait()
		t.Fatal(err)
	case <-time.After(run):
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d grants, %d refreshes, %d rows purged, %d retries", grants.Load(), refreshes.Load(), purged.Load(), s.Retries()+s2.Retries())
	if grants.Load() == 0 || purged.Load() == 0 {
		t.Fatalf("%d grants, %d rows purged: the test raced nothing", grants.Load(), purged.Load())
	}
	purgeUntil(t, s, time.Microsecond, "expired holders of keys no longer used are still there", func() bool {
		for _, k := range keys {
			if all, _ := holderRows(t, db, s, k); all > 0 {
				return false
			}
		}
		return true
	})
}

// TestPurgeRacesWriters: exclusive Acquires refused by holders
// (writer records), AcquireShared and purges race: no call fails, the
// exclusive grants never overlap a live shared holder.
func TestPurgeRacesWriters(t *testing.T) {
	db := openDB(t)
	s := newStore(t, db)
	ctx := t.Context()
	keys := testKeys(2)
	stop := make(chan struct{})
	errs := make(chan error, 64)
	report := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	var wg sync.WaitGroup
	var exclusive, shared atomic.Int64
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := keys[mrand.IntN(len(keys))]
				token := fmt.Sprintf("x%d-%d", w, i)
				if w%2 == 0 {
					g, err := s.Acquire(ctx, []string{key}, token, 3*time.Millisecond)
					if err != nil {
						report(fmt.Errorf("Acquire: %w", err))
						return
					}
					if g.OK {
						exclusive.Add(1)
					}
					continue
				}
				g, err := s.AcquireShared(ctx, key, token, 0, 3*time.Millisecond)
				if err != nil {
					report(fmt.Errorf("AcquireShared: %w", err))
					return
				}
				if g.OK {
					shared.Add(1)
				}
			}
		})
	}
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.purge(ctx, time.Microsecond); err != nil && !errors.Is(err, stores.ErrInvalid) {
				report(fmt.Errorf("purge: %w", err))
				return
			}
		}
	})
	select {
	case err := <-errs:
		close(stop)
		wg.Wait()
		t.Fatal(err)
	case <-time.After(3 * time.Second):
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d exclusive, %d shared grants, %d retries", exclusive.Load(), shared.Load(), s.Retries())
}

// TestPurgeKeepsWriterRecord: a writer's unexpired record on a key
// whose holders all left (its lease row released, purgeable by the lease
// conditions) survives purges, with its lease row, and keeps refusing new
// holders for the writer's window.
func TestPurgeKeepsWriterRecord(t *testing.T) {
	db := openDB(t)
	s := newStore(t, db)
	ctx := t.Context()
	key := testKeys(1)[0]
	if g, err := s.AcquireShared(ctx, key, "h", 0, time.Minute); err != nil || !g.OK {
		t.Fatalf("AcquireShared: %+v, %v", g, err)
	}
	if g, err := s.Acquire(ctx, []string{key}, "w", time.Minute); err != nil || g.OK || !g.SharedHeld {
		t.Fatalf("Acquire: %+v, %v; want refused by holders", g, err)
	}
	if err := s.ReleaseShared(ctx, key, "h", 0); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for range 5 {
		if _, err := s.purge(ctx, time.Microsecond); err != nil {
			t.Fatal(err)
		}
	}
	g, err := s.AcquireShared(ctx, key, "h2", 0, time.Minute)
	if time.Since(start) < stores.WriterWindow/2 {
		if err != nil || g.OK {
			t.Fatalf("AcquireShared within the writer's window after purges: %+v, %v; want refused by the writer's record", g, err)
		}
		if !leaseRow(t, db, s, key) {
			t.Fatal("the purge deleted the lease row of a key with a writer record")
		}
	} else {
		t.Skip("machine too slow to stay within the writer window")
	}
}

// TestPurgeHoldersSQLModes: the purge's statements on the holders
// table under every sql_mode, interpolated or prepared, for a key of
// quotes, backslashes, NUL and non-UTF-8 bytes: a key held shared once,
// with a writer's record, and an orphaned holder, all go.
func TestPurgeHoldersSQLModes(t *testing.T) {
	for _, m := range sqlModes {
		for _, interpolate := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/%v", m.name, interpolate), func(t *testing.T) {
				db := modeDB(t, m.mode, interpolate)
				s := newStore(t, db, WithTable("reqlock_sqlmode"), WithPurge(0, MinRetention))
				ctx := t.Context()
				keys := testKeys(2)
				for i := range keys {
					keys[i] += "'\"\\%_\x00\xff\xfe`"
				}
				key, orphan := keys[0], keys[1]
				if g, err := s.AcquireShared(ctx, key, "a", 0, 100*time.Millisecond); err != nil || !g.OK {
					t.Fatalf("AcquireShared: %+v, %v", g, err)
				}
				if g, err := s.Acquire(ctx, []string{key}, "w", time.Minute); err != nil || g.OK || !g.SharedHeld {
					t.Fatalf("Acquire: %+v, %v", g, err)
				}
				if g, err := s.AcquireShared(ctx, orphan, "a", 0, time.Millisecond); err != nil || !g.OK {
					t.Fatalf("AcquireShared: %+v, %v", g, err)
				}
				if _, err := db.ExecContext(ctx, "DELETE FROM reqlock_sqlmode WHERE lock_key = ?", []byte(orphan)); err != nil {
					t.Fatal(err)
				}
				purgeUntil(t, s, 200*time.Millisecond, "the key's rows are still there", func() bool {
					a, _ := holderRows(t, db, s, key)
					b, _ := holderRows(t, db, s, orphan)
					var n int
					if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM reqlock_sqlmode WHERE lock_key = ?", []byte(key)).Scan(&n); err != nil {
						t.Fatal(err)
					}
					return a == 0 && b == 0 && n == 0
				})
			})
		}
	}
}

// TestRefreshExpiredHolder: a holder whose place expired, before and
// after a purge (its row still there, then deleted), is told ErrNotHeld
// by RefreshShared and ReleaseShared, and is not revived: with a limit of
// one, another token's grant after the expiry stands.
func TestRefreshExpiredHolder(t *testing.T) {
	db := openDB(t)
	s := newStore(t, db)
	ctx := t.Context()
	key := testKeys(1)[0]
	if g, err := s.AcquireShared(ctx, key, "old", 1, 50*time.Millisecond); err != nil || !g.OK {
		t.Fatalf("AcquireShared: %+v, %v", g, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if all, live := holderRows(t, db, s, key); all == 1 && live == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the place never expired")
		}
		<-tick.C
	}
	if err := s.RefreshShared(ctx, key, "old", time.Minute); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("RefreshShared of an expired place, row kept: %v, want ErrNotHeld", err)
	}
	purgeUntil(t, s, time.Microsecond, "the expired place is still there", func() bool {
		all, _ := holderRows(t, db, s, key)
		return all == 0
	})
	if err := s.RefreshShared(ctx, key, "old", time.Minute); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("RefreshShared of a purged place: %v, want ErrNotHeld", err)
	}
	if err := s.ReleaseShared(ctx, key, "old", 0); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("ReleaseShared of a purged place: %v, want ErrNotHeld", err)
	}
	if g, err := s.AcquireShared(ctx, key, "new", 1, time.Minute); err != nil || !g.OK {
		t.Fatalf("AcquireShared after the purge: %+v, %v", g, err)
	}
	if g, err := s.AcquireShared(ctx, key, "old", 1, time.Minute); err != nil || g.OK {
		t.Fatalf("AcquireShared of the old token under a limit of 1: %+v, %v; want refused", g, err)
	}
	_ = s.ReleaseShared(ctx, key, "new", 0)
}
