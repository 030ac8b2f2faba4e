// Command inventory is a small shop service that shows what reqlock is for:
// deducting the stock of a SKU during a flash sale without overselling, when
// many requests, on one instance or many, hit the same SKU at once.
//
// Every change to a SKU runs under the lock key sku:<id>, taken by reqlock's
// middleware before the handler runs. The deduction reads the stock, works
// for a while (the -work flag), then writes the stock back: without the lock
// (-nolock) concurrent deductions read the same stock and lose each other's
// updates, so the shop sells more than it has. With the lock they run one at
// a time, on every instance that shares the lock store. A checkout locks
// every SKU of its cart at once, all or none, in the same sku: key space, so
// it excludes the single-SKU routes on each of its SKUs.
//
// The lock alone is not enough when a lease expires while its holder still
// works (a GC pause, a slow network). So every write is fenced: each lock
// grant carries a fencing token per key that only grows (Lock.FenceOf), and
// the stock store keeps per SKU the highest fence that read it for an update
// or wrote it, and refuses a read or write with a lower one. Reads count
// too: once a newer holder has read the stock, an older holder's write
// (computed from the same stock) would lose the newer one's update. A holder
// whose lock was lost gets 409 "stale fence" and changes nothing; a checkout
// with a stale fence on any of its SKUs changes none of them.
//
// Usage:
//
//	go -C examples/inventory run . [flags]
//
// (the example is a Go module of its own, so that the stores it can take from a
// URL do not become dependencies of reqlock's core; -C runs it from its
// directory, where relative paths such as -routes routes.yaml start)
//
// Flags:
//
//	-addr HOST:PORT   listen address (default 127.0.0.1:8080; port 0 picks a free one)
//	-framework NAME   gin, echo or nethttp (default gin)
//	-redis URL        keep the stock in this Redis, such as
//	                  redis://127.0.0.1:6379/0 (default $REDIS_URL; without
//	                  either, it lives in memory), and the locks too
//	                  (rueidisstore) unless -store says otherwise
//	-store URL        keep the locks in this store (default $REQLOCK_STORE;
//	                  without either, where -redis says, else in memory):
//	                    memory://                                  memstore, this process only
//	                    redis://host:6379/0                        rueidisstore: redisstore on rueidis (rediss:// for TLS)
//	                    redlock://h1:6379,h2:6379,h3:6379          redlockstore, a Redlock over independent nodes
//	                    etcd://h1:2379,h2:2379/prefix              etcdstore
//	                    zk://h1:2181,h2:2181/root?session=10s      zkstore
//	                    mysql://user:pass@host:3306/db             mysqlstore (MySQL or MariaDB)
//	                    postgres://user:pass@host:5432/db?sslmode=disable   pgstore
//	                    file:///var/lib/inventory/locks            filestore, processes of one host
//	                  (each store's package documents its URL's parameters).
//	                  A store whose server cannot be reached stops start-up
//	                  within 5s, naming the address; add connect=lazy to the
//	                  URL (redis://host:6379/0?connect=lazy) to start anyway
//	                  and answer 503 until the server is back
//	-stock N          initial stock of a SKU never set (default 100)
//	-work DURATION    simulated work between reading and writing the stock (default 0)
//	-wait DURATION    how long a request waits for a held lock (default 2s; 0 tries once)
//	-ttl DURATION     lease of each lock (default 10s)
//	-routes FILE      take the lock configuration from this route table file
//	                  (.yaml, .yml or .json) instead of the built-in one; the
//	                  table sets each route's wait and ttl, so -wait and -ttl
//	                  are refused with -routes, and so is -nolock
//	-nolock           no lock middleware and no fences: shows overselling
//	-worklog FILE     append a line per report, rebuild and export handler's
//	                  work to FILE: its start and end (Unix nanoseconds),
//	                  whether it ran to its end, its key and route; load
//	                  programs (bench/cmd/httpbench) check the locks across
//	                  instances with it
//
// Lock configuration:
//
// The locks are a route table, installed once in front of all the routes
// (ginlock.Install, echolock.Install, or middleware.Routes.Handler around the
// ServeMux). Built in, it is, with -wait and -ttl filled in:
//
//	PUT  /skus/{id}          @lock key=sku:<id>                  on-timeout=423 on-store-error=503
//	POST /skus/{id}/deduct   @lock key=sku:<id> idempotency=optional  on-timeout=423 on-store-error=503
//	POST /orders             @lock key=sku:<json:sku>            on-timeout=423 on-store-error=503
//	POST /carts/checkout     @lock key=sku:<json:items[*].sku> idempotency=optional  on-timeout=423 on-store-error=503
//	GET  /reports/{id}       @lock key=report:<id> mode=shared   on-timeout=423 on-store-error=503
//	POST /reports/{id}/rebuild  @lock key=report:<id>            on-timeout=423 on-store-error=503
//	POST /exports            @lock key=tenant:<header:X-Tenant> limit=3  on-timeout=429 on-store-error=503
//
// The deduct and checkout routes take an optional Idempotency-Key header
// (docs/idempotency.md): a retry with the same key gets the first answer,
// replayed, and a request without one runs as before. With the locks in the
// stock's Redis (-redis without -store), the deduction writes its record in
// the same Lua script that deducts, guarded by the key's claim, so that a
// client whose deduction answered 503 "outcome unknown" and that retries
// with the same key gets the first answer, never a second deduction. On a
// store that keeps no idempotency records (ZooKeeper, filestore, Redlock)
// the built-in table leaves idempotency out.
//
// On a store without shared locks (all but memstore today) the report read
// and the export lock exclusively instead (mode and limit left out), and a
// warning says so at start-up; a table file that asks for them there stops
// the service, naming each entry.
//
// routes.yaml, next to this file, is that table with the default wait=2s and
// ttl=10s: -routes routes.yaml behaves exactly as no
// flag. Edit a copy to change a route's wait, ttl, timeout status or failure
// policy (see package middleware for the spec grammar). A route left out of
// the table runs unlocked. A table with an error, or with an entry that
// matches none of the routes below, stops the service before it listens:
// it exits with status 1 and a message naming the file and line of each
// problem, such as
//
//	inventory: reqlock/middleware: invalid configuration: r.yaml:13: POST /skus/{id}/deduct: spec column 20: wait: "2x" is not a duration (such as 2s or 500ms)
//	inventory: reqlock/middleware: invalid configuration: r.yaml:15: POST /cart/checkout matches no registered route
//
// A handler writes a SKU with the fence of that SKU's key in its lock; a
// table whose keys leave a SKU the handler writes unlocked while the request
// holds a lock (another key space, say) gets 500 and nothing is written.
//
// Routes:
//
//	GET  /skus/{id}          200 {"sku":"…","stock":N}; not locked
//	PUT  /skus/{id}          body {"stock":N}: sets the stock under sku:<id>
//	POST /skus/{id}/deduct   body {"qty":Q}: deducts under sku:<id>;
//	                         200 {"sku":"…","stock":remaining,"fence":F}
//	POST /orders             body {"sku":"…","qty":Q}: the same deduction, keyed
//	                         from the body (sku:<json:sku>, the same keys)
//	POST /carts/checkout     body {"items":[{"sku":"…","qty":Q},…]}: deducts every
//	                         item, all or none, under the keys of all its SKUs
//	                         (sku:<json:items[*].sku>); a SKU listed twice has its
//	                         quantities added up. 200 {"items":[{"sku":"…","qty":Q,
//	                         "stock":remaining,"fence":F},…]}, one line per SKU,
//	                         sorted by SKU
//	GET  /reports/{id}       200 {"report":"…","version":V,"fence":F}; reads of one
//	                         report run together, never during its rebuild
//	POST /reports/{id}/rebuild  200 {"report":"…","version":V+1,"fence":F}: runs
//	                         alone; a read and a rebuild that ever see each other
//	                         answer 500 "overlap: …"
//	POST /exports            header X-Tenant: 200 {"tenant":"…","running":N}, at
//	                         most 3 of a tenant at once; the next waits, then 429
//	                         with Retry-After and reason "limit"
//	GET  /metrics            the lock metrics in the Prometheus text format
//	                         (package metrics); not locked
//
// Every framework answers these routes alike. A GET route serves HEAD too.
// A method a path does not serve answers 405 with an Allow header naming the
// methods it does (echo also answers OPTIONS itself, 204, and lists it), and
// a path unknown or with a trailing slash answers 404; these bodies are the
// router's own. A SKU in a path is its segment unescaped: /skus/a%2Fb/deduct
// deducts the SKU "a/b", under the same lock key as /orders with
// {"sku":"a/b"}, on every framework (gin is set up for it, see
// routes_gin.go), so instances on different frameworks that share one Redis
// lock the same keys.
//
// The checkout reads every SKU with its fence, works (-work), then deducts
// them all in one atomic step that checks every fence and every stock first
// (one Lua script on Redis, one critical section in memory). So even with
// -nolock a checkout cannot oversell; the lock keeps the carts and the
// single deductions of a SKU one at a time, and the fences refuse a cart
// whose lease expired.
//
// The metrics are the Locker's (reqlock.WithMetrics), labelled by route as
// the table names it (or by its spec's name=): with one deduction done and
// one answered 423,
//
//	reqlock_lock_success_total{route="POST /skus/{id}/deduct"} 1
//	reqlock_lock_failure_total{reason="timeout",route="POST /skus/{id}/deduct"} 1
//
// and the failures by every other reason (store_error, bad_key, canceled),
// the wait and hold histograms reqlock_lock_wait_seconds and
// reqlock_lock_hold_seconds, reqlock_lock_lost_total and
// reqlock_lock_handoffs_total. With -nolock it serves no series.
//
// Answers:
//
//   - 400 for a bad body (a missing "sku" on /orders; on a checkout, missing
//     or empty "items", an item without "sku", a "qty" below 1); when the
//     route is locked the middleware answers the body errors it sees while
//     deriving the keys, with a problem details body of reason "bad_key".
//   - 409 with the current stock when it is insufficient; on a checkout 409
//     {"error":"insufficient stock","short":[{"sku":"…","qty":Q,"stock":N},…]}
//     naming every short SKU, and no SKU changed.
//   - 409 "stale fence" when the lock was lost before the write and a newer
//     holder came first: the stock store refused the write, nothing changed.
//   - 409 "lock lost" when the request's lease ran out while it worked and
//     its client still waited: its context ended with a cause wrapping
//     reqlock.ErrLockLost (context.Cause tells the loss from a client that
//     left), so it stopped, and wrote nothing more.
//   - 413 for a body over 64 KiB, on every route that reads one, and for a
//     cart of more than 64 items (the lock's max-keys). /orders and the
//     checkout, whose keys the lock middleware reads from the body, refuse a
//     body over 1 MiB before they lock, with a problem details body of reason
//     "body_too_large".
//   - 423 with Retry-After when the lock wait runs out.
//   - 503 with Retry-After when the lock store or the stock store is down or
//     does not answer in time (see Failures); when it is the write that went
//     unanswered, the answer says that its outcome is unknown, even if the
//     lock was lost meanwhile.
//   - 500 when the request's lock does not cover a SKU it writes (see Lock
//     configuration).
//
// Failures:
//
// When Redis freezes or dies, a request answers 503 with Retry-After at most
// its lock wait plus its work (-work) plus one second after it arrived. The
// wait bounds getting the lock: reqlock bounds each store call by the wait's
// deadline. Once the request has its lock, its stock calls share 600ms,
// each bounded by what the calls before it left (the work does not count),
// and the release of its lock, which runs before the answer leaves, takes
// at most 400ms (the Locker's release timeout). A request without a lock (a
// GET, -nolock, a fail-open route whose lock store failed) gives its stock
// calls the whole second. With -wait 0 the one try is bounded by the
// Locker's release timeout, 400ms, and answered 503 when Redis has not
// answered by then.
//
// An outage of the lock store (any -store) is a fast 503 for every request,
// and the service heals by itself when the store returns; the Locker runs
// with reqlock's defaults for this:
//
//   - The requests queued behind a hot SKU learn of a store failure together:
//     when the request talking to the store fails, the ones waiting behind it
//     in this process answer 503 at once, not 423 at the end of their wait.
//     423 always means that another request holds the SKU.
//   - After 5 store failures in a row the Locker counts the store down (its
//     circuit breaker): every locked request answers 503 with Retry-After at
//     once, without a store call, while one request every 500ms probes the
//     store; the first probe that succeeds resumes service.
//   - A release that failed while the store was down is retried in the
//     background, owner-checked, until it lands: the SKU is free within about
//     a second of the store's return, not at the end of its TTL (-ttl). At
//     shutdown the service tries the releases still pending once more and
//     prints how many it could not release (their keys expire with their
//     TTL).
//   - The log shows one line when the store goes down (ERROR) and one when it
//     is back (INFO, with the outage's length and the count of requests
//     refused meanwhile), not one per request; GET /metrics counts each
//     request (reqlock_lock_failure_total{reason="store_error"}).
//
// A deduction whose write went unanswered may still be applied after its
// request was answered: a frozen Redis applies what it was sent when it
// thaws. Fencing keeps the stock accounting exact all the same. The write
// carries the fence its read claimed, and Redis applies it only if no newer
// holder has read or written the SKU since: a newer holder either reads the
// stock that write left, or claims the SKU first and the late write is
// refused. No update is lost; the client may not know whether it bought the
// unit, and GET /skus/{id} tells it.
//
// Try it:
//
//	go -C examples/inventory run . -work 10ms -wait 30s &
//	seq 150 | xargs -P 50 -I{} curl -s -o /dev/null -w '%{http_code}\n' \
//	    -X POST -d '{"qty":1}' localhost:8080/skus/apple/deduct | sort | uniq -c
//	curl -s localhost:8080/skus/apple   # 100 answered 200, 50 answered 409; stock 0
//
// Again with -nolock, all 150 answer 200 and the stock still shows units
// left: the shop sold more than it had. Run two instances on different
// -addr with the same -redis URL, and the lock holds across them.
//
// A checkout, then one with a short item, which changes nothing:
//
//	curl -s -X POST -d '{"items":[{"sku":"pear","qty":2},{"sku":"plum","qty":1}]}' \
//	    localhost:8080/carts/checkout    # 200: pear 98, plum 99, with their fences
//	curl -s -X POST -d '{"items":[{"sku":"pear","qty":1},{"sku":"plum","qty":500}]}' \
//	    localhost:8080/carts/checkout    # 409: plum is short (stock 99); pear stays 98
//
// The lock metrics after the run above:
//
//	curl -s localhost:8080/metrics | grep -E '^reqlock_lock_(success|failure)_total'
//
// The same service, its locks from the route table:
//
//	go -C examples/inventory run . -routes routes.yaml
//	cp examples/inventory/routes.yaml /tmp/r.yaml     # break a line, such as wait=2x
//	go -C examples/inventory run . -routes /tmp/r.yaml # exits 1: /tmp/r.yaml:LINE: …
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/metrics"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
)

