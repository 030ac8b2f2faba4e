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
//
// # Idempotency keys
//
// A route with idempotency (Config.Idempotency, WithIdempotency, or the
// spec words idempotency=required|optional, idempotency-header,
// idempotency-retention, idempotency-scope and idempotency-max-body)
// records its answers by the request's idempotency key in the Locker's
// store and replays them to retries:
//
//	@lock key=sku:<id> idempotency=required idempotency-scope=<header:Authorization>
//
// The first request with a key claims the key's record (one store call),
// takes the route's lock, runs the handler and records its answer as it is
// written (a Recording); the record is written at the same time as the
// lock is released. A retry with the same key and the same method, path,
// query and body gets the recorded status, headers and body, byte for
// byte, with the header Idempotent-Replayed: true, in one store call and
// without running the handler. A duplicate that arrives while the first
// runs waits for it like a lock waiter, and gets the replay, or 409
// (ReasonIdempotencyConflict) when the wait ends first. A key used for
// another request is 422 (ReasonIdempotencyMismatch); a key missing on a
// required route, or malformed, is 400 (ReasonIdempotencyKeyMissing,
// ReasonIdempotencyKeyInvalid). Answers of 500 and above, 401, 408, 423,
// 425 and 429, reqlock's own rejections, answers over the size limits and handler
// panics are not recorded: the claim is released, and a retry runs again.
// The store must implement stores.RecordStore; a route that cannot work is
// refused at start-up. docs/idempotency.md has the whole behaviour.
//
// A handler whose own write lives in the store of the records (the same
// Redis) can write the record in the same atomic step as its write, so
// that a retry after an unknown outcome gets the first answer:
// IdempotencyOf gives it the request's record key, claim token, fence and
// fingerprint, and IdempotentRequest.Record the record of its answer as the
// middleware would encode it (see redisstore.RecordLua).
//
// An adapter serves a request with Guard.ServeResponse (or
// Installation.ServeResponse), which can replay and record; Serve cannot,
// and answers an idempotent route's requests 500.
package middleware
