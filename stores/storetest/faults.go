package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// faultTests are the Faults subtests: the contract's promises while the
// network or the server fails, checked through Suite.Proxied's proxies with
// stores from Suite.New, which reach the server directly. Those marked
// needProxy do not run on an InProcess store, which has no network to fail.
var faultTests = []subtest{
	{name: "AbandonedAcquire/ReplyLost", needs: needProxy, run: testAbandonedReplyLost},
	{name: "AbandonedAcquire/ReplyLate", needs: needProxy, run: testAbandonedReplyLate},
	{name: "AbandonedAcquire/ServerPaused", needs: needProxy, run: testAbandonedServerPaused},
	{name: "AbandonedAcquire/CutThenRefused", needs: needProxy, run: testAbandonedCutThenRefused},
	{name: "AbandonedAcquire/LateRequest", needs: needProxy, run: testAbandonedLateRequest},
	{name: "CutOffHolderExpiresFirst", needs: needProxy, run: testCutOffHolderExpiresFirst},
	{name: "CutOffHolderExpiresFirst/MaxTTL", needs: needProxy, run: testCutOffHolderExpiresFirstMaxTTL},
	{name: "StaleHolder/PausedPastTTL", needs: needProxy, run: testStalePausedPastTTL},
	{name: "StaleHolder/PausedPastMaxTTL", needs: needProxy, run: testStalePausedPastMaxTTL},
	{name: "LateRefreshDoesNotShorten", needs: needProxy, run: testLateRefreshDoesNotShorten},
	{name: "AbandonedShared/ReplyLost", needs: needProxy | needShared, run: testAbandonedSharedReplyLost},
	{name: "AbandonedShared/ReplyLate", needs: needProxy | needShared, run: testAbandonedSharedReplyLate},
	{name: "AbandonedShared/ReplyCut", needs: needProxy | needShared, run: testAbandonedSharedReplyCut},
	{name: "StaleSharedHolder/PausedPastTTL", needs: needProxy | needShared, run: testStaleSharedPaused},
	{name: "RefreshRacingRelease", run: testRefreshRacingRelease},
	{name: "CancelledRefreshThenRelease", run: testCancelledRefreshThenRelease},
}

// Durations of the Faults group.
const (
	// abandonWait is the deadline of a call that a fault keeps unanswered.
	abandonWait = 300 * time.Millisecond

	// returnSlack is how long past its context's end a call may take to
	// return: every call returns once its context ends.
	returnSlack = time.Second

	// faultHold is how long a fault lasts after the abandoned call has
	// returned: the store's clean-up runs into the fault too.
	faultHold = 500 * time.Millisecond

	// healLimit bounds the time, after a fault heals, until a key that an
	// abandoned call may have set is free: the store cleans up after the
	// call, it does not leave the key to its TTL.
	healLimit = 3 * time.Second

	// freeFor is how long a key must stay free, probed again and again, to
	// count as free for good: a write still in flight would land within it.
	freeFor = time.Second

	// pausedTries is how often the paused-server scenario runs: a late
	// write that lands after its undo may do so in only some of the tries.
	pausedTries = 3

	// minFaultTTL is the least TTL the abandoned acquires need, so that a
	// grant left to its TTL is told apart from one cleaned up: past
	// healLimit and freeFor, with a margin.
	minFaultTTL = healLimit + freeFor + time.Second

	// longestPause bounds the pauses the suite makes: a store whose
	// MaxTTL is longer skips the subtests that pause past it.
	longestPause = 30 * time.Second
)

// backend is the proxies in front of every server of a proxied store.
type backend []*faultproxy.Proxy

func (b backend) stall(dir faultproxy.Direction) {
	for _, p := range b {
		p.Stall(dir)
	}
}

func (b backend) blackhole(dir faultproxy.Direction) {
	for _, p := range b {
		p.Blackhole(dir)
	}
}

func (b backend) delay(dir faultproxy.Direction, d time.Duration) {
	for _, p := range b {
		p.Delay(dir, d)
	}
}

