// Package zkstore is a reqlock store on Apache ZooKeeper (3.5 or later), with
// release notification (stores.Notifier) and fair queues
// (stores.FairStore), through github.com/go-zookeeper/zk.
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
//	<root>/<key>/lock             the grant: ephemeral, data "<ttl ms>\n<token>"
//	<root>/<key>/q-<token>-<seq>  a fair waiter: ephemeral sequential, data "<lease ms>"
//
// Keys and tokens are escaped into valid node names.
//
// # Grants
//
// Acquire creates the lock node of every key in one multi transaction, so
// that the keys are granted all or none, atomically for every other client;
// a free key costs one round trip. A held key makes the transaction fail;
// the Store then reads the keys (one round trip, all keys in parallel) and
// either refuses, naming the first held key and its holder's remaining TTL,
// or takes over the nodes it may take (expired, or holding the caller's own
// token: a retry) by deleting them at the version it read in the granting
// transaction. Each grant also increments its parent's data version in its
// transaction; Release and Refresh check that version and the lock node's
// before they write, so an owner check names one grant and cannot land on
// a later grant's node (a node's own version starts again at 0 when the
// node is created anew).
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
//     timeout, default 10s) the server deletes it at once and wakes the
//     waiters. A crashed process's locks are free after the session
//     timeout even when their TTL is longer.
//
// Refresh resets the TTL; the session is kept alive by the client's own
// pings, independently. A holder whose session has expired finds its lock
// node gone: its next Refresh returns stores.ErrNotHeld, so the Locker
// cancels its context with reqlock.ErrLockLost.
//
// A Release with keep sets the lock node's TTL to keep and leaves it in
// place, so that no waiter is signalled. The node stays ephemeral: a kept
// key is held until keep has passed or the Store's session ends, whichever
// comes first. A persistent node would outlive a crashed process for good
// (nothing on the server expires it), and a TTL node needs a setting that
// is off by default; a short-lived session ending is the lesser evil.
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
// # Failures
//
// Every call returns as soon as its context ends, even while the server has
// not answered (go-zookeeper's requests take no context, and wait out a
// lost connection): an Acquire or AcquireFair left in flight is undone,
// owner-checked, once it returns, and its error wraps stores.ErrAbandoned
// and the context's error. A call made while the connection has no session
// fails at once with stores.ErrUnreachable, sending nothing.
package zkstore
