// Package plainshop is the service of httpbench's library scenario: one
// plain handler behind one of three locks, so that two services differ in
// their lock alone.
//
// POST /skus/{id}/deduct decodes {"qty":Q}, GETs the stock of the SKU (the
// string key plain:stock:<id>; a SKU never set has the default stock),
// answers 409 when it is below Q, else SETs the stock less Q and answers 200
// {"sku":"…","stock":remaining}: two plain commands, no script, no fence,
// on the go-redis client of NewClient. GET /skus/{id} reads the stock,
// unlocked. The handlers are the same code whatever the lock.
//
// The lock goes in front of the deduction as gin middleware on the key
// sku:<id>, with the wait, TTL and release timeout of the Config:
//
//   - Redislock: bsm/redislock written by hand, with redislockshop's own
//     Obtain, Refusal and Release (ExponentialBackoff(RetryMin, RetryMax)
//     until the wait, release after the handler, 423 with Retry-After when
//     not obtained, 503 when Redis fails), on the handlers' own client.
//   - Ginlock: reqlock's ginlock on a Store (redisstore on the handlers'
//     go-redis client, or rueidisstore on a rueidis client of its own),
//     configured by the spec "@lock key=sku:<id> wait=… ttl=… on-timeout=423
//     on-store-error=503", a Locker with its defaults and the release
//     timeout.
package plainshop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/bsm/redislock"
	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/bench/internal/redislockshop"
	"github.com/reqlock/reqlock/ginlock"
	"github.com/reqlock/reqlock/stores"
)

// init puts gin in release mode: no debug banner or route log.
func init() { gin.SetMode(gin.ReleaseMode) }

// StockPrefix is put in front of a SKU to name its stock key.
const StockPrefix = "plain:stock:"

// LockPrefix is put in front of a SKU to name its lock key.
const LockPrefix = "sku:"

// Config is redislockshop's: the wait, TTL, default stock, redislock's
// backoff, and the stock and release timeouts, with the example's defaults
// (redislockshop.DefaultConfig).
type Config = redislockshop.Config

// New returns the service's routes on a gin engine: lock in front of the
// deduction, whose stock lives in client.
func New(client *redis.Client, lock gin.HandlerFunc, cfg Config) (http.Handler, error) {
	switch {
	case lock == nil:
		return nil, errors.New("plainshop: no lock middleware")
	case cfg.StockTimeout <= 0:
		return nil, errors.New("plainshop: stock timeout must be positive")
	case cfg.DefaultStock < 0:
		return nil, fmt.Errorf("plainshop: default stock %d is negative", cfg.DefaultStock)
	}
	s := &shop{client: client, cfg: cfg}
	r := gin.New()
	r.Use(gin.Recovery())
	r.GET("/skus/:id", s.get)
	r.POST("/skus/:id/deduct", lock, s.deduct)
	return r, nil
}

// Redislock returns bsm/redislock's lock on sku:<id> as gin middleware over
// client.
func Redislock(client *redis.Client, cfg Config) (gin.HandlerFunc, error) {
	if err := redislockshop.CheckLock(cfg); err != nil {
		return nil, fmt.Errorf("plainshop: %w", err)
	}
	if cfg.ReleaseTimeout <= 0 {
		return nil, errors.New("plainshop: release timeout must be positive")
	}
	locks := redislock.New(client)
	return func(c *gin.Context) {
		ctx := c.Request.Context()
		lock, err := redislockshop.Obtain(ctx, locks, LockPrefix+c.Param("id"), cfg)
		if err != nil {
			switch redislockshop.Refusal(ctx, err) {
			case redislockshop.StatusClientClosed:
				c.AbortWithStatus(redislockshop.StatusClientClosed)
			case http.StatusLocked:
				c.Header("Retry-After", "1")
				c.AbortWithStatusJSON(http.StatusLocked, errorBody{Error: "the SKU is locked by another request; retry later"})
			default:
				c.Header("Retry-After", "1")
				c.AbortWithStatusJSON(http.StatusServiceUnavailable, errorBody{Error: "the lock store is unavailable"})
			}
			return
		}
		defer redislockshop.Release(ctx, lock, cfg)
		c.Next()
	}, nil
}

// Ginlock returns reqlock's ginlock on sku:<id> over store as gin
// middleware, and the Locker, which the caller closes.
func Ginlock(store stores.Store, cfg Config) (gin.HandlerFunc, *reqlock.Locker, error) {
	locker, err := reqlock.New(store, reqlock.WithReleaseTimeout(cfg.ReleaseTimeout))
	if err != nil {
		return nil, nil, err
	}
	h, err := ginlock.FromSpec(locker, fmt.Sprintf("@lock key=%s<id> wait=%v ttl=%v on-timeout=423 on-store-error=503",
		LockPrefix, cfg.Wait, cfg.TTL))
	if err != nil {
		return nil, nil, err
	}
	return h, locker, nil
}

// shop holds what the handlers share.
type shop struct {
	client *redis.Client
	cfg    Config
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

// maxBodyBytes bounds a request body.
const maxBodyBytes = 64 << 10

// get answers GET /skus/{id}.
func (s *shop) get(c *gin.Context) {
	sku := c.Param("id")
	ctx, cancel := context.WithTimeout(c.Request.Context(), s.cfg.StockTimeout)
	defer cancel()
	stock, err := s.read(ctx, sku)
	if err != nil {
		unavailable(c)
		return
	}
	c.JSON(http.StatusOK, stockBody{SKU: sku, Stock: stock})
}

// deduct answers POST /skus/{id}/deduct, under the lock.
func (s *shop) deduct(c *gin.Context) {
	sku := c.Param("id")
	var req struct {
		Qty *int64 `json:"qty"`
	}
	if err := json.NewDecoder(io.LimitReader(c.Request.Body, maxBodyBytes)).Decode(&req); err != nil {
		c.JSON(http.StatusBadRequest, errorBody{Error: "request body is not valid JSON: " + err.Error()})
		return
	}
	if req.Qty == nil || *req.Qty < 1 {
		c.JSON(http.StatusBadRequest, errorBody{Error: `"qty" must be a number of at least 1`})
		return
	}
	ctx, cancel := context.WithTimeout(c.Request.Context(), s.cfg.StockTimeout)
	defer cancel()
	stock, err := s.read(ctx, sku)
	if err != nil {
		unavailable(c)
		return
	}
	if stock < *req.Qty {
		c.JSON(http.StatusConflict, errorBody{Error: "insufficient stock", SKU: sku, Stock: &stock})
		return
	}
	if err := s.client.Set(ctx, StockPrefix+sku, stock-*req.Qty, 0).Err(); err != nil {
		unavailable(c)
		return
	}
	c.JSON(http.StatusOK, stockBody{SKU: sku, Stock: stock - *req.Qty})
}

// read returns the stock of sku: the default for a SKU never set.
func (s *shop) read(ctx context.Context, sku string) (int64, error) {
	v, err := s.client.Get(ctx, StockPrefix+sku).Result()
	if errors.Is(err, redis.Nil) {
		return s.cfg.DefaultStock, nil
	}
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(v, 10, 64)
}

// unavailable answers 503 with Retry-After.
func unavailable(c *gin.Context) {
	c.Header("Retry-After", "1")
	c.JSON(http.StatusServiceUnavailable, errorBody{Error: "the stock store is unavailable"})
}