func (b backend) heal() {
	for _, p := range b {
		p.Heal()
	}
}

func (b backend) refuse() {
	for _, p := range b {
		p.Refuse()
	}
}

func (b backend) cutWhen(dir faultproxy.Direction, match func([]byte) bool, forward bool) {
	for _, p := range b {
		p.CutWhen(dir, match, forward)
	}
}

func (b backend) delayWhen(dir faultproxy.Direction, match func([]byte) bool, d time.Duration) {
	for _, p := range b {
		p.DelayWhen(dir, match, d)
	}
}

// armed reports how many armed faults of every proxy wait for a chunk.
func (b backend) armed() int {
	n := 0
	for _, p := range b {
		n += p.Armed()
	}
	return n
}

// count starts counting, on every proxy, the chunks to the servers that
// carry needle, and returns a function that reports the sum.
func (b backend) count(needle string) func() int {
	counts := make([]func() int, len(b))
	for i, p := range b {
		counts[i] = p.Count(faultproxy.ToServer, []byte(needle))
	}
	return func() int {
		n := 0
		for _, c := range counts {
			n += c()
		}
		return n
	}
}

// proxied returns a store from Suite.Proxied and its backend, the store
// warmed up by a lock of a key of its own in the subtest keys' hash slot,
// so that its connection to their server is open and a fault catches the
// calls that follow, not a connection's set-up; the faults heal when the
// test ends.
func (e *env) proxied(t *testing.T) (stores.Store, backend) {
	t.Helper()
	s, proxies := e.newProxied(t)
	if s == nil || len(proxies) == 0 {
		t.Fatal("storetest: Suite.Proxied returned no store or no proxy")
	}
	b := backend(proxies)
	t.Cleanup(b.heal)
	e.warm(t, s, 1, e.short)
	return s, b
}

// warm locks and releases n keys of its own in the subtest keys' hash slot
// for ttl through s, warmCycles times, so that whatever a call of that
// shape needs before it sends its keys (a connection, a prepared statement,
// a lease) is ready, and a fault armed next catches the request that
// carries the keys.
func (e *env) warm(t *testing.T, s stores.Store, n int, ttl time.Duration) {
	t.Helper()
	for range warmCycles {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = "storetest:{" + e.tag + "}:warm:" + randomHex(8)
		}
		slices.Sort(keys)
		if g, err := s.Acquire(t.Context(), keys, "warm", ttl); err != nil || !g.OK {
			t.Fatalf("warming up the proxied store: Acquire: %+v, %v", g, err)
		}
		if err := s.Release(t.Context(), keys, "warm", 0); err != nil {
			t.Fatalf("warming up the proxied store: Release: %v", err)
		}
	}
}

// warmCycles is how many lock cycles warm runs. rueidis sends each call to
// one of its connections to a server at random (2 on 2 cores, up to 4) and
// opens a connection when a call first picks it; a call that picks one
// under a fault waits for its handshake, or fails to dial, and the fault
// catches no request. After 12 cycles (24 calls), a connection is left
// unopened with a chance of about 1 in 8 million on 2 connections, and 1
// in 250 on 4.
const warmCycles = 12

// abandoned is an Acquire that a fault left without an answer: the caller's
// side of the clean-up, which the Locker does.
type abandoned struct {
	s     stores.Store
	keys  []string
	token string
	err   error
	owed  bool // the caller owes a release: the store did not take it on
}

// abandon runs an Acquire of keys by token on s under a fault that keeps it
// unanswered, and checks that it returns soon after its context ends,
// without a grant, and without claiming that it never reached the server,
// which it may have. Then, as the Locker does after a failure whose outcome
// is unknown (neither ErrAbandoned, which the store cleans up after, nor
// ErrUnreachable, which changed nothing), it releases the keys, owner-checked,
// which the fault may defeat: see settle.
func (e *env) abandon(t *testing.T, s stores.Store, keys []string, token string, wait time.Duration) *abandoned {
	t.Helper()
	return e.abandonMaybeUnsent(t, s, keys, token, wait, nil)
}

