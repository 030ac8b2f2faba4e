package pgstore_test

import (
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/pgstore"
	"github.com/reqlock/reqlock/stores/storetest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
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

// openProxied returns a fault proxy in front of the test server and a Store
// on the default table whose connections go through it, closed when the
// test ends.
func openProxied(t testing.TB) (*faultproxy.Proxy, *pgstore.Store) {
	t.Helper()
	return openProxiedLimited(t, 0)
}

// proxiedCallLimit is the call limit of the conformance suite's proxied
// stores: short, so that the suite's late request (held back past it) takes
// seconds, not the default's.
const proxiedCallLimit = time.Second

// openProxiedLimited is openProxied with a call limit (see
// pgstore.WithCallLimit), or the default when limit is zero.
func openProxiedLimited(t testing.TB, limit time.Duration) (*faultproxy.Proxy, *pgstore.Store) {
	t.Helper()
	dsn := testservers.PostgresDSN(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("the test DSN: %v", err)
	}
	p := faultproxy.New(t, u.Host)
	u.Host = p.Addr()
	if limit > 0 {
		q := u.Query()
		q.Set("call_limit", limit.String())
		u.RawQuery = q.Encode()
	}
	s, err := pgstore.Open(t.Context(), u.String())
	if err != nil {
		t.Fatalf("Open through the proxy: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return p, s
}

// TestConformance runs the conformance suite, its Faults group through a
// fault proxy, with a store whose call limit is proxiedCallLimit.
func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Suite{
		New:     func(t *testing.T) stores.Store { return open(t, "") },
		Notify:  true,
		Shared:  true,
		Records: true,
		Proxied: func(t *testing.T) (stores.Store, []*faultproxy.Proxy) {
			p, s := openProxiedLimited(t, proxiedCallLimit)
			return s, []*faultproxy.Proxy{p}
		},
		CallLimit: proxiedCallLimit,
	})
}
