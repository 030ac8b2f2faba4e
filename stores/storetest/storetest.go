// Package storetest is the conformance suite every stores.Store must pass.
//
// A store's tests call Run with a Suite that makes a ready store and declares
// the optional interfaces the store implements:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Suite{New: func(t *testing.T) stores.Store { return memstore.New() }, Notify: true, Fair: true})
//	}
//
// The subtests come in groups, named by their first element: Core (one key),
// Multi (several keys in one call), Keep (releases that keep the keys held),
// Notify (stores.Notifier), Fair (stores.FairStore), Shared and Limit
// (stores.SharedStore: readers and writers, and at most N holders), Records
// (stores.RecordStore: idempotency records), Limits (keys and TTLs
// at the edges of the store's stores.Bounds) and Faults (the promises that
// must hold while the network or the server fails). A group of an
// optional interface runs when the Suite declares it; its subtests are
// skipped otherwise. Run fails at once when a declared interface is not
// implemented, and when an implemented one is not declared: a store states
// what it supports, and the suite checks all of it. One group, or one
// subtest, runs with go test's -run flag, such as -run 'TestConformance/Fair/'.
//
// # Keys
//
// Every subtest uses keys of its own, so stores that share one backend (one
// Redis server) across subtests and test binaries never collide. Every key of
// one Run shares one Redis Cluster hash tag (a "{...}" in its prefix), so all
// keys of a call, and of a subtest, hash to one slot and a store on a Redis
// Cluster can run the whole suite.
//
// # Time
//
// The expiry subtests give a lock Suite.ExpiryTTL and wait, polling, until
// it is free. The suite's other durations (10s for a lock that must not
// expire during a subtest, 1s for one that outlives a few calls, 500ms for a
// kept release, 300ms for a fair waiter's short lease) grow with a longer
// ExpiryTTL, so that none is below it.
//
// # Shared and limited grants
//
// A store that declares Shared (stores.SharedStore) runs the Shared group
// (readers together, a writer excluded and excluding, writer preference and
// its window, a waiting writer's withdrawal by Release, one record per
// waiting writer, a writer not starved by overlapping readers, owner checks,
// one fence sequence, retries, keep, signals, bounds, an abandoned acquire)
// and the Limit group (a full key, a limit never exceeded by 16 goroutines
// with holders that die and a writer, per-holder expiry, a stale holder that
// cannot touch its successor's place, a retry counted once, each caller
// admitted under its own limit). An exclusive probe of a shared key records
// a waiting writer, so these subtests probe with AcquireShared.
//
// # Idempotency records
//
// A store that declares Records (stores.RecordStore) runs the Records group:
// a finished record answers every later claim byte for byte (binary bodies,
// empty ones, and records of the store's MaxRecordBytes, or 8 MiB) and no
// Release or Refresh touches it; a claim is refused while another token's
// holds the key and granted again to its own token; FinishRecord is
// owner-checked (another token, an expired claim, a released one) and
// changes nothing then, and a retry of it answers nil; a record is kept for
// its retention and gone after it; a released claim leaves no record;
// claims' fences follow Acquire's; records and retentions out of the
// Bounds are refused with ErrInvalid before the store acts; of 16
// concurrent claimers exactly one finishes and the others read its record;
// a Notifier signals a finish. With Proxied, an abandoned claim (its reply
// lost or late) leaves no claim, a finish whose reply is lost leaves the
// record or the claim (never both, never two records), and a finish that
// lands late, or from a claimer paused past its TTL, cannot finish over a
// newer claim.
//
// # Faults
//
// A store with a network between it and its server gives the suite
// Suite.Proxied: a store whose connections go through faultproxy proxies.
// The Faults group then pauses, slows, blackholes and cuts its servers,
// and checks, with stores that reach the servers directly:
//
//   - an abandoned acquire (its reply lost, its reply late, the server
//     paused past the call's wait, its connection cut after the request
//     while new connections are refused, its request held up in the
//     network past the call and past the store's own Suite.CallLimit, to
//     arrive after the undo sent on another connection) returns soon after its context
//     ends, never claims with ErrUnreachable that it did not reach the
//     server, and leaves no grant once the fault heals: the key is free
//     within 3s and stays free, although the acquire asked for a TTL of 10s
//     (at least 5s on a store with a shorter MaxTTL). The store cleans up
//     after an acquire it failed with ErrAbandoned; after any other failure
//     the suite releases the keys at once, as the Locker does, and once
//     more after the fault heals if that release did not land: the store
//     must not let the acquire land after the release;
//   - a holder cut off from its server keeps the key for its TTL at least,
//     counted from before its Acquire, so that nobody else is granted it
//     while the holder may believe it holds it, and the key then comes free
//     without the holder; with a short TTL and with the store's MaxTTL;
//   - a stale holder (paused past its TTL, or past the store's MaxTTL, such
//     as a session that expired meanwhile) can neither Refresh nor Release
//     the next holder's grant: both answer ErrNotHeld, never nil;
//   - a Refresh racing the grant's Release, or abandoned just before it,
//     never sets the key again once the Release has returned;
//   - a Refresh held up in the network that lands after a later Refresh of
//     the grant does not shorten the TTL the later one gave the key.
//
// A store that declares Shared too runs the shared cases: an abandoned
// AcquireShared (its reply lost, late, or its connection cut after the
// request that carries the key) leaves no holder once the fault heals, and
// a holder paused past its TTL can neither release nor renew the place of
// the holder that took it since.
//
// A store with no network (InProcess) runs the race subtests alone. The
// Limits group runs on every store: long random keys (1 KB and 600 KB, alone
// and with a short key) and TTLs, keeps and fair leases of 1ns and
// math.MaxInt64 are honoured within the store's stores.Bounds and refused
// with ErrInvalid beyond them, with nothing changed and the store still
// serving other keys. The suite's own TTLs stay within the store's MaxTTL.
//
// # Notification
//
// A store that declares Notify must hand the suite a non-nil channel, may
// subscribe asynchronously (the suite releases until a first signal shows
// the subscription is live), and must deliver its signals in release order
// (the suite waits for a signal on a fresh key to know that every earlier
// signal has been delivered). Before each release it expects a signal from,
// the suite has a waiter refused the key, since a store may skip the signal
// of a release no caller was refused (see stores.Notifier). The suite
// checks that no signal arrives where
// none is due (another key, a stopped subscription, a release that keeps its
// keys), so a store whose signals are spurious fails those subtests. While
// fair waiters queue for a key, the suite expects a signal only for the
// waiter whose turn came, as stores.Notifier allows.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// Suite describes the store under test.
type Suite struct {
	// New returns a ready store. Run calls it once per subtest, and once
	// more to check the declared capabilities.
	New func(t *testing.T) stores.Store

	// Notify declares that the store implements stores.Notifier.
	Notify bool

	// Fair declares that the store implements stores.FairStore.
	Fair bool

	// Shared declares that the store implements stores.SharedStore: the
	// Shared and Limit groups run.
	Shared bool

	// Records declares that the store implements stores.RecordStore: the
	// Records group runs.
	Records bool

	// ExpiryTTL is the TTL the expiry subtests give a lock: the shortest
	// the store honours. Default 50ms.
	ExpiryTTL time.Duration

	// WaitUnknown declares that a refusal's Wait may be zero, which the
	// contract allows when the store does not know how long the holder
	// keeps the key. A non-zero Wait must still be within bounds.
	WaitUnknown bool

	// Proxied returns a store on the backend of New's stores whose every
	// connection to its servers goes through the proxies it returns, one
	// per server, each made with faultproxy.New in front of its server.
	// The Faults group injects faults on them and checks the store's
	// promises with stores from New, which reach the servers directly.
	// Required unless InProcess.
	Proxied func(t *testing.T) (stores.Store, []*faultproxy.Proxy)

	// InProcess declares that no network lies between the store and what
	// holds its locks (memory, a local file system): the Faults group runs
	// its subtests that need no proxy, and Proxied must be nil.
	InProcess bool

	// CallLimit is the longest the store waits on its own for the answer
	// to a call whose caller has left (its request timeout, as configured
	// for Proxied's store); zero when the caller's context alone bounds a
	// call. The Faults group holds an acquire's request back for longer.
	CallLimit time.Duration
}

