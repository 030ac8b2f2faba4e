package etcdstore_test

import (
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/etcdstore"
	"github.com/reqlock/reqlock/stores/storetest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

func TestMain(m *testing.M) { os.Exit(testservers.Main(m)) }

// newClient returns a client of endpoints, closed when the test ends.
func newClient(t testing.TB, endpoints []string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("clientv3.New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newStore returns a Store on the shared etcd, closed when the test ends.
func newStore(t testing.TB, opts ...etcdstore.Option) *etcdstore.Store {
	t.Helper()
	s, err := etcdstore.New(newClient(t, testservers.EtcdEndpoints(t)), opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestConformance runs the conformance suite on the shared etcd, its Faults
// group through a faultproxy in front of it.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storetest.Suite{
		New:     func(t *testing.T) stores.Store { return newStore(t) },
		Notify:  true,
		Fair:    true,
		Shared:  true,
		Records: true,
		// A key lives at least etcd's shortest lease (2s with the default
		// election timeout), so the expiry subtests wait that long.
		ExpiryTTL: minLeaseTTL(t),
		// The suite's pauses (800ms) end within the request timeout; for
		// pauses past it see TestAbandonedAcquireNeverOutlivesItsUndo.
		Proxied: func(t *testing.T) (stores.Store, []*faultproxy.Proxy) {
			s, p := proxiedStore(t, etcdstore.WithRequestTimeout(conformanceTimeout))
			return s, []*faultproxy.Proxy{p}
		},
		CallLimit: conformanceTimeout,
	})
}

// conformanceTimeout is the request timeout of the conformance suite's
// proxied Store: the suite holds a request back past it.
const conformanceTimeout = 2 * time.Second

// minLeaseTTL returns the shortest lease the shared etcd grants: it raises
// shorter ones to 1.5 x its election timeout, rounded up to seconds.
func minLeaseTTL(t *testing.T) time.Duration {
	t.Helper()
	c := newClient(t, testservers.EtcdEndpoints(t))
	resp, err := c.Grant(t.Context(), 1)
	if err != nil {
		t.Fatalf("Grant: %v", err)
	}
	_, _ = c.Revoke(t.Context(), resp.ID)
	return time.Duration(resp.TTL) * time.Second
}