// abandonMaybeUnsent is abandon under a fault that can never deliver a call
// late (the proxy forwards nothing it has not forwarded yet): a call that
// reached (counted by reached) nothing may rightly answer ErrUnreachable,
// since its connection broke before it was sent and no new one could be
// made. A nil reached holds every call to abandon's rule.
func (e *env) abandonMaybeUnsent(t *testing.T, s stores.Store, keys []string, token string, wait time.Duration, reached func() int) *abandoned {
	t.Helper()
	a := &abandoned{s: s, keys: keys, token: token}
	a.err = e.acquireUnanswered(t, s, keys, token, wait)
	if reached == nil || reached() > 0 {
		expectNotUnreachable(t, a.err, "Acquire under a fault, which may have reached the server")
	}
	if !errors.Is(a.err, stores.ErrAbandoned) {
		a.owed = !a.releaseOnce(t)
	}
	t.Logf("the abandoned Acquire failed with %v; a release is still owed: %v", a.err, a.owed)
	return a
}

// releaseOnce releases the abandoned acquire's keys once, bounded by
// healLimit, and reports whether the release landed (nil or ErrNotHeld).
func (a *abandoned) releaseOnce(t *testing.T) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), healLimit)
	defer cancel()
	err := a.s.Release(ctx, a.keys, a.token, 0)
	return err == nil || errors.Is(err, stores.ErrNotHeld)
}

// settle retries, once the fault has healed, a release the fault defeated:
// a release a caller owes is retried until it lands, for healLimit at most
// (a client may take a moment to reconnect).
func (a *abandoned) settle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(healLimit)
	for a.owed && !a.releaseOnce(t) {
		if time.Now().After(deadline) {
			t.Fatalf("the release owed after an Acquire that failed with %v did not land within %v of the heal", a.err, healLimit)
		}
		<-time.After(50 * time.Millisecond) // between retries of a store that reconnects
	}
}

func (e *env) acquireUnanswered(t *testing.T, s stores.Store, keys []string, token string, wait time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	start := time.Now()
	g, err := s.Acquire(ctx, keys, token, e.long)
	if took := time.Since(start); took > wait+returnSlack {
		t.Errorf("Acquire under the fault returned after %v, %v past its context's end", took, took-wait)
	}
	switch {
	case err == nil:
		t.Fatalf("Acquire under the fault: %+v with no error, want a failure", g)
	case g.OK:
		t.Fatalf("Acquire under the fault failed (%v) but reports a grant", err)
	}
	return err
}

// expectFreeForGood fails the test unless every key, probed by a store that
// reaches the server directly, is free within limit and then stays free for
// freeFor: nothing the store left in flight holds it, now or later.
func (e *env) expectFreeForGood(t *testing.T, keys []string, limit time.Duration, what string) {
	t.Helper()
	start := time.Now()
	var freeSince time.Time
	ticker := time.NewTicker(20 * time.Millisecond)
	defer ticker.Stop()
	for {
		held := ""
		for _, k := range keys {
			if h, ttl := e.probe(t, k); h {
				held = fmt.Sprintf("%q (remaining TTL %v)", k, ttl)
				break
			}
		}
		now := time.Now()
		switch {
		case held != "" && !freeSince.IsZero():
			t.Fatalf("%s: %s held again %v after it was seen free: a write left in flight landed", what, held, now.Sub(freeSince))
		case held != "" && now.Sub(start) > limit:
			t.Fatalf("%s: %s still held %v later: a grant nobody owns blocks the key", what, held, limit)
		case held == "" && freeSince.IsZero():
			freeSince = now
		case held == "" && now.Sub(freeSince) >= freeFor:
			return
		}
		<-ticker.C
	}
}

// reachedServer fails the test unless a call carrying the subtest's keys
// reached a server through the proxies: the fault caught a real call.
func reachedServer(t *testing.T, reached func() int, what string) {
	t.Helper()
	if reached() == 0 {
		t.Fatalf("%s: no request carrying the keys reached the server: the fault caught no call", what)
	}
}