// defaultExpiryTTL is the ExpiryTTL of a Suite that leaves it zero.
const defaultExpiryTTL = 50 * time.Millisecond

// Durations of the suite for the default ExpiryTTL. A longer ExpiryTTL
// lengthens them, so that no duration the suite gives a store is below it;
// see newEnv.
const (
	// longTTL outlives every subtest, so a lock given it never expires
	// during one.
	longTTL = 10 * time.Second

	// shortTTL keeps a lock held through the few calls of a subtest, and
	// is far enough below longTTL to tell the two apart by a holder's
	// remaining TTL.
	shortTTL = time.Second

	// keepTTL is the keep of the subtests that watch kept keys expire: long
	// enough to see them still held right after the release, short enough
	// to wait for.
	keepTTL = 500 * time.Millisecond

	// shortLease lapses within a fair subtest, so a waiter that stops
	// calling is dropped.
	shortLease = 300 * time.Millisecond

	// expiryLimit bounds every wait for a lock or lease to expire, past its
	// TTL.
	expiryLimit = 5 * time.Second

	// expiryEarly is how much sooner than its TTL a lock may be seen free,
	// for the clocks of the test and of the store.
	expiryEarly = 10 * time.Millisecond
)

// capability is a set of optional interfaces a subtest needs.
type capability uint8

