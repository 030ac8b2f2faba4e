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

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Suite{
		New:       func(t *testing.T) stores.Store { return newStore(t) },
		Notify:    true,
		Fair:      true,
		ExpiryTTL: 2 * time.Second, // etcd's shortest lease with its default election timeout
	})
}
