package mysqlstore

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// testURL returns the test MariaDB as a URL of the form Open takes, with
// query appended.
func testURL(t *testing.T, query string) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(testservers.MySQLDSN(t))
	if err != nil {
		t.Fatalf("ParseDSN: %v", err)
	}
	u := url.URL{Scheme: "mysql", User: url.UserPassword(cfg.User, cfg.Passwd), Host: cfg.Addr, Path: "/" + cfg.DBName, RawQuery: query}
	return u.String()
}

func TestParseURL(t *testing.T) {
	cfg, opts, _, err := parseURL("mysql://u:p%40ss@db.example:3307/locks?table=my_locks&create=false&timeout=3s")
	if err != nil {
		t.Fatalf("parseURL: %v", err)
	}
	if cfg.User != "u" || cfg.Passwd != "p@ss" || cfg.Net != "tcp" || cfg.Addr != "db.example:3307" ||
		cfg.DBName != "locks" || cfg.Timeout != 3*time.Second || !cfg.InterpolateParams {
		t.Fatalf("parseURL: config %+v", cfg)
	}
	s := &Store{createTable: true}
	for _, o := range opts {
		if err := o(s); err != nil {
			t.Fatalf("option: %v", err)
		}
	}
	if s.table != "my_locks" || s.createTable {
		t.Fatalf("options set table %q, createTable %v; want my_locks, false", s.table, s.createTable)
	}
	cfg, _, _, err = parseURL("mysql://u@h/locks?time_zone=%27%2B00:00%27&transaction_isolation=%27READ-COMMITTED%27")
	if err != nil || cfg.Params["time_zone"] != "'+00:00'" || cfg.Params["transaction_isolation"] != "'READ-COMMITTED'" {
		t.Fatalf("parseURL with session variables: %v, params %v", err, cfg)
	}
	cfg, _, _, err = parseURL("mariadb://u@[::1]/locks?interpolateParams=false")
	if err != nil {
		t.Fatalf("parseURL: %v", err)
	}
	if cfg.Addr != "[::1]:3306" || cfg.InterpolateParams {
		t.Fatalf("parseURL without a port: Addr %q, interpolateParams %v; want [::1]:3306, false", cfg.Addr, cfg.InterpolateParams)
	}

	bad := []struct{ url, want string }{
		{"postgres://u:p@h/db", `scheme "postgres"`},
		{"mysql://u:p@/db", "names no host"},
		{"mysql://h/db", "names no user"},
		{"mysql://u:p@h", "is not one database name"},
		{"mysql://u:p@h/a/b", "is not one database name"},
		{"mysql://u:p@h:/db", "empty port"},
		{"mysql://u:p@h/db?table=bad-name", "URL parameter table"},
		{"mysql://u:p@h/db?table=a&table=b", "given 2 times"},
		{"mysql://u:p@h/db?create=maybe", "create="},
		{"mysql://u:p@h/db?timeout=soon", "driver parameters"},
		{"mysql://u:p@h/db?tabel=x", `mysqlstore: unknown URL option "tabel" (known: connect, table,`},
		{"mysql://u:p@h/db?innodb_lock_wait_timeout=5", `unknown URL option "innodb_lock_wait_timeout"`},
		{"mysql://u:p@h/db#x", "fragment"},
		{"mysql://u:p@h/db?%zz", "URL query"},
		{"::", "URL"},
		{"mysql://u:p@h:port/db", "invalid port"},
		{"mysql://u:p@h/db\x7f", "invalid control character"},
	}
	for _, b := range bad {
		_, err := Open(t.Context(), b.url)
		if !errors.Is(err, stores.ErrInvalid) || !strings.Contains(err.Error(), b.want) {
			t.Errorf("Open(%q): %v; want stores.ErrInvalid naming %q", b.url, err, b.want)
		}
		if strings.Contains(b.want, "unknown URL option") != errors.Is(err, stores.ErrUnknownOption) {
			t.Errorf("Open(%q): %v; wraps stores.ErrUnknownOption: %v", b.url, err, errors.Is(err, stores.ErrUnknownOption))
		}
		if err != nil && strings.Contains(err.Error(), ":p@") {
			t.Errorf("Open(%q): the error shows the password: %v", b.url, err)
		}
	}
}