// Frameworks the service can route with.
const (
	frameworkGin     = "gin"
	frameworkEcho    = "echo"
	frameworkNetHTTP = "nethttp"
)

// shutdownTimeout bounds the graceful shutdown.
const shutdownTimeout = 10 * time.Second

// redisGrace is the most a Redis that freezes or dies adds to the answer
// time of a request once it has its lock (see Failures in the package doc):
// the request's stock calls share stockBudget of it, and the release of its
// lock, which runs after the handler and before the answer leaves, takes at
// most the rest, releaseTimeout. A request without a lock has all of it for
// its stock calls. It is also the Redis client's read, write and dial
// timeout unless the -redis URL sets them.
const redisGrace = time.Second

// storeOpenTimeout bounds opening the -store lock store (connecting,
// creating its table).
const storeOpenTimeout = 10 * time.Second

// releaseTimeout bounds each lock release (reqlock.WithReleaseTimeout).
const releaseTimeout = 400 * time.Millisecond

// config is the service's configuration, one field per flag.
type config struct {
	addr         string
	framework    string
	redisURL     string // empty: the stock in memory (and the locks, without storeURL)
	storeURL     string // the lock store; empty: where redisURL says
	defaultStock int64
	work         time.Duration
	wait         time.Duration
	ttl          time.Duration
	noLock       bool
	routesFile   string // empty: the lock table in code, with wait and ttl
	workLog      string // empty: no work log

	// logger receives the lock middleware's warnings; nil means
	// slog.Default(). Not a flag: tests silence it.
	logger *slog.Logger
}

