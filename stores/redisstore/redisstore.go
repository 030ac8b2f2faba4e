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
// An uncontended lock costs Redis 8 commands: the acquire's EVALSHA, EXISTS
// of the token's abandon mark (see Timeouts), SET NX PX, TIME and SET ... GET
// of the fence key (a second SET only when the fence runs ahead of the
// clock), and the release's EVALSHA, GET and DEL.
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
// waiting key follows the same rules with ":waiting" for ":fence". So a
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

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/storeargs"
	"github.com/reqlock/reqlock/stores"
)

// args checks the arguments of Store's methods; its errors start "redisstore:".
const args storeargs.Checker = "redisstore"

// DefaultFenceRetention is how long a fence key outlives the last grant of its
// lock key unless WithFenceRetention says otherwise.
const DefaultFenceRetention = 24 * time.Hour

// MinFenceRetention is the shortest fence retention WithFenceRetention
// accepts.
const MinFenceRetention = time.Minute

// ErrUnexpectedReply means a script answered in a shape this package does not
// expect, such as a key name clash with data of another program.
var ErrUnexpectedReply = errors.New("redisstore: unexpected reply from Redis")

var (
	//go:embed lib.lua
	libSrc string
	//go:embed acquire.lua
	acquireSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed refresh.lua
	refreshSrc string
	//go:embed acquire_all.lua
	acquireAllSrc string
	//go:embed release_all.lua
	releaseAllSrc string
	//go:embed mark_abandoned.lua
	markAbandonedSrc string
	//go:embed refresh_all.lua
	refreshAllSrc string

	acquireScript       = newScript(withLib(acquireSrc))
	acquireAllScript    = newScript(withLib(acquireAllSrc))
	releaseScript       = newScript(releaseSrc)
	releaseAllScript    = newScript(releaseAllSrc)
	refreshScript       = newScript(refreshSrc)
	refreshAllScript    = newScript(refreshAllSrc)
	markAbandonedScript = newScript(markAbandonedSrc)
)

// withLib prepends the helpers of lib.lua to a script's source: Redis has no
// include, and one definition keeps every script's fences and waiting marks
// alike.
func withLib(src string) string { return libSrc + src }

// allScripts lists every script of the package, for Load.
func allScripts() []*Script {
	return []*Script{
		acquireScript, releaseScript, refreshScript,
		fairAcquireScript, fairLeaveScript,
		acquireAllScript, releaseAllScript, refreshAllScript,
		markAbandonedScript,
	}
}

// Store is a stores.Store on Redis, and a stores.Notifier and
// stores.FairStore. It is safe
// for concurrent use. Once NotifyRelease has been called it owns a pub/sub
// connection and a goroutine until Close.
type Store struct {
	driver             Driver
	routing            Routing // how the client spreads keys; see checkColocated
	fenceRetention     time.Duration
	clientTimeoutsOnly bool
	closeClient        func() error // closes the client Open made, last in Close

	mu     sync.Mutex // guards notify
	notify notifier
}

var (
	_ stores.Store     = (*Store)(nil)
	_ stores.Notifier  = (*Store)(nil)
	_ stores.FairStore = (*Store)(nil)
)

// Option configures a Store.
type Option func(*Store)

// WithFenceRetention sets how long a fence key outlives the last grant of its
// lock key. Default DefaultFenceRetention; at least MinFenceRetention.
func WithFenceRetention(d time.Duration) Option {
	return func(s *Store) { s.fenceRetention = d }
}

// WithClientTimeoutsOnly accepts a client without ContextTimeoutEnabled:
// each Redis call is then bounded by the client's own ReadTimeout and
// WriteTimeout only, not by the lock wait's deadline.
func WithClientTimeoutsOnly() Option {
	return func(s *Store) { s.clientTimeoutsOnly = true }
}

// New returns a Store over client: a *redis.Client, *redis.ClusterClient,
// *redis.Ring, redis.UniversalClient or Sentinel failover client. It starts
// nothing: the pub/sub connection for NotifyRelease opens on first use. It
// returns
// an error wrapping stores.ErrInvalid when client is nil, an option is
// invalid, or client ignores context deadlines (see Timeouts in the package
// documentation).
func New(client redis.Scripter, opts ...Option) (*Store, error) {
	if isNil(client) {
		return nil, fmt.Errorf("%w: redisstore: client is nil", stores.ErrInvalid)
	}
	s, err := NewWithDriver(newGoRedis(client), opts...)
	if err != nil {
		return nil, err
	}
	if enabled, known := contextTimeoutEnabled(client); known && !enabled && !s.clientTimeoutsOnly {
		return nil, fmt.Errorf("%w: redisstore: the go-redis client ignores context deadlines, so a stalled Redis "+
			"would hold requests past their lock wait; set ContextTimeoutEnabled: true in its options "+
			"(or pass redisstore.WithClientTimeoutsOnly() to accept this)", stores.ErrInvalid)
	}
	return s, nil
}

