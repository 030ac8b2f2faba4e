// Package reqlock is a distributed lock for HTTP endpoints.
//
// The root package holds the lock core: a [Locker] that obtains locks from a
// [Store], the [Lock] handle it returns, and the errors both report. Requests
// derive their keys in package keyfunc, the request flow lives in package
// middleware (with the net/http adapter), and packages ginlock and echolock
// adapt it to gin and echo. Stores live under stores/: memstore for a single
// process and redisstore for Redis.
//
// Every grant carries a random 128-bit token and a fencing token (a per-key
// number that only grows). Release and refresh act only while the key still
// holds the caller's token.
package reqlock
