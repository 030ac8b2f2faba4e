package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/callctx"
	"github.com/reqlock/reqlock/internal/redislua"
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

var (
	//go:embed lib.lua
	libSrc string
	//go:embed grant_lib.lua
	grantLibSrc string
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
	releaseScript       = newScript(withLib(releaseSrc))
	releaseAllScript    = newScript(withLib(releaseAllSrc))
	refreshScript       = newScript(refreshSrc)
	refreshAllScript    = newScript(refreshAllSrc)
	markAbandonedScript = newScript(markAbandonedSrc)
)

// withLib prepends the helpers of lib.lua, the waiting writers' of
// internal/redislua and grant_lib.lua's (which calls both), in that order,
// to a script's source: Redis has no include, and one definition keeps
// every script's fences and waiting marks alike. It prepends only the helpers that src calls, and those they call:
// Redis runs the whole source on every call, and each helper defined costs
// the call a closure.
func withLib(src string) string { return helpers.usedBy(src) + src }

// helpers are the helpers of withLib.
var helpers = parseHelpers(libSrc + redislua.Writers + grantLibSrc)

// luaHelpers are the helper functions of a Lua library, in their order.
type luaHelpers []luaHelper

// luaHelper is one function of a Lua library: its name and its source, with
// the comment above it.
type luaHelper struct {
	name, src string
	call      *regexp.Regexp // matches a call of it
}

// parseHelpers splits src, a sequence of top-level "local function name("
// definitions each ending with a line "end", into its helpers. Lines
// outside a definition and its comment are left out.
func parseHelpers(src string) luaHelpers {
	var (
		hs      luaHelpers
		comment []string
		cur     *luaHelper
		body    []string
	)
	for _, line := range strings.SplitAfter(src, "\n") {
		switch {
		case cur != nil:
			body = append(body, line)
			if strings.TrimRight(line, "\r\n") == "end" {
				cur.src = strings.Join(body, "")
				hs = append(hs, *cur)
				cur, body = nil, nil
			}
		case strings.HasPrefix(line, "local function "):
			name := strings.TrimPrefix(line, "local function ")
			name = name[:strings.IndexByte(name, '(')]
			cur = &luaHelper{name: name, call: regexp.MustCompile(`(^|[^A-Za-z0-9_])` + name + `\(`)}
			body = append(comment, line)
			comment = nil
		case strings.HasPrefix(line, "--"):
			comment = append(comment, line)
		default:
			comment = nil
		}
	}
	if cur != nil {
		panic("redisstore: Lua helper " + cur.name + " has no closing end")
	}
	return hs
}

// usedBy returns the sources of the helpers that src calls, and of those they
// call, in the library's order.
func (hs luaHelpers) usedBy(src string) string {
	need := make([]bool, len(hs))
	callers := []string{src}
	for len(callers) > 0 {
		caller := callers[0]
		callers = callers[1:]
		for i, h := range hs {
			if !need[i] && h.call.MatchString(caller) {
				need[i] = true
				callers = append(callers, h.src)
			}
		}
	}
	var b strings.Builder
	for i, h := range hs {
		if need[i] {
			b.WriteString(h.src)
		}
	}
	return b.String()
}

// allScripts lists every script of the package, for Load.
func allScripts() []*Script {
	return []*Script{
		acquireScript, releaseScript, refreshScript,
		fairAcquireScript, fairLeaveScript,
		acquireAllScript, releaseAllScript, refreshAllScript,
		markAbandonedScript,
		sharedAcquireScript, sharedReleaseScript, sharedRefreshScript,
		claimRecordScript, finishRecordScript,
	}
}

// Store is a stores.Store on Redis, and a stores.Notifier,
// stores.FairStore, stores.SharedStore, stores.RecordStore and
// stores.Bounded (for its records' size). It is safe
// for concurrent use. Once NotifyRelease has been called it owns a pub/sub
// connection and a goroutine until Close.
type Store struct {
	driver             Driver
	routing            Routing // how the client spreads keys; see checkColocated
	fenceRetention     time.Duration
	maxRecordBytes     int // see WithMaxRecordBytes
	retentionArg       any // fenceRetention in ms, as the scripts take it, boxed once
	clientTimeoutsOnly bool
	closeClient        func() error // closes the client Open made, last in Close

	mu     sync.Mutex // guards notify
	notify notifier
}