// Load caches the store's scripts in Redis with SCRIPT LOAD, so that even the
// first operation after start-up takes one round trip. It is optional: an
// uncached script costs one extra round trip (EVALSHA, then EVAL). A cluster
// client loads them on every node. It returns the client's error.
func (s *Store) Load(ctx context.Context) error {
	return s.driver.Load(ctx, allScripts())
}

// Acquire sets every key to token for ttl when none is held by another
// token, and issues each key its next fence, in one script and one round trip
// (see Fencing in the package documentation). When a key is held it sets
// nothing and returns a Grant with OK false, Held the index of the first held
// key and Wait its remaining TTL. A key that already holds token (a retried
// call whose reply was lost) is granted again with a fresh fence and TTL.
//
// keys must be distinct and sorted. With a *redis.ClusterClient several keys
// must all hash to one slot (see Redis Cluster in the package documentation);
// Acquire checks that before it sends anything.
//
// It returns ctx.Err() as soon as ctx is cancelled, even while Redis has not
// answered (go-redis itself honours only deadlines); the script then goes on
// in the background, bounded by ctx's deadline, and a grant it makes is
// released, owner-checked, once it returns. AcquireFair does the same.
//
// It returns an error wrapping stores.ErrInvalid for no keys, an empty,
// duplicate or unsorted key, or a non-positive ttl; one wrapping ErrCrossSlot,
// and so stores.ErrInvalid, when the keys span Cluster slots (or Ring
// shards); the client's error, wrapped with stores.ErrUnreachable when the
// call never reached Redis (no connection could be made); and ctx.Err()
// without acting when ctx has ended.
func (s *Store) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return stores.Grant{}, err
	}
	script, scriptKeys := acquireScript, []string{keys[0], fenceKey(keys[0]), waitingKey(keys[0]), abandonKey(keys[0], token)}
	if len(keys) > 1 {
		if err := s.checkColocated(keys, true); err != nil {
			return stores.Grant{}, err
		}
		script, scriptKeys = acquireAllScript, append(withSiblingKeys(keys, fenceKey, waitingKey), abandonKey(keys[0], token))
	}
	call := &scriptCall{store: s, script: script, keys: scriptKeys,
		args: []any{token, milliseconds(ttl), s.fenceRetention.Milliseconds(), stores.FenceStride},
		undo: undoRelease, undoKeys: keys, undoToken: token, ttl: ttl}
	r, err := call.run(ctx)
	if err != nil {
		return stores.Grant{}, s.mapCrossSlot(err, keys, true)
	}
	reply := r.Ints
	switch {
	case len(reply) == len(keys)+1 && reply[0] == 1:
		return stores.Grant{OK: true, Fences: reply[1:]}, nil
	case len(keys) == 1 && len(reply) == 2 && reply[0] == 0:
		return stores.Grant{Wait: holderTTL(reply[1])}, nil
	case len(keys) > 1 && len(reply) == 3 && reply[0] == 0 && reply[1] >= 0 && reply[1] < int64(len(keys)):
		return stores.Grant{Held: int(reply[1]), Wait: holderTTL(reply[2])}, nil
	}
	return stores.Grant{}, fmt.Errorf("%w: acquire %q answered %v", ErrUnexpectedReply, keys, reply)
}

// Release ends token's grant on every key that holds it, in one script and
// one round trip. With keep zero or negative it deletes the key and, when a
// caller was refused it meanwhile (see Release notification in the package
// documentation), publishes the release on the channel named like the key; with keep
// positive it sets the key's TTL to keep instead and publishes nothing,
// since the key stays held until it expires (and an expiry publishes
// nothing either).
//
// It returns an error wrapping stores.ErrNotHeld, naming the keys, when some
// keys were absent or held another token, after ending the grant on the
// others. A key overwritten with another type than a string (another
// program's data) counts as not held and is left as it is. keys must be
// distinct and sorted and, with a *redis.ClusterClient, in one slot. It
// returns an error wrapping stores.ErrInvalid for no keys or an empty,
// duplicate or unsorted key; one wrapping ErrCrossSlot, and so
// stores.ErrInvalid, when the keys span Cluster slots (or Ring shards); the
// client's error as is; and ctx.Err() without acting when ctx has ended.
func (s *Store) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	if err := args.CheckRelease(ctx, keys); err != nil {
		return err
	}
	if len(keys) == 1 && keep <= 0 {
		r, err := s.run(ctx, releaseScript, []string{keys[0], waitingKey(keys[0])}, token)
		if err != nil {
			return s.mapCrossSlot(err, keys, false)
		}
		if r.Ints != nil {
			return fmt.Errorf("%w: release %q answered %v", ErrUnexpectedReply, keys, r.Ints)
		}
		if r.Int == 0 {
			return fmt.Errorf("%w: %q", stores.ErrNotHeld, keys[0])
		}
		return nil
	}
	if err := s.checkColocated(keys, false); err != nil {
		return err
	}
	var keepMS int64
	if keep > 0 {
		keepMS = milliseconds(keep)
	}
	r, err := s.run(ctx, releaseAllScript, withSiblingKeys(keys, waitingKey), token, keepMS)
	if err != nil {
		return s.mapCrossSlot(err, keys, false)
	}
	reply := r.Ints
	if len(reply) != len(keys) {
		return fmt.Errorf("%w: release %q answered %v", ErrUnexpectedReply, keys, reply)
	}
	var notHeld []string
	for i, r := range reply {
		if r != 1 {
			notHeld = append(notHeld, keys[i])
		}
	}
	if len(notHeld) > 0 {
		return fmt.Errorf("%w: %d of %d keys: %q", stores.ErrNotHeld, len(notHeld), len(keys), notHeld)
	}
	return nil
}

