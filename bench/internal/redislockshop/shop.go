// Package redislockshop is the baseline of httpbench: the hot path of
// examples/inventory, POST /skus/{id}/deduct, written by hand the way a
// github.com/bsm/redislock user would write it, on gin, against the same
// Redis data.
//
// A deduction decodes its body {"qty":Q}, obtains the lock sku:<id> with
// redislock.Obtain (a retry strategy of ExponentialBackoff(16ms, 512ms), the
// wait as the context deadline: the same wait as the example's, -wait 2s by
// default), reads the stock, deducts, writes it back, and releases the lock
// when the handler returns. It answers as the example does: 200
// {"sku":"…","stock":remaining}, 409 insufficient stock with the current
// stock, 423 with Retry-After when the wait runs out (redislock's
// ErrNotObtained, or the wait's deadline), 400 for a bad body or quantity,
// and 503 with Retry-After when Redis fails. GET /skus/{id} reads the stock,
// unlocked.
//
// The stock lives where the example keeps it, the hash inventory:sku:<id>
// (field stock; a SKU never set has the default stock), and is read and
// written with the example's own two scripts (ReadScript, WriteScript, the
// same source text; a test compares it), called with fence 0: their
// unfenced branches, HMGET on the read and HSET of the stock on the write.
//
// What it leaves out: fencing. redislock hands out no fencing token, and its
// users typically do not fence, so a holder whose lease lapsed (a GC pause,
// a slow network) can still write over a newer holder's update. The example
// fences every write: its lock grant carries a fencing token per key, which
// reqlock's acquire script issues inside the same EVALSHA that takes the
// lock, and its read and write scripts check and record it (an HSET of the
// fence on the read, an HGET on the write, inside the same EVALSHAs).
// Fencing therefore costs the reqlock side no round trip: both services
// make four per deduction, all script calls (lock, read, write, release).
// It costs commands inside Redis instead: this package's deduction runs 9
// (EVALSHA x4, SET, HMGET, HSET, GET, DEL), and httpbench reports how many
// the example's runs, per command. The example also keeps lock metrics and
// checks that the lock covers the SKU it writes; this package does not.
//
// The Redis client has the example's options (NewClient): the contexts of
// the calls bound them (ContextTimeoutEnabled), 1s read, write and dial
// timeouts, one dial per try, the default pool.
package redislockshop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/bsm/redislock"
	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"
)

// init puts gin in release mode, as the example does: no debug banner or
// route log.
func init() { gin.SetMode(gin.ReleaseMode) }

// StockPrefix is put in front of a SKU to name its stock hash, as in the
// example.
const StockPrefix = "inventory:sku:"

// LockPrefix is put in front of a SKU to name its lock key: the example's
// key template sku:<id>.
const LockPrefix = "sku:"

// ReadScript is the example's fenced read (examples/inventory, shop.go,
// redisReadScript), called here with fence 0. It and WriteScript are copies
// on purpose: the example is a main package, which no other package can
// import, and the two services must run the same stock scripts so that
// httpbench compares their locks, not their stock code.
// TestScriptsAreTheExamples fails when a copy drifts from the example's.
var ReadScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 'stock', 'fence')
local fence = tonumber(ARGV[1])
local stored = tonumber(v[2]) or 0
if fence > 0 then
  if fence < stored then
    return {0, 0, 0, stored}
  end
  if fence > stored then
    redis.call('HSET', KEYS[1], 'fence', ARGV[1])
  end
end
if v[1] == false then
  return {1, 0, 0, stored}
end
return {1, 1, tonumber(v[1]), stored}
`)

// WriteScript is the example's fenced write (redisWriteScript), called here
// with fence 0.
var WriteScript = redis.NewScript(`
local fence = tonumber(ARGV[2])
if fence > 0 then
  local stored = tonumber(redis.call('HGET', KEYS[1], 'fence')) or 0
  if fence < stored then
    return {0, stored}
  end
  redis.call('HSET', KEYS[1], 'stock', ARGV[1], 'fence', ARGV[2])
  return {1, fence}
