package main

import (
	"encoding/json"
	"net/http"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/middleware"
)

// netHTTPRoutes routes the shop with net/http's ServeMux (Go 1.22
// patterns). rt, the lock configuration, wraps the whole ServeMux once
// (Routes.Handler), which checks it against the registered patterns; with a
// nil rt (-nolock) the routes run unlocked. GET /metrics serves
// metricsHandler, unlocked.
func netHTTPRoutes(s *shop, rt *middleware.Routes, metricsHandler http.Handler) (http.Handler, error) {
	setKeys, deductKeys := skuKeysOf(rt, routeSet), skuKeysOf(rt, routeDeduct)
	orderKeys, checkoutKeys := skuKeysOf(rt, routeOrders), skuKeysOf(rt, routeCheckout)
	mux := http.NewServeMux()
	mux.HandleFunc(routeGet, func(w http.ResponseWriter, r *http.Request) {
		writeReply(w, s.getReply(r.Context(), r.PathValue("id")))
	})
	mux.HandleFunc(routeSet, func(w http.ResponseWriter, r *http.Request) {
		writeReply(w, s.setReply(r.Context(), r.PathValue("id"), r.Body, httpHolder(r, setKeys)))
	})
	mux.HandleFunc(routeDeduct, func(w http.ResponseWriter, r *http.Request) {
		writeReply(w, s.deductReply(r.Context(), r.PathValue("id"), r.Body, httpHolder(r, deductKeys)))
	})
	mux.HandleFunc(routeOrders, func(w http.ResponseWriter, r *http.Request) {
		writeReply(w, s.orderReply(r.Context(), r.Body, httpHolder(r, orderKeys)))
	})
	mux.HandleFunc(routeCheckout, func(w http.ResponseWriter, r *http.Request) {
		writeReply(w, s.checkoutReply(r.Context(), r.Body, httpHolder(r, checkoutKeys)))
	})
	mux.HandleFunc(routeReport, func(w http.ResponseWriter, r *http.Request) {
		writeReply(w, s.readReply(r.Context(), r.PathValue("id"), httpHolder(r, nil)))
	})
	mux.HandleFunc(routeRebuild, func(w http.ResponseWriter, r *http.Request) {
		writeReply(w, s.rebuildReply(r.Context(), r.PathValue("id"), httpHolder(r, nil)))
	})
	mux.HandleFunc(routeExports, func(w http.ResponseWriter, r *http.Request) {
		writeReply(w, s.exportReply(r.Context(), r.Header.Get("X-Tenant"), httpHolder(r, nil)))
	})
	mux.Handle(routeMetrics, metricsHandler)
	if rt == nil {
		return mux, nil
	}
	return rt.Handler(mux)
}

// httpHolder returns the lock the middleware holds for r, if any, with the
// route's SKU keys.
func httpHolder(r *http.Request, keys *skuKeys) holder {
	lock, _ := reqlock.FromContext(r.Context())
	idem, _ := middleware.IdempotencyOf(r)
	return holder{lock: lock, keys: keys, idem: idem, render: renderNetHTTP}
}

// renderNetHTTP renders rep as writeReply writes it: JSON, as a
// json.Encoder writes it (with a newline).
func renderNetHTTP(rep reply) rendered {
	b, _ := json.Marshal(rep.body) // a reply body always marshals
	return rendered{rep.status, "application/json", append(b, '\n')}
}

// writeReply writes rep as JSON.
func writeReply(w http.ResponseWriter, rep reply) {
	out := renderNetHTTP(rep)
	if v := rep.retryAfter(); v != "" {
		w.Header().Set("Retry-After", v)
	}
	w.Header().Set("Content-Type", out.contentType)
	w.WriteHeader(out.status)
	_, _ = w.Write(out.body)
}
