// Package privateredis starts a redis-server of its own for a test binary
// of the bench module: on a free loopback port, without persistence, in a
// temporary directory. lockbench's and httpbench's tests use it; they read
// INFO commandstats, which counts every client's commands, so they want a
// server no other test binary uses. (The core's internal/testredis, which
// redislockshop's tests use, honours REQLOCK_REDIS_ADDR, the server that
// scripts/test.sh shares among all test binaries.)
//
// On Linux the server dies with the test binary, even one that crashes
// before it calls Stop.
package privateredis

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

	"github.com/reqlock/reqlock/bench/internal/pdeathsig"
)

const (
	attempts     = 3
	startTimeout = 10 * time.Second
	pollInterval = 20 * time.Millisecond
	stopTimeout  = 5 * time.Second
)

// Server is a redis-server that Start started.
type Server struct {
	addr   string
	dir    string
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
}

// Addr returns the server's host:port.
func (s *Server) Addr() string { return s.addr }

// Start starts redis-server, trying a few ports: another process may take a
// port between the moment it was free and the server's bind.
func Start() (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, errors.New("redis-server is not on PATH (apt-get install redis-server)")
	}
	var errs []error
	for range attempts {
		s, err := tryStart()
		if err == nil {
			return s, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func tryStart() (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	dir, err := os.MkdirTemp("", "reqlock-bench-redis-")
	if err != nil {
		return nil, err
	}
	s := &Server{addr: addr, dir: dir}
	if err := s.spawn(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// spawn runs redis-server on s.addr in s.dir and waits until it answers.
func (s *Server) spawn() error {
	_, port, _ := net.SplitHostPort(s.addr)
	log, err := os.Create(s.dir + "/redis.log")
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir)
	cmd.Stdout, cmd.Stderr = log, log
	pdeathsig.Set(cmd)
	exited := make(chan struct{})
	started := make(chan error)
	// The server gets SIGKILL when the thread that started it dies
	// (pdeathsig.Set): start it on a thread of its own, which this
	// goroutine keeps until the server exits.
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the server
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		return err
	}
	s.cmd, s.exited = cmd, exited
	if err := s.waitReady(); err != nil {
		out, _ := os.ReadFile(s.dir + "/redis.log")
		s.kill()
		return fmt.Errorf("redis-server on %s: %w; its log: %s", s.addr, err, lastLines(string(out), 5))
	}
	return nil
}

// Restart stops the server as Stop does and starts a new one on the same
// address, which it returns once that one answers PING. The new server
// starts empty: the server keeps nothing on disk.
func (s *Server) Restart() error {
	s.kill()
	return s.spawn()
}

// waitReady polls the server with PING until it answers PONG, it exits, or
// startTimeout passes.
func (s *Server) waitReady() error {
	deadline := time.Now().Add(startTimeout)
	for {
		err := ping(s.addr)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no PONG within %v: %w", startTimeout, err)
		}
		select {
		case <-s.exited:
			return errors.New("it exited")
		case <-time.After(pollInterval): // polling for PONG
		}
	}
}

// Stop stops the server with SIGTERM, or SIGKILL when it has not exited
// stopTimeout later, and removes its directory.
func (s *Server) Stop() {
	s.kill()
	_ = os.RemoveAll(s.dir)
}

// kill stops the server process as Stop does, keeping its directory.
func (s *Server) kill() {
	select {
	case <-s.exited:
	default:
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(stopTimeout):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
}

// ping sends PING over a connection of its own and wants +PONG.
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

// lastLines returns the last n lines of s, joined with " | ".
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], " | ")
}

// Pause stops the server with SIGSTOP: it keeps its connections and
// answers nothing until Resume, as a Redis in a long pause. It returns once
// the process is stopped (on Linux).
func (s *Server) Pause() error {
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
		if err != nil {
			return nil // not Linux: the signal's return is the best we know
		}
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && i+2 < len(b) && b[i+2] == 'T' {
			return nil
		}
		time.Sleep(time.Millisecond) // polling the process state
	}
	return nil
}

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() error { return s.cmd.Process.Signal(syscall.SIGCONT) }
