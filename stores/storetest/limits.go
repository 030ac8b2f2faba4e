package storetest

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// limitTests are the Limits subtests: keys and TTLs at the edges. A store
// honours what is within the Bounds it states (stores.Bounded; none stated
// means every non-empty key and every positive duration) and refuses the
// rest with stores.ErrInvalid before it acts: never a store failure, never
// a change on the server, never an outage of other keys.
var limitTests = []subtest{
	{name: "LongKeys", run: testLongKeys},
	{name: "ExtremeTTLs/Acquire", run: testExtremeAcquire},
	{name: "ExtremeTTLs/Refresh", run: testExtremeRefresh},
	{name: "ExtremeTTLs/Keep", run: testExtremeKeep},
	{name: "ExtremeTTLs/Fair", needs: needFair, run: testExtremeFair},
}

// longKeySizes returns the lengths of the random keys LongKeys tries: 1 KB,
// 600 KB, and the store's MaxKeyBytes and one byte more.
func (e *env) longKeySizes() []int {
	sizes := []int{1 << 10, 600 << 10}
	if m := e.bounds.MaxKeyBytes; m > len(e.prefix) && m < 1<<20 {
		sizes = append(sizes, m, m+1)
	}
	return sizes
}

// extremeTTLs returns the durations ExtremeTTLs tries: 1ns and
// math.MaxInt64, and the edges of the store's TTL range, each with the
// duration 1ns beyond it.
func (e *env) extremeTTLs() []time.Duration {
	ttls := []time.Duration{time.Nanosecond, math.MaxInt64}
	if m := e.bounds.MinTTL; m > time.Nanosecond {
		ttls = append(ttls, m, m-1)
	}
	if m := e.bounds.MaxTTL; m > 0 && m < math.MaxInt64 {
		ttls = append(ttls, m, m+1)
	}
	return ttls
}

// keyOfLen returns a key of the subtest n bytes long, random after the
// subtest's prefix.
func (e *env) keyOfLen(n int) string {
	pad := n - len(e.prefix)
	if pad < 1 {
		pad = 1
	}
	return e.prefix + randomHex((pad + 1) / 2)[:pad]
}

// keyFits reports whether the store honours key's length.
func (e *env) keyFits(key string) bool {
	return e.bounds.MaxKeyBytes == 0 || len(key) <= e.bounds.MaxKeyBytes
}

// ttlFits reports whether the store honours d.
func (e *env) ttlFits(d time.Duration) bool {
	return d >= max(e.bounds.MinTTL, 1) && (e.bounds.MaxTTL == 0 || d <= e.bounds.MaxTTL)
}

// expectInvalid fails the test unless err wraps stores.ErrInvalid.
func expectInvalid(t *testing.T, err error, what string) {
	t.Helper()
	if !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("%s: got %v, want stores.ErrInvalid", what, err)
	}
}

// expectServing fails the test unless s still serves an ordinary key: a
// refused argument must not have broken its connection.
func (e *env) expectServing(t *testing.T, s stores.Store, what string) {
	t.Helper()
	k := e.keys("ordinary")
	g, err := s.Acquire(t.Context(), k, "ordinary", e.short)
	if err != nil || !g.OK {
		t.Fatalf("%s: the store no longer serves an ordinary key: %+v, %v", what, g, err)
	}
	if err := s.Release(t.Context(), k, "ordinary", 0); err != nil {
		t.Fatalf("%s: Release of an ordinary key: %v", what, err)
	}
}

