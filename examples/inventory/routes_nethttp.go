package main

import (
	"encoding/json"
	"net/http"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/middleware"
)

// netHTTPRoutes routes the shop with net/http's ServeMux (Go 1.22
// patterns). With a nil locker (-nolock) the routes run unlocked.
func netHTTPRoutes(s *shop, locker *reqlock.Locker, opts []middleware.Option) (http.Handler, error) {
	lockSKU, lockOrder := passHTTP, passHTTP
	if locker != nil {
		sku, err := middleware.New(locker, "sku:<id>", opts...)
		if err != nil {
			return nil, err
		}
		order, err := middleware.New(locker, "sku:<json:sku>", opts...)
		if err != nil {
			return nil, err
		}
		lockSKU, lockOrder = sku.Handler, order.Handler
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /skus/{id}", func(w http.ResponseWriter, r *http.Request) {
		writeReply(w, s.getReply(r.Context(), r.PathValue("id")))
	})
	mux.Handle("PUT /skus/{id}", lockSKU(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeReply(w, s.setReply(r.Context(), r.PathValue("id"), r.Body, httpFence(r)))
	})))
	mux.Handle("POST /skus/{id}/deduct", lockSKU(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeReply(w, s.deductReply(r.Context(), r.PathValue("id"), r.Body, httpFence(r)))
	})))
	mux.Handle("POST /orders", lockOrder(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeReply(w, s.orderReply(r.Context(), r.Body, httpFence(r)))
	})))
	return mux, nil
}

// passHTTP is the lock middleware's stand-in with -nolock.
func passHTTP(next http.Handler) http.Handler { return next }

// httpFence returns the fence of the lock the middleware holds, or 0 when
// the route runs unlocked.
func httpFence(r *http.Request) int64 {
	if lock, ok := reqlock.FromContext(r.Context()); ok {
		return lock.Fence()
	}
	return 0
}

// writeReply writes rep as JSON.
func writeReply(w http.ResponseWriter, rep reply) {
	if v := rep.retryAfter(); v != "" {
		w.Header().Set("Retry-After", v)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(rep.status)
	_ = json.NewEncoder(w).Encode(rep.body) // a reply body always marshals
}
