// Package reqlock is a distributed lock for HTTP endpoints.
//
// The root package holds the lock core: a Locker that obtains locks from a
// store, the Lock it returns, and the errors and outcomes both report.
// Requests derive their keys in package keyfunc; the request flow lives in
// package middleware (with the net/http adapter), and packages ginlock and
// echolock adapt it to gin and echo. The contract a store implements is
// package stores; the stores live beneath it: stores/memstore for one
// process and stores/redisstore for Redis, each proven by the conformance
// suite stores/storetest.
//
// Every grant carries a random 128-bit token and a fencing token per key (a
// number that only grows). Release and refresh act only while the keys still
// hold the caller's token.
//
// A key may also be held by several at once, on a store that implements
// stores.SharedStore: ObtainShared for readers that run together and never
// with a writer (Obtain), ObtainLimited for at most N holders. Each is a grant
// of its own (shared.go) with its own token, TTL and fence; a waiting writer
// keeps new readers out, so readers do not starve it.
//
// Inside, a Locker runs one acquire loop (acquire.go), plain or fair (fair.go);
// a single key first waits its turn in the process's local queue
// (internal/localqueue). What the store granted is a grant (grant.go), which
// owns its validity and fences and may pass from local holder to local holder;
// a Lock (lock.go) holds one or several grants; its keep-alive side (the
// contexts that end with it, the watchdog) is in keepalive.go, and reentrancy
// in reentry.go.
package reqlock
