package main

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/echolock"
	"github.com/reqlock/reqlock/middleware"
)

// echoRoutes routes the shop with echo. With a nil locker (-nolock) the
// routes run unlocked. Lock rejections come back as *echo.HTTPError and
// echo's error handler renders them as JSON.
func echoRoutes(s *shop, locker *reqlock.Locker, opts []middleware.Option) (http.Handler, error) {
	lockSKU, lockOrder := echo.MiddlewareFunc(passEcho), echo.MiddlewareFunc(passEcho)
	if locker != nil {
		var err error
		if lockSKU, err = echolock.New(locker, "sku:<id>", opts...); err != nil {
			return nil, err
		}
		if lockOrder, err = echolock.New(locker, "sku:<json:sku>", opts...); err != nil {
			return nil, err
		}
	}

	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.GET("/skus/:id", func(c echo.Context) error {
		return echoReply(c, s.getReply(c.Request().Context(), c.Param("id")))
	})
	e.PUT("/skus/:id", func(c echo.Context) error {
		return echoReply(c, s.setReply(c.Request().Context(), c.Param("id"), c.Request().Body, echoFence(c)))
	}, lockSKU)
	e.POST("/skus/:id/deduct", func(c echo.Context) error {
		return echoReply(c, s.deductReply(c.Request().Context(), c.Param("id"), c.Request().Body, echoFence(c)))
	}, lockSKU)
	e.POST("/orders", func(c echo.Context) error {
		return echoReply(c, s.orderReply(c.Request().Context(), c.Request().Body, echoFence(c)))
	}, lockOrder)
	return e, nil
}

// passEcho is the lock middleware's stand-in with -nolock.
func passEcho(next echo.HandlerFunc) echo.HandlerFunc { return next }

// echoFence returns the fence of the lock the middleware holds, or 0 when
// the route runs unlocked.
func echoFence(c echo.Context) int64 {
	if lock, ok := echolock.Lock(c); ok {
		return lock.Fence()
	}
	return 0
}

// echoReply writes rep as JSON.
func echoReply(c echo.Context, rep reply) error {
	if v := rep.retryAfter(); v != "" {
		c.Response().Header().Set("Retry-After", v)
	}
	return c.JSON(rep.status, rep.body)
}
