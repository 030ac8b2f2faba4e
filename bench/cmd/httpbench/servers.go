package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/bench/internal/pdeathsig"
	"github.com/reqlock/reqlock/bench/internal/plainshop"
	"github.com/reqlock/reqlock/bench/internal/redislockshop"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redisstore"
	"github.com/reqlock/reqlock/stores/redisstore/rueidisstore"
)

// serveBaselineFlag, as the first argument, makes httpbench serve the
// baseline instead of measuring.
const serveBaselineFlag = "-serve-baseline"

// baselineListening starts the line the baseline prints once it listens.
const baselineListening = "redislockshop: listening on "

// inventoryListening starts the line the example prints once it listens.
const inventoryListening = "inventory: listening on "

// startTimeout bounds a service's start, from exec to its listening line.
const startTimeout = 30 * time.Second

// serveBaselineMain serves redislockshop on a free loopback port until
// SIGINT or SIGTERM, as the example serves itself: flags -redis URL, -wait,
// -ttl, -stock.
func serveBaselineMain(args []string, stdout, stderr io.Writer) int {
	cfg := redislockshop.DefaultConfig()
	fs := flag.NewFlagSet("httpbench "+serveBaselineFlag, flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("redis", "", "Redis URL")
	fs.DurationVar(&cfg.Wait, "wait", cfg.Wait, "lock wait")
	fs.DurationVar(&cfg.TTL, "ttl", cfg.TTL, "lock TTL")
	fs.Int64Var(&cfg.DefaultStock, "stock", cfg.DefaultStock, "stock of a SKU never set")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serveBaseline(ctx, *url, cfg, stdout); err != nil {
		fmt.Fprintln(stderr, "redislockshop:", err)
		return 1
	}
	return 0
}

func serveBaseline(ctx context.Context, url string, cfg redislockshop.Config, stdout io.Writer) error {
	client, err := redislockshop.NewClient(url)
	if err != nil {
		return err
	}
	defer client.Close()
	h, err := redislockshop.New(client, cfg)
	if err != nil {
		return err
	}
	return listenAndServe(ctx, h, baselineListening, stdout)
}

// listenAndServe serves h on a free loopback port until ctx ends, once it
// has printed listening and its base URL to stdout.
func listenAndServe(ctx context.Context, h http.Handler, listening string, stdout io.Writer) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "%shttp://%s\n", listening, ln.Addr())
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// servePlainFlag, as the first argument, makes httpbench serve one of the
// library scenario's services instead of measuring.
const servePlainFlag = "-serve-plain"

// plainListening starts the line a library scenario's service prints once
// it listens.
const plainListening = "plainshop: listening on "

// The library scenario's services, by their lock (servePlainMain's -lock),
// in the order the scenario loads them: the baseline last.
const (
	lockRueidis   = "ginlock-rueidis"
	lockGoRedis   = "ginlock-goredis"
	lockRedislock = "redislock"
)

// plainLocks are the library scenario's services.
var plainLocks = []string{lockRueidis, lockGoRedis, lockRedislock}

// servePlainMain serves plainshop behind the lock -lock on a free loopback
// port until SIGINT or SIGTERM: flags -lock, -redis URL, -wait, -ttl,
// -stock.
func servePlainMain(args []string, stdout, stderr io.Writer) int {
	cfg := redislockshop.DefaultConfig()
	fs := flag.NewFlagSet("httpbench "+servePlainFlag, flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("redis", "", "Redis URL")
	lock := fs.String("lock", "", strings.Join(plainLocks, ", "))
	fs.DurationVar(&cfg.Wait, "wait", cfg.Wait, "lock wait")
	fs.DurationVar(&cfg.TTL, "ttl", cfg.TTL, "lock TTL")
	fs.Int64Var(&cfg.DefaultStock, "stock", cfg.DefaultStock, "stock of a SKU never set")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := servePlain(ctx, *url, *lock, cfg, stdout); err != nil {
		fmt.Fprintln(stderr, "plainshop:", err)
		return 1
	}
	return 0
}

// rueidisTimeouts are the URL parameters that give the rueidis client the
// 1s timeouts redislockshop.NewClient gives go-redis.
const rueidisTimeouts = "dial_timeout=1s&read_timeout=1s&write_timeout=1s"

func servePlain(ctx context.Context, url, lock string, cfg redislockshop.Config, stdout io.Writer) error {
	client, err := redislockshop.NewClient(url)
	if err != nil {
		return err
	}
	defer client.Close()
	var mw gin.HandlerFunc
	var store stores.Store
	switch lock {
	case lockRedislock:
		mw, err = plainshop.Redislock(client, cfg)
	case lockGoRedis:
		// On the handlers' client, as redislock is.
		store, err = redisstore.New(client)
	case lockRueidis:
		// A client of its own, as rueidisstore.Open makes it.
		var rs *redisstore.Store
		if rs, err = rueidisstore.Open(ctx, url+"?"+rueidisTimeouts); err == nil {
			defer rs.Close()
			store = rs
		}
	default:
		return fmt.Errorf("-lock %q: want one of %s", lock, strings.Join(plainLocks, ", "))
	}
	if err != nil {
		return err
	}
	if store != nil {
		var locker *reqlock.Locker
		if mw, locker, err = plainshop.Ginlock(store, cfg); err != nil {
			return err
		}
		defer locker.Close(context.Background())
	}
	h, err := plainshop.New(client, mw, cfg)
	if err != nil {
		return err
	}
	return listenAndServe(ctx, h, plainListening, stdout)
}

// service is one of the services, running as a process of its own.
type service struct {
	name string // "reqlock", "redislock" or a library scenario's lock
	base string // http://127.0.0.1:port

	cmd    *exec.Cmd
	exited chan struct{}
	out    *syncBuffer // its stdout after the listening line, and its stderr
}

// clockTick is the unit of utime and stime in /proc/<pid>/stat: USER_HZ,
// 100 per second on Linux (getconf CLK_TCK).
const clockTick = 10 * time.Millisecond

// cpu returns the CPU time the service's process has used so far, user
// plus system, from /proc/<pid>/stat (Linux; 10ms steps).
func (s *service) cpu() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
	if err != nil {
		return 0, fmt.Errorf("%s's CPU time: %w", s.name, err)
	}
	return parseProcCPU(string(b))
}

