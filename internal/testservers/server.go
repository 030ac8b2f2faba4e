package testservers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	startAttempts = 3                // a set whose server exits at start is started again on new ports
	startTimeout  = 60 * time.Second // CI machines are slow and busy
	stopTimeout   = 10 * time.Second // then SIGKILL
	pollMin       = 5 * time.Millisecond
	pollMax       = 100 * time.Millisecond
)

// errExited marks a server that exited while starting: most likely another
// process took its port between the draw and the bind, so a retry on new
// ports has a good chance.
var errExited = errors.New("exited while starting")

// Server is one server process started for a test, on a loopback port, with
// its data in a private directory. The test that started it owns it: call
// its methods from that test's goroutine. It is stopped, and its directory
// removed, when that test ends.
type Server struct {
	tb   testing.TB // the owner: its Fatalf reports a failed method
	kind string     // "redis-server", "etcd", ... for messages
	addr string
	dir  string // data, configuration and log
	log  string

	stopSignal syscall.Signal // the graceful stop
	cred       *syscall.Credential
	// tree has Pause, Resume and Kill signal the server's child processes
	// too: PostgreSQL's backends, each in a session of its own, freeze and
	// die with the postmaster.
	tree bool
	args func() []string // the command line, built at each start
	// ready reports nil once the process answers as itself (pid), not as
	// another process that holds the port.
	ready func(ctx context.Context, pid int) error
	// wipe removes what the server stored, for RestartEmpty.
	wipe func() error
	// rejoin runs before an emptied server starts again (an etcd member
	// must be replaced in its cluster).
	rejoin func(ctx context.Context) error

	mu sync.Mutex
	p  *proc // the running (or last) process
}

type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has been waited for
}