// expectNotUnreachable fails the test when err wraps ErrUnreachable, which
// claims that nothing reached the server, for a call that may have reached
// it.
func expectNotUnreachable(t *testing.T, err error, what string) {
	t.Helper()
	if errors.Is(err, stores.ErrUnreachable) {
		t.Fatalf("%s: %v: ErrUnreachable says the call never reached the server, but it may have", what, err)
	}
}

// testAbandonedReplyLost: an acquire whose reply is lost, and is still lost
// when the call gives up, leaves no grant once the network heals.
func testAbandonedReplyLost(t *testing.T, e *env) {
	for _, keys := range e.keySets("k") {
		p, b := e.proxied(t)
		e.warm(t, p, len(keys), e.long)
		reached := b.count(e.needle())
		b.blackhole(faultproxy.ToClient)
		a := e.abandon(t, p, keys, "t1", abandonWait)
		<-time.After(faultHold) // the fault outlasts the call: the injected fault itself
		reachedServer(t, reached, "a lost reply")
		b.heal()
		a.settle(t)
		e.expectFreeForGood(t, keys, healLimit, "after a lost reply")
	}
}

// testAbandonedReplyLate: an acquire whose reply arrives after the call
// gave up leaves no grant.
func testAbandonedReplyLate(t *testing.T, e *env) {
	for _, keys := range e.keySets("k") {
		p, b := e.proxied(t)
		e.warm(t, p, len(keys), e.long)
		reached := b.count(e.needle())
		b.stall(faultproxy.ToClient)
		a := e.abandon(t, p, keys, "t1", abandonWait)
		<-time.After(faultHold) // the injected lateness itself
		reachedServer(t, reached, "a late reply")
		b.heal()
		a.settle(t)
		e.expectFreeForGood(t, keys, healLimit, "after a late reply")
	}
}

// testAbandonedServerPaused: an acquire sent to a server that is paused
// past the call's wait, and the store's clean-up after it, reach the server
// when it resumes, in whatever order; no grant is left behind.
func testAbandonedServerPaused(t *testing.T, e *env) {
	for i := range pausedTries {
		for _, keys := range e.keySets("k" + strconv.Itoa(i) + "-") {
			p, b := e.proxied(t)
			e.warm(t, p, len(keys), e.long)
			reached := b.count(e.needle())
			b.stall(faultproxy.Both)
			a := e.abandon(t, p, keys, "t1", abandonWait)
			<-time.After(faultHold) // the pause itself
			b.heal()
			a.settle(t)
			e.expectFreeForGood(t, keys, healLimit, fmt.Sprintf("try %d: after a paused server resumed", i))
			reachedServer(t, reached, "a paused server")
		}
	}
}

// testAbandonedCutThenRefused: an acquire whose connection is cut once the
// request has reached the server, while the server refuses new connections
// (a client retry cannot get through), leaves no grant once the server can
// be reached again; above all, the store does not claim with ErrUnreachable
// that nothing changed.
//
// A connection may also break before the request is sent (a loaded
// machine's client times its connection out, or the server closes it): the
// call then fails without reaching the server, which stages nothing, and
// ErrUnreachable is its right answer. Such a try is checked like the others
// (no grant left) and the scenario is staged again, up to stagingTries
// times.
func testAbandonedCutThenRefused(t *testing.T, e *env) {
	for _, keys := range e.keySets("k") {
		for try := 1; ; try++ {
			p, b := e.proxied(t)
			e.warm(t, p, len(keys), e.long)
			needle := e.needle()
			reached := b.count(needle)
			b.refuse()
			b.cutWhen(faultproxy.ToServer, func(chunk []byte) bool { return bytes.Contains(chunk, []byte(needle)) }, true)
			// Long enough for a client to retry and find the server refusing.
			a := e.abandonMaybeUnsent(t, p, keys, "t1", 2*time.Second, reached)
			staged := reached() > 0
			if staged || try == stagingTries {
				reachedServer(t, reached, "a connection cut after the request")
			}
			b.heal()
			a.settle(t)
			e.expectFreeForGood(t, keys, healLimit, "after a cut and refused connections")
			if staged {
				break
			}
			t.Logf("try %d: the connection broke before the request was sent; staging the cut again", try)
		}
	}
}

