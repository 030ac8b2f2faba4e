package testservers

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// ZooKeeper, MariaDB and PostgreSQL, which the tests share (one of each per
// test binary when no environment variable names one); ZooKeeper, MariaDB
// and PostgreSQL also as private servers, for failure tests and servers
// configured otherwise.

// ZooKeeperServer starts a standalone ZooKeeper for the calling test. It
// keeps its data across Restart and loses it with RestartEmpty.
func ZooKeeperServer(tb testing.TB) *Server {
	tb.Helper()
	needPrivate(tb, "ZooKeeperServer", findZooKeeper)
	return private(tb, "zookeeper", func(g *group) (*Server, error) { return startZooKeeper(tb, g) })
}

// PostgresServer starts a PostgreSQL for the calling test and returns it with
// the URL of its database reqlock (as PostgresDSN's). Pause, Resume and Kill
// act on all its processes (the postmaster and its backends), so that a
// paused server answers nothing on the connections it has. It keeps its data
// across Restart; RestartEmpty fails the test (not supported).
func PostgresServer(tb testing.TB) (s *Server, dsn string) {
	tb.Helper()
	needPrivate(tb, "PostgresServer", func() error { _, err := findPostgres(); return err })
	type started struct {
		s   *Server
		dsn string
	}
	v := private(tb, "postgres", func(g *group) (started, error) {
		s, dsn, err := startPostgres(tb, g)
		return started{s, dsn}, err
	})
	return v.s, v.dsn
}

const zooKeeperJar = "/usr/share/java/zookeeper.jar" // Debian's; its manifest names the other jars

func findZooKeeper() error {
	if _, err := findProgram("java"); err != nil {
		return err
	}
	_, err := os.Stat(zooKeeperJar)
	return err
}

func startZooKeeper(tb testing.TB, g *group) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s, err := g.newServer(tb, "zookeeper", port)
	if err != nil {
		return nil, err
	}
	dataDir := s.dir + "/data"
	if err := os.Mkdir(dataDir, 0o755); err != nil {
		return nil, err
	}
	conf := strings.Join([]string{
		"tickTime=500", "initLimit=10", "syncLimit=5", "maxSessionTimeout=60000",
		"dataDir=" + dataDir, "clientPort=" + strconv.Itoa(port), "clientPortAddress=127.0.0.1",
		"admin.enableServer=false", "4lw.commands.whitelist=ruok,srvr,stat,conf,mntr,isro",
	}, "\n") + "\n"
	if err := os.WriteFile(s.dir+"/zoo.cfg", []byte(conf), 0o644); err != nil {
		return nil, err
	}
	cp := zooKeeperJar
	if _, err := os.Stat("/usr/share/java/slf4j-simple.jar"); err == nil {
		cp += ":/usr/share/java/slf4j-simple.jar" // a log, for when it fails
	}
	// A small heap, the serial GC and C1 only: the JVM is up in well under
	// a second.
	s.args = func() []string {
		return []string{"java", "-Xms16m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
			"-Xshare:auto", "-cp", cp, "-Dzookeeper.log.dir=" + s.dir,
			"org.apache.zookeeper.server.ZooKeeperServerMain", s.dir + "/zoo.cfg"}
	}
	s.ready = func(ctx context.Context, _ int) error {
		if ok, err := zooKeeperWord(ctx, s.addr, "ruok"); err != nil || ok != "imok" {
			return fmt.Errorf("ruok: %q, %v", ok, err)
		}
		conf, err := zooKeeperWord(ctx, s.addr, "conf")
		if err != nil {
			return err
		}
		if !strings.Contains(conf, "dataDir="+dataDir+"/") {
			return fmt.Errorf("%s keeps its data elsewhere: %s", s.addr, conf)
		}
		return nil
	}
	// Its snapshots and transaction logs (the sessions and znodes).
	s.wipe = func() error { return os.RemoveAll(dataDir + "/version-2") }
	return s, startAll(s)
}

// zooKeeperWord sends a four-letter word and returns the answer.
func zooKeeperWord(ctx context.Context, addr, word string) (string, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte(word)); err != nil {
		return "", err
	}
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		b.Write(buf[:n])
		if err != nil { // the server closes after its answer
			return b.String(), nil
		}
	}
}

func findMariaDB() error {
	for _, p := range []string{"mariadbd", "mariadb-install-db", "mariadb"} {
		if _, err := findProgram(p); err != nil {
			return err
		}
	}
	return nil
}

