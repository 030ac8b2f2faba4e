package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"time"
)

// config is httpbench's configuration, one field per flag.
type config struct {
	redisAddr  string
	inventory  string // the example's binary; empty: build it from reqlockDir
	reqlockDir string
	clients    int
	skus       int
	duration   time.Duration
	rounds     int
	warmup     time.Duration
	wait, ttl  time.Duration
	stock      int64
	note       string
	scenario   string        // deduct (the default), library, reads or limit
	work       time.Duration // reads and limit: the example's -work
	pause      time.Duration // limit: how long one instance stays stopped
	keys       int           // idempotency: the idempotency keys
	freeze     time.Duration // idempotency: how long Redis stays stopped
	delay      time.Duration // idempotency: before the keys are sent again
}

// The scenarios (-scenario).
const (
	scenarioDeduct  = "deduct"
	scenarioLibrary = "library"
	scenarioReads   = "reads"
	scenarioLimit   = "limit"
	scenarioIdem    = "idempotency"
)

// parseFlags parses httpbench's arguments; usage and flag errors go to out.
func parseFlags(args []string, out io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("httpbench", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&cfg.redisAddr, "redis", "", "Redis `host:port` both services use (required; nobody else should use it meanwhile)")
	fs.StringVar(&cfg.inventory, "inventory", "", "the examples/inventory `binary`; empty: go build it from -reqlock-dir")
	fs.StringVar(&cfg.reqlockDir, "reqlock-dir", "..", "the reqlock module `dir` to build examples/inventory from when -inventory is empty")
	fs.IntVar(&cfg.clients, "clients", 50, "concurrent HTTP clients")
	fs.IntVar(&cfg.skus, "skus", 1000, "SKUs; client c cycles through c, c+clients, ...")
	fs.DurationVar(&cfg.duration, "duration", 5*time.Second, "measured time per service per round")
	fs.IntVar(&cfg.rounds, "rounds", 3, "rounds, each every service in turn (deduct, library: the order reversed every other round)")
	fs.DurationVar(&cfg.warmup, "warmup", time.Second, "unmeasured load per service before the first round")
	fs.DurationVar(&cfg.wait, "wait", 2*time.Second, "lock wait of both services (the example's -wait)")
	fs.DurationVar(&cfg.ttl, "ttl", 10*time.Second, "lock TTL of both services (the example's -ttl)")
	fs.Int64Var(&cfg.stock, "stock", 1_000_000_000_000, "initial stock of every SKU (the example's -stock): enough that no deduction runs out")
	fs.StringVar(&cfg.scenario, "scenario", scenarioDeduct, "deduct: the example against the bsm/redislock service; "+
		"library: one plain handler behind ginlock on rueidis, ginlock on go-redis and bsm/redislock; "+
		"reads: report reads shared against exclusive; limit: an export limit of 3 through a stopped instance and a Redis restart; "+
		"idempotency: deductions sent 3 times with one Idempotency-Key through a stopped Redis (see the package doc)")
	fs.DurationVar(&cfg.work, "work", 20*time.Millisecond, "reads, limit and idempotency: each handler's work (the example's -work)")
	fs.DurationVar(&cfg.pause, "pause", 12*time.Second, "limit: how long one instance stays stopped (SIGSTOP); longer than -ttl")
	fs.IntVar(&cfg.keys, "keys", 1000, "idempotency: the deductions, each with an Idempotency-Key of its own")
	fs.DurationVar(&cfg.freeze, "freeze", 2*time.Second, "idempotency: how long Redis stays stopped (SIGSTOP)")
	fs.DurationVar(&cfg.delay, "delay", time.Second, "idempotency: the pause before every key is sent again")
	fs.StringVar(&cfg.note, "note", "", "a line for the report's header (httpbench.sh says which reqlock was built)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q: every setting is a flag", fs.Arg(0))
	}
	return cfg, cfg.validate()
}