const (
	needNotify  capability = 1 << iota // stores.Notifier
	needFair                           // stores.FairStore
	needProxy                          // Suite.Proxied: a network to fail
	needShared                         // stores.SharedStore
	needRecords                        // stores.RecordStore
)

// String names the interfaces of c.
func (c capability) String() string {
	var names []string
	if c&needNotify != 0 {
		names = append(names, "Notify (stores.Notifier)")
	}
	if c&needFair != 0 {
		names = append(names, "Fair (stores.FairStore)")
	}
	if c&needShared != 0 {
		names = append(names, "Shared (stores.SharedStore)")
	}
	if c&needRecords != 0 {
		names = append(names, "Records (stores.RecordStore)")
	}
	if c&needProxy != 0 {
		names = append(names, "Proxied (a network between the store and its server; the store is InProcess)")
	}
	return strings.Join(names, " and ")
}

// subtest is one case of the suite.
type subtest struct {
	name  string
	needs capability // skipped unless the Suite declares all of them
	run   func(t *testing.T, e *env)
}

// env is what a subtest works with: the store under test as each interface
// it declares, its keys, and the suite's durations.
type env struct {
	s  stores.Store
	n  stores.Notifier    // nil unless the Suite declares Notify
	f  stores.FairStore   // nil unless the Suite declares Fair
	sh stores.SharedStore // nil unless the Suite declares Shared
	rs stores.RecordStore // nil unless the Suite declares Records

	prefix string // of every key of the subtest

	expiry     time.Duration // Suite.ExpiryTTL
	short      time.Duration // shortTTL or longer
	long       time.Duration // longTTL or longer
	keep       time.Duration // keepTTL or longer
	shortLease time.Duration // shortLease or longer

	waitUnknown bool // Suite.WaitUnknown

	random     string                                                 // the random part of prefix
	tag        string                                                 // the run's hash tag
	callLimit  time.Duration                                          // Suite.CallLimit
	bounds     stores.Bounds                                          // the store's, when it is stores.Bounded
	newProxied func(t *testing.T) (stores.Store, []*faultproxy.Proxy) // Suite.Proxied
}

// waitIn reports whether a refusal's Wait is in (lo, hi], or zero on a store
// that declared WaitUnknown.
func (e *env) waitIn(w, lo, hi time.Duration) bool {
	return (w > lo && w <= hi) || (e.waitUnknown && w == 0)
}

