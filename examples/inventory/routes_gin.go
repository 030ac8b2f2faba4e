package main

import (
	"encoding/json"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/reqlock/reqlock/ginlock"
	"github.com/reqlock/reqlock/middleware"
)

// init puts gin in release mode: no debug banner or route log.
func init() { gin.SetMode(gin.ReleaseMode) }

// ginRoutes routes the shop with gin. rt, the lock configuration, is
// installed once in front of every route (ginlock.Install) and then checked
// against the registered routes; with a nil rt (-nolock) the routes run
// unlocked. GET /metrics serves metricsHandler, unlocked.
//
// gin is set to answer as net/http's ServeMux and echo do (see newGinEngine),
// and serves HEAD beside each GET, as the ServeMux does.
func ginRoutes(s *shop, rt *middleware.Routes, metricsHandler http.Handler) (http.Handler, error) {
	r := newGinEngine()
	if rt != nil {
		if err := ginlock.Install(r, rt); err != nil { // before any route
			return nil, err
		}
	}
	setKeys, deductKeys := skuKeysOf(rt, routeSet), skuKeysOf(rt, routeDeduct)
	orderKeys, checkoutKeys := skuKeysOf(rt, routeOrders), skuKeysOf(rt, routeCheckout)
	r.Match(getHead, "/skus/:id", func(c *gin.Context) {
		ginReply(c, s.getReply(c.Request.Context(), c.Param("id")))
	})
	r.PUT("/skus/:id", func(c *gin.Context) {
		ginReply(c, s.setReply(c.Request.Context(), c.Param("id"), c.Request.Body, ginHolder(c, setKeys)))
	})
	r.POST("/skus/:id/deduct", func(c *gin.Context) {
		ginReply(c, s.deductReply(c.Request.Context(), c.Param("id"), c.Request.Body, ginHolder(c, deductKeys)))
	})
	r.POST("/orders", func(c *gin.Context) {
		ginReply(c, s.orderReply(c.Request.Context(), c.Request.Body, ginHolder(c, orderKeys)))
	})
	r.POST("/carts/checkout", func(c *gin.Context) {
		ginReply(c, s.checkoutReply(c.Request.Context(), c.Request.Body, ginHolder(c, checkoutKeys)))
	})
	r.Match(getHead, "/reports/:id", func(c *gin.Context) {
		ginReply(c, s.readReply(c.Request.Context(), c.Param("id"), ginHolder(c, nil)))
	})
	r.POST("/reports/:id/rebuild", func(c *gin.Context) {
		ginReply(c, s.rebuildReply(c.Request.Context(), c.Param("id"), ginHolder(c, nil)))
	})
	r.POST("/exports", func(c *gin.Context) {
		ginReply(c, s.exportReply(c.Request.Context(), c.GetHeader("X-Tenant"), ginHolder(c, nil)))
	})
	r.Match(getHead, "/metrics", gin.WrapH(metricsHandler))
	if rt != nil {
		if err := ginlock.Verify(r, rt); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// newGinEngine returns a gin engine with Recovery that answers as the
// ServeMux and echo do where gin's defaults differ:
//   - a wrong method is 405 with an Allow header naming the path's methods
//     (HandleMethodNotAllowed; gin answers 404 by default);
//   - a path parameter is matched on the escaped path and then unescaped
//     (UseEscapedPath, UnescapePathValues), so /skus/a%2Fb is the SKU "a/b",
//     and the lock key sku:<id> is the one the other routers and a JSON
//     "a/b" give. By default gin matches the unescaped path /skus/a/b, one
//     segment too many: 404;
//   - a path with a trailing slash the route lacks is 404, not a redirect
//     (RedirectTrailingSlash), which would also redirect /skus/a%2Fb/ to the
//     unescaped /skus/a/b.
func newGinEngine() *gin.Engine {
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.UseEscapedPath, r.UnescapePathValues = true, true
	r.RedirectTrailingSlash = false
	r.Use(gin.Recovery())
	return r
}

// ginHolder returns the lock the middleware holds for c's request, if any,
// with the route's SKU keys.
func ginHolder(c *gin.Context, keys *skuKeys) holder {
	lock, _ := ginlock.Lock(c)
	idem, _ := middleware.IdempotencyOf(c.Request)
	return holder{lock: lock, keys: keys, idem: idem, render: renderGin}
}

// renderGin renders rep as gin's c.JSON does.
func renderGin(rep reply) rendered {
	b, _ := json.Marshal(rep.body) // a reply body always marshals
	return rendered{rep.status, "application/json; charset=utf-8", b}
}

// ginReply writes rep as JSON, the bytes and header fields of c.JSON (not
// c.Data's, which adds Content-Length: a handler that records its answer
// itself records these fields).
func ginReply(c *gin.Context, rep reply) {
	out := renderGin(rep)
	if v := rep.retryAfter(); v != "" {
		c.Header("Retry-After", v)
	}
	c.Header("Content-Type", out.contentType)
	c.Status(out.status)
	_, _ = c.Writer.Write(out.body)
}
