// Package stress runs shared and limited grants (stores.SharedStore) under
// contention for the SQL stores' tests: holders under a limit and plain
// writers on a few keys, over several Stores at once (as processes have),
// checking, by the callers' own count, that no more than the limit hold a
// key at once, that no holder overlaps a writer, and that no call fails.
package stress

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// Store is what a run calls: a Store that offers shared grants.
type Store interface {
	stores.Store
	stores.SharedStore
}

// Config is a run.
type Config struct {
	Keys    int           // keys, fresh ones
	Limit   int           // every holder's limit
	Readers int           // holder goroutines, spread over the Stores and keys
	Writers int           // plain Acquire goroutines, spread likewise
	For     time.Duration // how long the goroutines start new calls
	Hold    time.Duration // how long a grant is held (the handler's work)
}

// Result is what a run saw.
type Result struct {
	MaxHolders       int32 // the most holders of one key at once
	Holds, Writes    int64 // grants
	Overlaps, Errors int64
}

// Run runs cfg over ss and fails t on an error, more than Limit holders at
// once, a holder beside a writer, or no grant of either kind.
func Run(t *testing.T, ss []Store, cfg Config) Result {
	t.Helper()
	var id [6]byte
	_, _ = rand.Read(id[:])
	prefix := "stress:" + hex.EncodeToString(id[:]) + ":"
	ctx, cancel := context.WithTimeout(t.Context(), cfg.For+60*time.Second)
	defer cancel()
	type keyState struct{ holders, writers atomic.Int32 }
	keys := make([]keyState, cfg.Keys)
	var (
		r     Result
		maxH  atomic.Int32
		holds atomic.Int64
		wrs   atomic.Int64
		ovl   atomic.Int64
		errs  atomic.Int64
		wg    sync.WaitGroup
		seq   atomic.Int64
		until = time.Now().Add(cfg.For)
	)
	fail := func(format string, args ...any) {
		if errs.Add(1) <= 5 {
			t.Errorf(format, args...)
		}
	}
	const ttl = 30 * time.Second
	for g := range cfg.Readers + cfg.Writers {
		s := ss[g%len(ss)]
		k := g % cfg.Keys
		key := fmt.Sprintf("%s%d", prefix, k)
		st := &keys[k]
		writer := g >= cfg.Readers
		wg.Go(func() {
			for time.Now().Before(until) && ctx.Err() == nil {
				token := fmt.Sprintf("t%d", seq.Add(1))
				granted := false
				for range 200 { // a waiter polls with its token
					var (
						g   stores.Grant
						err error
					)
					if writer {
						g, err = s.Acquire(ctx, []string{key}, token, ttl)
					} else {
						g, err = s.AcquireShared(ctx, key, token, cfg.Limit, ttl)
					}
					if err != nil {
						fail("%s: acquire (writer %v): %v", key, writer, err)
						return
					}
					if g.OK {
						granted = true
						break
					}
					time.Sleep(time.Millisecond) // the poll's pace, not a wait for an event
				}
				if !granted {
					if writer { // withdraw the writer record, as a Locker does
						if err := s.Release(ctx, []string{key}, token, 0); err != nil && !errors.Is(err, stores.ErrNotHeld) {
							fail("%s: withdrawing Release: %v", key, err)
							return
						}
					}
					continue
				}
				if writer {
					wrs.Add(1)
					if st.writers.Add(1) != 1 || st.holders.Load() != 0 {
						ovl.Add(1)
						fail("%s: writer granted beside %d holders, %d writers", key, st.holders.Load(), st.writers.Load()-1)
					}
					work(cfg.Hold)
					st.writers.Add(-1)
					if err := s.Release(ctx, []string{key}, token, 0); err != nil {
						fail("%s: Release: %v", key, err)
						return
					}
					continue
				}
				holds.Add(1)
				n := st.holders.Add(1)
				for {
					m := maxH.Load()
					if n <= m || maxH.CompareAndSwap(m, n) {
						break
					}
				}
				if int(n) > cfg.Limit || st.writers.Load() != 0 {
					ovl.Add(1)
					fail("%s: %d holders at once (limit %d), %d writers", key, n, cfg.Limit, st.writers.Load())
				}
				work(cfg.Hold)
				st.holders.Add(-1)
				if err := s.ReleaseShared(ctx, key, token, 0); err != nil {
					fail("%s: ReleaseShared: %v", key, err)
					return
				}
			}
		})
	}
	wg.Wait()
	r.MaxHolders, r.Holds, r.Writes, r.Overlaps, r.Errors = maxH.Load(), holds.Load(), wrs.Load(), ovl.Load(), errs.Load()
	t.Logf("%+v", r)
	if r.Holds == 0 || (cfg.Writers > 0 && r.Writes == 0) {
		t.Errorf("no progress: %+v", r)
	}
	return r
}

// work is a holder's work: d long, or a yield.
func work(d time.Duration) {
	if d <= 0 {
		runtime.Gosched() // invite an overlap, should the lock fail
		return
	}
	time.Sleep(d) // the work itself, not a wait for an event
}
