// Package etcdstore is a stores.Store on etcd (3.3 or later) through
// go.etcd.io/etcd/client/v3. It is also a stores.Notifier, a
// stores.FairStore, a stores.SharedStore and a stores.RecordStore: etcd
// orders waiters by create revision and tells watchers of every delete, so
// fair waiting costs no polling.
//
// # What is stored
//
// Every key of the Locker gets a directory, the Store's prefix plus the key
// with '%' and '/' percent-escaped plus "/". In it:
//
//   - holder: the lock is held while this key exists. Its value is the
//     holder's token, a NUL byte, the sequence of the call that set it (see
//     below), a NUL byte, and the TTL it was given in milliseconds, which
//     refusals report as Wait. One fixed name per lock key, so that etcd's
//     index does not grow with every acquisition until the next
//     compaction, and a grant compares one key, not a range. A record key
//     (see Idempotency records) keeps its claim here as a lock, and then
//     its finished record, a value that starts with a NUL byte.
//   - holder/<token>: a reader, a shared holder under no limit (see
//     stores.SharedStore), and holder/NUL<slot>, a holder under a limit N,
//     in slot 0 to N-1 (16 hex digits, so that slots sort by number, before
//     every reader: a token has no NUL byte). Each has a holder key's
//     value, on a lease of its own TTL as a holder key's, so that each
//     expires at its own TTL. The holder key and these are one range of
//     etcd keys, so that Acquire and AcquireFair compare and read both
//     kinds with one operation each.
//   - writer/<token>: a writer waiting for the shared holders to drain. It
//     stands as long as it exists, on a lease that lasts at least
//     stores.WriterWindow from the refusal that wrote it, which etcd raises
//     to its shortest lease: it goes by itself between WriterWindow and
//     about 2.5s after the writer's last refusal with etcd's default
//     election timeout (a lease's bounds, see below), whatever the clocks of
//     the Stores. An exclusive grant to its token, or a Release by its
//     token, deletes it at once, as the Locker's withdrawal of a writer that
//     stops trying does. Its value, the window's end in Unix milliseconds,
//     serves Stores of earlier versions only.
//   - q/<token>: a fair waiter, ordered by its create revision (the queue is
//     etcd's revision order, as in concurrency.Mutex). Its value is the
//     waiter's lease, in milliseconds. Each waiter leaves a deleted name in
//     etcd's index until the next compaction, which fair use of a busy key
//     therefore needs (etcd's --auto-compaction-retention).
//
// Every owner check compares the holder's value with the caller's token, in
// the same transaction as the change it guards, so a release or refresh
// never acts on another acquisition, even one of the same Store and the
// same etcd lease (etcd issue 22082 is a concurrency.Mutex that identifies
// its owner by its session's lease alone). A token must not contain a NUL
// byte.
//
// # TTL and leases
//
// Every holder and waiter key is attached to an etcd lease that expires by
// itself; nothing is kept alive. A grant of ttl uses a lease of ttl plus an
// eighth, rounded up to whole seconds, which the Store shares between the
// calls that start early enough for the lease to outlive their start plus
// ttl (a lease's clock starts when its grant is sent, at the earliest), so
// that a lease costs one LeaseGrant per second or so and not one per lock;
// a lease requested for a call always serves it, however slow the round
// trip. Refresh moves the keys to a lease of the new TTL, and a Release
// with keep to one of keep. So a key is held at least its TTL from the
// start of the call that set it, as the Locker counts its validity, and
// outlives it by at most an eighth of it plus a second, plus the round
// trip of its lease's grant and what the call waited before sending it,
// plus etcd's expiry sweep (500ms), whether its holder lives or died; a
// leader change renews every lease, so that a key may then outlive its TTL
// by up to once more its lease. etcd raises a lease below its minimum (1.5
// x the election timeout, rounded up: 2s by default) to that minimum: a
// lock of 50ms is honoured, and held up to 2.5s if its holder dies without
// releasing it. Fair-waiter leases round the same way.
//
// Each call takes a sequence when it starts: its start in Unix
// nanoseconds, or one more than the Store's previous one, so that the
// Store's calls are numbered in the order they started. Refresh, and a
// Release with keep, act only on holder keys set by a call of the token
// with a sequence no later than theirs, compared in their transaction: a
// renewal that reaches etcd late (its reply lost, its request held in the
// network) cannot move the keys back to its own lease, which lasts from
// its earlier start, after a later renewal succeeded; the Locker confirms
// validity from the later one (see Refresh). A token's calls are meant to
// go through one Store, as the Locker's do: across Stores, their order is
// that of the clocks that numbered them.
//
// The Store remembers every lease it granted until etcd confirms it gone.
// A lease that can serve no call any more (its TTL and a second have
// passed since its grant, by the local clock) is revoked, a few at each
// new grant, rather than forgotten, since etcd may keep it longer; Close
// revokes the rest: the Store's keys go at once rather than at their TTL
// (etcd issue 17470 is a lease kept alive after its client exits; here
// none is kept alive at all).
//
// # Limits
//
// Bounds states them (see stores.Bounded), and every call refuses
// arguments beyond them with stores.ErrInvalid before any request:
//
//   - TTLs, keeps and fair leases up to MaxTTL (8e9s, about 253 years),
//     whose lease, an eighth longer, is etcd's longest; none is too short
//     (see above).
//   - Keys up to MaxKeyBytes, which follows from etcd's request size limit
//     (--max-request-bytes, 1.5 MiB by default; WithMaxRequestBytes for
//     another): a fair attempt names its key's directory 14 times in one
//     transaction, and '%' and '/' take three bytes escaped, so a key may
//     take a 42nd of a request: 35 KiB by default. Keys that together (or
//     with a token longer than 1 KiB) would make a request above the limit,
//     and more than MaxKeys keys, are refused too. etcd's refusal of a
//     request for its size, the client's refusal to send one (its
//     MaxCallSendMsgSize, which Open raises to match max-request-bytes),
//     and etcd's refusal of more operations than its --max-txn-ops (a
//     cluster below the default 128 refuses calls of many keys) are
//     stores.ErrInvalid as well: nothing was done. A reply larger than
//     the client takes (its MaxCallRecvMsgSize) comes after etcd acted,
//     and is an unknown outcome.
//   - Tokens: not empty, no NUL byte (stores.ErrInvalid; Release and
//     Refresh answer stores.ErrNotHeld for a token that starts with one,
//     as a finished record's value does: it holds no key). A token whose acquire returned
//     stores.ErrAbandoned serves no other: its abandon marks (below) make
//     every later acquire of it fail with stores.ErrInvalid, and one
//     granted before its undo landed is deleted by that undo. The Locker
//     never reuses a token.
//
// # Fences
//
// A grant's fence is the revision of the transaction that granted it times
// stores.FenceStride. etcd revisions are cluster-wide, persist across
// restarts, member replacement and compaction, and grow with every write,
// so two grants of a key (or of any keys) get revisions at least one apart
// and fences at least the stride apart. A cluster restored from a snapshot
// must be restored with etcdutl's --bump-revision (and --mark-compacted), as
// etcd's own documentation advises, or it could issue revisions again; a
// cluster that loses every member's data starts again from revision 1.
//
// # Idempotency records
//
// A record key is a lock key (stores.RecordStore): ClaimRecord is
// Acquire's transaction on its one key, with Acquire's lease, fence,
// abandon marks, undo and errors, and Release and Refresh end and extend
// the claim. FinishRecord replaces the claim by the record in one
// transaction, owner-checked as Release is: the holder key's value
// becomes a NUL byte, the token that finished it, a NUL byte, the
// retention in milliseconds, and the record's fence, fingerprint and
// response. No token starts with a NUL byte (Acquire, AcquireFair and
// ClaimRecord refuse one, Release and Refresh answer stores.ErrNotHeld for
// it), so no owner check of a lock matches a record, and a plain Acquire or AcquireShared of the key is
// refused (Wait: the retention) while it stands. A ClaimRecord refused by
// the record reads it in the same transaction: a replay is one round
// trip, a new key one for the claim and one for the finish.
//
// The record is on a lease of its retention plus an eighth of it, at most
// a minute, rounded up to seconds: records of one retention finished
// within that time share a lease, granted by a pool of its own, and etcd
// deletes them when it ends, whatever becomes of the Store that wrote
// them (Close does not revoke records' leases: they outlive it). So
// records take what the finishes of one retention put, and no more; etcd
// frees the space of deleted ones at its next compaction (etcd's
// --auto-compaction-retention), and all of them count against its
// database quota (--quota-backend-bytes, 2 GiB by default): a retention's
// worth of records, times their size, must fit it. A leader change renews
// every lease, so that a record may then stand up to once more its lease.
//
// The put of the record is a change of the holder key that the watches of
// NotifyRelease take for the claim's release: waiters claim again and
// read the record. A FinishRecord is sent again while etcd does not answer
// (see "Leader changes"); a copy that finds the record of its own token
// answers nil, as a retry does, and one that lands after its claim's
// release, expiry or another token's claim changes nothing.
//
// A record (fingerprint and response) is at most Bounds().MaxRecordBytes,
// which follows from --max-request-bytes: the request less its framing,
// for keys and tokens of up to 1 KiB each, 1498 KiB with the defaults. A
// longer key or token takes a smaller record: a FinishRecord whose request
// would exceed the limit is refused with stores.ErrInvalid before it acts.
// The longest retention is MaxTTL.
//
// # Shared and limited grants
//
// AcquireShared counts a limit without a counter, with one slot key per
// place: a caller under a limit N takes a slot below N. Its first
// transaction tries a slot picked at random (or the one this Store last
// tried for the token, so that a retry finds its own place), granted when
// that slot is free, no holder stands outside the slots below N (readers,
// holders under a larger limit) and no writer record stands. Otherwise
// the transaction reads the holders and the writer records, and the next
// tries a free slot i below k, k the largest number such that k plus the
// holders read from slot k on (readers included) is at most N, comparing
// that slot i is still free and that no holder from slot k on, or reader,
// was created since the read: at most k-1 others hold the slots below k,
// at most N-k the rest, so fewer than N hold the key at the grant, and
// each holder got in under its own limit. When every caller of a key uses
// one limit and none reads it, k is N: callers collide only when they
// take the same slot, and the one that lost reads again and tries another;
// a caller is refused only when the key has N holders or more, an
// exclusive holder or a writer record. A caller tries again until then or
// its context ends (the request timeout bounds it too). A reader (limit 0)
// compares only that the key has no exclusive holder and no writer record:
// readers that come and go never fail each other's transactions.
// ReleaseShared and RefreshShared of a limited holder act on the slot this
// Store sent for the token; when it does not hold the token (a slot set
// through another Store), they read the holders once to find the token's
// place. Every grant's fence is its revision, from the one sequence of
// every grant. Release and Refresh of a shared holder are those of a holder
// key, owner- and sequence-checked in their transaction. An Acquire or
// AcquireFair refused by shared holders puts its token's writer record in
// a second transaction, and sets Grant.SharedHeld. While a writer record
// exists, AcquireShared refuses new tokens with a Wait of WriterWindow: no
// clock is read, so a skewed clock changes nothing. A shared holder's
// delete, by release or expiry, signals the key's NotifyRelease
// subscribers, and so does the delete of a key's last writer record (a
// withdrawal, or its lease's end), so that the readers it refused come in
// at once.
//
// # Round trips and costs
//
// Acquire, Release and Refresh are one transaction each, for any number of
// keys (up to MaxKeys), plus a LeaseGrant when no shared lease fits (about
// once a second per TTL in use, which also revokes up to four spent
// leases), and a second transaction for a retried Acquire that finds its
// own grant, or for a Refresh (or Release with keep) refused, which reads
// its keys to tell a key not held from one renewed by a later call. Every
// request is a write through etcd's log, a refused acquire too. A fair
// attempt is one transaction, and a second one when its caller heads the
// queue behind other waiters; its reply holds the whole queue of the key,
// so that it grows with the waiters and the length of the key (100 waiters
// on a key of 35 KiB, every byte escaped, make a reply of about 11 MB). An
// acquire's check that its token was not abandoned (below) is one more
// comparison in its transaction, not a round trip; abandoned acquires cost
// their undos, up to 63 of them in one transaction. While etcd does not
// answer (see "Leader changes" below), a lease grant, a Release or a
// Refresh is sent again every 250ms (or twice the latest round trip, when
// longer, at most 1s), so that a fault costs up to a few more copies of these small requests per call, 8 at a time at most.
//
// # Calls, contexts and faults
//
// Every call returns as soon as its context ends (a Release may land
// after, see "Leader changes"). An acquire (plain or
// fair) runs on a context that the caller's cancellation does not end,
// bounded by the request timeout, and the caller who left gets an error
// wrapping stores.ErrAbandoned and the context's error; so does a caller
// whose acquire ran out of the request timeout with a transaction
// unanswered, so that it does not release the keys itself (a release that
// the late transaction could overtake). Once such an acquire has an answer
// or has timed out, the Store queues its undo: put an abandon mark of the
// token on each lease the acquire's transactions used, then delete what
// the acquire may have set (owner-checked). Every acquire transaction
// compares that its token has no mark, so a transaction of the acquire
// that etcd applies only after the marks (a request held in a paused
// member's socket, say) changes nothing: while its lease lives the mark
// does, and once the lease is gone a put on it fails.
//
// One goroutine per Store works through the undos, only while some are
// pending: it puts as many marks and deletes in one transaction as etcd
// takes (128 operations by default, fewer after etcd refuses them, and the
// request size), and while etcd does not answer it tries again, pausing up
// to a second between tries that failed; a try waits 250ms for the answer
// (or twice the latest round trip, when longer, at most 1s),
// and the next follows at once, and once etcd has answered none for 2s,
// each waits twice as long as the one before, up to the request timeout.
// An undo ends only when it has landed, or when
// etcd reports every lease of its acquire gone (revoked, or expired),
// after which nothing the acquire sent can hold a key: never on the local
// clock, since a leader change renews every lease. So during a partition
// the undos wait in memory (their keys and token each, no goroutine), as
// many as the acquires abandoned meanwhile; PendingUndos tells how many.
// Close waits for them, and revokes every lease meanwhile, within its
// time (see Close), and says how many may still be granted after it.
//
// A call that failed because no member could be dialled before any of its
// requests changed something never reached etcd and wraps
// stores.ErrUnreachable; any other failure leaves its outcome unknown. The
// client spreads requests over the members and moves on when one fails: a
// killed or paused member, the leader included, costs the calls in flight
// on it and an election, and no lock is lost or granted twice. A holder
// cut off from etcd keeps its keys until their lease ends, at least its
// TTL from its call's start, and its Refresh and Release then answer
// stores.ErrNotHeld, never acting on another's grant: every write compares
// the holder's token in its own transaction, so a Refresh racing a Release
// never sets a key again after it.
//
// # Leader changes
//
// A request that a follower forwards to the leader as the leader dies is
// never answered: etcd drops it, and the follower waits for its own
// request timeout (7s by default) or the client's. So the Store does not
// wait on one copy of an idempotent request for long: a lease grant that
// etcd has not answered within 250ms (or twice the latest request's round
// trip, when longer, at most 1s: a distant cluster gets each request once)
// is joined by another, and the calls that share the pool's lease
// take whichever answers first (a grant answered after another took its
// place is revoked at once); a Release or a Refresh, which compares the
// owner (and the sequence) in its transaction and so may land twice with
// no other effect, is sent again on the same bound while etcd does not answer
// (its lease, when it needs one, is got before its first copy: the bound is
// for the transaction alone), the earlier copies still counting, and at once after a transient failure
// (no leader yet). A refusal settles such a call only once its earlier
// copies have answered too, since one of them may have ended the grant
// first. A Release goes on after its caller left, up to the request
// timeout, so that its key is free as soon as the new leader answers, and
// not at its TTL; 16 at most at once: beyond, a Release whose caller
// leaves goes to the undo queue (its owner-checked deletes), or, with a
// keep, is given up (its keys keep their TTL). An acquire's transaction is not sent twice (a late copy
// could take a key again after its release): an acquire caught by the
// kill costs its caller's wait, or is abandoned, and its undo follows the
// same bounds. With three members and etcd's default election timeout
// (1s), the leader killed under steady load on one hot key (two Stores,
// Lockers with a wait of 1s): both sell again 1-2.1s after the kill, as
// soon as the election (1-2s here) is over and the waits caught by the
// kill have ended (TestLeaderKilledEveryInstanceSellsAgain). It took 6.5s
// when every acquire of a Store waited behind one grant caught by the
// kill, until the request timeout. A paused (SIGSTOP) leader costs more:
// its connection stays up, so the client goes on sending it a share of the
// requests, and an acquire sent there waits for its caller's context; in
// the same test with the leader paused, the instances sold again 1.5-4.5s
// after the pause (6.5-13s before).
//
// # Start-up
//
// Open fails, naming the endpoints, unless a member answers within the dial
// timeout (default 5s) or its context's deadline; with connect=lazy in the
// URL it starts anyway: the client connects in the background, and calls
// fail with store errors until a member answers, then work with no restart.
// New sends nothing.
package etcdstore
