package redlocktest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores/redlockstore"
)

// CallsDuringClose: calls that start while Close runs (a Locker's
// background release of a failed acquire, say) do not race with Close's
// wait for the background calls (run with -race), and calls after Close
// fail at once with ErrClosed.
func CallsDuringClose(t *testing.T, c Client) {
	nodes := clients(t, testservers.RedisNodeAddrs(t))
	admit(t, nodes)
	for range 20 {
		s, err := c.open(t, nodes)
		if err != nil {
			t.Fatal(err)
		}
		key := uniqueKey("closing")
		ctx := context.Background()
		if g, err := s.Acquire(ctx, []string{key}, "t", 10*time.Second); err != nil || !g.OK {
			t.Fatalf("Acquire: %+v, %v", g, err)
		}
		stop := make(chan struct{})
		started := make(chan struct{}, 4)
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				started <- struct{}{}
				for {
					select {
					case <-stop:
						return
					default:
					}
					_ = s.Release(ctx, []string{key}, "t", 0)
					_ = s.Refresh(ctx, []string{key}, "t", 10*time.Second)
					_, _ = s.Acquire(ctx, []string{key}, "t", 10*time.Second)
				}
			})
		}
		for range 4 {
			<-started
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		close(stop)
		wg.Wait()
		start := time.Now()
		if err := s.Release(ctx, []string{key}, "t", 0); !errors.Is(err, redlockstore.ErrClosed) {
			t.Fatalf("Release after Close: %v; want ErrClosed", err)
		}
		if _, err := s.Acquire(ctx, []string{key}, "t", 10*time.Second); !errors.Is(err, redlockstore.ErrClosed) {
			t.Fatalf("Acquire after Close: %v; want ErrClosed", err)
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("calls after Close took %v; want at once", took)
		}
	}
}
