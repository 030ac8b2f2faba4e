package main

import (
	"encoding/json"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/reqlock/reqlock/echolock"
	"github.com/reqlock/reqlock/middleware"
)

// echoRoutes routes the shop with echo. rt, the lock configuration, is
// installed once for every route (echolock.Install) and then checked against
// the registered routes; with a nil rt (-nolock) the routes run unlocked.
// Lock rejections are written as problem details, the same bytes as on
// net/http and gin, with echo's default error handler (a custom one would
// get them as *echo.HTTPError). GET /metrics serves metricsHandler, unlocked. Like
// net/http's ServeMux, it serves HEAD beside each GET; echo answers a wrong
// method 405 with an Allow header itself, and an OPTIONS request 204 with
// one.
func echoRoutes(s *shop, rt *middleware.Routes, metricsHandler http.Handler) (http.Handler, error) {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	if rt != nil {
		if err := echolock.Install(e, rt); err != nil {
			return nil, err
		}
	}
	setKeys, deductKeys := skuKeysOf(rt, routeSet), skuKeysOf(rt, routeDeduct)
	orderKeys, checkoutKeys := skuKeysOf(rt, routeOrders), skuKeysOf(rt, routeCheckout)
	e.Match(getHead, "/skus/:id", func(c echo.Context) error {
		return echoReply(c, s.getReply(c.Request().Context(), echoSKU(c)))
	})
	e.PUT("/skus/:id", func(c echo.Context) error {
		return echoReply(c, s.setReply(c.Request().Context(), echoSKU(c), c.Request().Body, echoHolder(c, setKeys)))
	})
	e.POST("/skus/:id/deduct", func(c echo.Context) error {
		return echoReply(c, s.deductReply(c.Request().Context(), echoSKU(c), c.Request().Body, echoHolder(c, deductKeys)))
	})
	e.POST("/orders", func(c echo.Context) error {
		return echoReply(c, s.orderReply(c.Request().Context(), c.Request().Body, echoHolder(c, orderKeys)))
	})
	e.POST("/carts/checkout", func(c echo.Context) error {
		return echoReply(c, s.checkoutReply(c.Request().Context(), c.Request().Body, echoHolder(c, checkoutKeys)))
	})
	e.Match(getHead, "/reports/:id", func(c echo.Context) error {
		return echoReply(c, s.readReply(c.Request().Context(), echolock.Param(c, "id"), echoHolder(c, nil)))
	})
	e.POST("/reports/:id/rebuild", func(c echo.Context) error {
		return echoReply(c, s.rebuildReply(c.Request().Context(), echolock.Param(c, "id"), echoHolder(c, nil)))
	})
	e.POST("/exports", func(c echo.Context) error {
		return echoReply(c, s.exportReply(c.Request().Context(), c.Request().Header.Get("X-Tenant"), echoHolder(c, nil)))
	})
	e.Match(getHead, "/metrics", echo.WrapHandler(metricsHandler))
	if rt != nil {
		if err := echolock.CheckRoutes(rt, e.Routes()); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// echoSKU returns the path parameter id as the lock key has it (see
// echolock.Param): unescaped, as net/http and gin give it.
func echoSKU(c echo.Context) string { return echolock.Param(c, "id") }

// echoHolder returns the lock the middleware holds for c's request, if any,
// with the route's SKU keys.
func echoHolder(c echo.Context, keys *skuKeys) holder {
	lock, _ := echolock.Lock(c)
	idem, _ := middleware.IdempotencyOf(c.Request())
	return holder{lock: lock, keys: keys, idem: idem, render: renderEcho}
}

// renderEcho renders rep as echo's c.JSON does (a json.Encoder, with a
// newline).
func renderEcho(rep reply) rendered {
	b, _ := json.Marshal(rep.body) // a reply body always marshals
	return rendered{rep.status, echo.MIMEApplicationJSON, append(b, '\n')}
}

// echoReply writes rep as JSON, the bytes of c.JSON.
func echoReply(c echo.Context, rep reply) error {
	out := renderEcho(rep)
	if v := rep.retryAfter(); v != "" {
		c.Response().Header().Set("Retry-After", v)
	}
	return c.Blob(out.status, out.contentType, out.body)
}