var (
	_ stores.Store       = (*Store)(nil)
	_ stores.Notifier    = (*Store)(nil)
	_ stores.FairStore   = (*Store)(nil)
	_ stores.SharedStore = (*Store)(nil)
	_ stores.RecordStore = (*Store)(nil)
	_ stores.Bounded     = (*Store)(nil)
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
	if enabled, known := callctx.ContextTimeoutEnabled(client); known && !enabled && !s.clientTimeoutsOnly {
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
// duplicate or unsorted key, a non-positive ttl, or a token that starts
// like a record's value (see Idempotency records in the package
// documentation); one wrapping ErrCrossSlot,
// and so stores.ErrInvalid, when the keys span Cluster slots (or Ring
// shards); the client's error, wrapped with stores.ErrUnreachable when the
// call never reached Redis (no connection could be made); and ctx.Err()
// without acting when ctx has ended.
func (s *Store) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return stores.Grant{}, err
	}
	if err := checkGrantToken(token); err != nil {
		return stores.Grant{}, err
	}
	call := &scriptCall{store: s, script: acquireScript,
		undo: undoRelease, undoKeys: keys, undoToken: token, ttl: ttl}
	if len(keys) == 1 {
		// The five sibling names in one allocation, the key and argument
		// lists in the call's own arrays: see siblingNames.
		call.keys = siblingNames(append(call.keyBuf[:0], keys[0]), keys[0], token,
			":fence", ":waiting", ":abandoned:", ":writer:", ":writers")
	} else {
		if err := s.checkColocated(keys, true); err != nil {
			return stores.Grant{}, err
		}
		writerMark := func(key string) string { return writerMarkKey(key, token) }
		call.script, call.keys = acquireAllScript,
			append(withSiblingKeys(keys, fenceKey, waitingKey, writerMark, writersKey), abandonKey(keys[0], token))
	}
	call.argBuf = [len(call.argBuf)]any{token, milliseconds(ttl), s.retentionArg, strideArg, writerWindowArg}
	call.args = call.argBuf[:]
	r, err := call.run(ctx)
	if err != nil {
		return stores.Grant{}, s.mapCrossSlot(err, keys, true)
	}
	reply := r.Ints
	switch {
	case len(reply) == len(keys)+1 && reply[0] == 1:
		return stores.Grant{OK: true, Fences: reply[1:]}, nil
	case len(keys) == 1 && len(reply) == 3 && reply[0] == 0:
		return stores.Grant{Wait: holderTTL(reply[1]), SharedHeld: reply[2] == 1}, nil
	case len(keys) > 1 && len(reply) == 4 && reply[0] == 0 && reply[1] >= 0 && reply[1] < int64(len(keys)):
		return stores.Grant{Held: int(reply[1]), Wait: holderTTL(reply[2]), SharedHeld: reply[3] == 1}, nil
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
// others, and at once for a token that starts like a record's value, which
// holds no key. A key overwritten with another type than a string (another
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
	if err := notHeldByRecordToken(keys, token); err != nil {
		return err
	}
	if len(keys) == 1 && keep <= 0 {
		var keyBuf [4]string
		scriptKeys := siblingNames(append(keyBuf[:0], keys[0]), keys[0], token, ":waiting", ":writer:", ":writers")
		r, err := s.run(ctx, releaseScript, scriptKeys, token)
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
	writerMark := func(key string) string { return writerMarkKey(key, token) }
	r, err := s.run(ctx, releaseAllScript, withSiblingKeys(keys, waitingKey, writerMark, writersKey), token, keepMS)
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
// A token that starts like a record's value holds no key: ErrNotHeld.
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
	if err := notHeldByRecordToken(keys, token); err != nil {
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

// siblingNames appends to dst the sibling keys of key (see siblingKey)
// with each of suffixes, a suffix that ends in ':' followed by token:
// what abandonKey, writerMarkKey, fenceKey and the other names of this
// package give, with one allocation for all of them where each would take
// one or two.
func siblingNames(dst []string, key, token string, suffixes ...string) []string {
	open, closed := "{", "}"
	if hasHashTag(key) || strings.IndexByte(key, '}') >= 0 {
		open, closed = "", ""
	}
	size := 0
	for _, suffix := range suffixes {
		size += len(open) + len(key) + len(closed) + len(suffix)
		if strings.HasSuffix(suffix, ":") {
			size += len(token)
		}
	}
	var b strings.Builder
	b.Grow(size)
	ends := make([]int, 0, 8)
	for _, suffix := range suffixes {
		b.WriteString(open)
		b.WriteString(key)
		b.WriteString(closed)
		b.WriteString(suffix)
		if strings.HasSuffix(suffix, ":") {
			b.WriteString(token)
		}
		ends = append(ends, b.Len())
	}
	all, start := b.String(), 0
	for _, end := range ends {
		dst = append(dst, all[start:end])
		start = end
	}
	return dst
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

// Close stops the Store's notification goroutine and closes its pub/sub
// connection, if NotifyRelease ever started them, and waits for the goroutine
// to return; go-redis's own pub/sub goroutines end shortly after. It does not
// close the client, which the caller still owns and closes, unless Open made
// it: then it closes it last, and the Store's calls fail from then on. Locks, and
// Acquire, Release and Refresh, keep working; NotifyRelease returns a nil
// channel from now on, so waiters poll. Subscribers from before Close get no
// further signals; their stop functions still work. Close may be called more
// than once; later calls return nil. It returns the error of closing the
// pub/sub connection. While Redis is unreachable, Close may wait for a
// SUBSCRIBE or reconnection in progress, as long as the client's dial, read
// and write timeouts allow.
func (s *Store) Close() error {
	s.mu.Lock()
	n := &s.notify
	if n.closed {
		s.mu.Unlock()
		return nil
	}
	n.closed = true
	ps, done, exited := n.pubsub, n.done, n.exited
	clear(n.dirty)
	s.mu.Unlock()
	var err error
	if ps != nil {
		close(done)
		err = ps.Close()
		<-exited
	}
	if s.closeClient != nil {
		err = errors.Join(err, s.closeClient())
	}
	return err
}

// closed reports whether Close was called.
func (s *Store) closed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.notify.closed
}