// defaultConfig returns the configuration with every flag at its default.
func defaultConfig() config {
	return config{
		addr:         "127.0.0.1:8080",
		framework:    frameworkGin,
		defaultStock: 100,
		wait:         2 * time.Second,
		ttl:          10 * time.Second,
	}
}

// parseFlags parses the command line args (without the program name).
// getenv supplies REDIS_URL when -redis is not given; usage and flag errors
// go to out. Every error names the flag at fault.
func parseFlags(args []string, getenv func(string) string, out io.Writer) (config, error) {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("inventory", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&cfg.addr, "addr", cfg.addr, "listen address `host:port` (port 0 picks a free one)")
	fs.StringVar(&cfg.framework, "framework", cfg.framework, "router: gin, echo or nethttp")
	fs.StringVar(&cfg.redisURL, "redis", "", "Redis `URL` for the stock, and the locks without -store (default $REDIS_URL; none: in memory)")
	fs.StringVar(&cfg.storeURL, "store", "", "lock store `URL`: "+storeSchemes()+" (default $REQLOCK_STORE; none: where -redis says); "+
		"an unreachable store stops start-up unless the URL says connect=lazy")
	fs.Int64Var(&cfg.defaultStock, "stock", cfg.defaultStock, "initial stock of a SKU never set")
	fs.DurationVar(&cfg.work, "work", cfg.work, "simulated work between reading and writing the stock")
	fs.DurationVar(&cfg.wait, "wait", cfg.wait, "how long a request waits for a held lock (0 tries once)")
	fs.DurationVar(&cfg.ttl, "ttl", cfg.ttl, "lease of each lock")
	fs.BoolVar(&cfg.noLock, "nolock", false, "no lock and no fences: shows overselling")
	fs.StringVar(&cfg.routesFile, "routes", "", "lock configuration from this route table `file` (.yaml, .yml or .json) instead of the built-in one")
	fs.StringVar(&cfg.workLog, "worklog", "", "append a line per report, rebuild and export handler's work to this `file` (start, end, key, route)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q: every setting is a flag", fs.Arg(0))
	}
	if cfg.routesFile != "" {
		// The table sets each route's wait and ttl: refuse the flags rather
		// than let one silently lose.
		var conflict error
		fs.Visit(func(f *flag.Flag) {
			if (f.Name == "wait" || f.Name == "ttl") && conflict == nil {
				conflict = fmt.Errorf("-%s with -routes: the route table %s sets each route's %s; set it there (%s=…) and drop -%s",
					f.Name, cfg.routesFile, f.Name, f.Name, f.Name)
			}
		})
		if conflict != nil {
			return config{}, conflict
		}
	}
	redisFlag, storeFlag := "-redis", "-store"
	if cfg.redisURL == "" && getenv != nil {
		cfg.redisURL = getenv("REDIS_URL")
		redisFlag = "-redis (from $REDIS_URL)"
	}
	if cfg.storeURL == "" && getenv != nil {
		cfg.storeURL = getenv("REQLOCK_STORE")
		storeFlag = "-store (from $REQLOCK_STORE)"
	}
	if err := cfg.validate(redisFlag, storeFlag); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// validate reports the first invalid setting, naming its flag; redisFlag
