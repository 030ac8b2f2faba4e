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

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Suite{
		New:    func(t *testing.T) stores.Store { return newStore(t) },
		Notify: true,
		Fair:   true,
	})
}