// testLongKeys: a long random key, alone or with a short one, is honoured
// within the store's MaxKeyBytes and refused with ErrInvalid beyond it, and
// so are three keys of MaxKeyBytes in one call (whose request may be too
// large for the server).
func testLongKeys(t *testing.T, e *env) {
	for _, n := range e.longKeySizes() {
		long := e.keyOfLen(n)
		short := e.key("short" + strconv.Itoa(n))
		for _, keys := range [][]string{{long}, slices.Sorted(slices.Values([]string{long, short}))} {
			what := "a key of " + byteCount(n)
			if len(keys) > 1 {
				what += " with a short one"
			}
			if e.keyFits(long) {
				e.mustAcquire(t, keys, "t1", e.long)
				if g := e.acquire(t, keys, "t2", e.long); g.OK {
					t.Fatalf("%s: granted twice", what)
				}
				if err := e.s.Refresh(t.Context(), keys, "t1", e.long); err != nil {
					t.Fatalf("%s: Refresh: %v", what, err)
				}
				e.mustRelease(t, keys, "t1")
				e.expectFree(t, keys, what+": after its release")
				continue
			}
			g, err := e.s.Acquire(t.Context(), keys, "t1", e.long)
			expectInvalid(t, err, what+": Acquire beyond MaxKeyBytes")
			if g.OK {
				t.Fatalf("%s: refused with ErrInvalid but granted", what)
			}
			e.expectRefusedBeforeActing(t, what+": Acquire", func(s stores.Store, ctx context.Context) error {
				_, err := s.Acquire(ctx, keys, "t1", e.long)
				return err
			})
			expectInvalid(t, e.s.Refresh(t.Context(), keys, "t1", e.long), what+": Refresh")
			expectInvalid(t, e.s.Release(t.Context(), keys, "t1", 0), what+": Release")
			if e.f != nil && len(keys) == 1 {
				_, err := e.f.AcquireFair(t.Context(), long, "t1", e.long, e.shortLease)
				expectInvalid(t, err, what+": AcquireFair")
			}
			e.expectFree(t, []string{short}, what+": the short key after the refusal")
			e.expectServing(t, e.s, what)
		}
	}
	if m := e.bounds.MaxKeyBytes; m > len(e.prefix)+2 && m < 1<<20 {
		keys := make([]string, 3)
		for i := range keys {
			keys[i] = e.keyOfLen(m)
		}
		slices.Sort(keys)
		g, err := e.s.Acquire(t.Context(), keys, "t1", e.long)
		switch {
		case errors.Is(err, stores.ErrInvalid):
			e.expectFree(t, keys, "three keys of MaxKeyBytes, refused together")
		case err != nil || !g.OK:
			t.Fatalf("three keys of MaxKeyBytes in one call: %+v, %v, want granted or ErrInvalid", g, err)
		default:
			e.mustRelease(t, keys, "t1")
		}
		e.expectServing(t, e.s, "three keys of MaxKeyBytes in one call")
	}
}

// expectRefusedBeforeActing checks, on a store with a network, that call
// answers ErrInvalid at once while every server is paused: it refused its
// arguments before sending anything.
func (e *env) expectRefusedBeforeActing(t *testing.T, what string, call func(s stores.Store, ctx context.Context) error) {
	t.Helper()
	if e.newProxied == nil {
		return
	}
	p, b := e.proxied(t)
	b.stall(faultproxy.Both)
	defer b.heal()
	ctx, cancel := context.WithTimeout(t.Context(), 2*returnSlack)
	defer cancel()
	start := time.Now()
	err := call(p, ctx)
	expectInvalid(t, err, what+" with every server paused")
	if took := time.Since(start); took > returnSlack {
		t.Fatalf("%s: ErrInvalid came after %v with every server paused: the store asked the server first", what, took)
	}
}

// byteCount writes n as "1 KB" or "600 KB".
func byteCount(n int) string { return strconv.Itoa(n>>10) + " KB" }

// testExtremeAcquire: Acquire with a TTL of 1ns or math.MaxInt64 grants
// within the store's range, in a way other callers can read, and is refused
// with ErrInvalid, changing nothing, beyond it.
func testExtremeAcquire(t *testing.T, e *env) {
	for _, ttl := range e.extremeTTLs() {
		k := e.keys("k" + ttl.String())
		start := time.Now()
		g, err := retryShort(ttl, func() (stores.Grant, error) { return e.s.Acquire(t.Context(), k, "t1", ttl) })
		if !e.ttlFits(ttl) {
			expectInvalid(t, err, "Acquire with TTL "+ttl.String())
			e.expectFree(t, k, "after a refused Acquire with TTL "+ttl.String())
			e.expectRefusedBeforeActing(t, "Acquire with TTL "+ttl.String(), func(s stores.Store, ctx context.Context) error {
				_, err := s.Acquire(ctx, k, "t1", ttl)
				return err
			})
			continue
		}
		if err != nil || !g.OK {
			t.Fatalf("Acquire with TTL %v, within the store's range: %+v, %v", ttl, g, err)
		}
		// Another caller reads the grant without an error (the probe fails
		// the test on one); a TTL of 1ns may have run out already.
		held, wait := e.probe(t, k[0])
		if ttl == math.MaxInt64 && (!held || wait < 0) {
			t.Fatalf("Acquire with TTL %v: the key reads as held %v with Wait %v, want held", ttl, held, wait)
		}
		if err := e.s.Release(t.Context(), k, "t1", 0); err != nil && !ranOut(err, start, ttl) {
			t.Fatalf("Release of a grant with TTL %v: %v", ttl, err)
		}
		e.expectFree(t, k, "after the release of a grant with TTL "+ttl.String())
	}
}

