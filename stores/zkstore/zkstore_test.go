package zkstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
	"github.com/reqlock/reqlock/stores/zkstore"
)

func TestMain(m *testing.M) { os.Exit(testservers.Main(m)) }

// testRoot returns a root of its own for one test.
func testRoot() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "/reqlock-test/" + hex.EncodeToString(b)
}

// newStore returns a Store on the shared ZooKeeper, with a root of its own,
// closed when the test ends.
func newStore(t testing.TB, opts ...zkstore.Option) *zkstore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := zkstore.New(ctx, []string{testservers.ZooKeeperAddr(t)}, append([]zkstore.Option{zkstore.WithRoot(testRoot())}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// conformanceSession is the session timeout of the conformance suite's
// Stores, and so their MaxTTL: the suite's longest TTL, and how long its
// fault scenarios wait for a cut-off or paused Store's session to expire.
// Long enough for a session to survive a loaded machine, short enough to
// keep those scenarios to seconds.
const conformanceSession = 6 * time.Second

func TestConformance(t *testing.T) {
	root := testRoot() // one root for New's and Proxied's Stores: the same backend
	storetest.Run(t, storetest.Suite{
		New: func(t *testing.T) stores.Store {
			return newStore(t, zkstore.WithRoot(root), zkstore.WithSessionTimeout(conformanceSession))
		},
		Proxied: func(t *testing.T) (stores.Store, []*faultproxy.Proxy) {
			s, p := proxiedStore(t, zkstore.WithRoot(root), zkstore.WithSessionTimeout(conformanceSession))
			return s, []*faultproxy.Proxy{p}
		},
		Notify: true,
		Fair:   true,
		Shared: true,
	})
}