// stagingTries is how many times a fault scenario whose call may fail
// before the fault can catch it is staged.
const stagingTries = 3

// testAbandonedLateRequest: an acquire whose request is held up in the
// network (a lost packet until its retransmission) past the call's wait and
// past the store's own CallLimit reaches the server after the store, or the
// caller, has undone it on another connection: it must not leave a grant.
func testAbandonedLateRequest(t *testing.T, e *env) {
	hold := max(e.callLimit, abandonWait) + faultHold + time.Second
	for _, keys := range e.keySets("k") {
		p, b := e.proxied(t)
		e.warm(t, p, len(keys), e.long)
		needle := e.needle()
		reached := b.count(needle)
		start := time.Now()
		b.delayWhen(faultproxy.ToServer, func(chunk []byte) bool { return bytes.Contains(chunk, []byte(needle)) }, hold)
		a := e.abandon(t, p, keys, "t1", abandonWait)
		if b.armed() == len(b) {
			t.Fatal("the acquire's request never reached a proxy: the fault caught no call")
		}
		<-time.After(time.Until(start.Add(hold))) // the lateness itself: the request lands now
		deadline := time.Now().Add(returnSlack)
		for reached() == 0 && time.Now().Before(deadline) {
			<-time.After(10 * time.Millisecond) // until the proxy has passed the held request on
		}
		reachedServer(t, reached, "a late request")
		a.settle(t)
		e.expectFreeForGood(t, keys, healLimit, "after an acquire's request arrived late")
	}
}

// needle returns what every request for the subtest's keys carries and no
// other request does: the random part of its key prefix.
func (e *env) needle() string { return e.random }

// testCutOffHolderExpiresFirst: a holder cut off from the server keeps the
// key for its TTL at least, counted from before its Acquire, and no longer
// than the store's bound: nobody else is granted the key while the holder
// may still believe it holds it, and the key comes free without the holder.
func testCutOffHolderExpiresFirst(t *testing.T, e *env) { e.cutOffHolder(t, e.short) }

// testCutOffHolderExpiresFirstMaxTTL is testCutOffHolderExpiresFirst with
// the store's MaxTTL, which a store bounds by what its server keeps for a
// client it no longer hears (a session): a store that states a MaxTTL its
// server does not keep grants the key to another while the cut-off holder
// still believes it holds it.
func testCutOffHolderExpiresFirstMaxTTL(t *testing.T, e *env) {
	switch {
	case e.bounds.MaxTTL == 0:
		t.Skip("the store states no MaxTTL: CutOffHolderExpiresFirst covers it")
	case e.bounds.MaxTTL > longestPause:
		t.Skipf("MaxTTL %v: a cut-off past it would take too long for a test; CutOffHolderExpiresFirst covers it", e.bounds.MaxTTL)
	}
	e.cutOffHolder(t, e.bounds.MaxTTL)
}

func (e *env) cutOffHolder(t *testing.T, ttl time.Duration) {
	k := e.keys("k")
	p, b := e.proxied(t)
	start := time.Now()
	g, err := p.Acquire(t.Context(), k, "t1", ttl)
	if err != nil || !g.OK {
		t.Fatalf("Acquire through the proxy: %+v, %v", g, err)
	}
	b.blackhole(faultproxy.Both)
	next := e.pollAcquire(t, k, "t2", e.long, ttl+e.maxTTLOr(0)+expiryLimit)
	if granted := time.Since(start); granted < ttl-expiryEarly {
		t.Fatalf("another holder was granted the key %v after the cut-off holder's Acquire began, within its TTL %v", granted, ttl)
	}
	expectStride(t, g.Fences[0], next.Fences[0], "the grant after the cut-off holder's")
	b.heal()
	e.expectStaleRefused(t, p, k, "t1")
	e.expectStillHeld(t, k, "t2")
}