// Run runs the conformance suite as subtests of t, grouped as the package
// documentation describes. It fails without running any when s.New is nil,
// when s.ExpiryTTL is negative, or when the store from s.New does not
// implement what s declares or implements an optional interface s does not
// declare.
func Run(t *testing.T, s Suite) {
	t.Helper()
	if s.New == nil {
		t.Fatal("storetest: Suite.New is nil")
	}
	declared, bounds := checkCapabilities(t, s)
	switch {
	case s.ExpiryTTL < 0:
		t.Fatalf("storetest: Suite.ExpiryTTL %v is negative", s.ExpiryTTL)
	case s.ExpiryTTL == 0:
		s.ExpiryTTL = max(defaultExpiryTTL, bounds.MinTTL)
	case s.ExpiryTTL < bounds.MinTTL:
		t.Fatalf("storetest: Suite.ExpiryTTL %v is below the store's MinTTL %v", s.ExpiryTTL, bounds.MinTTL)
	}

	tag := randomHex(6) // the hash tag of every key of this run
	groups := []struct {
		name  string
		tests []subtest
	}{
		{"Core", coreTests},
		{"Multi", multiTests},
		{"Keep", keepTests},
		{"Notify", notifyTests},
		{"Fair", fairTests},
		{"Shared", sharedTests},
		{"Limit", limitedTests},
		{"Records", recordTests},
		{"Limits", limitTests},
		{"Faults", faultTests},
	}
	for _, g := range groups {
		for _, c := range g.tests {
			t.Run(g.name+"/"+c.name, func(t *testing.T) {
				if missing := c.needs &^ declared; missing != 0 {
					t.Skipf("the Suite does not declare %v", missing)
				}
				c.run(t, newEnv(t, s, tag))
			})
		}
	}
}

// checkCapabilities fails t unless the store from s.New implements exactly
// the optional interfaces s declares, and either is InProcess or has
// Proxied, and states sensible Bounds. It returns the capabilities and the
// Bounds.
func checkCapabilities(t *testing.T, s Suite) (capability, stores.Bounds) {
	t.Helper()
	store := s.New(t)
	if store == nil {
		t.Fatal("storetest: Suite.New returned nil")
	}
	var bounds stores.Bounds
	if b, ok := store.(stores.Bounded); ok {
		bounds = b.Bounds()
	}
	switch {
	case bounds.MinTTL < 0 || bounds.MaxTTL < 0 || bounds.MaxKeyBytes < 0 || bounds.MaxRecordBytes < 0 || bounds.MaxRetention < 0:
		t.Fatalf("storetest: %T states negative Bounds %+v", store, bounds)
	case bounds.MaxTTL > 0 && bounds.MaxTTL < bounds.MinTTL:
		t.Fatalf("storetest: %T states a MaxTTL %v below its MinTTL %v", store, bounds.MaxTTL, bounds.MinTTL)
	case s.InProcess && s.Proxied != nil:
		t.Fatal("storetest: Suite.InProcess and Suite.Proxied are both set: a store with a network to fail is not InProcess")
	case !s.InProcess && s.Proxied == nil:
		t.Fatal("storetest: Suite.Proxied is nil: give the suite a store whose connections go through faultproxy proxies, or declare InProcess for a store with no network")
	}
	_, isNotifier := store.(stores.Notifier)
	_, isFair := store.(stores.FairStore)
	_, isShared := store.(stores.SharedStore)
	_, isRecords := store.(stores.RecordStore)
	check := func(declared, implemented bool, field, iface string) {
		t.Helper()
		switch {
		case declared && !implemented:
			t.Fatalf("storetest: Suite.%s is set, but %T does not implement %s", field, store, iface)
		case !declared && implemented:
			t.Fatalf("storetest: %T implements %s, but Suite.%s is not set: declare it, so that the suite checks it", store, iface, field)
		}
	}
	check(s.Notify, isNotifier, "Notify", "stores.Notifier")
	check(s.Fair, isFair, "Fair", "stores.FairStore")
	check(s.Shared, isShared, "Shared", "stores.SharedStore")
	check(s.Records, isRecords, "Records", "stores.RecordStore")
	var c capability
	if s.Records {
		c |= needRecords
	}
	if s.Shared {
		c |= needShared
	}
	if s.Notify {
		c |= needNotify
	}
	if s.Fair {
		c |= needFair
	}
	if s.Proxied != nil {
		c |= needProxy
	}
	return c, bounds
}

