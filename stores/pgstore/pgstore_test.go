package pgstore_test

import (
	"os"
	"testing"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/pgstore"
	"github.com/reqlock/reqlock/stores/storetest"
)

func TestMain(m *testing.M) { os.Exit(testservers.Main(m)) }

// open returns a Store on the test server's database, with table (the
// default when empty), closed when the test ends.
func open(t testing.TB, table string) *pgstore.Store {
	t.Helper()
	dsn := testservers.PostgresDSN(t)
	if table != "" {
		dsn += "&table=" + table
	}
	s, err := pgstore.Open(t.Context(), dsn)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Suite{
		New:    func(t *testing.T) stores.Store { return open(t, "") },
		Notify: true,
	})
}