// parseProcCPU returns utime + stime of a /proc/<pid>/stat line: the 12th
// and 13th fields after the command name, which ends at the last ')'.
func parseProcCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	f := strings.Fields(stat[i+1:])
	if i < 0 || len(f) < 13 {
		return 0, fmt.Errorf("/proc/<pid>/stat %.60q: too short", stat)
	}
	var ticks int64
	for _, v := range f[11:13] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/<pid>/stat: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}

// startService runs cmd and waits for the line that starts with listening
// and names the service's base URL.
func startService(name string, cmd *exec.Cmd, listening string) (*service, error) {
	s := &service{name: name, cmd: cmd, exited: make(chan struct{}), out: &syncBuffer{}}
	cmd.Stderr = s.out
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	pdeathsig.Set(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if base, ok := strings.CutPrefix(sc.Text(), listening); ok {
				found <- strings.TrimSpace(base)
				break
			}
			s.out.WriteString(sc.Text() + "\n")
		}
		_, _ = io.Copy(s.out, stdout) // the rest, until it exits
		_ = cmd.Wait()
		close(s.exited)
	}()
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case s.base = <-found:
		return s, nil
	case <-s.exited:
		return nil, fmt.Errorf("%s exited before it listened (%v); its output:\n%s", name, cmd.ProcessState, s.out)
	case <-timer.C:
		s.stop()
		return nil, fmt.Errorf("%s did not listen within %v; its output:\n%s", name, startTimeout, s.out)
	}
}

// stop ends the service with SIGTERM (both shut down gracefully), and kills
// it when it has not exited 10s later.
func (s *service) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-s.exited:
	case <-t.C:
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// startInventory runs the example's binary on a free loopback port.
func startInventory(bin string, cfg config) (*service, error) {
	cmd := exec.Command(bin, "-framework", "gin", "-redis", redisURL(cfg.redisAddr), "-addr", "127.0.0.1:0",
		"-stock", strconv.FormatInt(cfg.stock, 10), "-wait", cfg.wait.String(), "-ttl", cfg.ttl.String())
	cmd.Env = withoutEnv(os.Environ(), "REDIS_URL")
	return startService("reqlock", cmd, inventoryListening)
}

// startBaseline re-executes this program to serve the baseline.
func startBaseline(cfg config) (*service, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, serveBaselineFlag, "-redis", redisURL(cfg.redisAddr),
		"-stock", strconv.FormatInt(cfg.stock, 10), "-wait", cfg.wait.String(), "-ttl", cfg.ttl.String())
	return startService("redislock", cmd, baselineListening)
}

// startPlain re-executes this program to serve plainshop behind lock.
func startPlain(lock string, cfg config) (*service, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, servePlainFlag, "-lock", lock, "-redis", redisURL(cfg.redisAddr),
		"-stock", strconv.FormatInt(cfg.stock, 10), "-wait", cfg.wait.String(), "-ttl", cfg.ttl.String())
	return startService(lock, cmd, plainListening)
}

// redisURL is the URL of db 0 at addr.
func redisURL(addr string) string { return "redis://" + addr + "/0" }

// withoutEnv returns env without the variable name.
func withoutEnv(env []string, name string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// buildInventory builds examples/inventory of the reqlock module in dir
// into tmp and returns the binary's path.
func buildInventory(ctx context.Context, dir, tmp string) (string, error) {
	if _, err := os.Stat(filepath.Join(dir, "examples", "inventory", "main.go")); err != nil {
		return "", fmt.Errorf("-reqlock-dir %s: no examples/inventory there (run from bench/, or pass -inventory): %w", dir, err)
	}
	bin := filepath.Join(tmp, "inventory")
	// The example is a module of its own: build it from its directory.
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	cmd.Dir = filepath.Join(dir, "examples", "inventory")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build in %s: %w\n%s", cmd.Dir, err, out)
	}
	return bin, nil
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) WriteString(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b.WriteString(s)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