// testStalePausedPastTTL: a holder whose server connection pauses past its
// TTL, while another takes the key, can neither Refresh nor Release the new
// holder's grant once it resumes.
func testStalePausedPastTTL(t *testing.T, e *env) {
	e.stalePaused(t, e.expiry)
}

// testStalePausedPastMaxTTL is testStalePausedPastTTL with the store's
// longest TTL, which a store bounds by what its server keeps for a client
// it no longer hears (a session): the pause outlasts that too.
func testStalePausedPastMaxTTL(t *testing.T, e *env) {
	switch {
	case e.bounds.MaxTTL == 0:
		t.Skip("the store states no MaxTTL: StaleHolder/PausedPastTTL covers it")
	case e.bounds.MaxTTL > longestPause:
		t.Skipf("MaxTTL %v: a pause past it would take too long for a test; StaleHolder/PausedPastTTL covers it", e.bounds.MaxTTL)
	}
	e.stalePaused(t, e.bounds.MaxTTL)
}

func (e *env) stalePaused(t *testing.T, ttl time.Duration) {
	k := e.keys("k")
	p, b := e.proxied(t)
	g, err := p.Acquire(t.Context(), k, "t1", ttl)
	if err != nil || !g.OK {
		t.Fatalf("Acquire through the proxy: %+v, %v", g, err)
	}
	b.stall(faultproxy.Both)
	next := e.pollAcquire(t, k, "t2", e.long, ttl+expiryLimit)
	expectStride(t, g.Fences[0], next.Fences[0], "the grant after the paused holder's")
	b.heal()
	e.expectStaleRefused(t, p, k, "t1")
	e.expectStillHeld(t, k, "t2")
}

// expectStaleRefused fails the test unless a Refresh and a Release by the
// stale holder token through s answer ErrNotHeld, retried while they fail
// otherwise (a store may need to reconnect first), and never succeed.
func (e *env) expectStaleRefused(t *testing.T, s stores.Store, keys []string, token string) {
	t.Helper()
	expectStaleCalls(t, []staleCall{
		{"Refresh", func(ctx context.Context) error { return s.Refresh(ctx, keys, token, e.long) }},
		{"Release", func(ctx context.Context) error { return s.Release(ctx, keys, token, 0) }},
	})
}

// staleCall is a call of a stale holder, named for messages.
type staleCall struct {
	name string
	call func(ctx context.Context) error
}

// expectStaleCalls fails the test unless each call answers ErrNotHeld,
// retried while it fails otherwise (a store may need to reconnect first),
// and never succeeds.
func expectStaleCalls(t *testing.T, calls []staleCall) {
	t.Helper()
	for _, c := range calls {
		deadline := time.Now().Add(healLimit)
		for {
			ctx, cancel := context.WithTimeout(t.Context(), healLimit)
			err := c.call(ctx)
			cancel()
			if err == nil {
				t.Fatalf("%s by the stale holder succeeded: it acted on the next holder's grant", c.name)
			}
			if errors.Is(err, stores.ErrNotHeld) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s by the stale holder: %v, still not ErrNotHeld %v after the fault healed", c.name, err, healLimit)
			}
			<-time.After(50 * time.Millisecond) // between retries of a store that reconnects
		}
	}
}

// expectStillHeld fails the test unless token still holds keys: its
// Refresh succeeds and another token is refused. It then releases them.
func (e *env) expectStillHeld(t *testing.T, keys []string, token string) {
	t.Helper()
	if err := e.s.Refresh(t.Context(), keys, token, e.long); err != nil {
		t.Fatalf("Refresh by the new holder after the stale one's calls: %v", err)
	}
	if g := e.acquire(t, keys, "intruder", e.long); g.OK {
		t.Fatal("the key is free after the stale holder's calls: they released the new holder's grant")
	}
	e.mustRelease(t, keys, token)
}

