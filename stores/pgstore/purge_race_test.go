package pgstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/pgstore"
)

// TestPurgeBatches: 1201 free rows with binary keys (NUL, 0xff,
// prefixes of each other); while another transaction locks the first 600
// in key order (more than a batch), a purge returns and deletes the other
// 601; once they are unlocked, the next purge deletes them too.
func TestPurgeBatches(t *testing.T) {
	const table = "reqlock_test_review_batches"
	db, s := purgeStore(t, table, pgstore.WithPurge(0, pgstore.MinRetention))
	ctx := t.Context()
	if _, err := s.Purge(ctx, pgstore.MinRetention); err != nil { // creates the tables
		t.Fatal(err)
	}
	var keys [][]byte
	for i := range 1201 {
		k := []byte{byte(i % 256), byte(i / 256)}
		switch i % 3 {
		case 1:
			k = append(k, 0)
		case 2:
			k = append(k, 0xff, 0xff)
		}
		keys = append(keys, k)
	}
	if _, err := db.Exec(ctx, `INSERT INTO `+table+` (key, fence) SELECT k, 0 FROM unnest($1::bytea[]) AS k`, keys); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT key FROM `+table+` ORDER BY key LIMIT 600 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	n, err := s.PurgeShort(pctx, 0)
	if err != nil {
		t.Fatalf("purge beside 600 locked rows: %d, %v", n, err)
	}
	if n != 601 || count(t, db, `SELECT count(*) FROM `+table) != 600 {
		t.Errorf("purge beside 600 locked rows deleted %d rows, left %d; want 601 and 600", n, count(t, db, `SELECT count(*) FROM `+table))
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := s.PurgeShort(pctx, 0); err != nil || n != 600 {
		t.Errorf("second purge: %d, %v; want 600", n, err)
	}
}

// TestPurgeUnderTraffic: purges at a retention of 1ms beside
// exclusive single- and multi-key grants and shared grants under limit 2,
// a third of which die (never released, a TTL of 20ms) so that expired
// holders and expired rows keep appearing: never two exclusive holders,
// never an exclusive beside a shared one, never more than 2 live shared
// ones, and every grant's fence is above every fence returned before the
// call began.
func TestPurgeUnderTraffic(t *testing.T) {
	const (
		table = "reqlock_test_review_traffic"
		nkeys = 6
		limit = 2
	)
	_, s := purgeStore(t, table, pgstore.WithPurge(0, pgstore.MinRetention))
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Second)
	defer cancel()
	var (
		mu       sync.Mutex
		excl     [nkeys]int
		shared   [nkeys]int
		maxDone  [nkeys]int64
		failures = make(chan string, 100)
		grants   int
	)
	fail := func(format string, args ...any) {
		select {
		case failures <- fmt.Sprintf(format, args...):
		default:
		}
	}
	name := func(k int) string { return fmt.Sprintf("rt:%d", k) }
	snapshot := func(ks ...int) []int64 {
		mu.Lock()
		defer mu.Unlock()
		b := make([]int64, len(ks))
		for i, k := range ks {
			b[i] = maxDone[k]
		}
		return b
	}
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() { // exclusive, one or two keys
			token := fmt.Sprint("x", w)
			for i := 0; ctx.Err() == nil; i++ {
				ks := []int{(w + i) % nkeys}
				if i%2 == 1 {
					a, b := (w+i)%nkeys, (w+i+1)%nkeys
					ks = []int{min(a, b), max(a, b)}
				}
				var names []string
				for _, k := range ks {
					names = append(names, name(k))
				}
				dies := i%3 == 0
				ttl := 5 * time.Second
				if dies {
					ttl = 20 * time.Millisecond
				}
				before := snapshot(ks...)
				g, err := s.Acquire(ctx, names, token, ttl)
				if ctx.Err() != nil {
					return
				}
				if err != nil {
					fail("Acquire: %v", err)
					return
				}
				if !g.OK {
					continue
				}
				mu.Lock()
				grants++
				for j, k := range ks {
					if g.Fences[j] <= before[j] {
						fail("key %d: exclusive fence %d not above %d", k, g.Fences[j], before[j])
					}
					maxDone[k] = max(maxDone[k], g.Fences[j])
					if !dies {
						if excl[k] != 0 || shared[k] != 0 {
							fail("key %d granted exclusively beside %d exclusive, %d shared", k, excl[k], shared[k])
						}
						excl[k]++
					}
				}
				mu.Unlock()
				if dies {
					continue
				}
				mu.Lock()
				for _, k := range ks {
					excl[k]--
				}
				mu.Unlock()
				if err := s.Release(context.WithoutCancel(ctx), names, token, 0); err != nil {
					fail("Release: %v", err)
					return
				}
			}
		})
		wg.Go(func() { // shared
			for i := 0; ctx.Err() == nil; i++ {
				token := fmt.Sprint("s", w, ".", i)
				k := (w*2 + i) % nkeys
				dies := i%3 == 0
				ttl := 5 * time.Second
				if dies {
					ttl = 20 * time.Millisecond
				}
				before := snapshot(k)
				g, err := s.AcquireShared(ctx, name(k), token, limit, ttl)
				if ctx.Err() != nil {
					return
				}
				if err != nil {
					fail("AcquireShared: %v", err)
					return
				}
				if !g.OK {
					continue
				}
				mu.Lock()
				grants++
				if g.Fences[0] <= before[0] {
					fail("key %d: shared fence %d not above %d", k, g.Fences[0], before[0])
				}
				maxDone[k] = max(maxDone[k], g.Fences[0])
				if !dies {
					shared[k]++
					if excl[k] != 0 || shared[k] > limit {
						fail("key %d: %d live shared beside %d exclusive", k, shared[k], excl[k])
					}
				}
				mu.Unlock()
				if dies {
					continue
				}
				mu.Lock()
				shared[k]--
				mu.Unlock()
				if err := s.ReleaseShared(context.WithoutCancel(ctx), name(k), token, 0); err != nil {
					fail("ReleaseShared: %v", err)
					return
				}
			}
		})
	}
	purged := purgeBeside(ctx, t, s, &wg, failures, fail)
	t.Logf("%d grants, %d rows purged", grants, purged)
	if purged == 0 || grants == 0 {
		t.Fatalf("%d grants, %d purged: no purge beside traffic", grants, purged)
	}
}

