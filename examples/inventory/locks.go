package main

// This file holds the service's lock configuration, a route table: built in
// code from lockTable with -wait and -ttl, or loaded from a file (-routes).
// Every router installs it once, as router-level middleware, and checks it
// against the routes it registered. It also holds how a handler finds, in
// its request's lock, the fence of each SKU it writes.

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/routetable"
)

// The routes of the service, as the route table names them.
const (
	routeGet      = "GET /skus/{id}"
	routeSet      = "PUT /skus/{id}"
	routeDeduct   = "POST /skus/{id}/deduct"
	routeOrders   = "POST /orders"
	routeCheckout = "POST /carts/checkout"
	routeReport   = "GET /reports/{id}"
	routeRebuild  = "POST /reports/{id}/rebuild"
	routeExports  = "POST /exports"
	routeMetrics  = "GET /metrics"
)

// getHead are the methods of the GET routes on gin and echo: HEAD is GET
// without the body, as net/http's ServeMux serves it with every GET route.
var getHead = []string{http.MethodGet, http.MethodHead}

// lockTable is the lock configuration in code: each locked route and its
// spec without wait and ttl, which -wait and -ttl add. The SKU routes' keys
// are in the sku: key space, so that all the routes that change a SKU
// exclude each other on it; the report routes share report:<id>, read
// shared and rebuilt exclusively; exports have a limit per tenant. The
// deduct and checkout routes take an optional Idempotency-Key (a request
// without one runs as before); on a store that keeps no idempotency records
// (ZooKeeper, filestore, Redlock) codeEntries leaves it out.
// routes.yaml holds the same table with the default -wait and -ttl; a test
// keeps the two equal. Every store of reqlock has shared locks
// (stores.SharedStore), which the report and export specs need.
var lockTable = []struct{ route, spec string }{
	{routeSet, "@lock key=sku:<id> on-timeout=423 on-store-error=503"},
	{routeDeduct, "@lock key=sku:<id> idempotency=optional on-timeout=423 on-store-error=503"},
	{routeOrders, "@lock key=sku:<json:sku> on-timeout=423 on-store-error=503"},
	{routeCheckout, "@lock key=sku:<json:items[*].sku> idempotency=optional on-timeout=423 on-store-error=503"},
	{routeReport, "@lock key=report:<id> mode=shared on-timeout=423 on-store-error=503"},
	{routeRebuild, "@lock key=report:<id> on-timeout=423 on-store-error=503"},
	{routeExports, "@lock key=tenant:<header:X-Tenant> limit=3 on-timeout=429 on-store-error=503"},
}

// codeSource labels the entries of lockTable in errors and Entry.Source.
const codeSource = "inventory's built-in lock table"

// codeEntries returns lockTable as route table entries, each with wait and
// ttl (wait 0: try once), and idempotency only when records says the
// Locker's store keeps idempotency records.
func codeEntries(wait, ttl time.Duration, records bool) ([]routetable.Entry, error) {
	w := "none"
	if wait > 0 {
		w = wait.String()
	}
	entries := make([]routetable.Entry, 0, len(lockTable))
	var errs []error
	for _, e := range lockTable {
		spec := e.spec
		if !records {
			spec = strings.Replace(spec, " idempotency=optional", "", 1)
		}
		entry, err := routetable.ParseEntry(e.route, fmt.Sprintf("%s wait=%s ttl=%s", spec, w, ttl), codeSource)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		entries = append(entries, entry)
	}
	return entries, errors.Join(errs...)
}

// lockRoutes builds the service's route table for cfg: from the file
// cfg.routesFile when set, else from lockTable with cfg.wait and cfg.ttl.
// Errors of a file name its path and line.
func lockRoutes(cfg config, locker *reqlock.Locker) (*middleware.Routes, error) {
	if cfg.routesFile != "" {
		return middleware.LoadRoutes(locker, cfg.routesFile)
	}
	entries, err := codeEntries(cfg.wait, cfg.ttl, locker.CheckRecords() == nil)
	if err != nil {
		return nil, err
	}
	return middleware.NewRoutes(locker, entries)
}

// errNotCovered means a request holds a lock that has no key for a SKU it
// is about to write: the route's key template does not lock that SKU (a
// table with another key space, say). The handler then writes nothing.
var errNotCovered = errors.New("the route's lock does not cover the SKU")

// skuKeys renders the lock key of a SKU on one route, "sku:" and the SKU
// escaped (or hashed when long, by the route's max-value-len), as every key
// template of the sku: key space renders it. A nil *skuKeys is a route that
// runs unlocked.
type skuKeys struct {
	tmpl *keyfunc.Template
}

// skuKeysOf returns the skuKeys of route ("METHOD /path") in rt: nil when rt
// is nil (-nolock) or has no entry for the route.
func skuKeysOf(rt *middleware.Routes, route string) *skuKeys {
	if rt == nil {
		return nil
	}
	method, path, _ := strings.Cut(route, " ")
	g := rt.Guard(method, path)
	if g == nil {
		return nil
	}
	return &skuKeys{keyfunc.MustParse("sku:<id>", keyfunc.WithMaxValueLen(g.Config().MaxValueLen))}
}

// key returns the lock key of sku.
func (k *skuKeys) key(sku string) (string, error) {
	return k.tmpl.Key(skuRequest(sku))
}

// skuRequest is a keyfunc.Request whose only value is the path parameter
// id, the SKU.
type skuRequest string

func (skuRequest) HTTPRequest() *http.Request      { return nil }
func (s skuRequest) PathValue(string) string       { return string(s) }
func (skuRequest) ContextValue(string) (any, bool) { return nil, false }

// holder is what a handler knows of its request's lock: the lock the
// middleware holds, nil when the request runs unlocked (-nolock, a route
// without an entry, a fail-open route whose store failed), and how the
// route's keys name SKUs.
type holder struct {
	lock *reqlock.Lock
	keys *skuKeys

	// idem is the request's idempotency claim, nil without a key (or on a
	// route without idempotency); render renders a reply as the router
	// writes it, for a handler that records its answer itself.
	idem   *middleware.IdempotentRequest
	render func(reply) rendered
}

// fence returns the fence for writes to sku: the fence of sku's key in the
// lock, or 0 (unfenced) when the request runs unlocked. A lock without a key
// for sku gives errNotCovered: writing with another key's fence, or none,
// would defeat the fencing.
func (h holder) fence(sku string) (int64, error) {
	if h.lock == nil {
		return 0, nil
	}
	if h.keys == nil {
		return 0, fmt.Errorf("%w: SKU %q: the route has no key template", errNotCovered, sku)
	}
	key, err := h.keys.key(sku)
	if err != nil {
		return 0, fmt.Errorf("%w: SKU %q: %w", errNotCovered, sku, err)
	}
	fence, ok := h.lock.FenceOf(key)
	if !ok {
		return 0, fmt.Errorf("%w: SKU %q has the key %q; the lock holds %q", errNotCovered, sku, key, h.lock.Keys())
	}
	return fence, nil
}