// and storeFlag name where the Redis and store URLs came from.
func (cfg config) validate(redisFlag, storeFlag string) error {
	if _, _, err := net.SplitHostPort(cfg.addr); err != nil {
		return fmt.Errorf("-addr %q: %w", cfg.addr, err)
	}
	switch cfg.framework {
	case frameworkGin, frameworkEcho, frameworkNetHTTP:
	default:
		return fmt.Errorf("-framework %q: unknown framework (want gin, echo or nethttp)", cfg.framework)
	}
	if cfg.redisURL != "" {
		if _, err := redis.ParseURL(withoutConnect(cfg.redisURL)); err != nil {
			return fmt.Errorf("%s: invalid Redis URL: %w", redisFlag, err)
		}
	}
	if cfg.storeURL != "" {
		if _, _, err := parseStoreURL(cfg.storeURL); err != nil {
			return fmt.Errorf("%s: %w", storeFlag, err)
		}
	}
	switch {
	case cfg.defaultStock < 0:
		return fmt.Errorf("-stock %d: must not be negative", cfg.defaultStock)
	case cfg.work < 0:
		return fmt.Errorf("-work %v: must not be negative", cfg.work)
	case cfg.wait < 0:
		return fmt.Errorf("-wait %v: must not be negative (0 tries once)", cfg.wait)
	case cfg.ttl < time.Millisecond:
		return fmt.Errorf("-ttl %v: must be at least 1ms", cfg.ttl)
	case cfg.noLock && cfg.routesFile != "":
		return fmt.Errorf("-nolock with -routes %s: -nolock runs without any lock; drop one of them", cfg.routesFile)
	}
	return nil
}

