// Package routetable is reqlock's language for lock configuration: the
// one-line lock spec, route paths, and route table files that map routes
// to specs. It parses and checks; package middleware turns what it parses
// into the Config of each route and runs the requests (middleware.ParseSpec,
// middleware.NewRoutes, middleware.LoadRoutes).
//
// # Lock specs
//
// A route's lock configuration is one line, for route tables and
// annotations:
//
//	@lock key=sku:<id> wait=2s ttl=10s on-timeout=423 on-store-error=503
//
// ParseSpec parses it into a Spec and documents the grammar and every
// field. Errors give the column of the offending field:
//
//	reqlock/routetable: invalid configuration: spec column 20: wait: "2x" is not a duration (such as 2s or 500ms)
//
// # Routes and tables
//
// A route is "METHOD /path", such as "POST /skus/{id}/deduct"; the path
// takes net/http's {id} and {path...} or gin and echo's :id and *path, and
// all spellings of a route are the same route (CanonicalPath). ParseEntry
// parses one route and its spec, for tables written in code; Load and Parse
// read a table from a JSON or YAML file:
//
//	routes:
//	  POST /skus/{id}/deduct: "@lock key=sku:<id> wait=2s"
//
// and report every problem of the file at once, each with its line; Check
// and CheckFile return what they found without failing.
//
// Every problem is an *Error wrapping ErrInvalid; package middleware
// reports it again under its own prefix, wrapping middleware.ErrInvalidConfig
// as well.
package routetable
