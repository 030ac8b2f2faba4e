package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores/etcdstore"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// proxiedStore returns a Store on the shared etcd whose every connection
// goes through a faultproxy, with the given options, and the proxy.
func proxiedStore(t *testing.T, opts ...etcdstore.Option) (*etcdstore.Store, *faultproxy.Proxy) {
	t.Helper()
	p := faultproxy.New(t, strings.TrimPrefix(testservers.EtcdEndpoints(t)[0], "http://"))
	s, err := etcdstore.New(newClient(t, []string{"http://" + p.Addr()}), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, p
}

// expectHoldersGone fails the test unless no holder key under prefix
// exists within limit, and none for a second after: nothing in flight
// sets one again.
func expectHoldersGone(t *testing.T, c *clientv3.Client, prefix string, limit time.Duration, what string) {
	t.Helper()
	const stable = time.Second
	deadline := time.Now().Add(limit + stable)
	var freeSince time.Time
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := c.Get(t.Context(), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		var held []string
		for _, kv := range resp.Kvs {
			if strings.HasSuffix(string(kv.Key), "/holder") {
				held = append(held, string(kv.Key))
			}
		}
		now := time.Now()
		switch {
		case len(held) > 0:
			freeSince = time.Time{}
			if now.After(deadline) {
				t.Fatalf("%s: %d keys still held %v later, such as %s", what, len(held), limit+stable, held[0])
			}
		case freeSince.IsZero():
			freeSince = now
		case now.Sub(freeSince) >= stable:
			return
		}
		<-tick.C
	}
}

// TestAbandonedAcquireNeverOutlivesItsUndo (issue 18, defect 12): acquires
// abandoned while etcd is paused (its proxy stalled both ways) past the
// request timeout reach etcd when it resumes, together with the Store's
// undo of each or after the undo's first try timed out, and etcd applies
// them in whatever order. No grant may survive its undo: every key is free
// soon after, not at the end of its minute-long TTL.
func TestAbandonedAcquireNeverOutlivesItsUndo(t *testing.T) {
	t.Parallel()
	const timeout = 400 * time.Millisecond
	for _, tc := range []struct {
		pause time.Duration
		n     int
	}{
		// The acquire times out and its undo reaches etcd with it: etcd
		// applied the late acquire after the undo in about 1 acquire in
		// 400 (measured without the abandon marks: 1 run in 4 of 100
		// acquires), so this catches that order in about 1 run in 4;
		// TestLateAcquireAfterItsUndo forces it.
		{timeout + timeout/2, 100},
		// The undo's first try times out too: before the fix 5 to 16 of
		// the 30 keys stayed held (1 acquire in 5 or more), so 30 catch it
		// but about 1 time in 800 (0.8^30).
		{3 * timeout, 30},
	} {
		pause, n := tc.pause, tc.n
		t.Run(fmt.Sprintf("pause=%v", pause), func(t *testing.T) {
			prefix := "reqlock-test/" + uniqueKey(t) + "/"
			s, p := proxiedStore(t, etcdstore.WithRequestTimeout(timeout), etcdstore.WithPrefix(prefix))
			// A first grant makes the Store's lease and connection ready,
			// so that what the pause holds back is the transactions.
			warm(t, s, time.Minute)
			p.Stall(faultproxy.Both)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
					defer cancel()
					k := []string{fmt.Sprintf("k%02d", i)}
					g, err := s.Acquire(ctx, k, fmt.Sprintf("t%02d", i), time.Minute)
					// On a loaded machine the context may end before the
					// call is sent: context.DeadlineExceeded alone.
					if !errors.Is(err, context.DeadlineExceeded) || g.OK {
						t.Errorf("Acquire of %s on a paused etcd: %+v, %v; want stores.ErrAbandoned", k[0], g, err)
					}
				})
			}
			wg.Wait()
			<-time.After(pause - 100*time.Millisecond) // the pause itself
			p.Heal()
			expectHoldersGone(t, newClient(t, testservers.EtcdEndpoints(t)), prefix, 5*time.Second,
				fmt.Sprintf("%d acquires abandoned during a pause of %v (request timeout %v)", n, pause, timeout))
		})
	}
}