// app is the whole service for one config, with the parts tests look at.
type app struct {
	handler http.Handler
	shop    *shop
	locker  *reqlock.Locker    // nil with -nolock
	routes  *middleware.Routes // the lock configuration; nil with -nolock
	metrics *metrics.Registry  // the locker's metrics, served on GET /metrics
	closers []func() error

	// lockDesc and stockDesc say where the locks and the stock live.
	lockDesc, stockDesc string
	// ping checks the Redis server; nil without Redis.
	ping func(context.Context) error
}

// closeLockerTimeout bounds the Locker's last try of the releases that
// failed while the lock store was down, at shutdown.
const closeLockerTimeout = 2 * time.Second

// shutdown closes the Locker: the releases that failed while the lock store
// was down, and are retried in the background meanwhile, are tried once
// more within ctx. The error says how many could not be released (their
// keys expire with their TTL). Call it once the server has stopped, before
// close.
func (a *app) shutdown(ctx context.Context) error {
	if a.locker == nil {
		return nil
	}
	return a.locker.Close(ctx)
}

// close releases what the app opened (its Redis client), after closing the
// Locker if shutdown has not.
func (a *app) close() {
	ctx, cancel := context.WithTimeout(context.Background(), closeLockerTimeout)
	_ = a.shutdown(ctx) // a second Close does nothing
	cancel()
	for _, c := range a.closers {
		_ = c()
	}
}

