package mysqlstore

import (
	"database/sql"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

func TestMain(m *testing.M) { os.Exit(testservers.Main(m)) }

// openDB returns a *sql.DB on the test MariaDB, closed when the test ends;
// each of configure changes the driver's configuration first.
func openDB(t testing.TB, configure ...func(*mysql.Config)) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(testservers.MySQLDSN(t))
	if err != nil {
		t.Fatalf("ParseDSN: %v", err)
	}
	for _, f := range configure {
		f(cfg)
	}
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatalf("NewConnector: %v", err)
	}
	db := sql.OpenDB(c)
	db.SetMaxIdleConns(maxIdleConns) // as Open does
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// withParam returns a configuration change that sets the session variable
// name to value on every connection (the driver runs SET name=value).
func withParam(name, value string) func(*mysql.Config) {
	return func(cfg *mysql.Config) {
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		cfg.Params[name] = value
	}
}

// newStore returns a Store on db, closed when the test ends (before db).
func newStore(t testing.TB, db *sql.DB, opts ...Option) *Store {
	t.Helper()
	s, err := New(db, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestConformance runs the conformance suite on MariaDB, its Faults group
// through a fault proxy, with a store whose call limit is proxiedCallLimit.
func TestConformance(t *testing.T) {
	db := openDB(t)
	var retries atomic.Int64
	storetest.Run(t, storetest.Suite{
		New: func(t *testing.T) stores.Store {
			s := newStore(t, db)
			t.Cleanup(func() {
				if n := s.Retries(); n > 0 {
					retries.Add(n)
					t.Logf("attempts made again after a loss to contention: %d", n)
				}
			})
			return s
		},
		Shared:  true,
		Records: true,
		Proxied: func(t *testing.T) (stores.Store, []*faultproxy.Proxy) {
			p, db := proxiedDB(t)
			return newStore(t, db, WithCallLimit(proxiedCallLimit)), []*faultproxy.Proxy{p}
		},
		CallLimit: proxiedCallLimit,
	})
}

// proxiedCallLimit is the call limit of the conformance suite's proxied
// stores: short, so that the suite's late request (held back past it) takes
// seconds, not the default's minute.
const proxiedCallLimit = time.Second
