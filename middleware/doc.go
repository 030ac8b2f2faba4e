// Package middleware holds the framework-neutral request flow of a locked
// route (Guard), the lock configuration of a whole service (Routes), and
// their net/http adapter.
//
// A route's Config comes from code (New, NewWithConfig and the With...
// options) or from a one-line lock spec, in code (NewFromSpec, ParseSpec)
// or in a route table file (LoadRoutes):
//
//	@lock key=sku:<id> wait=2s ttl=10s on-timeout=423 on-store-error=503
//
// The spec and route table language, its grammar and its parsers are
// package routetable's; this package turns what routetable parses into
// Configs, under its own error prefix:
//
//	reqlock/middleware: invalid configuration: spec column 20: wait: "2x" is not a duration (such as 2s or 500ms)
package middleware
