// Package testredis gives tests a real Redis server.
//
// Addr uses the server named by the REQLOCK_REDIS_ADDR environment variable.
// Without it, Addr starts one redis-server per test binary on a free loopback
// port, and Main stops it when the tests end. Tests never skip: with neither
// the variable nor redis-server on PATH they fail, pointing at
// ./scripts/test.sh, which installs redis-server and starts one.
//
// A package whose tests use testredis must have
//
//	func TestMain(m *testing.M) { os.Exit(testredis.Main(m)) }
package testredis

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// EnvAddr names the environment variable that points tests at a running
// Redis, as host:port.
const EnvAddr = "REQLOCK_REDIS_ADDR"

const (
	startAttempts = 3
	startTimeout  = 10 * time.Second
	pollInterval  = 10 * time.Millisecond
	stopTimeout   = 5 * time.Second
)

var (
	mainRunning atomic.Bool

	startOnce sync.Once
	addr      string
	startErr  error

	mu     sync.Mutex
	server *redisServer // the server this package started, if any
)

// Main runs the tests and then stops the redis-server that Addr started, if
// any, and removes its directory. It returns m.Run's exit code.
func Main(m *testing.M) int {
	mainRunning.Store(true)
	code := m.Run()
	mu.Lock()
	s := server
	server = nil
	mu.Unlock()
	if s != nil {
		if err := s.stop(); err != nil {
			fmt.Fprintf(os.Stderr, "testredis: %v\n", err)
		}
	}
	return code
}

// Addr returns the host:port of the test Redis: REQLOCK_REDIS_ADDR when set,
// else a redis-server started once per test binary. It fails the test when
// neither is available or the server does not start.
func Addr(tb testing.TB) string {
	tb.Helper()
	if a := os.Getenv(EnvAddr); a != "" {
		return a
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		tb.Fatalf("testredis: no Redis for tests: set %s=host:port or install redis-server; "+
			"the README test command ./scripts/test.sh does both", EnvAddr)
	}
	if !mainRunning.Load() {
		tb.Fatalf("testredis: this package starts redis-server but has no " +
			"func TestMain(m *testing.M) { os.Exit(testredis.Main(m)) } to stop it")
	}
	startOnce.Do(func() {
		var s *redisServer
		s, startErr = startServer()
		if startErr == nil {
			addr = s.addr
			mu.Lock()
			server = s
			mu.Unlock()
		}
	})
	if startErr != nil {
		tb.Fatalf("testredis: %v", startErr)
	}
	return addr
}

// Client returns a new client to Addr, closed when the test ends. Like the
// clients the README tells users to build, it honours context deadlines.
func Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: Addr(tb), ContextTimeoutEnabled: true})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Prefix returns a key prefix unique to this test: its sanitised name and a
// random suffix, ending in ':'. Tests that share one server never collide.
func Prefix(tb testing.TB) string {
	tb.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "test:" + sanitize(tb.Name()) + ":" + hex.EncodeToString(b[:]) + ":"
}

// DownClient returns a client, closed when the test ends, for a loopback
// address where nothing listens, with short timeouts and no retries: a store
// that is down.
func DownClient(tb testing.TB) *redis.Client {
	tb.Helper()
	a, err := freeAddr()
	if err != nil {
		tb.Fatalf("testredis: %v", err)
	}
	c := redis.NewClient(&redis.Options{
		Addr:                  a,
		DialTimeout:           200 * time.Millisecond,
		DialerRetries:         1,
		DialerRetryTimeout:    10 * time.Millisecond,
		ReadTimeout:           200 * time.Millisecond,
		WriteTimeout:          200 * time.Millisecond,
		PoolTimeout:           200 * time.Millisecond,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
	})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// StalledAddr returns the host:port of a loopback listener that accepts
// connections and never answers: a store that times out. The listener, its
// connections and its goroutine end when the test ends.
func StalledAddr(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("testredis: listen: %v", err)
	}
	var (
		connsMu sync.Mutex
		conns   []net.Conn
		done    = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return // the listener was closed
			}
			connsMu.Lock()
			conns = append(conns, c)
			connsMu.Unlock()
		}
	}()
	tb.Cleanup(func() {
		_ = ln.Close()
		<-done
		connsMu.Lock()
		defer connsMu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

type redisServer struct {
	addr   string
	dir    string
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
}

// startServer starts redis-server on a goroutine locked to its OS thread,
// which it keeps until the server exits: on Linux the server is killed when
// that thread dies (see setParentDeathSignal), so even a test binary that
// crashes before Main stops it leaves no server behind.
func startServer() (*redisServer, error) {
	type result struct {
		s   *redisServer
		err error
	}
	res := make(chan result)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		s, err := startWithRetries()
		res <- result{s, err}
		if s != nil {
			<-s.exited
		}
	}()
	r := <-res
	return r.s, r.err
}

func startWithRetries() (*redisServer, error) {
	var errs []error
	for range startAttempts {
		s, err := tryStart()
		if err == nil {
			return s, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("redis-server did not start: %w", errors.Join(errs...))
}

// tryStart starts redis-server on a port that was free a moment ago. Another
// process may take the port in between, so the caller retries.
func tryStart() (*redisServer, error) {
	a, err := freeAddr()
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(a)
	dir, err := os.MkdirTemp("", "reqlock-testredis-")
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(dir + "/redis.log")
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command("redis-server",
		"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	setParentDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s := &redisServer{addr: a, dir: dir, cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	if err := s.waitReady(); err != nil {
		log, _ := os.ReadFile(dir + "/redis.log")
		_ = s.stop()
		return nil, fmt.Errorf("port %s: %w; log: %s", port, err, strings.TrimSpace(lastLines(string(log), 5)))
	}
	return s, nil
}

// waitReady polls the server with PING until it answers PONG, it exits, or
// startTimeout passes.
func (s *redisServer) waitReady() error {
	deadline := time.Now().Add(startTimeout)
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	var lastErr error
	for {
		if lastErr = ping(s.addr); lastErr == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no PONG within %v: %w", startTimeout, lastErr)
		}
		select {
		case <-s.exited:
			return errors.New("redis-server exited")
		case <-ticker.C:
		}
	}
}

func (s *redisServer) stop() error {
	var err error
	select {
	case <-s.exited:
	default:
		if s.cmd.Process.Signal(syscall.SIGTERM) != nil {
			_ = s.cmd.Process.Kill()
		}
		select {
		case <-s.exited:
		case <-time.After(stopTimeout):
			_ = s.cmd.Process.Kill()
			<-s.exited
			err = fmt.Errorf("redis-server on %s ignored SIGTERM for %v and was killed", s.addr, stopTimeout)
		}
	}
	return errors.Join(err, os.RemoveAll(s.dir))
}

func ping(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line = strings.TrimSpace(line); line != "+PONG" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// freeAddr returns a loopback address on a port nothing listens on now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	a := ln.Addr().String()
	if err := ln.Close(); err != nil {
		return "", err
	}
	return a, nil
}

func sanitize(name string) string {
	var b strings.Builder
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
