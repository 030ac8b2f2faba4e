package reqlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
)

// overlappingKeys gives contender i one of three overlapping pairs of three
// keys, or one of them alone: requests for several keys and for one share
// each key's local queue and the store.
func overlappingKeys(i int) []string {
	return [][]string{{"hot:1", "hot:2"}, {"hot:2", "hot:3"}, {"hot:3", "hot:1"}, {"hot:2"}}[i%4]
}

// TestContentionIsNeverAStoreFailure's burst through the other acquire
// paths: locks of several overlapping keys (ObtainAll), fair mode on one
// key, and fair mode with locks of several keys beside it; on memstore and
// Redis, with one Locker and with two. Half the contenders wait with the
// wait argument, half until their context's deadline. Every request that
// does not get the lock ran out of time while its keys were held by
// someone: each failure is a timeout (OutcomeTimeout; with a wait argument,
// ErrHeld joined with ErrWaitEnded), never a store failure, which the
// middleware answers 503 or runs unlocked for.
func TestContentionIsNeverAStoreFailureInEveryMode(t *testing.T) {
	fair := reqlock.WithFairness(2 * time.Second)
	modes := []struct {
		name string
		opts []reqlock.Option
		keys func(i int) []string
	}{
		{"multi", nil, overlappingKeys},
		{"fair", []reqlock.Option{fair}, func(int) []string { return []string{"hot:1"} }},
		{"fair multi", []reqlock.Option{fair}, overlappingKeys},
	}
	for _, mode := range modes {
		for _, backend := range []string{"memstore", "redis"} {
			for _, n := range []int{1, 2} {
				t.Run(fmt.Sprintf("%s/%s/%d lockers", mode.name, backend, n), func(t *testing.T) {
					lockers := contentionLockers(t, backend, n, mode.opts...)
					var granted, timedOut atomic.Int32
					errs := make(chan error, 200)
					var wg sync.WaitGroup
					for i := range 200 {
						l, keys := lockers[i%n], mode.keys(i)
						wg.Go(func() {
							// Long enough that a loaded machine answers the first store
							// call within it; 200 requests of 2ms work still time out.
							const limit = 200 * time.Millisecond
							ctx, wait, how := context.Background(), limit, "wait argument"
							if i%2 == 1 {
								var cancel context.CancelFunc
								ctx, cancel = context.WithTimeout(ctx, limit)
								defer cancel()
								wait, how = time.Minute, "context deadline"
							}
							lock, err := l.ObtainAll(ctx, keys, time.Second, wait)
							if err == nil {
								granted.Add(1)
								time.Sleep(2 * time.Millisecond) // the work under the lock
								if err := lock.Release(context.Background()); err != nil {
									errs <- fmt.Errorf("release of %q: %w", keys, err)
								}
								return
							}
							o := reqlock.OutcomeOf(ctx, err)
							if o != reqlock.OutcomeTimeout || errors.Is(err, reqlock.ErrStore) || !errors.Is(err, reqlock.ErrWaitEnded) {
								errs <- fmt.Errorf("%q, waiting by %s: outcome %q of %w", keys, how, o, err)
								return
							}
							timedOut.Add(1)
						})
					}
					wg.Wait()
					close(errs)
					for err := range errs {
						t.Errorf("a request on busy keys failed with %v, want a timeout", err)
					}
					if granted.Load() == 0 || timedOut.Load() == 0 {
						t.Fatalf("granted %d, timed out %d: the burst must produce both", granted.Load(), timedOut.Load())
					}
					// A grant that came as a wait ended is released, and a fair
					// waiter whose last attempt went unanswered leaves the
					// store's queue, in the background: let that finish while
					// the store is open. A try-once Obtain of one key in fair
					// mode also needs the key's queue empty.
					eventually(t, "the hot keys free again", func() bool {
						for _, k := range []string{"hot:1", "hot:2", "hot:3"} {
							lock, err := lockers[0].Obtain(context.Background(), k, time.Second, 0)
							if err != nil || lock.Release(context.Background()) != nil {
								return false
							}
						}
						return true
					})
				})
			}
		}
	}
}