func (p *proc) running() bool {
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Addr returns the server's host:port on 127.0.0.1. It stays the same across
// restarts.
func (s *Server) Addr() string { return s.addr }

// Kill sends SIGKILL, as a crash would, and waits until the process is gone.
// Nothing the server had not yet written survives. Killing a server that is
// not running does nothing.
func (s *Server) Kill() {
	s.tb.Helper()
	s.must("kill", s.halt(syscall.SIGKILL))
}

// Stop stops the server the graceful way (SIGTERM; SIGINT for PostgreSQL)
// and waits until the process is gone. Stopping a server that is not running
// does nothing.
func (s *Server) Stop() {
	s.tb.Helper()
	s.must("stop", s.halt(s.stopSignal))
}

// Restart stops the server if it runs, starts it again on the same port with
// the data it had, and waits until it answers. A cluster node or member may
// still be rejoining its cluster when Restart returns: poll for the state the
// test needs.
func (s *Server) Restart() {
	s.tb.Helper()
	s.must("restart", s.restart(false))
}

// RestartEmpty is Restart after the server lost everything it stored, as on
// a new disk: a Redis comes back with no keys (it keeps its configuration,
// and a cluster node its cluster identity); an etcd member is replaced in its
// cluster by a new, empty member of the same name and addresses. A Sentinel
// stores nothing and simply restarts.
func (s *Server) RestartEmpty() {
	s.tb.Helper()
	s.must("restart empty", s.restart(true))
}

// Pause stops the process with SIGSTOP: it keeps its connections but
// answers nothing, as a server in a long GC pause or behind a partition. It
// returns once every thread of the server has stopped (on Linux).
func (s *Server) Pause() {
	s.tb.Helper()
	s.must("pause", s.signal(syscall.SIGSTOP))
	s.must("pause", s.waitStopped())
}

// waitStopped polls /proc until every thread of the server's processes is
// stopped: a signal is delivered asynchronously, and a thread that was
// running may still answer a request meanwhile. Without /proc it returns at
// once.
func (s *Server) waitStopped() error {
	p := s.current()
	if _, err := os.Stat("/proc/self/task"); err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	return poll(ctx, p.done, func(context.Context) error {
		pids := []int{p.cmd.Process.Pid}
		if s.tree {
			pids = append(pids, childPids(pids[0])...)
		}
		for _, pid := range pids {
			tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
			for _, t := range tasks {
				if st := procState(t); st != "T" && st != "t" && st != "" && st != "Z" && st != "X" {
					return fmt.Errorf("thread %s is in state %s, not stopped", t, st)
				}
			}
		}
		return nil
	})
}

// procState returns the state field of a /proc stat file, "" when it is
// gone.
func procState(statFile string) string {
	b, err := os.ReadFile(statFile)
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// childPids returns the child processes of ppid.
func childPids(ppid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var pids []int
	for _, st := range stats {
		b, err := os.ReadFile(st)
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(ppid) {
			if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(st))); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// Resume continues a paused process with SIGCONT.
func (s *Server) Resume() {
	s.tb.Helper()
	s.must("resume", s.signal(syscall.SIGCONT))
}

func (s *Server) must(what string, err error) {
	if err != nil {
		s.tb.Helper()
		s.tb.Fatalf("testservers: %s %s: %s: %v", s.kind, s.addr, what, err)
	}
}

func (s *Server) current() *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p
}

func (s *Server) signal(sig syscall.Signal) error {
	p := s.current()
	if !p.running() {
		return errors.New("not running")
	}
	return s.send(p, sig)
}

// send signals p, and for a tree server its children too (but a graceful
// stop, which the server passes on to its children itself). The parent is
// stopped first, so that it starts no child meanwhile.
func (s *Server) send(p *proc, sig syscall.Signal) error {
	if !s.tree || sig == s.stopSignal {
		return p.cmd.Process.Signal(sig)
	}
	pid := p.cmd.Process.Pid
	if sig != syscall.SIGCONT {
		if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			return err
		}
	}
	for _, c := range childPids(pid) {
		_ = syscall.Kill(c, sig) // it may have exited meanwhile
	}
	return p.cmd.Process.Signal(sig)
}

// halt sends sig (with SIGCONT, so that a paused process can act on it) and
// waits for the process to exit; after stopTimeout it kills it and reports
// so.
func (s *Server) halt(sig syscall.Signal) error {
	p := s.current()
	if !p.running() {
		return nil
	}
	_ = s.send(p, sig)
	if sig != syscall.SIGKILL {
		_ = s.send(p, syscall.SIGCONT)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(stopTimeout):
		_ = s.send(p, syscall.SIGKILL)
		<-p.done
		return fmt.Errorf("ignored %v for %v and was killed", sig, stopTimeout)
	}
}

func (s *Server) restart(empty bool) error {
	if err := s.halt(s.stopSignal); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if empty {
		if s.rejoin != nil {
			if err := s.rejoin(ctx); err != nil {
				return err
			}
		}
		if s.wipe != nil {
			if err := s.wipe(); err != nil {
				return err
			}
		}
	}
	if err := s.launch(); err != nil {
		return err
	}
	return s.waitReady(ctx)
}

// launch starts the process without waiting for it to answer.
func (s *Server) launch() error {
	logFile, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close() // the child has its own descriptor
	args := s.args()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = s.dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = sysProcAttr(s.cred)
	if err := spawn(cmd); err != nil {
		return fmt.Errorf("start %s: %w", args[0], err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	s.mu.Lock()
	s.p = p
	s.mu.Unlock()
	return nil
}

// waitReady polls ready until it reports nil, the process exits (errExited)
// or ctx ends; the errors carry the tail of the server's log.
func (s *Server) waitReady(ctx context.Context) error {
	p := s.current()
	err := poll(ctx, p.done, func(ctx context.Context) error {
		return s.ready(ctx, p.cmd.Process.Pid)
	})
	switch {
	case err == nil && p.running():
		return nil
	case err == nil || errors.Is(err, errExited):
		return fmt.Errorf("%s on %s %w (%v); log: %s", s.kind, s.addr, errExited, p.cmd.ProcessState, s.logTail())
	default:
		return fmt.Errorf("%s on %s not ready: %w; log: %s", s.kind, s.addr, err, s.logTail())
	}
}

func (s *Server) logTail() string {
	b, err := os.ReadFile(s.log)
	if err != nil {
		return err.Error()
	}
	return tail(string(b), 8)
}

// poll calls check until it returns nil or a permanent error, done is
// closed (errExited) or ctx ends (the last error), sleeping a little longer
// after each try.
func poll(ctx context.Context, done <-chan struct{}, check func(context.Context) error) error {
	wait := pollMin
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := check(cctx)
		cancel()
		if err == nil {
			return nil
		}
		if p, ok := err.(permanent); ok {
			return p.err
		}
		timer := time.NewTimer(wait)
		select {
		case <-done:
			timer.Stop()
			return errExited
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("%w; last: %w", ctx.Err(), err)
		case <-timer.C:
		}
		wait = min(2*wait, pollMax)
	}
}

// permanent is an error that ends a poll at once.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }

// group is a set of servers started together, with one directory under
// which each has its own. Closing it stops them and removes the directory.
type group struct {
	dir     string
	mu      sync.Mutex
	servers []*Server
}

const groupPrefix = "reqlock-testservers-"

func newGroup(name string) (*group, error) {
	sweepOnce.Do(sweepStale)
	dir, err := os.MkdirTemp(tempBase(), groupPrefix+name+"-")
	if err != nil {
		return nil, err
	}
	// Another user (postgres, when the tests run as root) must reach its
	// own directory inside.
	err = os.Chmod(dir, 0o711)
	if err == nil {
		err = os.WriteFile(dir+"/owner", []byte(self()), 0o644)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return &group{dir: dir}, nil
}

var sweepOnce sync.Once

// sweepStale removes the directories that test binaries killed before their
// cleanups left behind (their servers died with them): those whose owner
// file names a process that no longer runs.
func sweepStale() {
	dirs, _ := filepath.Glob(filepath.Join(tempBase(), groupPrefix+"*"))
	for _, d := range dirs {
		owner, err := os.ReadFile(d + "/owner")
		if err != nil {
			continue // not ours, or still being made
		}
		pid, start, _ := strings.Cut(string(owner), " ")
		if id, err := strconv.Atoi(pid); err == nil && procStart(id) != start {
			_ = os.RemoveAll(d)
		}
	}
}

// self names this process as "pid start-time", which stays unique when the
// pid is reused.
func self() string {
	pid := os.Getpid()
	return strconv.Itoa(pid) + " " + procStart(pid)
}

// procStart returns the start time of process pid (in clock ticks since
// boot), or "" when it does not run (or there is no /proc).
func procStart(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// The command name, in parentheses, may hold spaces: count after it.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 20 || f[0] == "Z" {
		return ""
	}
	return f[19]
}

// newServer makes the directory of one server of the group and registers it
// to be stopped with the group.
func (g *group) newServer(tb testing.TB, kind string, port int) (*Server, error) {
	dir := fmt.Sprintf("%s/%s-%d", g.dir, strings.ReplaceAll(kind, " ", "-"), port)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	s := &Server{
		tb:         tb,
		kind:       kind,
		addr:       net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		dir:        dir,
		log:        dir + "/server.log",
		stopSignal: syscall.SIGTERM,
	}
	g.mu.Lock()
	g.servers = append(g.servers, s)
	g.mu.Unlock()
	return s, nil
}

// close stops every server: gracefully when graceful (a database's
// shutdown cleans up what a kill would leave, such as shared memory), else
// with SIGKILL; then it removes the directory.
func (g *group) close(graceful bool) error {
	g.mu.Lock()
	servers := g.servers
	g.mu.Unlock()
	errs := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		wg.Go(func() {
			sig := syscall.SIGKILL
			if graceful {
				sig = s.stopSignal
			}
			if err := s.halt(sig); err != nil {
				errs[i] = fmt.Errorf("%s on %s: %w", s.kind, s.addr, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(append(errs, os.RemoveAll(g.dir))...)
}

// startAll launches every server, then waits until each answers.
func startAll(servers ...*Server) error {
	for _, s := range servers {
		if err := s.launch(); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for _, s := range servers {
		if err := s.waitReady(ctx); err != nil {
			return err
		}
	}
	return nil
}

// withRetries runs start, which builds a group and starts its servers, up to
// startAttempts times while a server exits at start; a failed attempt's
// group is closed.
func withRetries[T any](name string, start func(g *group) (T, error)) (T, *group, error) {
	var errs []error
	for range startAttempts {
		g, err := newGroup(name)
		if err != nil {
			var zero T
			return zero, nil, err
		}
		v, err := start(g)
		if err == nil {
			return v, g, nil
		}
		errs = append(errs, err)
		if cerr := g.close(false); cerr != nil {
			errs = append(errs, cerr)
		}
		if !errors.Is(err, errExited) {
			break
		}
	}
	var zero T
	return zero, nil, errors.Join(errs...)
}

// private starts a set of servers owned by tb, stopped when its test ends.
func private[T any](tb testing.TB, name string, start func(g *group) (T, error)) T {
	tb.Helper()
	v, g, err := withRetries(name, start)
	if err != nil {
		tb.Fatalf("testservers: %s: %v", name, err)
	}
	tb.Cleanup(func() {
		if err := g.close(false); err != nil {
			tb.Errorf("testservers: %s: %v", name, err)
		}
	})
	return v
}

var (
	spawnOnce sync.Once
	spawnReqs chan spawnReq
)

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// spawn starts cmd from one goroutine locked to its OS thread for the life
// of the test binary: on Linux every server gets SIGKILL when that thread
// dies (see sysProcAttr), which is only when the binary exits, even by a
// crash that runs no cleanup.
func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnReqs = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the process
			for r := range spawnReqs {
				r.done <- r.cmd.Start()
			}
		}()
	})
	r := spawnReq{cmd: cmd, done: make(chan error, 1)}
	spawnReqs <- r
	return <-r.done
}

var (
	portsMu   sync.Mutex
	portsUsed = map[int]bool{}
)

// freePort returns a loopback port nothing listens on, drawn at random below
// the kernel's ephemeral range, so that no outgoing connection takes it while
// its server is down between a Kill and a Restart. A port is handed out once
// per test binary. Another process may still bind it before the server does:
// the server then exits at start, and the set is started again (errExited).
func freePort() (int, error) {
	lo, hi := 20000, 32767
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if eph, err := strconv.Atoi(f[0]); err == nil && eph-1 < hi {
				hi = eph - 1
			}
		}
	}
	if hi-lo < 1000 {
		lo = 10000
	}
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 1000 {
		p := lo + rand.IntN(hi-lo+1)
		if portsUsed[p] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		_ = ln.Close()
		portsUsed[p] = true
		return p, nil
	}
	return 0, errors.New("no free loopback port found")
}

func freePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	return ports, nil
}

// tempBase is where the servers' directories go: /dev/shm when it is a
// writable directory, so that fsync costs nothing, else the usual one.
func tempBase() string {
	const shm = "/dev/shm"
	if fi, err := os.Stat(shm); err == nil && fi.IsDir() && syscall.Access(shm, 2) == nil {
		return shm
	}
	return os.TempDir()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// run runs a command-line tool to completion and returns its combined
// output; a failure carries the output.
func run(ctx context.Context, dir string, cred *syscall.Credential, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", name, err, tail(string(out), 8))
	}
	return string(out), nil
}