// TestPurgeRecords: claims and finishes with a retention of 300ms
// beside purges at a retention of 1ms: a claim that began within the
// retention of a finish (less a margin) reads its record, never a grant,
// and every claim granted has a fence above every fence returned before it
// began.
func TestPurgeRecords(t *testing.T) {
	const (
		table     = "reqlock_test_review_records"
		retention = 300 * time.Millisecond
		margin    = 100 * time.Millisecond
	)
	_, s := purgeStore(t, table, pgstore.WithPurge(0, pgstore.MinRetention))
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Second)
	defer cancel()
	var (
		mu       sync.Mutex
		maxDone  = map[string]int64{}
		finished = map[string]time.Time{} // when the last finish returned
		failures = make(chan string, 100)
		claims   int
	)
	fail := func(format string, args ...any) {
		select {
		case failures <- fmt.Sprintf(format, args...):
		default:
		}
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				key := fmt.Sprint("rec:", (w+i)%3)
				token := fmt.Sprint("c", w, ".", i)
				mu.Lock()
				before, fin := maxDone[key], finished[key]
				mu.Unlock()
				start := time.Now()
				g, rec, err := s.ClaimRecord(ctx, key, token, 20*time.Millisecond)
				if ctx.Err() != nil {
					return
				}
				if err != nil {
					fail("ClaimRecord: %v", err)
					return
				}
				if rec != nil || !g.OK {
					continue
				}
				mu.Lock()
				claims++
				if g.Fences[0] <= before {
					fail("%s: claim fence %d not above %d", key, g.Fences[0], before)
				}
				if !fin.IsZero() && start.Before(fin.Add(retention-margin)) {
					fail("%s: claim granted %v after a finish, within its retention %v", key, start.Sub(fin), retention)
				}
				maxDone[key] = max(maxDone[key], g.Fences[0])
				mu.Unlock()
				if i%2 == 0 {
					continue // the claim dies
				}
				err = s.FinishRecord(context.WithoutCancel(ctx), key, token,
					stores.Record{Fingerprint: "f", Response: []byte(token), Fence: g.Fences[0]}, retention)
				if err != nil {
					continue // the claim expired first: ErrNotHeld
				}
				mu.Lock()
				finished[key] = time.Now()
				mu.Unlock()
			}
		})
	}
	purged := purgeBeside(ctx, t, s, &wg, failures, fail)
	t.Logf("%d claims granted, %d rows purged", claims, purged)
	if purged == 0 || claims == 0 {
		t.Fatalf("%d claims, %d purged: no purge beside claims", claims, purged)
	}
}

// purgeBeside purges s without pause, at a retention of 1ms, until ctx
// ends, then waits for wg (the traffic's goroutines), reports the failures
// they and the purge sent, and returns how many rows the purges deleted.
func purgeBeside(ctx context.Context, t *testing.T, s *pgstore.Store, wg *sync.WaitGroup, failures chan string, fail func(string, ...any)) int64 {
	t.Helper()
	var purged int64
	wg.Go(func() {
		for ctx.Err() == nil {
			n, err := s.PurgeShort(ctx, time.Millisecond)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				fail("purge: %v", err)
				return
			}
			purged += n
		}
	})
	wg.Wait()
	close(failures)
	for f := range failures {
		t.Error(f)
	}
	return purged
}
