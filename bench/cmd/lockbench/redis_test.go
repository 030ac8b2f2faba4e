package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// envRedisAddr names a running Redis for the tests (host:port); without it
// they start a private redis-server on a free loopback port.
const envRedisAddr = "LOCKBENCH_REDIS_ADDR"

// testRedis is a redis-server the tests started.
type testRedis struct {
	addr   string
	dir    string
	cmd    *exec.Cmd
	exited chan struct{}
}

// startTestRedis starts redis-server on a free loopback port, without
// persistence, in a temporary directory, trying a few ports.
func startTestRedis() (*testRedis, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redis-server is not on PATH (apt-get install redis-server), "+
			"and %s does not name a running Redis", envRedisAddr)
	}
	// The server gets SIGKILL when the thread that started it dies (Linux):
	// keep this thread for the main goroutine, which lives until the tests end.
	runtime.LockOSThread()
	var errs []error
	for range 3 {
		s, err := tryStartTestRedis()
		if err == nil {
			return s, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func tryStartTestRedis() (*testRedis, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	dir, err := os.MkdirTemp("", "lockbench-test-redis-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir)
	setParentDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s := &testRedis{addr: addr, dir: dir, cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := ping(addr); err == nil {
			return s, nil
		} else if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("redis-server on %s: no PONG: %w", addr, err)
		}
		select {
		case <-s.exited:
			s.stop()
			return nil, fmt.Errorf("redis-server on %s exited", addr)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (s *testRedis) stop() {
	select {
	case <-s.exited:
	default:
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(5 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	_ = os.RemoveAll(s.dir)
}

func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
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
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}