// newEnv makes the env of one subtest: a store of its own from s.New, and a
// key prefix of its own under the run's hash tag.
func newEnv(t *testing.T, s Suite, tag string) *env {
	t.Helper()
	random := randomHex(6)
	e := &env{
		s:           s.New(t),
		prefix:      keyPrefix(t, tag, random),
		random:      random,
		tag:         tag,
		expiry:      s.ExpiryTTL,
		short:       max(shortTTL, 2*s.ExpiryTTL),
		keep:        max(keepTTL, 2*s.ExpiryTTL),
		shortLease:  max(shortLease, 2*s.ExpiryTTL),
		waitUnknown: s.WaitUnknown,
		newProxied:  s.Proxied,
		callLimit:   s.CallLimit,
	}
	if e.s == nil {
		t.Fatal("storetest: Suite.New returned nil")
	}
	if b, ok := e.s.(stores.Bounded); ok {
		e.bounds = b.Bounds()
	}
	e.long = max(longTTL, 10*e.short)
	if m := e.bounds.MaxTTL; m > 0 && e.long > m {
		// A store that keeps keys for a bounded time (a session) gets its
		// longest.
		e.long = m
	}
	switch {
	case e.long < 2*e.short:
		t.Fatalf("storetest: the store's MaxTTL %v is below twice the suite's short TTL %v (2 x ExpiryTTL, at least %v)", e.bounds.MaxTTL, e.short, shortTTL)
	case s.Proxied != nil && e.long < minFaultTTL:
		t.Fatalf("storetest: the store's MaxTTL %v is below the %v the Faults group needs to tell a grant left to its TTL from one cleaned up", e.bounds.MaxTTL, minFaultTTL)
	}
	var ok bool
	if s.Notify {
		if e.n, ok = e.s.(stores.Notifier); !ok {
			t.Fatalf("%T from Suite.New does not implement stores.Notifier", e.s)
		}
	}
	if s.Fair {
		if e.f, ok = e.s.(stores.FairStore); !ok {
			t.Fatalf("%T from Suite.New does not implement stores.FairStore", e.s)
		}
	}
	if s.Shared {
		if e.sh, ok = e.s.(stores.SharedStore); !ok {
			t.Fatalf("%T from Suite.New does not implement stores.SharedStore", e.s)
		}
	}
	if s.Records {
		if e.rs, ok = e.s.(stores.RecordStore); !ok {
			t.Fatalf("%T from Suite.New does not implement stores.RecordStore", e.s)
		}
	}
	return e
}

// keyPrefix returns the key prefix of one subtest: the run's hash tag, the
// subtest's name without braces (so that the tag stays the only one) and a
// random suffix.
func keyPrefix(t *testing.T, tag, random string) string {
	name := strings.Map(func(r rune) rune {
		if r == '{' || r == '}' || r == ' ' {
			return '_'
		}
		return r
	}, t.Name())
	return "storetest:{" + tag + "}:" + name + ":" + random + ":"
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// key returns the key of the subtest called name.
func (e *env) key(name string) string { return e.prefix + name }

// keys returns the keys of the subtest called names, sorted, as Acquire
// wants them.
func (e *env) keys(names ...string) []string {
	keys := make([]string, len(names))
	for i, n := range names {
		keys[i] = e.key(n)
	}
	slices.Sort(keys)
	return keys
}

// keySets returns a set of one key and a set of three, named after prefix,
// for the subtests that check a rule on both: a store may take another path
// for one key.
func (e *env) keySets(prefix string) [][]string {
	return [][]string{e.keys(prefix + "1"), e.keys(prefix+"a", prefix+"b", prefix+"c")}
}

// acquire calls Acquire and checks the shape of its grant: a fence per key
// when granted, no fences and the index of a key when refused.
func (e *env) acquire(t *testing.T, keys []string, token string, ttl time.Duration) stores.Grant {
	t.Helper()
	g, err := e.s.Acquire(t.Context(), keys, token, ttl)
	if err != nil {
		t.Fatalf("Acquire(%s, %q): %v", keysForMessage(keys), token, err)
	}
	checkGrant(t, g, len(keys), "Acquire("+keysForMessage(keys)+")")
	return g
}

// checkGrant fails the test unless g has the shape of a grant of n keys: n
// fences when granted; no fences and Held in [0, n) when refused.
func checkGrant(t *testing.T, g stores.Grant, n int, what string) {
	t.Helper()
	if g.OK && len(g.Fences) != n {
		t.Fatalf("%s: granted with fences %v, want %d", what, g.Fences, n)
	}
	if !g.OK && g.Fences != nil {
		t.Fatalf("%s: refused with fences %v, want nil", what, g.Fences)
	}
	if !g.OK && (g.Held < 0 || g.Held >= n) {
		t.Fatalf("%s: refused with Held %d, want the index of one of the %d keys", what, g.Held, n)
	}
}

// mustAcquire calls Acquire and fails the test unless it grants.
func (e *env) mustAcquire(t *testing.T, keys []string, token string, ttl time.Duration) stores.Grant {
	t.Helper()
	g := e.acquire(t, keys, token, ttl)
	if !g.OK {
		t.Fatalf("Acquire(%s, %q) refused: %+v", keysForMessage(keys), token, g)
	}
	return g
}

// mustRelease releases keys with keep 0 and fails the test on an error.
func (e *env) mustRelease(t *testing.T, keys []string, token string) {
	t.Helper()
	if err := e.s.Release(t.Context(), keys, token, 0); err != nil {
		t.Fatalf("Release(%s, %q): %v", keysForMessage(keys), token, err)
	}
}

// expectNotHeld fails the test unless err wraps stores.ErrNotHeld.
func expectNotHeld(t *testing.T, err error, what string) {
	t.Helper()
	if !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("%s: got %v, want stores.ErrNotHeld", what, err)
	}
}

