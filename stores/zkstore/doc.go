// Package zkstore is a reqlock store on Apache ZooKeeper (3.5 or later), with
// release notification (stores.Notifier), fair queues (stores.FairStore)
// and shared and limited grants (stores.SharedStore), through
// github.com/go-zookeeper/zk.
//
//	store, err := zkstore.Open(ctx, "zk://zk1:2181,zk2:2181,zk3:2181/reqlock?session=10s")
//	...
//	defer store.Close()
//	locker, err := reqlock.New(store)
//
// # Znodes
//
// Under the Store's root (default /reqlock), each key has a parent node, a
// container that the server deletes once it has been empty for a while:
//
//	<root>/<key>/lock               the grant: ephemeral, data "<ttl ms>\n<token>"
//	<root>/<key>/h-<token hash>     the grant's holder: ephemeral, empty
//	<root>/<key>/q-<token>-<seq>    a fair waiter: ephemeral sequential, data "<lease ms>"
//	<root>/<key>/s-<token>          a shared holder: ephemeral, data "<ttl ms>"
//	<root>/<key>/w-<token>          a waiting writer's record: ephemeral, data "<window ms>"
//
// While a key has shared holders, its lock node is a persistent marker
// (data "shared") instead of a grant (see Shared and limited grants).
//
// Keys and tokens are escaped into valid node names (bytes outside
// printable ASCII, '/' and '%' as %XX).
//
// # Grants
//
// Acquire creates the lock node of every key, and the holder node of the
// token, in one multi transaction, so that the keys are granted all or
// none, atomically for every other client; a free key costs one round
// trip. A held key makes the transaction fail; the Store then reads the
// keys (one round trip, all keys in parallel) and either refuses, naming
// the first held key and its holder's remaining TTL, or takes over the
// nodes it may take (expired, or holding the caller's own token: a retry)
// by deleting the lock node and its holder node in the granting
// transaction.
//
// A takeover must delete the grant it read and no later one, and a lock
// node's version cannot tell them apart (versions start again at 0 with
// each node). Every granting transaction also sets the data of the key's
// parent node, whose version therefore changes with each grant of the key:
// a takeover sets it at the version that names the grant read (the
// parent's last write being that grant's creation, or else read before the
// node), so that it fails, and changes nothing, once another grant of the
// key has been made since; the Store then reads the key again. Two
// contenders that take over the same expired grant get one grant between
// them, and a late takeover never deletes the holder's own retry. (A
// parent's version would repeat after 2^32 grants of the key without the
// parent being deleted in between; a takeover that reads it at -1, which
// ZooKeeper takes for "any version", moves it on first.) A takeover costs
// the read of the parent's version, one round trip, unless the read of the
// queue in fair mode brought it.
//
// The holder node, named by a hash of the token, exists exactly while the
// lock node holds that token: every transaction that creates or deletes a
// lock node creates or deletes its holder node with it, and both go with
// their session. Release and Refresh check it in their transaction, so the
// server checks the token of every owner-checked write: a Store whose grant
// went away without its knowing (its session expired or was closed) can
// never refresh or release the next holder's grant, even when the key's
// nodes were created anew with the versions it last saw (ZooKeeper has no
// compare-data operation, and a node's versions start again at 0).
//
// # Fences
//
// A grant's fence is its transaction's zxid times stores.FenceStride. Every
// grant creates its lock node in a transaction of its own (a release
// deletes the node; a retry or takeover deletes and creates it), and
// ZooKeeper numbers its transactions with zxids that grow strictly across
// the whole ensemble and are kept in its transaction log across restarts
// and leader elections (the epoch is the zxid's high 32 bits). So each grant
// of a key has a zxid at least one above the previous grant's, and a fence
// at least FenceStride above. The product fits an int64 while the epoch is
// below 2^21; past that Acquire fails with ErrFenceRange. Fences stay
// increasing only as long as the ensemble keeps its data: a ZooKeeper whose
// data directory is wiped starts its zxids again.
//
// # TTLs and sessions
//
// ZooKeeper expires sessions, not nodes (TTL nodes need the server setting
// zookeeper.extendedTypesEnabled, off by default, and expire only to the
// second). A grant therefore ends at whichever comes first:
//
//   - its TTL: every Store ages a lock node version (its mzxid) from the
//     moment it first saw it, or for its own writes from the start of the
//     call, on its monotonic clock, and treats it as free once the TTL in
//     its data has passed. The writer's deadline comes first, so a grant is
//     never taken over before its holder's TTL has passed on the holder's
//     clock, whatever the machines' wall clocks say (clocks must only run at
//     about the same rate). A Store that first sees a stale node waits a
//     full TTL from then before it takes it over;
//   - its Store's session: the node is ephemeral, so when the session ends
//     (Close, or the server heard nothing from the Store for the session
//     timeout) the server deletes it at once and wakes the waiters. A
//     crashed process's locks are free after the session timeout.
//
// So that a holder's validity never outlives its node, the Store takes no
// TTL longer than the session timeout the server granted (see Limits and
// Sessions shorter than MaxTTL): the
// server restarts a session's timer on each request it receives, after the
// Store sent it, so a grant or renewal that started at t stands until at
// least t plus the session timeout, and a validity counted from t with a
// TTL up to the session timeout ends first (the Locker's margin for clock
// drift covers clocks that run at slightly different rates). A holder cut
// off from ZooKeeper therefore loses its validity before the server frees
// its key for anyone else.
//
// Refresh resets the TTL; the session is kept alive by the client's own
// pings, independently. A Refresh of a grant this Store made and knows has
// ended (its TTL passed, or the session that made it is gone) returns
// stores.ErrNotHeld at once, without the server, even while the Store is
// cut off from it; Release does too when the Store has no session. Any
// other Refresh of a grant whose session ended finds its nodes gone, and
// returns stores.ErrNotHeld.
//
// A Release with keep sets the lock node's TTL to keep and leaves it in
// place, so that no waiter is signalled. The node stays ephemeral: a kept
// key is held until keep has passed or the Store's session ends, whichever
// comes first; keep is at most the session timeout, so a live Store keeps
// it for the whole keep. A persistent node would outlive a crashed process
// for good (nothing on the server expires it), and a TTL node needs a
// setting that is off by default.
//
// Close ends the session, so ZooKeeper frees every lock of the Store at once:
// close a Store only once its locks are released, since the Locker's holders
// of locks still held keep their validity until it runs out.
//
// A lost session is not signalled to holders as it happens: with every TTL
// within the session timeout, a holder's validity has always run out by the
// time the server expires its session, and the client learns of the
// expiry only later still, when it reconnects; such a signal would never
// cancel a holder sooner than its validity does.
//
// # Sessions shorter than MaxTTL
//
// Bounds are fixed for a Store's lifetime: MaxTTL is the session timeout
// granted on the Store's first connection. The Store asks for its
// configured timeout on every connection (go-zookeeper would ask for the
// one granted last), but a server configured with a lower
// maxSessionTimeout, or a larger tickTime, than the one that granted
// MaxTTL grants less. While the last connection got less than MaxTTL, the
// Store logs it once (see WithLogger) and refuses every Acquire, Refresh
// and AcquireFair whose TTL is above that timeout with a store failure
// that changes nothing (wrapping ErrShortSession and
// stores.ErrUnreachable): the Locker answers 503, as when the store is
// down, until a server grants the full timeout again. A keep or a lease
// is taken as usual: a kept key or a queue place is held until its time
// has passed or the session ends, whichever comes first, and neither lets
// anybody in while a holder's validity stands.
//
// What this cannot cover: a grant made before the shortening (or by a call
// in flight across it) keeps its validity, up to MaxTTL from its last
// renewal, while the server would now expire its session the shorter
// timeout after it last heard from the Store. Should the Store be cut off
// right after such a reconnection, another Store could be granted the key
// before that validity ends. Give every member of an ensemble the same
// tickTime and session timeout bounds.
//
// # Fair queues
//
// AcquireFair queues a waiter by creating its ephemeral sequential node:
// the server numbers them in arrival order. A waiter is granted the key when
// the key is free and no node with a live lease is ahead of it, and its node
// is deleted in the granting transaction. A node whose lease has passed
// unrenewed (aged as lock nodes are) is deleted by the next attempt of a
// waiter behind it; a waiter whose process dies leaves the queue when its
// session ends. An attempt renews its own lease only when a quarter of it has
// passed, so most attempts only read.
//
// # Notification
//
// A release subscription watches one node: for a waiter this Store has
// queued, the queue node just ahead of it, or the lock node once it heads
// the queue; for any other waiter, the lock node. So a release wakes the
// head of the queue only, and a waiter leaving or lapsing wakes the one
// behind it. Deletions are dispatched from the connection's event callback
// in the server's order, and each subscription sets its watch again before
// it signals, so that the release that follows its waiter's grant is seen.
// ZooKeeper watches fire once, and go-zookeeper sets them again silently
// after a reconnection: whenever the connection gets its session back, or a
// new one, every subscription sets its watch anew and signals, since events
// may have been missed.
//
// A queue node is watched only while it exists: a subscription that finds
// the waiter ahead gone signals and watches the node now ahead at once (a
// watch on an absent node waits for its creation, which a queue node's name
// never sees again). The lock node is watched for its creation too, when
// absent, so that the next grant's release is seen: such a watch stays,
// on the server and in the client, until the key is next granted or the
// session ends, also after its subscription stopped (go-zookeeper has no
// call for ZooKeeper's removeWatches).
// It costs a few dozen bytes per key on each side, and is sent again on
// every reconnection.
//
// # Shared and limited grants
//
// AcquireShared makes a token a holder of a key with a node of its own,
// s-<token>, aged as a lock node is, so that each holder expires at its own
// TTL and is released, kept and refreshed alone; the node's name is the
// owner check (no other token's operation names it), and it goes with its
// session like a grant. While holders stand, the key's lock node is a
// persistent marker: plain Acquire's first transaction, which creates the
// lock node, therefore fails on a shared key as on an exclusive one, and a
// free key still costs it one round trip. The marker is persistent because
// the holders belong to several sessions; the last holder's release deletes
// it, and otherwise (its holders died) the next grant of either kind takes
// it over once every holder has expired.
//
// Every grant of a key, of either kind, sets the key's parent, and so
// changes its version. AcquireShared reads the parent's children and
// version, then the lock node, holders and writer records (two round trips,
// the second in parallel), and grants in a transaction that sets the
// parent at the version read: it fails, and the Store reads again, should
// any grant, or a writer's refusal, have been made since. So the holders a
// grant counts against its limit are exactly those that stand when it is
// made (ZooKeeper cannot check "no more than N children" in a transaction;
// the parent's version stands in for it). Expired holders are deleted at
// the versions read, in a transaction that checks the parent's version,
// before anything is granted over them, so that a late refresh of one fails
// rather than bringing it back. After ten attempts that lost such races,
// AcquireShared refuses with a Wait of 10ms.
//
// An exclusive Acquire or AcquireFair that meets the marker reads the
// holders the same way: it takes the key over when none is live (guarded by
// the parent's version), or refuses with SharedHeld and writes its writer
// record, w-<token>, in a transaction that also sets the parent, so that a
// shared grant racing it fails. The record lasts stores.WriterWindow from
// the refusal, aged as a holder, and while any stands AcquireShared refuses
// new tokens. The writer's exclusive grant deletes its record (one more
// round trip, only for a writer this Store recorded), as does a Release by a
// token that does not hold the key. Writer preference: a waiting writer is
// not starved by a stream of readers.
//
// A release of a holder deletes its node and, in the same transaction,
// deletes and creates again the marker, so that the subscriptions watching
// the lock node are signalled while nobody sees the key without its marker;
// the clean-up of an expired holder does the same. Shared fences come from
// the same zxids as exclusive ones: every grant is a transaction that sets
// the parent.
//
// # Limits
//
// Store.Bounds states what the Store takes; arguments out of it are refused
// with an error wrapping stores.ErrInvalid before anything is sent (and by
// reqlock's Locker and middleware before any store call, or at start-up):
//
//   - TTL, keep and fair lease: from MinTTL (1ms: nodes keep durations in
//     whole milliseconds, rounded up) to the session timeout the server
//     granted, which the URL parameter session= (or WithSessionTimeout,
//     default 10s) asks for and the server keeps within its
//     minSessionTimeout and maxSessionTimeout (by default 2 and 20 times
//     its tickTime). The Store learns it on its first connection; a server
//     that grants less later makes the Store refuse longer TTLs for as long
//     (see Sessions shorter than MaxTTL).
//   - keys: ZooKeeper takes requests of up to jute.maxbuffer bytes (1 MiB
//     by default; the Store assumes the default or more) and closes the
//     connection of a larger one, failing every call on it. A key appears in
//     up to six paths of one transaction, escaped bytes taking three bytes
//     each, so MaxKeyBytes is about 58,000 bytes under a short root (less
//     under a longer one). A call on several keys puts them in one
//     transaction, and is refused when they exceed the limit together; so
//     are a token and key whose request would.
//
// Node data this Store cannot read (another version's format, a TTL out of
// range) is not an error: such a lock node counts as held, with an unknown
// Wait, until its owner deletes it or its session ends; such a queue node's
// lease never lapses. A lock node without a holder node (another version's
// grant) is taken over, once expired, like any other.
//
// Versions of this package from before holder nodes (which checked owners
// by node versions alone) must not share a root with this one, such as in
// a rolling upgrade: one of them that takes over an expired grant of this
// version deletes its lock node and leaves its holder node behind, and the
// grant's owner could then refresh or release the old version's grant, two
// holders at once. Stop every Store of the old version before starting the
// new one, or give the new one another root.
//
// # Failures
//
// Every call returns as soon as its context ends, even while the server has
// not answered (go-zookeeper's requests take no context, and wait out a
// lost connection): an Acquire or AcquireFair left in flight is undone,
// owner-checked, once it returns, and its error wraps stores.ErrAbandoned
// and the context's error; the undo tries again while the server cannot be
// reached, until it knows the grant is gone (released, or the session
// that made it ended, which deleted its nodes) or the Store is closed. An
// undo that fails otherwise (the server refuses it, such as for an ACL) is
// logged, and the grant stands until its TTL passes or the session ends.
// A call made while the connection has no session fails at once with
// stores.ErrUnreachable, sending nothing. A call that could reach no server
// later on fails with stores.ErrUnreachable only when none of its writes
// may have been applied: a fair waiter that joined the queue, then lost the
// server, fails with an unknown outcome, and the Locker takes it out.
//
// What it survives: a lost or late reply (the call fails with an unknown
// outcome, or is undone when abandoned); a connection cut, or a server
// paused or partitioned for less than the session timeout (the session and
// its locks stay; calls in flight fail and the client reconnects, to
// another member of an ensemble when there is one); a Store cut off for
// longer (its holders' validity has run out before the server frees their
// keys, and its Refresh and Release answer stores.ErrNotHeld); a process
// crash (its locks are free after the session timeout); the loss of a
// minority of an ensemble. Fences stay increasing across leader elections
// and restarts, not across a wiped data directory (see Fences).
//
// # Start-up
//
// Open and New wait for a session and create the root, and fail, naming the
// servers, when that takes longer than 5s (DefaultConnectTimeout) or their
// context's deadline. With connect=lazy in the URL (WithLazyConnect) they
// return at once: the client connects in the background, calls fail with
// store errors until it has a session, and the first call with one creates
// the root; until a server has granted a session timeout, Bounds take the
// one asked for.
//
// # No idempotency records
//
// The Store does not implement stores.RecordStore. A record must outlive
// its writer's session (a retry may come after the instance that answered
// first restarted), so it would be a persistent node, and nothing on the
// server removes an expired persistent node: TTL nodes (ZooKeeper 3.5.3 and
// later) are off unless the server runs with the system property
// zookeeper.extendedTypesEnabled=true, which neither ZooKeeper's defaults
// nor Debian's packaged 3.8 (which the tests run) set; and the Store has
// no sweep of its own (its only sweep is of the ages it keeps in memory,
// see TTLs and sessions). A record removed only when its key is claimed
// again would leave the records of keys never retried behind for good:
// growth without bound. Use another store for idempotency records.
package zkstore
