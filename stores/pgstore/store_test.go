package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/pgstore"
	"github.com/reqlock/reqlock/stores/storetest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// returnLimit bounds how long a call may take to return once its context
// ended while the server has not answered: "at once".
const returnLimit = time.Second

// pool returns a pool on the test database, closed when the test ends.
func pool(t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// row reads key's row: its token, and whether its lease is running.
func row(t *testing.T, db *pgxpool.Pool, table, key string) (token []byte, live bool) {
	t.Helper()
	err := db.QueryRow(t.Context(), `SELECT token, coalesce(expires_at > clock_timestamp(), false) FROM `+table+` WHERE key = $1`,
		[]byte(key)).Scan(&token, &live)
	if err != nil {
		t.Fatalf("reading the row of %q: %v", key, err)
	}
	return token, live
}

// TestOpenUnreachable: Open fails at start-up when the server cannot be
// reached, naming its address, unless connect=lazy; a lazy Store creates
// its table on the first call that reaches the server (issue 19 item 6).
func TestOpenUnreachable(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := faultproxy.New(t, u.Host)
	const table = "reqlock_startup_test"
	// The lazy Store must create it.
	if _, err := pool(t, dsn).Exec(t.Context(), "DROP TABLE IF EXISTS "+table); err != nil {
		t.Fatal(err)
	}
	storetest.Startup(t, []*faultproxy.Proxy{p}, func(ctx context.Context, addrs []string, lazy bool) (stores.Store, error) {
		pu := *u
		pu.Host = addrs[0]
		q := pu.Query()
		q.Set("table", table)
		if lazy {
			q.Set("connect", "lazy")
		}
		pu.RawQuery = q.Encode()
		return pgstore.Open(ctx, pu.String())
	})
}

func TestOpenRejectsBadURLs(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
	cases := []struct{ name, url, want string }{
		{"unparsable", "postgres://%zz", "does not parse"},
		{"scheme", strings.Replace(dsn, "postgres://", "mysql://", 1), `scheme "mysql"`},
		{"no host", "postgres:///reqlock", "names no host"},
		{"table with capitals", dsn + "&table=Locks", `table name "Locks"`},
		{"table with a digit first", dsn + "&table=1locks", `table name "1locks"`},
		{"table with SQL", dsn + "&table=locks;drop", "parameters do not parse"},
		{"table with SQL, escaped", dsn + "&table=locks%3Bdrop", `table name "locks;drop"`},
		{"empty table", dsn + "&table=", `table name ""`},
		{"bad parameter", dsn + "&pool_max_conns=none", "pool_max_conns"},
		{"bad connect", dsn + "&connect=later", `connect="later"`},
		{"unknown parameter", dsn + "&tabel=x", `pgstore: unknown URL option "tabel" (known: connect, table,`},
		{"unknown server parameter", dsn + "&work_mem=64MB", `unknown URL option "work_mem"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := pgstore.Open(t.Context(), c.url)
			if err == nil {
				_ = s.Close()
				t.Fatalf("Open(%q) succeeded", c.url)
			}
			if !errors.Is(err, stores.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Open(%q): %v; want stores.ErrInvalid naming %q", c.url, err, c.want)
			}
			if strings.HasPrefix(c.name, "unknown") != errors.Is(err, stores.ErrUnknownOption) {
				t.Errorf("Open(%q): %v; wraps stores.ErrUnknownOption: %v", c.url, err, errors.Is(err, stores.ErrUnknownOption))
			}
			if pw := passwordOf(t, dsn); strings.Contains(err.Error(), pw) {
				t.Fatalf("Open's error shows the password: %v", err)
			}
		})
	}
}

// TestOpenServerParams: the server run-time parameters pgstore takes reach
// the server.
func TestOpenServerParams(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
	app := fmt.Sprintf("reqlock-test-%d", time.Now().UnixNano())
	s, err := pgstore.Open(t.Context(), dsn+"&application_name="+app+"&search_path=public")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var n int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil || n == 0 {
		t.Fatalf("%d sessions with application_name %s, %v; want the store's", n, app, err)
	}
}

// TestOpenSocketURL: a URL whose host is a socket directory parameter is
// valid; with no server there, Open fails as unreachable.
func TestOpenSocketURL(t *testing.T) {
	_, err := pgstore.Open(t.Context(), "postgres://u:p@/reqlock?host="+t.TempDir()+"&connect_timeout=2")
	if errors.Is(err, stores.ErrInvalid) || !errors.Is(err, stores.ErrUnreachable) {
		t.Fatalf("Open with a socket directory and no server: %v; want stores.ErrUnreachable", err)
	}
}

// passwordOf returns the password of a postgres:// URL.
func passwordOf(t *testing.T, dsn string) string {
	t.Helper()
	_, rest, _ := strings.Cut(dsn, "://")
	userinfo, _, _ := strings.Cut(rest, "@")
	_, pw, ok := strings.Cut(userinfo, ":")
	if !ok || pw == "" {
		t.Fatalf("no password in the test DSN")
	}
	return pw
}

func TestNewRejectsInvalid(t *testing.T) {
	if _, err := pgstore.New(t.Context(), nil); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("New(nil): %v, want stores.ErrInvalid", err)
	}
	db := pool(t, testservers.PostgresDSN(t))
	for _, name := range []string{"", "a-b", "a.b.c", "x\"y", strings.Repeat("a", 64), "Ab"} {
		if _, err := pgstore.New(t.Context(), db, pgstore.WithTable(name)); !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("New with table %q: %v, want stores.ErrInvalid", name, err)
		}
	}
}

// TestTables: Open takes its table parameter out of the URL (the server
// would refuse it as a setting) and creates that table; stores on two
// tables do not see each other's locks; a keyword is a valid name.
func TestTables(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
	a := open(t, "reqlock_test_a")
	b := open(t, "order") // a keyword: quoted in every statement
	q := open(t, "public.reqlock_test_q")
	for _, s := range []*pgstore.Store{a, b, q} {
		var exists bool
		if err := pool(t, dsn).QueryRow(t.Context(), `SELECT to_regclass($1) IS NOT NULL`, `"`+strings.ReplaceAll(s.Table(), ".", `"."`)+`"`).Scan(&exists); err != nil || !exists {
			t.Fatalf("table %s: exists %v, %v", s.Table(), exists, err)
		}
	}
	keys := []string{"tables:" + t.Name()}
	for _, s := range []*pgstore.Store{a, b, q} {
		if g, err := s.Acquire(t.Context(), keys, "t-"+s.Table(), time.Minute); err != nil || !g.OK {
			t.Fatalf("Acquire on %s: %+v, %v; want granted (tables are independent)", s.Table(), g, err)
		}
		t.Cleanup(func() { _ = s.Release(context.Background(), keys, "t-"+s.Table(), 0) })
	}
	if g, err := a.Acquire(t.Context(), keys, "other", time.Minute); err != nil || g.OK {
		t.Fatalf("second token on %s: %+v, %v; want refused", a.Table(), g, err)
	}
	// A second Open of an existing table is fine.
	again := open(t, "reqlock_test_a")
	if g, err := again.Acquire(t.Context(), keys, "other", time.Minute); err != nil || g.OK {
		t.Fatalf("second store on %s: %+v, %v; want refused", again.Table(), g, err)
	}
}

// TestKeysAreBytes: a key may hold any bytes, NUL and invalid UTF-8
// included, and be as long as the store's Bounds say, which is longer than
// a NOTIFY payload's hex digest.
func TestKeysAreBytes(t *testing.T) {
	s := open(t, "")
	long := "long:" + t.Name() + ":"
	long += randomKey(s.Bounds().MaxKeyBytes - len(long))
	for _, key := range []string{"nul:\x00:" + t.Name(), "bad-utf8:\xff\xfe:" + t.Name(), long} {
		ch, stop := s.NotifyRelease(key, "waiter")
		defer stop()
		keys := []string{key}
		deadline := time.Now().Add(10 * time.Second)
		for i := 0; ; i++ { // released until the subscription is live
			token := fmt.Sprint("t", i)
			if g, err := s.Acquire(t.Context(), keys, token, time.Minute); err != nil || !g.OK {
				t.Fatalf("Acquire(%q): %+v, %v", key[:12], g, err)
			}
			if g, err := s.Acquire(t.Context(), keys, "other", time.Minute); err != nil || g.OK {
				t.Fatalf("second token on %q: %+v, %v; want refused", key[:12], g, err)
			}
			if err := s.Release(t.Context(), keys, token, 0); err != nil {
				t.Fatalf("Release(%q): %v", key[:12], err)
			}
			select {
			case <-ch:
			case <-time.After(50 * time.Millisecond):
				if time.Now().After(deadline) {
					t.Fatalf("no release signal for %q", key[:12])
				}
				continue
			}
			break
		}
	}
}

// TestCancelledAcquireReleasesItsGrant: an Acquire whose context ends while
// its statement waits on the server returns at once with ErrAbandoned and
// the context's error; when the statement then grants, the store releases
// the grant (the row's token is gone, long before its TTL).
func TestCancelledAcquireReleasesItsGrant(t *testing.T) {
	s := open(t, "")
	db := pool(t, testservers.PostgresDSN(t))
	key := "abandoned:" + t.Name()
	keys := []string{key}
	for _, multi := range []bool{false, true} {
		t.Run(fmt.Sprint("multi=", multi), func(t *testing.T) {
			k := keys
			if multi {
				k = []string{key + ":a", key + ":b"}
			}
			// The row is locked by a transaction, so the acquire waits.
			g, err := s.Acquire(t.Context(), k, "setup", time.Minute)
			if err != nil || !g.OK {
				t.Fatalf("setup Acquire: %+v, %v", g, err)
			}
			if err := s.Release(t.Context(), k, "setup", 0); err != nil {
				t.Fatal(err)
			}
			tx, err := db.Begin(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			if _, err := tx.Exec(t.Context(), `SELECT 1 FROM reqlock_locks WHERE key = $1 FOR UPDATE`, []byte(k[len(k)-1])); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			result := make(chan error, 1)
			go func() {
				g, err := s.Acquire(ctx, k, "abandoned", time.Minute)
				if g.OK {
					err = errors.New("granted")
				}
				result <- err
			}()
			waitBlocked(t, db, "reqlock_locks")
			cancel()
			start := time.Now()
			err = <-result
			if d := time.Since(start); d > returnLimit {
				t.Fatalf("Acquire returned %v after its context ended", d)
			}
			if !errors.Is(err, stores.ErrAbandoned) || !errors.Is(err, context.Canceled) {
				t.Fatalf("Acquire: %v, want stores.ErrAbandoned and context.Canceled", err)
			}
			if err := tx.Rollback(t.Context()); err != nil { // the statement goes on, and grants
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for _, key := range k {
				for {
					token, _ := row(t, db, "reqlock_locks", key)
					if token == nil {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("%q still holds %q; want the abandoned grant released", key, token)
					}
					time.Sleep(5 * time.Millisecond) // polling the row the background release clears
				}
			}
		})
	}
}

// waitBlocked returns once a session waits for a lock on table.
func waitBlocked(t *testing.T, db *pgxpool.Pool, table string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var n int
		if err := db.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no session waits for a lock on %s", table)
		}
		time.Sleep(2 * time.Millisecond) // polling the server's view of its sessions
	}
}

// TestCancelledReleaseAndRefreshReturnAtOnce: Release and Refresh blocked on
// the server return once their context ends.
func TestCancelledReleaseAndRefreshReturnAtOnce(t *testing.T) {
	s := open(t, "")
	db := pool(t, testservers.PostgresDSN(t))
	keys := []string{"cancelled:" + t.Name()}
	if g, err := s.Acquire(t.Context(), keys, "t1", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	tx, err := db.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(t.Context(), `SELECT 1 FROM reqlock_locks WHERE key = $1 FOR UPDATE`, []byte(keys[0])); err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func(context.Context) error{
		"Release": func(ctx context.Context) error { return s.Release(ctx, keys, "t1", 0) },
		"Refresh": func(ctx context.Context) error { return s.Refresh(ctx, keys, "t1", time.Minute) },
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		start := time.Now()
		err := call(ctx)
		cancel()
		if d := time.Since(start); d > 200*time.Millisecond+returnLimit {
			t.Fatalf("%s returned %v after it started, its deadline 200ms", name, d)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: %v, want context.DeadlineExceeded", name, err)
		}
	}
	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The cut-off calls' outcome is unknown: the server may have run them
	// once the row was free. Either way the token's grant ends here.
	if err := s.Release(t.Context(), keys, "t1", 0); err != nil && !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("Release after the cut-off calls: %v", err)
	}
}

// TestLostServer: while the server cannot be reached, Refresh fails (so the
// Locker cancels the holder's context), Acquire says ErrUnreachable; a lost
// connection alone does not lose the lock, which lives in its row: Refresh
// on a new connection succeeds. A row the server lost answers ErrNotHeld.
func TestLostServer(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
	p, proxied := openProxied(t)
	s := open(t, "")
	keys := []string{"lost:" + t.Name()}
	if g, err := proxied.Acquire(t.Context(), keys, "t1", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}

	// Every connection of the proxied store dies: the lock stays.
	p.Cut()
	if g, err := s.Acquire(t.Context(), keys, "other", time.Minute); err != nil || g.OK {
		t.Fatalf("other token after the holder's connections died: %+v, %v; want refused", g, err)
	}
	var refreshErr error
	for range 3 { // the pool may hand out a dead connection first
		if refreshErr = proxied.Refresh(t.Context(), keys, "t1", time.Minute); refreshErr == nil {
			break
		}
	}
	if refreshErr != nil {
		t.Fatalf("Refresh on a new connection: %v, want the lock still held", refreshErr)
	}

	// The server is gone: Refresh fails, Acquire never reaches it.
	p.Refuse()
	p.Cut()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if err := proxied.Refresh(ctx, keys, "t1", time.Minute); err == nil {
		t.Fatal("Refresh with the server gone succeeded")
	}
	_, err := proxied.Acquire(ctx, []string{"lost:other:" + t.Name()}, "t2", time.Minute)
	if !errors.Is(err, stores.ErrUnreachable) {
		t.Fatalf("Acquire with the server gone: %v, want stores.ErrUnreachable", err)
	}

	// The row is lost (a restore from an old backup, a hand-made DELETE).
	if _, err := pool(t, dsn).Exec(t.Context(), `DELETE FROM reqlock_locks WHERE key = $1`, []byte(keys[0])); err != nil {
		t.Fatal(err)
	}
	if err := s.Refresh(t.Context(), keys, "t1", time.Minute); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("Refresh of a lost row: %v, want stores.ErrNotHeld", err)
	}
}

// TestFenceFloorIsTheServerClock: a key's first fence is the server's clock
// in microseconds, so a row deleted and made again starts above every fence
// the old row issued.
func TestFenceFloorIsTheServerClock(t *testing.T) {
	s := open(t, "")
	db := pool(t, testservers.PostgresDSN(t))
	keys := []string{"floor:" + t.Name()}
	var before int64
	if err := db.QueryRow(t.Context(), `SELECT floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	g, err := s.Acquire(t.Context(), keys, "t1", time.Minute)
	if err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	if g.Fences[0] < before || g.Fences[0] > before+int64(time.Minute/time.Microsecond) {
		t.Fatalf("first fence %d, want the server's clock in microseconds (%d or a little later)", g.Fences[0], before)
	}
	if err := s.Release(t.Context(), keys, "t1", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(t.Context(), `DELETE FROM reqlock_locks WHERE key = $1`, []byte(keys[0])); err != nil {
		t.Fatal(err)
	}
	g2, err := s.Acquire(t.Context(), keys, "t2", time.Minute)
	if err != nil || !g2.OK {
		t.Fatalf("Acquire after the row was deleted: %+v, %v", g2, err)
	}
	if err := s.Release(t.Context(), keys, "t2", 0); err != nil { // for the next -count
		t.Fatal(err)
	}
	if g2.Fences[0]-g.Fences[0] < stores.FenceStride {
		t.Fatalf("fence %d after the row was deleted, %d before: want a stride above", g2.Fences[0], g.Fences[0])
	}
}

// TestCloseLeavesNoGoroutine: Close stops the listening connection's
// goroutines; a Store closed twice is fine, and NotifyRelease after Close
// returns a nil channel.
func TestCloseLeavesNoGoroutine(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
	base := runtime.NumGoroutine()
	s, err := pgstore.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	key := "close:" + t.Name()
	ch, stop := s.NotifyRelease(key, "waiter")
	if ch == nil {
		t.Fatal("NotifyRelease: nil channel")
	}
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ { // released until the subscription is live
		token := fmt.Sprint("t", i)
		if g, err := s.Acquire(t.Context(), []string{key}, token, time.Minute); err != nil || !g.OK {
			t.Fatalf("Acquire: %+v, %v", g, err)
		}
		if err := s.Release(t.Context(), []string{key}, token, 0); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ch:
		case <-time.After(50 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("no release signal")
			}
			continue
		}
		break
	}
	if n := runtime.NumGoroutine(); n <= base {
		t.Fatalf("%d goroutines while subscribed, %d before: the test cannot see a leak", n, base)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	stop()
	stop()
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after Close, %d before", runtime.NumGoroutine(), base)
		}
		time.Sleep(5 * time.Millisecond) // polling the goroutine count, which no channel reports
	}
	if ch, _ := s.NotifyRelease(key, "waiter"); ch != nil {
		t.Fatal("NotifyRelease after Close returned a channel")
	}
}

// TestLocksRowsInKeyOrder: a refusal of several keys (which marks the held
// ones watched) and a release of several keys lock their rows in key order,
// whatever the order of the rows in the table. Each call is left waiting
// for the first key's row, locked by a transaction that then locks the
// second key's row: that lock is free at once. Were the call to lock the
// rows in the order of its scan (the heap's: the second key's row was
// written first), it would hold the second row while it waits for the
// first, and the two would wait for each other until PostgreSQL's deadlock
// check (deadlock_timeout later) rolls one back; under contention, second
// after second.
func TestLocksRowsInKeyOrder(t *testing.T) {
	const table = "reqlock_test_order"
	s := open(t, table)
	db := pool(t, testservers.PostgresDSN(t))
	cases := []struct {
		name string
		call func(ctx context.Context, keys []string) error
	}{
		{"refusal", func(ctx context.Context, keys []string) error {
			g, err := s.Acquire(ctx, keys, "waiter", time.Minute)
			if err == nil && (g.OK || g.Held != 0) {
				err = fmt.Errorf("grant %+v, want refused on the first key", g)
			}
			return err
		}},
		{"release", func(ctx context.Context, keys []string) error {
			return s.Release(ctx, keys, "holder", 0)
		}},
		{"release keep", func(ctx context.Context, keys []string) error {
			return s.Release(ctx, keys, "holder", time.Minute)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Fresh rows, the second key's written first.
			prefix := fmt.Sprintf("order:%s:%d:", t.Name(), time.Now().UnixNano())
			keys := []string{prefix + "a", prefix + "b"}
			for _, k := range []string{keys[1], keys[0]} {
				if g, err := s.Acquire(t.Context(), []string{k}, "holder", time.Minute); err != nil || !g.OK {
					t.Fatalf("setup Acquire(%q): %+v, %v", k, g, err)
				}
			}
			t.Cleanup(func() { _ = s.Release(context.Background(), keys, "holder", 0) })
			tx, err := db.Begin(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			lock := `SELECT 1 FROM ` + table + ` WHERE key = $1 FOR UPDATE NOWAIT`
			if _, err := tx.Exec(t.Context(), lock, []byte(keys[0])); err != nil {
				t.Fatal(err)
			}
			result := make(chan error, 1)
			go func() { result <- c.call(t.Context(), keys) }()
			waitBlocked(t, db, table)
			if _, err := tx.Exec(t.Context(), lock, []byte(keys[1])); err != nil {
				t.Fatalf("the call holds the second key's row while it waits for the first: %v", err)
			}
			if err := tx.Rollback(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := <-result; err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
		})
	}
}
