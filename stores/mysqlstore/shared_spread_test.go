package mysqlstore

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSharedSpreadNeverRefused: holders of many keys, two per key under a
// limit of 3, over two Stores: no key ever has 3 holders, so every
// AcquireShared is granted and every call succeeds, however the
// transactions of neighbouring keys meet in the holders table (issue 22).
func TestSharedSpreadNeverRefused(t *testing.T) {
	ss := []*Store{newStore(t, openDB(t)), newStore(t, openDB(t))}
	ctx := t.Context()
	const keys, perKey = 24, 2
	prefix := fmt.Sprintf("spread:%d:", time.Now().UnixNano())
	var (
		wg               sync.WaitGroup
		grants, refusals atomic.Int64
		errs             atomic.Int64
		until            = time.Now().Add(3 * time.Second)
		seq              atomic.Int64
	)
	for g := range keys * perKey {
		s := ss[g%len(ss)]
		key := fmt.Sprintf("%s%d", prefix, g%keys)
		wg.Go(func() {
			for time.Now().Before(until) {
				token := fmt.Sprintf("t%d", seq.Add(1))
				gr, err := s.AcquireShared(ctx, key, token, 3, time.Minute)
				switch {
				case err != nil:
					if errs.Add(1) <= 5 {
						t.Errorf("AcquireShared: %v", err)
					}
					return
				case !gr.OK:
					if refusals.Add(1) <= 5 {
						t.Errorf("AcquireShared of %s refused (%+v) with at most %d holders under a limit of 3", key, gr, perKey-1)
					}
					continue
				}
				grants.Add(1)
				if err := s.ReleaseShared(ctx, key, token, 0); err != nil {
					if errs.Add(1) <= 5 {
						t.Errorf("ReleaseShared: %v", err)
					}
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("grants %d, refusals %d, errors %d, attempts made again after a loss to contention: %d",
		grants.Load(), refusals.Load(), errs.Load(), ss[0].Retries()+ss[1].Retries())
}