// newApp builds the whole service for cfg: its stores, its locker and its
// router. The returned func releases what it opened; call it after the
// server has stopped.
func newApp(cfg config) (http.Handler, func(), error) {
	a, err := buildApp(cfg)
	if err != nil {
		return nil, nil, err
	}
	return a.handler, a.close, nil
}

// buildApp is newApp returning the app's parts.
func buildApp(cfg config) (*app, error) {
	if err := cfg.validate("-redis", "-store"); err != nil {
		return nil, err
	}
	a := &app{}
	var (
		lockStore stores.Store
		stock     stockStore
	)
	if cfg.redisURL == "" {
		stock = newMemStock()
		a.stockDesc = "in memory"
	} else {
		client, where, err := newRedisClient(cfg.redisURL)
		if err != nil {
			return nil, fmt.Errorf("-redis: %w", err)
		}
		a.closers = append(a.closers, client.Close)
		stock = newRedisStock(client)
		a.ping = func(ctx context.Context) error { return client.Ping(ctx).Err() }
		a.stockDesc = "in " + where
		if cfg.storeURL == "" {
			// The locks live in the stock's Redis, through a client of
			// their own, checked at start-up as -store's.
			ctx, cancel := context.WithTimeout(context.Background(), storeOpenTimeout)
			u, err := url.Parse(cfg.redisURL)
			var opened openedStore
			if err == nil {
				opened, err = openRedisLocks(ctx, lockParamsOnly(u), cfg.redisURL)
			}
			cancel()
			if err != nil {
				a.close()
				return nil, fmt.Errorf("-redis: lock store: %w", err)
			}
			a.closers = append(a.closers, opened.close)
			lockStore, a.lockDesc = opened.store, opened.desc
		}
	}
	switch {
	case cfg.storeURL != "":
		ctx, cancel := context.WithTimeout(context.Background(), storeOpenTimeout)
		opened, err := openLockStore(ctx, cfg.storeURL)
		cancel()
		if err != nil {
			a.close()
			return nil, fmt.Errorf("-store: %w", err)
		}
		if opened.close != nil {
			a.closers = append(a.closers, opened.close)
		}
		lockStore, a.lockDesc = opened.store, opened.desc
	case lockStore == nil:
		lockStore, a.lockDesc = memstore.New(), "memstore (in memory)"
	}
	a.shop = &shop{store: stock, defaultStock: cfg.defaultStock, work: cfg.work, reports: newReports()}
	// With the locks in the stock's Redis, a deduction with an idempotency
	// key writes its record in the script that deducts (deductRecorded).
	a.shop.records = cfg.redisURL != "" && cfg.storeURL == ""
	if cfg.workLog != "" {
		f, err := os.OpenFile(cfg.workLog, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			a.close()
			return nil, fmt.Errorf("-worklog: %w", err)
		}
		a.closers = append(a.closers, f.Close)
		a.shop.reports.workLog = f
	}
	a.metrics = metrics.New()

	if !cfg.noLock {
		logger := cfg.logger
		if logger == nil {
			logger = slog.Default()
		}
		// The circuit breaker and the pending releases run at their
		// defaults (see Failures in the package doc); shutdown closes
		// the Locker.
		locker, err := reqlock.New(lockStore, reqlock.WithLogger(logger), reqlock.WithMetrics(a.metrics),
			reqlock.WithReleaseTimeout(releaseTimeout))
		if err != nil {
			a.close()
			return nil, fmt.Errorf("locker: %w", err)
		}
		a.locker = locker
		if a.routes, err = lockRoutes(cfg, locker); err != nil {
			a.close()
			return nil, err
		}
	}

	var err error
	switch cfg.framework {
	case frameworkEcho:
		a.handler, err = echoRoutes(a.shop, a.routes, a.metrics)
	case frameworkNetHTTP:
		a.handler, err = netHTTPRoutes(a.shop, a.routes, a.metrics)
	default:
		a.handler, err = ginRoutes(a.shop, a.routes, a.metrics)
	}
	if err != nil {
		a.close()
		return nil, err
	}
	return a, nil
}