// MySQLServer starts a MariaDB for the calling test, with options added to
// its command line (such as "--max-allowed-packet=1M"), and returns it with
// the DSN of its database reqlock (as MySQLDSN's): for a test that needs a
// server configured otherwise than the shared one.
func MySQLServer(tb testing.TB, options ...string) (s *Server, dsn string) {
	tb.Helper()
	needPrivate(tb, "MySQLServer", findMariaDB)
	type started struct {
		s   *Server
		dsn string
	}
	v := private(tb, "mariadbd", func(g *group) (started, error) {
		s, dsn, err := startMySQL(tb, g, options...)
		return started{s, dsn}, err
	})
	return v.s, v.dsn
}

// startMySQL starts MariaDB, with options added to its command line, with a
// database reqlock and a user reqlock with a random password, and returns
// it and the DSN (go-sql-driver/mysql form).
func startMySQL(tb testing.TB, g *group, options ...string) (*Server, string, error) {
	mariadbd, err := findProgram("mariadbd")
	if err != nil {
		return nil, "", err
	}
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	s, err := g.newServer(tb, "mariadbd", port)
	if err != nil {
		return nil, "", err
	}
	var asUser []string
	if os.Geteuid() == 0 {
		asUser = []string{"--user=root"} // mariadbd refuses root unless told
	}
	dataDir, sock := s.dir+"/data", s.dir+"/mysqld.sock"
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	install := append([]string{"--no-defaults"}, asUser...)
	install = append(install, "--datadir="+dataDir, "--auth-root-authentication-method=normal",
		"--skip-test-db", "--skip-name-resolve")
	if _, err := run(ctx, s.dir, nil, "mariadb-install-db", install...); err != nil {
		return nil, "", err
	}
	s.args = func() []string {
		return append(append(append([]string{mariadbd, "--no-defaults"}, asUser...),
			"--datadir="+dataDir, "--socket="+sock, "--pid-file="+s.dir+"/mysqld.pid",
			"--port="+strconv.Itoa(port), "--bind-address=127.0.0.1", "--skip-name-resolve",
			"--skip-log-bin", "--performance-schema=OFF", "--innodb-buffer-pool-size=64M",
			"--innodb-log-file-size=16M", "--innodb-flush-log-at-trx-commit=2",
			"--innodb-buffer-pool-dump-at-shutdown=0", "--innodb-buffer-pool-load-at-startup=0",
			"--max-connections=500"), options...)
	}
	// The socket is in this server's own directory: what answers there is it.
	s.ready = func(ctx context.Context, _ int) error {
		if _, err := os.Stat(sock); err != nil {
			return err
		}
		_, err := run(ctx, s.dir, nil, "mariadb", "--no-defaults", "-S", sock, "-uroot", "-e", "select 1")
		return err
	}
	if err := startAll(s); err != nil {
		return nil, "", err
	}
	pw := rand.Text()
	sql := fmt.Sprintf(`CREATE DATABASE reqlock;
		CREATE USER 'reqlock'@'%%' IDENTIFIED BY '%s';
		GRANT ALL ON reqlock.* TO 'reqlock'@'%%';
		DELETE FROM mysql.global_priv WHERE User = 'root' AND Host <> 'localhost';
		FLUSH PRIVILEGES;`, pw)
	if _, err := run(ctx, s.dir, nil, "mariadb", "--no-defaults", "-S", sock, "-uroot", "-e", sql); err != nil {
		return nil, "", err
	}
	err = poll(ctx, s.current().done, func(ctx context.Context) error {
		_, err := run(ctx, s.dir, nil, "mariadb", "--no-defaults", "-h127.0.0.1", "-P"+strconv.Itoa(port),
			"-ureqlock", "-p"+pw, "reqlock", "-e", "select 1")
		return err
	})
	if err != nil {
		return nil, "", fmt.Errorf("mariadbd on %s: reqlock cannot log in over TCP: %w; log: %s", s.addr, err, s.logTail())
	}
	return s, fmt.Sprintf("reqlock:%s@tcp(%s)/reqlock", pw, s.addr), nil
}

// findPostgres returns the directory of initdb, postgres and psql: Debian
// keeps them in /usr/lib/postgresql/VERSION/bin, off PATH.
func findPostgres() (string, error) {
	initdb, err := findProgram("initdb")
	if err != nil {
		return "", err
	}
	if initdb, err = filepath.EvalSymlinks(initdb); err != nil {
		return "", err
	}
	bin := filepath.Dir(initdb)
	for _, p := range []string{"postgres", "psql"} {
		if _, err := os.Stat(filepath.Join(bin, p)); err != nil {
			return "", err
		}
	}
	return bin, nil
}