// pollAcquire retries Acquire until it is granted or limit passes.
func (e *env) pollAcquire(t *testing.T, keys []string, token string, ttl, limit time.Duration) stores.Grant {
	t.Helper()
	deadline := time.Now().Add(limit)
	ticker := time.NewTicker(5 * time.Millisecond)
	defer ticker.Stop()
	for {
		if g := e.acquire(t, keys, token, ttl); g.OK {
			return g
		}
		if time.Now().After(deadline) {
			t.Fatalf("Acquire(%s) not granted within %v", keysForMessage(keys), limit)
		}
		<-ticker.C
	}
}

// probe reports whether key is held, and the holder's remaining TTL (the
// Wait of a refusal), by trying to acquire it with a token of its own, which
// it releases at once when granted.
func (e *env) probe(t *testing.T, key string) (held bool, ttl time.Duration) {
	t.Helper()
	g := e.acquire(t, []string{key}, "probe", e.long)
	if !g.OK {
		return true, g.Wait
	}
	e.mustRelease(t, []string{key}, "probe")
	return false, 0
}

// expectHeld fails the test unless every key is held, with a remaining TTL
// in (0, atMost].
func (e *env) expectHeld(t *testing.T, keys []string, atMost time.Duration, what string) {
	t.Helper()
	for _, k := range keys {
		held, ttl := e.probe(t, k)
		if !held {
			t.Fatalf("%s: %q is free, want held", what, k)
		}
		if ttl <= 0 || ttl > atMost {
			t.Fatalf("%s: %q has TTL %v, want in (0, %v]", what, k, ttl, atMost)
		}
	}
}

// expectFree fails the test unless every key is free.
func (e *env) expectFree(t *testing.T, keys []string, what string) {
	t.Helper()
	for _, k := range keys {
		if held, ttl := e.probe(t, k); held {
			t.Fatalf("%s: %q is held (TTL %v), want free", what, k, ttl)
		}
	}
}

// waitFree polls until every key is free or limit passes, and returns when
// the last one was found free.
func (e *env) waitFree(t *testing.T, keys []string, limit time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(limit)
	ticker := time.NewTicker(5 * time.Millisecond)
	defer ticker.Stop()
	for _, k := range keys {
		for {
			if held, _ := e.probe(t, k); !held {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%q still held %v after it should have expired", k, limit)
			}
			<-ticker.C
		}
	}
	return time.Now()
}

// expectStride fails the test unless next, a key's fence, is at least
// stores.FenceStride above prev, the fence of the key's previous grant.
func expectStride(t *testing.T, prev, next int64, what string) {
	t.Helper()
	if next-prev < stores.FenceStride {
		t.Fatalf("%s: fence %d after %d, want at least %d (+ stores.FenceStride)", what, next, prev, prev+stores.FenceStride)
	}
}

// expectStrides applies expectStride to the fences of one grant of keys.
func expectStrides(t *testing.T, keys []string, prev, next []int64, what string) {
	t.Helper()
	for i, k := range keys {
		expectStride(t, prev[i], next[i], what+": "+k)
	}
}

// cancelled returns a context that has ended.
func cancelled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// keysForMessage lists keys for a failure message, each shortened as
// stores.KeyForMessage does, so that a 600 KB key is not printed whole.
func keysForMessage(keys []string) string {
	quoted := make([]string, len(keys))
	for i, k := range keys {
		quoted[i] = stores.KeyForMessage(k)
	}
	return "[" + strings.Join(quoted, " ") + "]"
}