// validate reports the first invalid setting, naming its flag.
func (cfg config) validate() error {
	switch cfg.scenario {
	case scenarioDeduct, scenarioLibrary:
	case scenarioIdem:
		switch {
		case cfg.redisAddr != "":
			return fmt.Errorf("-redis with -scenario %s: it starts a redis-server of its own (which it stops); drop -redis", cfg.scenario)
		case cfg.keys < 1:
			return fmt.Errorf("-keys %d: want at least 1", cfg.keys)
		case cfg.clients < 1:
			return fmt.Errorf("-clients %d: want at least 1", cfg.clients)
		case cfg.skus < 1:
			return fmt.Errorf("-skus %d: want at least 1", cfg.skus)
		case cfg.freeze <= 0:
			return fmt.Errorf("-freeze %v: must be positive", cfg.freeze)
		case cfg.delay < 0:
			return fmt.Errorf("-delay %v: must not be negative", cfg.delay)
		case cfg.work < 0:
			return fmt.Errorf("-work %v: must not be negative", cfg.work)
		case cfg.wait < 0:
			return fmt.Errorf("-wait %v: must not be negative", cfg.wait)
		case cfg.ttl < time.Millisecond:
			return fmt.Errorf("-ttl %v: must be at least 1ms", cfg.ttl)
		case cfg.stock < int64(cfg.keys):
			return fmt.Errorf("-stock %d: want at least -keys (%d), so that no deduction runs out", cfg.stock, cfg.keys)
		}
		return nil
	case scenarioReads, scenarioLimit:
		if cfg.redisAddr != "" {
			return fmt.Errorf("-redis with -scenario %s: it starts a redis-server of its own (which limit restarts); drop -redis", cfg.scenario)
		}
		switch {
		case cfg.clients < 2:
			return fmt.Errorf("-clients %d: want at least 2, one per instance", cfg.clients)
		case cfg.work <= 0:
			return fmt.Errorf("-work %v: must be positive", cfg.work)
		case cfg.duration <= 0:
			return fmt.Errorf("-duration %v: must be positive", cfg.duration)
		case cfg.rounds < 1:
			return fmt.Errorf("-rounds %d: want at least 1", cfg.rounds)
		case cfg.ttl < time.Millisecond:
			return fmt.Errorf("-ttl %v: must be at least 1ms", cfg.ttl)
		case cfg.scenario == scenarioLimit && cfg.pause <= cfg.ttl:
			return fmt.Errorf("-pause %v: must exceed -ttl %v, so that the stopped holder's lease expires", cfg.pause, cfg.ttl)
		}
		return nil
	default:
		return fmt.Errorf("-scenario %q: want deduct, library, reads, limit or idempotency", cfg.scenario)
	}
	if cfg.redisAddr == "" {
		return errors.New("-redis is required (bench/httpbench.sh starts a private redis-server and passes it)")
	}
	if _, _, err := net.SplitHostPort(cfg.redisAddr); err != nil {
		return fmt.Errorf("-redis %q: %w", cfg.redisAddr, err)
	}
	switch {
	case cfg.clients < 1:
		return fmt.Errorf("-clients %d: want at least 1", cfg.clients)
	case cfg.skus < cfg.clients:
		return fmt.Errorf("-skus %d: want at least -clients (%d), so that every client has SKUs of its own", cfg.skus, cfg.clients)
	case cfg.duration <= 0:
		return fmt.Errorf("-duration %v: must be positive", cfg.duration)
	case cfg.rounds < 1:
		return fmt.Errorf("-rounds %d: want at least 1", cfg.rounds)
	case cfg.warmup < 0:
		return fmt.Errorf("-warmup %v: must not be negative", cfg.warmup)
	case cfg.wait < 0:
		return fmt.Errorf("-wait %v: must not be negative", cfg.wait)
	case cfg.ttl < time.Millisecond:
		return fmt.Errorf("-ttl %v: must be at least 1ms", cfg.ttl)
	case cfg.stock < 1:
		return fmt.Errorf("-stock %d: must be positive", cfg.stock)
	}
	return nil
}