// testLateRefreshDoesNotShorten: a Refresh whose request is held up in the
// network lands after a later Refresh of the same grant succeeded; the key
// keeps at least the TTL the later one gave it, counted from its start.
//
// The later Refresh overtakes the late one only on another connection: a
// client that pipelines calls on shared connections (rueidis) may send it
// on the late one's connection, behind the held request, where it waits or
// fails with it. Such a try stages nothing: it is staged again, with other
// keys, up to lateRefreshTries times.
//
// A client with one connection to each server (etcd's, ZooKeeper's) sends
// every call in order on it: a later Refresh never overtakes an earlier
// one, and the scenario cannot happen. After oneConnTries tries that staged
// nothing with one connection open through each proxy, the test is skipped.
func testLateRefreshDoesNotShorten(t *testing.T, e *env) {
	oneConn := 0
	for try := 1; ; try++ {
		staged, why, conns := e.lateRefresh(t, e.keys("k"+strconv.Itoa(try)))
		if staged {
			return
		}
		if conns <= 1 {
			if oneConn++; oneConn == oneConnTries {
				t.Skipf("the store's client sent every call on one connection to each server in %d tries (%s): "+
					"a later Refresh cannot overtake an earlier one", oneConn, why)
			}
		}
		if try == lateRefreshTries {
			t.Fatalf("in %d tries, the later Refresh never overtook the Refresh held up in the network: %s", try, why)
		}
		t.Logf("try %d: %s; staging the late Refresh again", try, why)
	}
}

// oneConnTries is how many tries of testLateRefreshDoesNotShorten stage
// nothing on one connection a server before it is skipped.
const oneConnTries = 3

// lateRefreshTries is how many times testLateRefreshDoesNotShorten is
// staged at most. rueidis spreads calls at random over its connections to
// a server (2 on 2 cores): about half the tries on one server, and on
// Redlock (3 of 5 nodes must be overtaken), stage nothing. A try that
// stages nothing takes about a second.
const lateRefreshTries = 20

// lateRefresh is one try of testLateRefreshDoesNotShorten on keys k. It
// reports false, and why, when the later Refresh did not return, granted,
// before the held one was let through, and then the most connections that
// were open through one proxy.
func (e *env) lateRefresh(t *testing.T, k []string) (staged bool, why string, conns int) {
	t.Helper()
	const (
		gap  = time.Second     // between the late Refresh's start and the later one's
		hold = 2 * time.Second // the late Refresh's lateness
	)
	p, b := e.proxied(t)
	if g, err := p.Acquire(t.Context(), k, "t1", e.long); err != nil || !g.OK {
		t.Fatalf("Acquire through the proxy: %+v, %v", g, err)
	}
	needle := e.needle()
	reached := b.count(needle)
	b.delayWhen(faultproxy.ToServer, func(chunk []byte) bool { return bytes.Contains(chunk, []byte(needle)) }, hold)
	ctx, cancel := context.WithTimeout(t.Context(), abandonWait)
	lateStart := time.Now()
	late := p.Refresh(ctx, k, "t1", e.long)
	cancel()
	t.Logf("the Refresh held up in the network returned %v", late)
	<-time.After(gap - abandonWait) // the gap itself
	laterStart := time.Now()
	err := p.Refresh(t.Context(), k, "t1", e.long)
	if overtook := time.Since(lateStart) < hold; err != nil || !overtook {
		for _, proxy := range b {
			conns = max(conns, proxy.Conns())
		}
		b.heal()
		e.mustRelease(t, k, "t1")
		return false, fmt.Sprintf("the later Refresh returned %v after %v, the held one being let through after %v",
			err, time.Since(laterStart).Round(time.Millisecond), hold-gap), conns
	}
	<-time.After(time.Until(lateStart.Add(hold))) // the lateness itself
	deadline := time.Now().Add(returnSlack)
	for reached() < 2 && time.Now().Before(deadline) {
		<-time.After(10 * time.Millisecond) // until the held Refresh has reached the server
	}
	if reached() < 2 {
		t.Fatal("the Refresh held up in the network never reached the server")
	}
	held, wait := e.probe(t, k[0])
	least := e.long - time.Since(laterStart) - expiryEarly
	if !held || (wait < least && !(e.waitUnknown && wait == 0)) {
		t.Fatalf("after a late Refresh landed: held %v with %v left, want at least %v (the later Refresh's TTL from its start)", held, wait, least)
	}
	e.mustRelease(t, k, "t1")
	return true, "", 0
}