// testExtremeRefresh: Refresh to a TTL of 1ns or math.MaxInt64 succeeds
// within the store's range, and is refused with ErrInvalid beyond it,
// leaving the holder's TTL as it was.
func testExtremeRefresh(t *testing.T, e *env) {
	for _, ttl := range e.extremeTTLs() {
		k := e.keys("k" + ttl.String())
		e.mustAcquire(t, k, "t1", e.short)
		start := time.Now()
		err := e.s.Refresh(t.Context(), k, "t1", ttl)
		if !e.ttlFits(ttl) {
			expectInvalid(t, err, "Refresh to TTL "+ttl.String())
			e.expectHeld(t, k, e.short, "after a refused Refresh to TTL "+ttl.String())
			e.mustRelease(t, k, "t1")
			continue
		}
		if err != nil {
			t.Fatalf("Refresh to TTL %v, within the store's range: %v", ttl, err)
		}
		if ttl == math.MaxInt64 {
			e.expectHeld(t, k, math.MaxInt64, "after a Refresh to TTL "+ttl.String())
		}
		if err := e.s.Release(t.Context(), k, "t1", 0); err != nil && !ranOut(err, start, ttl) {
			t.Fatalf("Release after a Refresh to TTL %v: %v", ttl, err)
		}
	}
}

// testExtremeKeep: a Release that keeps the key for 1ns or math.MaxInt64
// succeeds within the store's range, and is refused with ErrInvalid beyond
// it, leaving the key held as it was.
func testExtremeKeep(t *testing.T, e *env) {
	for _, keep := range e.extremeTTLs() {
		k := e.keys("k" + keep.String())
		e.mustAcquire(t, k, "t1", e.short)
		err := e.s.Release(t.Context(), k, "t1", keep)
		if !e.ttlFits(keep) {
			expectInvalid(t, err, "Release keeping the key for "+keep.String())
			e.expectHeld(t, k, e.short, "after a refused Release keeping the key for "+keep.String())
			e.mustRelease(t, k, "t1")
			continue
		}
		if err != nil {
			t.Fatalf("Release keeping the key for %v, within the store's range: %v", keep, err)
		}
		if keep == math.MaxInt64 {
			e.expectHeld(t, k, math.MaxInt64, "after a Release keeping the key for "+keep.String())
			// Not to leave it behind for ever: a release without keep by
			// the same token, which a store may refuse (ErrNotHeld).
			_ = e.s.Release(context.WithoutCancel(t.Context()), k, "t1", 0)
		}
	}
}

// testExtremeFair: AcquireFair with a TTL or a lease of 1ns or
// math.MaxInt64 grants within the store's range and is refused with
// ErrInvalid beyond it, leaving no queue entry behind.
func testExtremeFair(t *testing.T, e *env) {
	for _, d := range e.extremeTTLs() {
		for _, asLease := range []bool{false, true} {
			what := "AcquireFair with TTL " + d.String()
			ttl, lease := d, e.shortLease
			if asLease {
				what = "AcquireFair with lease " + d.String()
				ttl, lease = e.short, d
			}
			k := e.key("k" + what)
			start := time.Now()
			g, err := e.f.AcquireFair(t.Context(), k, "t1", ttl, lease)
			if !e.ttlFits(d) {
				expectInvalid(t, err, what)
				if g := e.fairTry(t, k, "t2", 0); !g.OK {
					t.Fatalf("%s: refused, but a try-once caller then finds the key held or queued: %+v", what, g)
				}
				e.releaseKey(t, k, "t2")
				continue
			}
			if err != nil || !g.OK {
				t.Fatalf("%s, within the store's range: %+v, %v", what, g, err)
			}
			if err := e.s.Release(t.Context(), []string{k}, "t1", 0); err != nil && !ranOut(err, start, ttl) {
				t.Fatalf("%s: Release: %v", what, err)
			}
		}
	}
}

// ranOut reports whether err is ErrNotHeld from a grant whose ttl, counted
// from start, may have run out: the release of a short grant may find it
// gone.
func ranOut(err error, start time.Time, ttl time.Duration) bool {
	return errors.Is(err, stores.ErrNotHeld) && time.Since(start) >= ttl
}

// shortGrantTTL is the TTL below which a store may fail a grant on a loaded
// machine: a store that bounds each server call by a part of the TTL
// (redlockstore gives a 10ms TTL's calls 3ms each) runs out of time under
// -race and load without any defect.
const shortGrantTTL = 100 * time.Millisecond

// grantTries is how many times a grant with a TTL below shortGrantTTL is tried
// while it fails with a store failure.
const grantTries = 5

// retryShort calls grant, and again up to grantTries times while ttl is
// below shortGrantTTL and grant fails with an error other than ErrInvalid (a
// call that ran out of its part of a short TTL). An invalid argument is
// never retried.
func retryShort(ttl time.Duration, grant func() (stores.Grant, error)) (stores.Grant, error) {
	g, err := grant()
	for try := 1; try < grantTries && ttl < shortGrantTTL && err != nil && !errors.Is(err, stores.ErrInvalid); try++ {
		g, err = grant()
	}
	return g, err
}
