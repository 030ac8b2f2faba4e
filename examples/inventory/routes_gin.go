package main

import (
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/ginlock"
	"github.com/reqlock/reqlock/middleware"
)

// init puts gin in release mode: no debug banner or route log.
func init() { gin.SetMode(gin.ReleaseMode) }

// ginRoutes routes the shop with gin. With a nil locker (-nolock) the
// routes run unlocked.
func ginRoutes(s *shop, locker *reqlock.Locker, opts []middleware.Option) (http.Handler, error) {
	lockSKU, lockOrder := gin.HandlerFunc(passGin), gin.HandlerFunc(passGin)
	if locker != nil {
		var err error
		if lockSKU, err = ginlock.New(locker, "sku:<id>", opts...); err != nil {
			return nil, err
		}
		if lockOrder, err = ginlock.New(locker, "sku:<json:sku>", opts...); err != nil {
			return nil, err
		}
	}

	r := gin.New()
	r.Use(gin.Recovery())
	r.GET("/skus/:id", func(c *gin.Context) {
		ginReply(c, s.getReply(c.Request.Context(), c.Param("id")))
	})
	r.PUT("/skus/:id", lockSKU, func(c *gin.Context) {
		ginReply(c, s.setReply(c.Request.Context(), c.Param("id"), c.Request.Body, ginFence(c)))
	})
	r.POST("/skus/:id/deduct", lockSKU, func(c *gin.Context) {
		ginReply(c, s.deductReply(c.Request.Context(), c.Param("id"), c.Request.Body, ginFence(c)))
	})
	r.POST("/orders", lockOrder, func(c *gin.Context) {
		ginReply(c, s.orderReply(c.Request.Context(), c.Request.Body, ginFence(c)))
	})
	return r, nil
}

// passGin is the lock middleware's stand-in with -nolock.
func passGin(c *gin.Context) { c.Next() }

// ginFence returns the fence of the lock the middleware holds, or 0 when
// the route runs unlocked.
func ginFence(c *gin.Context) int64 {
	if lock, ok := ginlock.Lock(c); ok {
		return lock.Fence()
	}
	return 0
}

// ginReply writes rep as JSON.
func ginReply(c *gin.Context, rep reply) {
	if v := rep.retryAfter(); v != "" {
		c.Header("Retry-After", v)
	}
	c.JSON(rep.status, rep.body)
}
