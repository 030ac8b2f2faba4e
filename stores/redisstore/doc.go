// Package redisstore is a stores.Store on Redis (6.2 or later, or Valkey)
// through go-redis v9, or through another client under a Driver: package
// rueidisstore (github.com/reqlock/reqlock/stores/redisstore/rueidisstore,
// a module of its own) runs this same Store on rueidis, which pipelines the
// commands of concurrent calls onto shared connections. What follows holds
// for both; where it names go-redis, see rueidisstore for rueidis.
//
// # What is stored
//
// A lock is its key holding the owner's token with a PX TTL, set with
// SET NX PX. Next to it a fence key holds the last fence issued for the key,
// with a TTL of the fence retention (WithFenceRetention, default 24h) that
// every grant renews, and a waiting key marks a lock a caller was refused
// (see Release notification). Release deletes the lock key, and Refresh
// resets its TTL, only while it holds the caller's token.
//
// An uncontended lock costs Redis 8 commands: the acquire's EVALSHA, one
// EXISTS of the token's abandon mark (see Timeouts) and of its writer mark
// (see Shared and limited grants), SET NX PX, TIME and SET ... GET of the
// fence key (a second SET only when the fence runs ahead of the clock), and
// the release's EVALSHA, GET and DEL.
// A refusal adds PTTL and the SET of the waiting key; the release of a lock
// someone waited for adds its PUBLISH.
//
// # Round trips
//
// Each operation is one Lua script, so one round trip once Redis has cached
// the script: EVALSHA, falling back to EVAL on the first use after a restart
// or SCRIPT FLUSH. That holds for the multi-key operations too, however many
// keys they take. Store.Load caches all scripts ahead of time.
//
// # Fencing
//
// A grant's fence is max(last fence + stores.FenceStride, server time in
// microseconds), and becomes the new last fence. So fences grow per key by
// at least the stride while the fence key lives. When it expires after the
// retention (which keeps a flood of distinct keys from growing Redis
// forever) the next fence starts again from the server clock. A fence runs
// ahead of that clock only while one key is granted more often than once per
// stride of microseconds (about a thousand times a second); the fence key
// then lives on by the lead, so that once it expires the clock alone exceeds
// every fence it held. The guarantee thus needs a server clock that does not
// step back by more than the retention. Microsecond values stay below 2^53,
// so Lua numbers hold them exactly.
//
// # Several keys
//
// Acquire, Release and Refresh take any number of keys in one script and
// one round trip. Acquire checks every key and, only when none is held by
// another token, sets them all to the token with PX TTL and issues each its
// own fence from its own fence key: a refused call sets nothing and names
// the first held key. Release ends the grant on every key that still holds
// the token, and Refresh resets every TTL only when every key still holds
// it. A release with a positive keep sets the keys' TTL to keep instead of
// deleting them: they stay held until they expire, so nothing is published
// and waiters keep waiting (and polling) until then.
//
// # Redis Cluster
//
// A script runs on one node, so every key it touches must hash to one slot:
// for a single-key call, the lock key, its fence key and its waiting key. When the lock key
// has a hash tag (a '{' followed later by a '}' with at least one character
// between), the fence key is the lock key plus ":fence" and shares the tag.
// Otherwise the fence key is "{" + key + "}:fence", whose hash tag is the
// whole lock key. A key that contains '}' but no valid hash tag cannot be
// wrapped that way: its fence key is key + ":fence", which may land in
// another slot, so such keys are not Cluster-safe (a multi-key call refuses
// them on a Cluster). Keys built by package keyfunc escape braces in request
// values, so they contain only the braces the template author wrote. The
// waiting key follows the same rules with ":waiting" for ":fence", and so do
// the keys of fair mode and of shared grants (":fair:queue", ":fair:lease",
// ":writers", ":writer:<token>", ":abandoned:<token>"). So a
// template must not make one lock's key another's fence or waiting key
// (sku:<id> next to sku:<id>:fence); keyfunc escapes ':' in request values,
// so only a template can.
//
// The keys of one multi-key call (Acquire, Release, Refresh), with
// their fence keys, must share one slot as well. Redis Cluster hashes only
// the part of a key between its first '{' and the next '}' (the whole key
// when there is no such pair or nothing between them), so give every key of
// the call the same hash tag: the keys of the template
// "cart:{<json:cart>}:sku:<json:items[*].sku>" all hash to their cart's slot,
// and so do their fence keys, which keep the tag. With a *redis.ClusterClient
// the Store computes the slots before it sends anything and returns an error
// wrapping ErrCrossSlot that names two keys in different slots and this fix;
// behind a client it cannot recognise as a Cluster, Redis's CROSSSLOT reply
// is mapped to the same error. A *redis.Ring places keys on its shards by
// that same part of the key, so there too the keys of one call must share a
// hash tag, or the call fails with ErrCrossSlot. ErrCrossSlot wraps
// stores.ErrInvalid: it is a mistake in the key template, which no retry
// fixes, not a failure of the store.
//
// # Release notification
//
// Release publishes "released" on the channel named exactly like the lock
// key, in the same script that deletes it, when a caller was refused the
// lock while it was held: every refused acquire sets the lock's waiting key
// (for the holder's remaining TTL plus a second; a waiter tries again within
// that TTL, which renews it), the release deletes it with the lock key in
// one DEL and publishes only when that DEL removed both. A waiter subscribes
// after its refusal, so nobody waits for an unmarked release, and an
// uncontended lock publishes nothing. Store implements stores.Notifier on
// that: a Locker's waiters wake as soon as the holder, in any process, lets
// go, instead of polling. (A waiter of a reqlock version that predates the
// waiting key, during a rolling upgrade, sets no mark: it wakes by its poll.)
//
// Each Store uses one pub/sub connection, multiplexed over every key its
// process waits on. The first NotifyRelease opens it and starts one
// goroutine, which sends SUBSCRIBE when a key gets its first subscriber and
// UNSUBSCRIBE when its last one stops, and one that hands each message to
// the subscribers of its channel (go-redis adds two goroutines of its own
// for reading and health checks). A Store that never calls NotifyRelease
// starts nothing and opens no connection: uncontended locks cost no
// pub/sub. The Store owns that connection and goroutines and Close stops
// them; the caller still owns the client, and closes it after the Store.
//
// Signals are hints and can be lost: a release published before the
// SUBSCRIBE reaches Redis, and every release while the pub/sub connection is
// down (go-redis reconnects and subscribes again by itself; it pings an idle
// connection every few seconds to notice a dead one). A lock that expires
// publishes nothing. So waiters keep a fallback poll, which the Locker caps
// by the holder's remaining TTL.
//
// A *redis.Client, a Sentinel failover client and a *redis.ClusterClient
// notify (Cluster broadcasts classic pub/sub to every node, so one
// connection to any node hears all releases). A *redis.Ring routes each
// channel to one shard, so it does not notify, nor does a client without
// Subscribe (such as a wrapper that exposes only redis.Scripter):
// NotifyRelease then returns a nil channel and waiters poll.
//
// # Fair mode
//
// Store implements stores.FairStore: a key in fair use gets a FIFO queue
// and a set of waiter leases, two sorted sets in the lock key's slot that
// expire when abandoned. See Store.AcquireFair.
//
// # Shared and limited grants
//
// Store implements stores.SharedStore (readers, and at most N holders of a
// key; see Locker.ObtainShared and Locker.ObtainLimited in package
// reqlock). While a key is held shared, the lock key itself is a sorted set
// of its holders' tokens, each scored by its own expiry (server time in
// milliseconds), with a TTL at the latest of them. Nothing else changes for
// Acquire: its SET NX finds the key held, its GET fails on a sorted set so
// no token owns it (Release and Refresh of a holder's token answer
// stores.ErrNotHeld), and its PTTL is the longest remaining TTL among the
// holders. Each shared call first drops the places whose expiry has passed
// (so a holder that dies frees its place at its own TTL) and then counts
// the others against the caller's limit, in the script. Shared and
// exclusive grants draw their fences from the one fence key.
//
// Writer preference: an Acquire or AcquireFair refused by holders (its GET
// failed, and only then is the key's TYPE read) records its token in a
// sorted set beside the key (":writers", token -> end of its window of
// stores.WriterWindow, server milliseconds) and sets a writer mark for the
// token (":writer:" and the token), both in the key's slot, and sets
// Grant.SharedHeld. AcquireShared refuses new holders while a window
// stands. The token's exclusive grant ends its record, found with the one
// EXISTS the acquire makes of its abandon mark anyway, and a Release by a
// token that does not hold the key withdraws it (one DEL of the mark on
// that path), publishing a release when no other writer waits, so that the
// refused readers come in at once. A holder's ReleaseShared publishes like
// a release when a caller was refused the key; a place freed by expiry is
// published by the next shared call that finds it, since Redis publishes
// no expiry.
//
// An AcquireShared costs EVALSHA, EXISTS of the abandon mark, TIME, TYPE,
// a ZRANGE of the writers, then ZADD, ZRANGE and PEXPIREAT of the holders
// and the fence's SET ... GET (a first holder adds a DEL of the waiting
// key; a later one ZREMRANGEBYSCORE and ZSCORE, and ZCARD under a limit); a
// ReleaseShared or RefreshShared costs EVALSHA, TYPE, TIME,
// ZREMRANGEBYSCORE, ZSCORE, the ZREM or ZADD and the ZRANGE and PEXPIREAT
// of the new latest expiry. Redlock (package redlockstore) does not offer
// shared grants.
//
// # Idempotency records
//
// Store is a stores.RecordStore. A record key is a lock key: ClaimRecord
// runs acquire.lua's grant (the same commands, fence, abandon marks,
// waiting writers and waiting mark) unless the key holds a finished record,
// which it returns instead (EXISTS, SET NX and GET: 3 commands). A record
// is a string value of the key that starts with a NUL byte and names the
// token that finished it, and no token that starts so is taken
// (ClaimRecord, Acquire and AcquireFair refuse one with stores.ErrInvalid,
// Release and Refresh answer stores.ErrNotHeld), so no token equals it:
// Release, Refresh and Acquire never act on it. FinishRecord (GET, SET ...
// PX retention, DEL of the waiting key, and PUBLISH when a claimer was
// refused) replaces the token's claim only, answers nil to a retry of the
// token that finished the record, and is not undone after a failure of unknown outcome: it replaced
// the claim or changes nothing. Redis removes a record when its PX expires.
// Bounds states the largest record (stores.Record.Size) the Store keeps:
// DefaultMaxRecordBytes, 16 MiB (what a replica's link carries safely), or
// up to MaxRecordBytesLimit with WithMaxRecordBytes; keys,
// TTLs and retentions have no bound but Redis's own. A Driver returns a
// record's value in Reply.Bulk.
//
// # Timeouts
//
// go-redis bounds a command by its ReadTimeout and WriteTimeout, and honours
// a context's deadline only when redis.Options.ContextTimeoutEnabled is set.
// Without it a stalled Redis holds every waiting request for the client's
// ReadTimeout (5s by default) whatever its wait limit, and a client that
// leaves does not stop the call. New therefore refuses a *redis.Client,
// *redis.ClusterClient or *redis.Ring without ContextTimeoutEnabled, unless
// WithClientTimeoutsOnly accepts it.
//
// An acquire whose caller leaves before it returns (its context ends) goes
// on in the background, and once it returns the Store undoes it: it marks
// the token abandoned (a key next to the lock, kept for the TTL asked and a
// minute), then releases the keys, owner-checked, trying again with a
// backoff until both land or the TTL has passed. Every acquire script
// refuses a token so marked, so a copy of the acquire that reaches Redis
// after the undo (held up in the network, or sent again by a retry) grants
// nothing. The Store makes a client's retries itself (MaxRetries, or
// MaxRedirects on a Cluster, with the client's backoff), one command per
// attempt, so that a failure wraps stores.ErrUnreachable only when no attempt
// reached Redis.
//
// # Start-up
//
// Open (a redis:// URL) sends PING and fails, naming the address, unless
// Redis answers within 5s (DefaultConnectTimeout) or its context's deadline;
// with connect=lazy in the URL it starts anyway, and calls fail with store
// errors until Redis answers, then work with no restart. New sends nothing:
// call Load, or PING the client, to check at start-up.
package redisstore