// raceTries is how many times the race subtests race their calls.
const raceTries = 5

// raceStore returns the store the race subtests run on: a proxied one whose
// every request and reply is delayed by a few milliseconds, so that calls
// overlap on the server as they do over a real network, or the store from
// New on an InProcess store.
func (e *env) raceStore(t *testing.T, delay time.Duration) stores.Store {
	t.Helper()
	if e.newProxied == nil {
		return e.s
	}
	p, b := e.proxied(t)
	b.delay(faultproxy.Both, delay)
	return p
}

// testRefreshRacingRelease: a Refresh that runs alongside the Release of
// the same grant never sets the key again once the Release has returned.
// The grant's TTL is long, as in testCancelledRefreshThenRelease.
func testRefreshRacingRelease(t *testing.T, e *env) {
	s := e.raceStore(t, 20*time.Millisecond)
	var released []string
	for i := range raceTries {
		k := e.keys("k" + strconv.Itoa(i))
		token := "t" + strconv.Itoa(i)
		if g, err := s.Acquire(t.Context(), k, token, e.long); err != nil || !g.OK {
			t.Fatalf("Acquire: %+v, %v", g, err)
		}
		var wg sync.WaitGroup
		var refreshErr, releaseErr error
		wg.Go(func() { refreshErr = s.Refresh(t.Context(), k, token, e.long) })
		wg.Go(func() { releaseErr = s.Release(t.Context(), k, token, 0) })
		wg.Wait()
		if releaseErr != nil {
			t.Fatalf("try %d: Release racing a Refresh: %v", i, releaseErr)
		}
		if refreshErr != nil && !errors.Is(refreshErr, stores.ErrNotHeld) {
			t.Fatalf("try %d: Refresh racing a Release: %v, want nil or ErrNotHeld", i, refreshErr)
		}
		released = append(released, k...)
	}
	e.expectFreeForGood(t, released, 0, "after Releases that raced Refreshes returned")
}

// testCancelledRefreshThenRelease: a Refresh abandoned when its context
// ends, followed at once by the grant's Release, never sets the key again.
// The grant's TTL is long: the Release must find it held, and with the
// short one, 1s, a loaded machine's Acquire, Refresh and Release through
// the delay now and then outlasted it ("lock not held"). Whether the
// Refresh set the key again is expectFreeForGood's to see, not the TTL's.
func testCancelledRefreshThenRelease(t *testing.T, e *env) {
	const delay = 50 * time.Millisecond
	s := e.raceStore(t, delay)
	var released []string
	for i := range raceTries {
		k := e.keys("k" + strconv.Itoa(i))
		token := "t" + strconv.Itoa(i)
		if g, err := s.Acquire(t.Context(), k, token, e.long); err != nil || !g.OK {
			t.Fatalf("Acquire: %+v, %v", g, err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), delay/2)
		refreshErr := s.Refresh(ctx, k, token, e.long)
		cancel()
		if refreshErr == nil && e.newProxied != nil {
			t.Logf("try %d: the Refresh returned within its %v deadline through a %v delay", i, delay/2, delay)
		}
		if err := s.Release(t.Context(), k, token, 0); err != nil {
			t.Fatalf("try %d: Release after a cancelled Refresh: %v", i, err)
		}
		released = append(released, k...)
	}
	e.expectFreeForGood(t, released, 0, "after cancelled Refreshes and the Releases that followed")
}

// maxTTLOr returns the store's MaxTTL, or d when it states none.
func (e *env) maxTTLOr(d time.Duration) time.Duration {
	if e.bounds.MaxTTL > 0 {
		return e.bounds.MaxTTL
	}
	return d
}