// main parses the flags and serves until SIGINT or SIGTERM.
func main() {
	cfg, err := parseFlags(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "inventory:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop) // a second signal kills at once
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "inventory:", err)
		os.Exit(1)
	}
}

// run serves cfg until ctx ends, then shuts down gracefully. It writes what
// it listens on, and how to try it, to out.
func run(ctx context.Context, cfg config, out io.Writer) error {
	a, err := buildApp(cfg)
	if err != nil {
		return err
	}
	defer a.close()

	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	srv := &http.Server{Handler: a.handler, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	base := "http://" + ln.Addr().String()
	var lock string
	switch {
	case cfg.noLock:
		lock = "NO LOCK (-nolock): concurrent deductions oversell"
	case cfg.routesFile != "":
		lock = fmt.Sprintf("lock store %s, locks from %s", a.lockDesc, cfg.routesFile)
	default:
		lock = fmt.Sprintf("lock store %s, wait %v, ttl %v", a.lockDesc, cfg.wait, cfg.ttl)
	}
	fmt.Fprintf(out, "inventory: listening on %s\n", base)
	fmt.Fprintf(out, "inventory: framework %s; %s; stock %s (default %d per SKU, work %v)\n",
		cfg.framework, lock, a.stockDesc, cfg.defaultStock, cfg.work)
	if a.routes != nil {
		for _, rs := range a.routes.Routes() {
			fmt.Fprintf(out, "inventory: lock %s %s: %s\n", rs.Method, rs.Path, rs.Spec)
		}
	}
	if a.ping != nil {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := a.ping(pctx); err != nil {
			fmt.Fprintf(out, "inventory: warning: Redis does not answer (%v); requests answer 503 until it does\n", err)
		}
		cancel()
	}
	fmt.Fprintf(out, "try:\n  curl -s -X POST -d '{\"qty\":1}' %s/skus/apple/deduct\n", base)
	fmt.Fprintf(out, "  curl -s -X POST -d '{\"items\":[{\"sku\":\"pear\",\"qty\":2},{\"sku\":\"plum\",\"qty\":1}]}' %s/carts/checkout\n", base)
	fmt.Fprintf(out, "  curl -s %s/metrics\n", base)
	fmt.Fprintf(out, "  curl -s %s/skus/apple\n", base)

	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	fmt.Fprintln(out, "inventory: shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	lctx, lcancel := context.WithTimeout(context.Background(), closeLockerTimeout)
	defer lcancel()
	if err := a.shutdown(lctx); err != nil {
		fmt.Fprintf(out, "inventory: warning: %v\n", err)
	}
	fmt.Fprintln(out, "inventory: stopped")
	return nil
}