// postgresCredential is who runs PostgreSQL, which refuses root: when the
// tests run as root, the postgres user that Debian's package creates.
func postgresCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL cannot run as root and there is no postgres user: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// startPostgres starts PostgreSQL with a database reqlock owned by a user
// reqlock with a random password, and returns it with the DSN (a
// postgres:// URL).
func startPostgres(tb testing.TB, g *group) (*Server, string, error) {
	bin, err := findPostgres()
	if err != nil {
		return nil, "", err
	}
	cred, err := postgresCredential()
	if err != nil {
		return nil, "", err
	}
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	s, err := g.newServer(tb, "postgres", port)
	if err != nil {
		return nil, "", err
	}
	s.stopSignal = syscall.SIGINT // the fast shutdown; SIGTERM waits for clients
	s.cred = cred
	s.tree = true // a backend would answer its connection while the postmaster is paused
	s.wipe = func() error { return errors.New("RestartEmpty is not supported for PostgreSQL") }
	pw := rand.Text()
	pwFile := s.dir + "/pwfile"
	if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
		return nil, "", err
	}
	if cred != nil {
		for _, p := range []string{s.dir, pwFile} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, "", err
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	dataDir := s.dir + "/data"
	if _, err := run(ctx, s.dir, cred, filepath.Join(bin, "initdb"), "-D", dataDir, "-U", "postgres",
		"--pwfile="+pwFile, "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync",
		"-E", "UTF8", "--locale=C"); err != nil {
		return nil, "", err
	}
	_ = os.Remove(pwFile)
	s.args = func() []string {
		return []string{filepath.Join(bin, "postgres"), "-D", dataDir, "-p", strconv.Itoa(port),
			"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=" + s.dir,
			"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
			"-c", "max_connections=300",
			// Shared memory segments in the data directory, not in
			// /dev/shm, where a killed server would leave them.
			"-c", "dynamic_shared_memory_type=mmap"}
	}
	psql := filepath.Join(bin, "psql")
	sock := fmt.Sprintf("%s/.s.PGSQL.%d", s.dir, port)
	// The socket is in this server's own directory: what answers there is it.
	s.ready = func(ctx context.Context, _ int) error {
		if _, err := os.Stat(sock); err != nil {
			return err
		}
		_, err := run(ctx, s.dir, nil, psql, "-h", s.dir, "-p", strconv.Itoa(port), "-U", "postgres",
			"-d", "postgres", "-Atc", "select 1")
		return err
	}
	if err := startAll(s); err != nil {
		return nil, "", err
	}
	if _, err := run(ctx, s.dir, nil, psql, "-h", s.dir, "-p", strconv.Itoa(port), "-U", "postgres",
		"-d", "postgres", "-v", "ON_ERROR_STOP=1", "-q",
		"-c", fmt.Sprintf("CREATE ROLE reqlock LOGIN PASSWORD '%s'", pw),
		"-c", "CREATE DATABASE reqlock OWNER reqlock"); err != nil {
		return nil, "", err
	}
	dsn := fmt.Sprintf("postgres://reqlock:%s@%s/reqlock?sslmode=disable", pw, s.addr)
	err = poll(ctx, s.current().done, func(ctx context.Context) error {
		_, err := run(ctx, s.dir, nil, psql, dsn, "-Atc", "select 1")
		return err
	})
	if err != nil {
		return nil, "", fmt.Errorf("postgres on %s: reqlock cannot log in over TCP: %w; log: %s", s.addr, err, s.logTail())
	}
	return s, dsn, nil
}

// findProgram looks for a program on PATH, then where Debian keeps daemons
// (/usr/sbin) and PostgreSQL (/usr/lib/postgresql/VERSION/bin, newest
// first).
func findProgram(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	candidates := []string{"/usr/sbin/" + name}
	versions, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name)
	version := func(p string) float64 { // /usr/lib/postgresql/VERSION/bin/NAME
		v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(filepath.Dir(p))), 64)
		return v
	}
	slices.SortFunc(versions, func(a, b string) int { return cmp.Compare(version(b), version(a)) })
	for _, p := range append(candidates, versions...) {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found on PATH", name)
}
