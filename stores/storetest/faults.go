package storetest

import (
	"context"
	"errors"
	"fmt"
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
	{name: "CutOffHolderExpiresFirst", needs: needProxy, run: testCutOffHolderExpiresFirst},
	{name: "StaleHolder/PausedPastTTL", needs: needProxy, run: testStalePausedPastTTL},
	{name: "StaleHolder/PausedPastMaxTTL", needs: needProxy, run: testStalePausedPastMaxTTL},
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

// proxied returns a store from Suite.Proxied and its backend; the faults
// heal when the test ends.
func (e *env) proxied(t *testing.T) (stores.Store, backend) {
	t.Helper()
	s, proxies := e.newProxied(t)
	if s == nil || len(proxies) == 0 {
		t.Fatal("storetest: Suite.Proxied returned no store or no proxy")
	}
	b := backend(proxies)
	t.Cleanup(b.heal)
	return s, b
}

// abandon runs an Acquire of keys by token on s under a fault that keeps it
// unanswered, and checks that it returns soon after its context ends,
// without a grant.
func (e *env) abandon(t *testing.T, s stores.Store, keys []string, token string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), abandonWait)
	defer cancel()
	start := time.Now()
	g, err := s.Acquire(ctx, keys, token, e.long)
	if took := time.Since(start); took > abandonWait+returnSlack {
		t.Errorf("Acquire under the fault returned after %v, %v past its context's end", took, took-abandonWait)
	}
	if err == nil {
		t.Fatalf("Acquire under the fault: %+v with no error, want a failure", g)
	}
	if g.OK {
		t.Fatalf("Acquire under the fault failed (%v) but reports a grant", err)
	}
}

// expectFreeForGood fails the test unless every key, probed by a store that
// reaches the server directly, becomes free within limit and then stays
// free for freeFor: nothing the store left in flight holds it.
func (e *env) expectFreeForGood(t *testing.T, keys []string, limit time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(limit + freeFor)
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
		case held != "":
			freeSince = time.Time{}
			if now.After(deadline) {
				t.Fatalf("%s: %s still held %v later: a grant nobody owns blocks the key", what, held, limit+freeFor)
			}
		case freeSince.IsZero():
			freeSince = now
		case now.Sub(freeSince) >= freeFor:
			return
		}
		<-ticker.C
	}
}

// testAbandonedReplyLost: an acquire whose reply is lost, and is still lost
// when the call gives up, leaves no grant once the network heals.
func testAbandonedReplyLost(t *testing.T, e *env) {
	for _, keys := range e.keySets("k") {
		p, b := e.proxied(t)
		b.blackhole(faultproxy.ToClient)
		e.abandon(t, p, keys, "t1")
		<-time.After(faultHold) // the fault outlasts the call: the injected fault itself
		b.heal()
		e.expectFreeForGood(t, keys, healLimit, "after a lost reply")
	}
}

// testAbandonedReplyLate: an acquire whose reply arrives after the call
// gave up leaves no grant.
func testAbandonedReplyLate(t *testing.T, e *env) {
	for _, keys := range e.keySets("k") {
		p, b := e.proxied(t)
		b.stall(faultproxy.ToClient)
		e.abandon(t, p, keys, "t1")
		<-time.After(faultHold) // the injected lateness itself
		b.heal()
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
			b.stall(faultproxy.Both)
			e.abandon(t, p, keys, "t1")
			<-time.After(faultHold) // the pause itself
			b.heal()
			e.expectFreeForGood(t, keys, healLimit, fmt.Sprintf("try %d: after a paused server resumed", i))
		}
	}
}

// testCutOffHolderExpiresFirst: a holder cut off from the server keeps the
// key for its TTL at least, counted from before its Acquire, and no longer
// than the store's bound: nobody else is granted the key while the holder
// may still believe it holds it, and the key comes free without the holder.
func testCutOffHolderExpiresFirst(t *testing.T, e *env) {
	k := e.keys("k")
	p, b := e.proxied(t)
	ttl := e.short
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
	const longest = 30 * time.Second
	switch {
	case e.bounds.MaxTTL == 0:
		t.Skip("the store states no MaxTTL: StaleHolder/PausedPastTTL covers it")
	case e.bounds.MaxTTL > longest:
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
	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Refresh", func(ctx context.Context) error { return s.Refresh(ctx, keys, token, e.long) }},
		{"Release", func(ctx context.Context) error { return s.Release(ctx, keys, token, 0) }},
	}
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
func testRefreshRacingRelease(t *testing.T, e *env) {
	s := e.raceStore(t, 20*time.Millisecond)
	var released []string
	for i := range raceTries {
		k := e.keys("k" + strconv.Itoa(i))
		token := "t" + strconv.Itoa(i)
		if g, err := s.Acquire(t.Context(), k, token, e.short); err != nil || !g.OK {
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
func testCancelledRefreshThenRelease(t *testing.T, e *env) {
	const delay = 50 * time.Millisecond
	s := e.raceStore(t, delay)
	var released []string
	for i := range raceTries {
		k := e.keys("k" + strconv.Itoa(i))
		token := "t" + strconv.Itoa(i)
		if g, err := s.Acquire(t.Context(), k, token, e.short); err != nil || !g.OK {
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