end
redis.call('HSET', KEYS[1], 'stock', ARGV[1])
return {1, 0}
`)

// Config is the service's configuration, with the example's defaults.
type Config struct {
	// Wait is how long a deduction waits for a held lock; 0 tries once.
	Wait time.Duration
	// TTL is the lease of each lock.
	TTL time.Duration
	// DefaultStock is the stock of a SKU never set.
	DefaultStock int64
	// RetryMin and RetryMax bound redislock.ExponentialBackoff, the retry
	// strategy of a deduction that waits: the minimum redislock's
	// documentation recommends, 16ms, and a cap that keeps a waiter trying
	// about twice a second (as lockbench configures redislock).
	RetryMin, RetryMax time.Duration
	// StockTimeout bounds a deduction's two stock calls together, and
	// ReleaseTimeout its release: the example's 600ms and 400ms.
	StockTimeout, ReleaseTimeout time.Duration
}

// DefaultConfig returns the example's defaults: wait 2s, TTL 10s, stock 100.
func DefaultConfig() Config {
	return Config{
		Wait:           2 * time.Second,
		TTL:            10 * time.Second,
		DefaultStock:   100,
		RetryMin:       16 * time.Millisecond,
		RetryMax:       512 * time.Millisecond,
		StockTimeout:   600 * time.Millisecond,
		ReleaseTimeout: 400 * time.Millisecond,
	}
}

// NewClient returns a Redis client for url (redis://host:port/db) with the
// options the example gives its own.
func NewClient(url string) (*redis.Client, error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("invalid Redis URL: %w", err)
	}
	opts.ContextTimeoutEnabled = true
	for _, d := range []*time.Duration{&opts.ReadTimeout, &opts.WriteTimeout, &opts.DialTimeout} {
		if *d == 0 {
			*d = time.Second
		}
	}
	opts.DialerRetries = 1
	return redis.NewClient(opts), nil
}

// service holds what the handlers share.
type service struct {
	client *redis.Client
	locks  *redislock.Client
	cfg    Config
}

// New returns the service's routes on a gin engine over client.
func New(client *redis.Client, cfg Config) (http.Handler, error) {
	if err := CheckLock(cfg); err != nil {
		return nil, fmt.Errorf("redislockshop: %w", err)
	}
	switch {
	case cfg.StockTimeout <= 0 || cfg.ReleaseTimeout <= 0:
		return nil, errors.New("redislockshop: stock and release timeouts must be positive")
	case cfg.DefaultStock < 0:
		return nil, fmt.Errorf("redislockshop: default stock %d is negative", cfg.DefaultStock)
	}
	s := &service{client: client, locks: redislock.New(client), cfg: cfg}
	r := gin.New()
	// As the example: a path parameter is the escaped segment unescaped.
	r.UseEscapedPath, r.UnescapePathValues = true, true
	r.Use(gin.Recovery())
	r.GET("/skus/:id", s.get)
	r.POST("/skus/:id/deduct", s.deduct)
	return r, nil
}

// errorBody is the body of a failed request.
type errorBody struct {
	Error string `json:"error"`
	SKU   string `json:"sku,omitempty"`
	Stock *int64 `json:"stock,omitempty"`
}

// stockBody is the body of a successful request.
type stockBody struct {
	SKU   string `json:"sku"`
	Stock int64  `json:"stock"`
}

// maxBodyBytes bounds a request body, as in the example.
const maxBodyBytes = 64 << 10

// get answers GET /skus/{id}.
func (s *service) get(c *gin.Context) {
	sku := c.Param("id")
	ctx, cancel := context.WithTimeout(c.Request.Context(), s.cfg.StockTimeout)
	defer cancel()
	stock, err := s.read(ctx, sku)
	if err != nil {
		unavailable(c, sku)
		return
	}
	c.JSON(http.StatusOK, stockBody{SKU: sku, Stock: stock})
}

// deduct answers POST /skus/{id}/deduct.
func (s *service) deduct(c *gin.Context) {
	sku := c.Param("id")
	var req struct {
		Qty *int64 `json:"qty"`
	}
	if err := json.NewDecoder(io.LimitReader(c.Request.Body, maxBodyBytes)).Decode(&req); err != nil {
		c.JSON(http.StatusBadRequest, errorBody{Error: "request body is not valid JSON: " + err.Error()})
		return
	}
	switch {
	case req.Qty == nil:
		c.JSON(http.StatusBadRequest, errorBody{Error: `"qty" is missing`})
		return
	case *req.Qty < 1:
		c.JSON(http.StatusBadRequest, errorBody{Error: `"qty" must be at least 1`})
		return
	}
	qty := *req.Qty

	ctx := c.Request.Context()
	lock, err := Obtain(ctx, s.locks, LockPrefix+sku, s.cfg)
	if err != nil {
		switch Refusal(ctx, err) {
		case StatusClientClosed:
			c.AbortWithStatus(StatusClientClosed)
		case http.StatusLocked:
			c.Header("Retry-After", "1")
			c.JSON(http.StatusLocked, errorBody{Error: "the SKU is locked by another request; retry later", SKU: sku})
		default:
			unavailable(c, sku)
		}
		return
	}
	defer Release(ctx, lock, s.cfg)

	sctx, cancel := context.WithTimeout(ctx, s.cfg.StockTimeout)
	defer cancel()
	stock, err := s.read(sctx, sku)
	if err != nil {
		unavailable(c, sku)
		return
	}
	if stock < qty {
		c.JSON(http.StatusConflict, errorBody{Error: "insufficient stock", SKU: sku, Stock: &stock})
		return
	}
	if err := WriteScript.Run(sctx, s.client, []string{StockPrefix + sku}, stock-qty, 0).Err(); err != nil {
		unavailable(c, sku)
		return
	}
	c.JSON(http.StatusOK, stockBody{SKU: sku, Stock: stock - qty})
}

// CheckLock checks the fields of cfg that the lock uses, as New does: the
// wait, the TTL and, for a wait, the backoff. Its errors have no package
// prefix; the caller adds its own.
func CheckLock(cfg Config) error {
	switch {
	case cfg.Wait < 0:
		return fmt.Errorf("wait %v is negative", cfg.Wait)
	case cfg.TTL < time.Millisecond:
		return fmt.Errorf("ttl %v is below 1ms", cfg.TTL)
	case cfg.Wait > 0 && (cfg.RetryMin <= 0 || cfg.RetryMax < cfg.RetryMin):
		return fmt.Errorf("retry backoff %v..%v is not a range", cfg.RetryMin, cfg.RetryMax)
	}
	return nil
}

// Obtain takes the lock on key with locks as a deduction does: one try when
// cfg.Wait is 0, else redislock.ExponentialBackoff(cfg.RetryMin,
// cfg.RetryMax) until the wait runs out, each lock with the lease cfg.TTL.
func Obtain(ctx context.Context, locks *redislock.Client, key string, cfg Config) (*redislock.Lock, error) {
	if cfg.Wait == 0 {
		return locks.Obtain(ctx, key, cfg.TTL, nil) // one try
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Wait)
	defer cancel()
	// A strategy counts its attempts: a new one for every Obtain.
	return locks.Obtain(ctx, key, cfg.TTL, &redislock.Options{
		RetryStrategy: redislock.ExponentialBackoff(cfg.RetryMin, cfg.RetryMax),
	})
}

// StatusClientClosed is the status of a request whose client went away
// (nginx's 499): no one reads the answer.
const StatusClientClosed = 499

// Refusal returns the status that answers a request on ctx whose Obtain
// failed with err: StatusClientClosed when ctx is done (the client went
// away), 423 Locked when the lock stayed held past the wait (redislock's
// ErrNotObtained, or the wait's deadline), else 503: Redis failed.
func Refusal(ctx context.Context, err error) int {
	switch {
	case ctx.Err() != nil:
		return StatusClientClosed
	case errors.Is(err, redislock.ErrNotObtained), errors.Is(err, context.DeadlineExceeded):
		return http.StatusLocked
	default:
		return http.StatusServiceUnavailable
	}
}

// Release releases lock within cfg.ReleaseTimeout, even when ctx, the
// request's, is done: a release that failed expires with the TTL.
func Release(ctx context.Context, lock *redislock.Lock, cfg Config) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ReleaseTimeout)
	defer cancel()
	_ = lock.Release(rctx)
}

// read returns the stock of sku: the default for a SKU never set.
func (s *service) read(ctx context.Context, sku string) (int64, error) {
	v, err := ReadScript.Run(ctx, s.client, []string{StockPrefix + sku}, 0).Int64Slice()
	if err != nil {
		return 0, err
	}
	if len(v) != 4 {
		return 0, fmt.Errorf("read %q: script answered %v", sku, v)
	}
	if v[1] == 0 {
		return s.cfg.DefaultStock, nil
	}
	return v[2], nil
}

// unavailable answers 503 with Retry-After.
func unavailable(c *gin.Context, sku string) {
	c.Header("Retry-After", "1")
	c.JSON(http.StatusServiceUnavailable, errorBody{Error: "stock store unavailable; retry later", SKU: sku})
}