// Refresh resets the TTL of every key to ttl if each holds token, in one
// script and one round trip; when one does not, it changes nothing and
// returns an error wrapping stores.ErrNotHeld that names the first such key.
// A key overwritten with another type than a string counts as not held.
// keys must be distinct and sorted and, with a *redis.ClusterClient, in one
// slot. It returns an error wrapping stores.ErrInvalid for no keys, an empty,
// duplicate or unsorted key, or a non-positive ttl; one wrapping
// ErrCrossSlot, and so stores.ErrInvalid, when the keys span Cluster slots
// (or Ring shards); the client's error as is; and ctx.Err() without acting
// when ctx has ended.
func (s *Store) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return err
	}
	// Cancel-aware (see scriptCall.run): a waiter renewing a handed-off
	// grant stops when its client leaves. A renewal left in flight needs
	// no undo: its outcome is unknown to the Locker, which trusts the
	// shorter of the two validities.
	refresh := func(script *Script, keys []string) (int64, error) {
		call := &scriptCall{store: s, script: script, keys: keys,
			args: []any{token, milliseconds(ttl)}}
		reply, err := call.run(ctx)
		if err != nil {
			return 0, err
		}
		if reply.Ints != nil {
			return 0, fmt.Errorf("%w: refresh %q answered %v", ErrUnexpectedReply, keys, reply.Ints)
		}
		return reply.Int, nil
	}
	if len(keys) == 1 {
		n, err := refresh(refreshScript, keys)
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("%w: %q", stores.ErrNotHeld, keys[0])
		}
		return nil
	}
	if err := s.checkColocated(keys, false); err != nil {
		return err
	}
	n, err := refresh(refreshAllScript, keys)
	if err != nil {
		return s.mapCrossSlot(err, keys, false)
	}
	switch {
	case n == 0:
		return nil
	case n >= 1 && n <= int64(len(keys)):
		return fmt.Errorf("%w: %q (none of the %d keys refreshed)", stores.ErrNotHeld, keys[n-1], len(keys))
	}
	return fmt.Errorf("%w: refresh %q answered %d", ErrUnexpectedReply, keys, n)
}

// withSiblingKeys returns keys followed by the keys each of names gives them,
// name by name, as the multi-key scripts take them.
func withSiblingKeys(keys []string, names ...func(string) string) []string {
	all := make([]string, len(keys), (1+len(names))*len(keys))
	copy(all, keys)
	for _, name := range names {
		for _, k := range keys {
			all = append(all, name(k))
		}
	}
	return all
}

// abandonKey names the mark that the Store abandoned token's acquisition of
// key (the first key of a multi-key one), in key's slot (see fenceKey).
func abandonKey(key, token string) string { return siblingKey(key, ":abandoned:"+token) }

// fenceKey names the fence key of key so that both hash to one Cluster slot.
func fenceKey(key string) string {
	if hasHashTag(key) || strings.IndexByte(key, '}') >= 0 {
		return key + ":fence"
	}
	return "{" + key + "}:fence"
}

// hasHashTag reports whether key has a Redis Cluster hash tag: a '{' followed
// later by a '}' with at least one character between.
func hasHashTag(key string) bool {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return false
	}
	return strings.IndexByte(key[open+1:], '}') > 0
}

// holderTTL turns a holder's PTTL, as a script answers it, into a Duration.
// PTTL is negative when the key has no TTL, which this store never sets:
// that counts as unknown (zero). A held key in its last millisecond answers
// 0, which counts as 1ms: it is still held, and zero would say "unknown".
func holderTTL(pttl int64) time.Duration {
	if pttl == 0 {
		return time.Millisecond
	}
	return storeargs.Millis(pttl)
}

// milliseconds rounds d up to whole milliseconds: Redis must not expire a
// lock before the holder's own clock says it has.
func milliseconds(d time.Duration) int64 {
	ms := d.Milliseconds()
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms
}

// isNil reports whether client is nil or a nil pointer in an interface.
func isNil(client redis.Scripter) bool {
	if client == nil {
		return true
	}
	v := reflect.ValueOf(client)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
