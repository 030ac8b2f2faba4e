// Package redlockstore is a stores.Store on Redlock: the same lock on N
// independent Redis masters (5.0 or later, or Valkey, no Cluster between
// them), granted while a majority of them holds it.
//
// Each node's calls go through a redisstore.Driver: New wraps go-redis
// clients (redisstore.NewDriver), and NewWithNodes takes the Driver of any
// client, such as rueidisstore.NewRedlock's over rueidis clients, which
// pipeline the calls of concurrent locks onto one connection per node.
// Everything below holds on either.
//
// # Algorithm
//
// Acquire runs one Lua script per node, each call bounded by a node timeout
// (WithNodeTimeout, default 1s, and at most a third of the TTL). The script
// sets every key to the token with SET NX semantics for the TTL plus the
// drift allowance (WithDrift: 1% of the TTL + 2ms by default), so that the
// lock lasts at least the TTL from the call's start in spite of clock drift
// between the nodes and the client. The lock is granted once a quorum
// (N/2+1) of nodes granted and the validity, TTL - elapsed, is positive:
// the Locker counts the TTL from its call's start, which equals the classic
// TTL - elapsed - drift on the nodes' clocks.
//
// A first attempt asks every node at once: one round trip for a free key.
// Each key has a gate node, the same for every client: the node that ranks
// first for the key by rendezvous hashing of the key with each node's
// address (host canonicalised), so the order in which a process lists the
// nodes plays no part; processes must name each node by the same address.
// Contenders that race split the nodes so that none may reach a quorum; the
// one that won the gate then asks the nodes that refused it again, after
// 1ms, 2ms, 4ms... (6 times at most), while the others, which lost the
// gate, let go of what they took. So racing contenders still yield one
// winner. A retry with a refused token (a waiter), or an Acquire of a key
// that another Acquire of this process is acquiring, asks the gate alone
// first, and the other nodes only when the gate granted: a contender that
// loses costs one call, not one per node. A gate whose last call failed is
// not asked alone, and a gate that alone refuses a waiter with the same
// holder as the waiter's last refusal is not trusted: the holder may have
// released everywhere but there (a lost release), so the other nodes are
// asked too, and a quorum of them grants at once.
//
// Acquire decides as soon as the replies settle it (a quorum of grants, or
// so many refusals or failures that no quorum is possible), then gives the
// other nodes whose last call did not fail as long again as the decision
// took, so that healthy nodes' grants are in hand and a refusal's Wait
// comes from most nodes. A later grant stays part of the lock; Release
// waits for it on a healthy node, and closes the token (a tombstone, see
// Late calls) on a node whose last call failed, and when the lock was
// refused, abandoned or released it is released as soon as it lands. When the lock is not
// granted, every node that granted, or whose outcome is unknown, is
// released, owner-checked, at once (a node still in flight once it answers,
// so the release never overtakes the grant), and again until it lands (see
// Clean-up). Such an undo releases only what its own attempt wrote (see
// Late calls), so a new Acquire with the same token, a waiter's retry,
// waits for none of them.
//
// Release and Refresh go to every node at once and, once the answers
// settle the outcome (a quorum released or renewed, too many did not, or
// no quorum is possible), give the nodes still out a short grace (twice
// the slowest answer, 5 to 50 ms; none to a node whose last call failed)
// before they return, each call bounded by the node timeout: on a healthy
// cluster every node has answered by then. What is still out is settled in
// the background (the token stays ended for Refresh until it is in). Refresh needs a quorum that still
// holds the token, within the TTL; only on top of such a quorum do nodes
// that answered that they lost the keys (restarted empty) take them again
// where they are free, so a minority that still holds the token never
// revives a lock that expired on the others. Release ends the lock on
// every node it reaches, and on the others once they answer (see Clean-up).
//
// # Skipped nodes
//
// A node that keeps timing out (frozen by SIGSTOP, partitioned) is skipped:
// after 2 calls in a row timed out (each given at least 50ms, and timed
// out after at least half of it: a TTL under 150ms gives its calls less,
// which a loaded process overruns on a healthy node, so their timeouts
// skip no node for the other callers), or as soon as one call has had no answer for its stall time (16 of the
// node's mean round trips, at least 200ms, at most a quarter of the node
// timeout above that) while most other live nodes answered calls sent
// after it, or pings sent then (that call then answers at once, an
// unknown outcome undone as a timeout is; the client's own call ends at
// its deadline). While the nodes that failed or did not answer leave no
// quorum of answers, an Acquire is a store failure, never a refusal: with
// 3 of 5 nodes frozen every request gets a store error. A skipped node gets no calls: they fail at once with
// ErrNodeSkipped, as unsent, and count as failed nodes toward the quorum.
// One probe at a time (a script call bounded by the node timeout, 50ms
// apart) checks it in the background, and the first answer, of a probe or
// of an owed release, brings it back. So 2 frozen nodes of 5 cost the
// calls in flight at most the stall time once, then nothing: Acquire,
// Release and Refresh run at the speed of the other 3 (measured by
// TestFrozenMinority). A skipped gate passes to the next node of the key's
// ranking, the notify node likewise, and a contended Acquire waits for the
// gate alone only 4 of its round trips + 2ms before it asks the others.
//
// # Late calls
//
// A node call whose reply did not come (a timeout, a lost reply) may still
// reach its node later. Every write carries an attempt number (one per
// Acquire or Refresh call of the Store) and sets each key to TOKEN#ATTEMPT,
// and the release that undoes a call whose outcome is unknown leaves on
// that node a tombstone, KEY:dead:TOKEN, holding the attempt it closed; the
// acquire and refresh scripts write nothing for a closed attempt, and an
// acquire writes nothing over a later attempt of its token. So an abandoned
// or failed acquire's late grants never outlive its undo, whichever reaches
// the node first, and an undo, which releases only what its attempt or an
// earlier one wrote, never releases a later attempt's grant (a Refresh
// makes the keys it renews its own). A Release ends its token in the Store
// until it returns (a Refresh running or starting meanwhile starts no more
// calls) and closes every attempt of the token on the nodes where a
// Refresh call is in flight or was lost within the refresh's TTL (with keep
// positive, on every node, for the keep), so no renewal or re-take lands
// after it, also when the Refresh's context ended. A tombstone lives for the max TTL plus the drift
// allowance and 2s: a call that reaches its node later than that after its
// undo is not stopped. An uncontended lock writes no tombstone; a refused
// or failed attempt writes them only on the nodes whose outcome it does
// not know.
//
// # Clean-up
//
// What the Store owes after a call it did not finish is a release per node,
// owner-checked by attempt and leaving the attempt's tombstone: the undo of
// an acquire that did not grant the lock, was abandoned, or whose call to a
// node has an unknown outcome; the release of a late grant nobody uses; a
// Release's call that failed on a node (whatever Release returned, also
// after its context ended). The Store sends it at once, and again while it
// fails, with a backoff per node (10ms doubling to 1s, with jitter), until
// it lands, until what it releases has surely expired (the TTL plus twice
// the drift allowance after the debt arose; the tombstone's life for a
// Release), or until Close. A node that answers gets up to 64 owed calls at
// once; a node in backoff gets one at a time, so an outage costs one call
// per node per backoff however much is owed to it, and no goroutine per
// debt (one waits for the backoffs); the releases owed for one token are
// one. At most 16384 debts (64 MiB of keys) are held: a new one beyond is
// given up, and what it would release expires with its TTL. NodeStats
// tells, per node, the releases owed and those given up. A late call that
// reaches its node after its undo was given up (a node paused past the
// TTL) is not stopped.
//
// # Errors
//
// A key held by another token is a refusal (Grant.OK false, so ErrHeld and
// 423 upstream) when refusals make a quorum impossible. When failed nodes
// (errors, timeouts, quarantine) make it impossible, Acquire returns an
// error wrapping ErrNoQuorum that names each failed node and its error: a
// store failure (503 upstream). It also wraps stores.ErrUnreachable when no
// node was reached: every node's Driver said its call could not have
// reached it (no connection could be dialled, on every attempt: the
// go-redis Driver makes a retrying client's attempts itself, so it knows
// whether an earlier attempt may have reached the node; on a go-redis
// client whose type hides its retries, every failure counts as reached).
// Release
// returns stores.ErrNotHeld when a key was not released on a quorum of the
// nodes that answered, and ErrNoQuorum when too few answered. NodeStats
// counts each node's calls and failures, and WithNodeFailureHook reports
// each failure, for metrics that alert when a node is down.
//
// # Fencing
//
// Fences grow strictly per key from grant to grant, also when the quorums
// of two grants differ, without any assumption about clocks while no node
// loses its data. Each node keeps a fence key per lock key: a grant on the
// node issues last + stores.FenceStride. The grant's fence F is the largest
// fence its quorum issued, and before Acquire returns F is stored on a
// quorum: nodes that saw the same grants issue the same fence, so this
// usually holds already; otherwise (a node that missed grants or was
// restarted) Acquire raises the lagging nodes' fence keys to F, one more
// round trip, and fails unless a quorum then stores F.
//
// Claim: a later grant G2 of the key gets a fence above G1's F1. G1 stored
// F1 on a quorum S1; G2 was granted by a quorum Q2; two majorities of N
// nodes share a node j. A fence key only grows, so j's last fence is at
// least F1 when G2 reaches it, and G2's fence, the largest of its quorum,
// is at least F1 + stride. This holds whichever nodes failed in between,
// and needs no clock. (A majority-quorum register needs a read before its
// write, or clocks; agreement between the nodes saves that round trip.)
//
// A new fence key (the first grant of a key, or after the fence retention,
// WithFenceRetention, default 24h, without grants) starts from the client's
// proposal, its clock + 1s, clamped on each node to [node clock, node clock
// + 2s], so that nodes agree on it without a raise. Two events remove a
// fence key, and monotonicity then rests on clocks. Expiry after the
// retention: a fence key lives on by the lead of its fence over the node's
// clock, so the next fence, at least that clock, exceeds every fence it
// held if the node's clock does not step back. A node restarted empty: it
// stays out of quorums for the quarantine (see Restarts), so when it next
// issues a fence its clock has moved on by the max TTL since it last held
// F1; that exceeds F1 when F1 led the clock of the node that issued it by
// less than the max TTL minus the clock skew between the nodes. A fence
// leads the clock by at most 2s when its key is created, and then gains
// 1024µs per grant against the clock's 1µs per µs, so it leads more only
// while a key is granted more than about 976 times a second for long.
//
// # Restarts
//
// A node restarted empty has lost the locks it held; if it joined a quorum
// at once, a second client could take a lock that a majority still held
// before the restart (the Redis documentation's "delayed restarts" rule).
// Every node keeps a marker key, MarkerKey. A script that finds it absent
// (data lost, or a new node) sets it to the moment the node will have been
// up for the max TTL (WithMaxTTL, default 1 minute), reading the node's
// uptime from INFO, and the node refuses to take part in grants and renewals
// until then: a quarantined node is a failed node, named in errors. Redis
// counts uptime_in_seconds between two clocks truncated to whole seconds,
// up to 1s more than the real uptime, so the node is credited 1s less: it
// never rejoins early, and may stay out up to 1s longer than the max TTL.
// TTLs above the max TTL are refused, so every lock the node held has
// expired by then. Every client of the nodes must use the same max TTL.
//
// What the operator must do: nothing for a node that comes back empty (with
// no data files). A node restarted from an RDB snapshot or an AOF without
// appendfsync always may come back with a marker but without recent locks:
// either configure appendfsync always, or delete its data files before
// starting it, or keep it away from clients for the max TTL. FLUSHALL on a
// node that has been up longer than the max TTL is not detected: don't.
// Nor is a lock key evicted for memory: set maxmemory-policy noeviction
// (every volatile-* policy evicts lock keys, which have a TTL).
// On a brand-new deployment, nodes started less than the max TTL ago are
// quarantined until then; SET MarkerKey to 0 on each to admit them at once
// (only on nodes that held no lock within the max TTL).
//
// # Release notification
//
// Every node publishes the release of a key in the same script that
// deletes it; NotifyRelease subscribes on the key's notify node, the node
// that ranks second for the key (the first is its gate, which a waiter's
// retry asks first), through a redisstore.Store per node (one pub/sub
// connection per node for all its keys). One node keeps a key's signals in
// release order, as stores.Notifier's users expect, and every process
// listens to the same node for a key, whatever its order of the nodes.
// While that node is down, waiters fall back to polling.
//
// # Duplicate nodes
//
// One server given twice would count as two votes. New refuses two nodes
// with the same address (the host in lower case, localhost, 127.0.0.1 and
// ::1 as one host, the database number ignored), and the first Acquire (or
// Refresh) of a Store asks every node for its run_id (one round trip, once)
// and refuses, with ErrInvalid and ErrDuplicateNode, nodes that are one
// server under two addresses (a host name and its IP address, a proxy); a
// node that did not answer then is asked again in the background once it
// answers calls, and until its run_id is known its grants and renewals do
// not count toward a quorum (they are released like a refused lock's).
//
// # Limits and costs
//
// Keys up to MaxKeyBytes (1 MiB; 16 MiB for the keys of one call
// together); TTLs and keeps from MinTTL (10ms: a grant needs a round trip
// to a quorum within a third of the TTL) to the max TTL; see Bounds.
// Arguments out of range are refused with stores.ErrInvalid before any
// node call. An uncontended lock costs one round trip to every node at
// once for Acquire and one for Release (and one for each Refresh); the
// scripts read a tombstone key per lock key, and every node publishes its
// releases (a PUBLISH with no subscriber is cheap); it owes nothing, and
// runs no background goroutine (each node call whose deadline leaves room
// arms a stall timer; a skipped node has one probe goroutine). A tombstone (a few dozen bytes plus the
// key and the token) lives for the max TTL: a long max TTL keeps the
// tombstones of abandoned acquires and lost renewals that long. The first Acquire of a Store costs one
// more round trip (run_ids).
//
// # Shared and limited grants
//
// Store is a stores.SharedStore. On a node, a key held shared is a sorted
// set of its holders' tokens scored by the expiry of each one's place (node
// ms), beside a hash KEY:places of each place's attempt and limit; the
// plain scripts find the key held (no token owns it), with the latest place
// as its PTTL. Each node applies the contract to its own holders in one
// script: it drops the expired places, refuses a key held exclusively, a
// new holder while a waiting writer's window stands, and one under limit L
// while L or more hold the key (under whatever limits), and grants again a
// token that holds a place. AcquireShared then runs Acquire's algorithm:
// the gate, the grace, the fence (the largest its quorum issued, stored on
// a quorum), the validity (the TTL from the call's start, the node TTL
// carrying the drift allowance), the undo, owner-checked by attempt, of a
// place that missed its quorum on the nodes that admitted it, Late calls
// and Clean-up. RefreshShared renews the place on the nodes that kept it,
// within the quorum of its limit, and never takes it again where it was
// lost: that would admit a holder past a node's count. ReleaseShared frees
// it on every node; a node publishes each freed place, by release or
// expiry.
//
// Quorums. A reader (limit 0) and a holder under limit 1 need a majority,
// as a lock does: a reader and a writer, or two holders under limit 1,
// would share a node that admitted both, which its script forbids. A limit
// of 2 or more needs every node, for the grant and for each renewal (a
// node that fails or restarted fails them: such routes do not survive a
// node's loss, unlike readers and plain locks). A majority is not enough:
// with 3 nodes and limit 3, holders on nodes {1,2}, {2,3}, {1,3} and {1,2}
// leave at most 3 places on each node, yet 4 hold a majority each. Counting
// places, L+1 holders of Q nodes each force a node past L only when
// (L+1)·Q > N·L, which a majority meets for L = 1 alone; and under the
// own-limit rule (a rolling change of a key's limit) holders under smaller
// limits need fewer nodes, so on 3 nodes (and 5, past limit 2) only every
// node serves every mix of limits.
//
// Claim: at no instant do more holders hold a key (none of them a reader)
// than the largest limit L among them. On a node, order the holders present
// by their admission there: the k-th found the k-1 before it, so its limit
// is at least k, and the node holds at most L of them. Two holders under
// limit 1 hold a majority each, so a node holds both, each first there:
// at most one holds under limit 1, and every other holder holds every node.
// So with more than L holders, a node of the limit-1 holder (any node if
// there is none) holds them all, more than L. This needs: every node
// applies the same rules to the limit each caller sends; a place lasts on
// its nodes at least as long as the grant is valid (the node TTL includes
// the drift allowance, and no place is evicted: noeviction); and a node that
// lost its places (restarted empty) stays out of quorums for the max TTL
// (see Restarts), and fails limited renewals meanwhile, so a holder under a
// limit of 2 or more loses its grant rather than keeping one with a node
// that forgot it.
//
// Writer preference. A plain Acquire refused on a node by holders records
// its token as a waiting writer there (a sorted set KEY:writers and a mark
// KEY:writer:TOKEN, for stores.WriterWindow; the helpers are redisstore's,
// from internal/redislua), and a grant of the key to the token on a node
// ends its record there. Grant.SharedHeld is set when any node that
// answered recorded the token, so that the Locker withdraws it: Release
// withdraws the token's records on every node it reaches (and owes the
// ones that failed), answering ErrNotHeld. A gate that refuses a writer for
// holders is not trusted alone: the writer's retry asks every node, so its
// records stand on all that have holders, and new holders, which need a
// majority without a standing record, stay out until the writer gets the
// key, withdraws or its window lapses.
//
// # Fair mode
//
// Store does not implement stores.FairStore. A FIFO queue needs every node
// to agree on the order of waiters; each node would keep its own queue, the
// queues' heads could differ, and then no waiter would get a majority until
// leases expire. Agreeing on one order needs consensus (etcd, ZooKeeper).
//
// # Start-up
//
// Open sends PING to every node and fails, naming the nodes that did not
// answer, unless a quorum answers within 5s (DefaultConnectTimeout) or its
// context's deadline: a dead minority does not stop it. With connect=lazy in
// the URL it starts anyway, and calls fail with store errors until a quorum
// answers. New sends nothing.
//
// # No idempotency records
//
// The Store does not implement stores.RecordStore. A record written to a
// majority is not a safe answer: a later claim can be granted by another
// majority, which shares only one node with the first, and that node may
// have restarted empty since (the restart delay, max_ttl, protects locks,
// which live a TTL, not records, kept for a retention of hours). A claim
// would then run a request a second time instead of replaying its answer.
package redlockstore