// TestOpen: Open reaches the server, creates the table the URL names, and
// the Store locks; Close closes its *sql.DB. A wrong password fails in Open.
func TestOpen(t *testing.T) {
	table := "open_test_" + strings.ToLower(testKeys(1)[0][16:26])
	s, err := Open(t.Context(), testURL(t, "table="+table))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if s.Table() != table {
		t.Fatalf("Table() = %q, want %q", s.Table(), table)
	}
	keys := testKeys(1)
	mustAcquire(t, s, keys, "t1", time.Minute)
	if g, err := s.Acquire(t.Context(), keys, "t2", time.Minute); err != nil || g.OK {
		t.Fatalf("second Acquire: %+v, %v; want refused", g, err)
	}
	var n int
	if err := s.db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM `"+table+"`").Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows of %s: %d, %v; want 1", table, n, err)
	}
	if _, err := s.db.ExecContext(t.Context(), "DROP TABLE `"+table+"`"); err != nil {
		t.Fatalf("DROP TABLE: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.db.PingContext(t.Context()); err == nil {
		t.Fatal("the *sql.DB of Open still works after Close")
	}
	if _, err := s.Acquire(t.Context(), keys, "t3", time.Minute); !errors.Is(err, ErrClosed) {
		t.Fatalf("Acquire after Close: %v, want ErrClosed", err)
	}

	// Open's connections run at a sql_mode of its own, unless the URL sets
	// one.
	for query, want := range map[string]string{"": "STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION", "sql_mode=ANSI": "ANSI_QUOTES"} {
		s, err := Open(t.Context(), testURL(t, query))
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		var mode string
		if err := s.db.QueryRowContext(t.Context(), "SELECT @@SESSION.sql_mode").Scan(&mode); err != nil || !strings.Contains(mode, want) {
			t.Errorf("Open with %q: session sql_mode %q, %v; want %s", query, mode, err, want)
		}
		mustAcquire(t, s, testKeys(1), "t1", time.Minute)
		_ = s.Close()
	}

	u, _ := url.Parse(testURL(t, ""))
	u.User = url.UserPassword(u.User.Username(), "wrong")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if s, err := Open(ctx, u.String()); err == nil {
		_ = s.Close()
		t.Fatal("Open with a wrong password succeeded")
	}
}

// proxiedURL returns testURL with its host replaced by addr.
func proxiedURL(t *testing.T, addr, query string) string {
	u, err := url.Parse(testURL(t, query))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}

// TestOpenUnreachable: Open fails at start-up when the server cannot be
// reached, naming its address, unless connect=lazy; a lazy Store sets its
// table up on the first call that reaches the server (issue 19 item 6).
func TestOpenUnreachable(t *testing.T) {
	cfg, err := mysql.ParseDSN(testservers.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(t.Context(), testURL(t, "connect=later")); !errors.Is(err, stores.ErrInvalid) ||
		strings.Count(err.Error(), "mysqlstore:") != 1 {
		t.Errorf("Open with connect=later: %v; want one ErrInvalid", err)
	}
	p := faultproxy.New(t, cfg.Addr)
	storetest.Startup(t, []*faultproxy.Proxy{p}, func(ctx context.Context, addrs []string, lazy bool) (stores.Store, error) {
		q := "table=reqlock_startup_test"
		if lazy {
			q += "&connect=lazy"
		}
		return Open(ctx, proxiedURL(t, addrs[0], q))
	})
}

// TestOpenLazyMisconfigured: a lazy Store whose table turns out to be
// missing (create=false) answers ErrMisconfigured once the server answers.
func TestOpenLazyMisconfigured(t *testing.T) {
	cfg, err := mysql.ParseDSN(testservers.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	p := faultproxy.New(t, cfg.Addr)
	p.Refuse()
	s, err := Open(t.Context(), proxiedURL(t, p.Addr(), "connect=lazy&create=false&table=reqlock_no_such_table"))
	if err != nil {
		t.Fatalf("Open with connect=lazy: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := s.Acquire(t.Context(), testKeys(1), "t1", time.Minute); !errors.Is(err, stores.ErrUnreachable) {
		t.Fatalf("Acquire while the server refuses: %v; want ErrUnreachable", err)
	}
	p.Heal()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := s.Acquire(t.Context(), testKeys(1), "t1", time.Minute)
		if errors.Is(err, ErrMisconfigured) {
			return
		}
		if !errors.Is(err, stores.ErrUnreachable) || time.Now().After(deadline) {
			t.Fatalf("Acquire once the server answers: %v; want ErrMisconfigured", err)
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
}
