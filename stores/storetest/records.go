package storetest

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// recordTests are the Records subtests, for stores.RecordStore: claims,
// finished records and their retention, owner checks, fences, sizes, and
// the fault cases that apply to records.
var recordTests = []subtest{
	{name: "ClaimFinishReplay", needs: needRecords, run: testRecordClaimFinishReplay},
	{name: "ClaimHeldRefused", needs: needRecords, run: testRecordClaimHeld},
	{name: "FinishOwnerChecked/OtherToken", needs: needRecords, run: testRecordFinishOtherToken},
	{name: "FinishOwnerChecked/AfterExpiry", needs: needRecords, run: testRecordFinishAfterExpiry},
	{name: "FinishOwnerChecked/AfterRelease", needs: needRecords, run: testRecordFinishAfterRelease},
	{name: "FinishRetried", needs: needRecords, run: testRecordFinishRetried},
	{name: "KeptForRetention", needs: needRecords, run: testRecordKeptForRetention},
	{name: "ReleaseLeavesNoRecord", needs: needRecords, run: testRecordReleaseLeavesNothing},
	{name: "Fences", needs: needRecords, run: testRecordFences},
	{name: "Sizes", needs: needRecords, run: testRecordSizes},
	{name: "Retentions", needs: needRecords, run: testRecordRetentions},
	{name: "BinaryBodies", needs: needRecords, run: testRecordBinary},
	{name: "ConcurrentClaimers", needs: needRecords, run: testRecordConcurrentClaimers},
	{name: "FinishSignals", needs: needRecords | needNotify, run: testRecordFinishSignals},
	{name: "AbandonedClaim/ReplyLost", needs: needRecords | needProxy, run: testRecordAbandonedReplyLost},
	{name: "AbandonedClaim/ReplyLate", needs: needRecords | needProxy, run: testRecordAbandonedReplyLate},
	{name: "FinishReplyLost", needs: needRecords | needProxy, run: testRecordFinishReplyLost},
	{name: "FinishLandsLate", needs: needRecords | needProxy, run: testRecordFinishLate},
	{name: "StaleClaimer/PausedPastTTL", needs: needRecords | needProxy, run: testRecordStaleClaimer},
}

// maxTestedRecord is the largest record Sizes writes: a store whose
// MaxRecordBytes is larger is tried at this size, and not beyond its limit.
const maxTestedRecord = 8 << 20

// claim calls ClaimRecord on rs and checks the shape of its answer: a grant
// with one fence and no record, a record with no grant, or a refusal with
// neither.
func claim(t *testing.T, rs stores.RecordStore, key, token string, ttl time.Duration) (stores.Grant, *stores.Record) {
	t.Helper()
	g, rec, err := rs.ClaimRecord(t.Context(), key, token, ttl)
	if err != nil {
		t.Fatalf("ClaimRecord(%s, %q): %v", stores.KeyForMessage(key), token, err)
	}
	checkGrant(t, g, 1, "ClaimRecord("+stores.KeyForMessage(key)+")")
	if g.OK && rec != nil {
		t.Fatalf("ClaimRecord(%s, %q): granted and answered a record %+v", stores.KeyForMessage(key), token, rec)
	}
	if rec != nil && g.Wait != 0 {
		t.Fatalf("ClaimRecord(%s, %q): answered a record with Wait %v, want 0", stores.KeyForMessage(key), token, g.Wait)
	}
	return g, rec
}

// mustClaim calls ClaimRecord and fails the test unless it grants.
func (e *env) mustClaim(t *testing.T, key, token string, ttl time.Duration) stores.Grant {
	t.Helper()
	g, rec := claim(t, e.rs, key, token, ttl)
	if !g.OK {
		t.Fatalf("ClaimRecord(%s, %q): refused (%+v, record %+v), want granted", stores.KeyForMessage(key), token, g, rec)
	}
	return g
}

// mustFinish calls FinishRecord and fails the test on an error.
func (e *env) mustFinish(t *testing.T, key, token string, rec stores.Record, retention time.Duration) {
	t.Helper()
	if err := e.rs.FinishRecord(t.Context(), key, token, rec, retention); err != nil {
		t.Fatalf("FinishRecord(%s, %q): %v", stores.KeyForMessage(key), token, err)
	}
}

// read returns the record key holds, or nil when the key is free: it
// claims the key with a token of its own, and releases the claim when
// granted. It fails the test when a claim holds the key.
func (e *env) read(t *testing.T, key string) *stores.Record {
	t.Helper()
	g, rec := claim(t, e.rs, key, "reader", e.long)
	switch {
	case g.OK:
		e.mustRelease(t, []string{key}, "reader")
		return nil
	case rec == nil:
		t.Fatalf("reading %s: a claim holds it (%+v), want a record or free", stores.KeyForMessage(key), g)
	}
	return rec
}

// expectRecord fails the test unless got is want, byte for byte.
func expectRecord(t *testing.T, got *stores.Record, want stores.Record, what string) {
	t.Helper()
	switch {
	case got == nil:
		t.Fatalf("%s: no record, want %s", what, describeRecord(&want))
	case got.Fingerprint != want.Fingerprint || !bytes.Equal(got.Response, want.Response) || got.Fence != want.Fence:
		t.Fatalf("%s: record %s, want %s", what, describeRecord(got), describeRecord(&want))
	}
}

// describeRecord shows r in a message, its response shortened.
func describeRecord(r *stores.Record) string {
	resp := r.Response
	if len(resp) > 32 {
		resp = resp[:32]
	}
	return strconv.Quote(r.Fingerprint) + " fence " + strconv.FormatInt(r.Fence, 10) +
		" response of " + strconv.Itoa(len(r.Response)) + " bytes " + strconv.Quote(string(resp))
}

// recordOf returns a record of the claim g, named by what.
func recordOf(g stores.Grant, what string) stores.Record {
	return stores.Record{Fingerprint: "fp:" + what, Response: []byte("response of " + what), Fence: g.Fences[0]}
}

// expectNoRecordCalls fails the test unless Release and Refresh of each
// token answer ErrNotHeld on key, which holds a record.
func (e *env) expectRecordUntouchable(t *testing.T, key string, tokens ...string) {
	t.Helper()
	for _, token := range tokens {
		expectNotHeld(t, e.s.Refresh(t.Context(), []string{key}, token, e.long), "Refresh of "+token+" on a record")
		expectNotHeld(t, e.s.Release(t.Context(), []string{key}, token, 0), "Release of "+token+" on a record")
	}
}

// testRecordClaimFinishReplay: a claim finished with a record answers every
// later claim, by any token, with that record byte for byte; no Release or
// Refresh of any token touches it.
func testRecordClaimFinishReplay(t *testing.T, e *env) {
	k := e.key("k")
	g := e.mustClaim(t, k, "a", e.long)
	rec := recordOf(g, "a")
	e.mustFinish(t, k, "a", rec, e.long)
	for _, token := range []string{"a", "b", "c"} {
		_, got := claim(t, e.rs, k, token, e.long)
		expectRecord(t, got, rec, "a claim by "+token+" after the finish")
	}
	e.expectRecordUntouchable(t, k, "a", "b")
	expectRecord(t, e.read(t, k), rec, "after Releases and Refreshes of the record")
}

// testRecordClaimHeld: a claim is refused while another token's claim holds
// the key, with Wait the holder's remaining TTL, and granted again to the
// token that holds it, with a fresh fence.
func testRecordClaimHeld(t *testing.T, e *env) {
	k := e.key("k")
	g1 := e.mustClaim(t, k, "a", e.short)
	for range 2 {
		g, rec := claim(t, e.rs, k, "b", e.long)
		if g.OK || rec != nil {
			t.Fatalf("a claim by b while a claims the key: %+v, record %+v; want refused", g, rec)
		}
		if !e.waitIn(g.Wait, 0, e.short) {
			t.Fatalf("a claim by b while a claims the key for %v: Wait %v, want in (0, %v]", e.short, g.Wait, e.short)
		}
	}
	g2 := e.mustClaim(t, k, "a", e.long)
	expectStride(t, g1.Fences[0], g2.Fences[0], "a claim granted again to its token")
	e.mustRelease(t, []string{k}, "a")
	g3 := e.mustClaim(t, k, "b", e.long)
	expectStride(t, g2.Fences[0], g3.Fences[0], "a claim after the released one")
	e.mustRelease(t, []string{k}, "b")
}

// testRecordFinishOtherToken: FinishRecord of a token that does not hold
// the claim answers ErrNotHeld and changes nothing.
func testRecordFinishOtherToken(t *testing.T, e *env) {
	k := e.key("k")
	g := e.mustClaim(t, k, "a", e.long)
	expectNotHeld(t, e.rs.FinishRecord(t.Context(), k, "b", recordOf(g, "b"), e.long), "FinishRecord of another token")
	if g, rec := claim(t, e.rs, k, "b", e.long); g.OK || rec != nil {
		t.Fatalf("a claim by b after its refused finish: %+v, record %+v; want refused by a's claim", g, rec)
	}
	if err := e.s.Refresh(t.Context(), []string{k}, "a", e.long); err != nil {
		t.Fatalf("Refresh of a's claim after another token's refused finish: %v", err)
	}
	rec := recordOf(g, "a")
	e.mustFinish(t, k, "a", rec, e.long)
	expectRecord(t, e.read(t, k), rec, "a's record")
}

// testRecordFinishAfterExpiry: FinishRecord of a claim that expired answers
// ErrNotHeld, whether the key is free or another token claimed it since,
// and changes nothing.
func testRecordFinishAfterExpiry(t *testing.T, e *env) {
	k := e.key("k")
	g := e.mustClaim(t, k, "a", e.expiry)
	e.waitFree(t, []string{k}, e.expiry+expiryLimit)
	expectNotHeld(t, e.rs.FinishRecord(t.Context(), k, "a", recordOf(g, "a"), e.long), "FinishRecord after the claim expired")
	if rec := e.read(t, k); rec != nil {
		t.Fatalf("after a refused finish of an expired claim: record %s, want none", describeRecord(rec))
	}

	g = e.mustClaim(t, k, "a", e.expiry)
	e.waitFree(t, []string{k}, e.expiry+expiryLimit)
	gb := e.mustClaim(t, k, "b", e.long)
	expectNotHeld(t, e.rs.FinishRecord(t.Context(), k, "a", recordOf(g, "a"), e.long), "FinishRecord after the claim expired and b claimed")
	if err := e.s.Refresh(t.Context(), []string{k}, "b", e.long); err != nil {
		t.Fatalf("Refresh of b's claim after a's refused finish: %v", err)
	}
	rec := recordOf(gb, "b")
	e.mustFinish(t, k, "b", rec, e.long)
	expectRecord(t, e.read(t, k), rec, "b's record")
}

// testRecordFinishAfterRelease: FinishRecord of a released claim answers
// ErrNotHeld and leaves the key free.
func testRecordFinishAfterRelease(t *testing.T, e *env) {
	k := e.key("k")
	g := e.mustClaim(t, k, "a", e.long)
	e.mustRelease(t, []string{k}, "a")
	expectNotHeld(t, e.rs.FinishRecord(t.Context(), k, "a", recordOf(g, "a"), e.long), "FinishRecord after Release")
	if rec := e.read(t, k); rec != nil {
		t.Fatalf("after a refused finish of a released claim: record %s, want none", describeRecord(rec))
	}
}

// testRecordFinishRetried: FinishRecord of the token that finished the
// record (a client retry) answers nil and changes nothing, and FinishRecord
// of another token answers ErrNotHeld.
func testRecordFinishRetried(t *testing.T, e *env) {
	k := e.key("k")
	g := e.mustClaim(t, k, "a", e.long)
	rec := recordOf(g, "a")
	e.mustFinish(t, k, "a", rec, e.long)
	e.mustFinish(t, k, "a", rec, e.long)
	e.mustFinish(t, k, "a", stores.Record{Fingerprint: "changed", Response: []byte("changed"), Fence: 1}, e.long)
	expectNotHeld(t, e.rs.FinishRecord(t.Context(), k, "b", recordOf(g, "b"), e.long), "FinishRecord of another token on a record")
	expectRecord(t, e.read(t, k), rec, "after retried finishes")
}

// testRecordKeptForRetention: a record answers every claim for its
// retention at least, and is gone soon after it: the key is free again.
func testRecordKeptForRetention(t *testing.T, e *env) {
	k := e.key("k")
	retention := e.short
	g := e.mustClaim(t, k, "a", e.long)
	rec := recordOf(g, "a")
	start := time.Now()
	e.mustFinish(t, k, "a", rec, retention)
	deadline := start.Add(retention + expiryLimit)
	ticker := time.NewTicker(20 * time.Millisecond)
	defer ticker.Stop()
	for i := 0; ; i++ {
		gr, got := claim(t, e.rs, k, "t"+strconv.Itoa(i), e.long)
		if gr.OK {
			// The grant came before the claim returned: only then is it
			// sure to have come within the retention (a claim slowed on a
			// loaded machine is granted later than it was sent).
			if elapsed := time.Since(start); elapsed < retention-expiryEarly {
				t.Fatalf("the key was claimed %v after the finish, within the record's retention %v", elapsed, retention)
			}
			expectStride(t, g.Fences[0], gr.Fences[0], "the claim after the record's retention")
			e.mustRelease(t, []string{k}, "t"+strconv.Itoa(i))
			return
		}
		expectRecord(t, got, rec, "a claim within the retention")
		if time.Now().After(deadline) {
			t.Fatalf("the record still answers %v after its retention %v", time.Since(start), retention)
		}
		<-ticker.C
	}
}

// testRecordReleaseLeavesNothing: a claim's Release frees the key and
// leaves no record.
func testRecordReleaseLeavesNothing(t *testing.T, e *env) {
	k := e.key("k")
	e.mustClaim(t, k, "a", e.long)
	e.mustRelease(t, []string{k}, "a")
	g, rec := claim(t, e.rs, k, "b", e.long)
	if !g.OK || rec != nil {
		t.Fatalf("a claim after the released one: %+v, record %+v; want granted", g, rec)
	}
	e.mustRelease(t, []string{k}, "b")
	expectNotHeld(t, e.s.Release(t.Context(), []string{k}, "a", 0), "a second Release of the claim")
}

// testRecordFences: the fences of claims follow the Acquire rules: each
// grant of the key, claim or Acquire, after a release, an expiry or a
// record's retention, is a stride above the one before.
func testRecordFences(t *testing.T, e *env) {
	k := e.key("k")
	prev := e.mustClaim(t, k, "a", e.long).Fences[0]
	next := func(g stores.Grant, what string) {
		t.Helper()
		expectStride(t, prev, g.Fences[0], what)
		prev = g.Fences[0]
	}
	next(e.mustClaim(t, k, "a", e.long), "a claim granted again")
	e.mustRelease(t, []string{k}, "a")
	next(e.mustAcquire(t, []string{k}, "x", e.long), "an Acquire after a released claim")
	e.mustRelease(t, []string{k}, "x")
	next(e.mustClaim(t, k, "b", e.expiry), "a claim after an Acquire")
	e.waitFree(t, []string{k}, e.expiry+expiryLimit)
	g := e.mustClaim(t, k, "c", e.long)
	next(g, "a claim after an expired one")
	e.mustFinish(t, k, "c", recordOf(g, "c"), e.expiry)
	deadline := time.Now().Add(e.expiry + expiryLimit)
	ticker := time.NewTicker(5 * time.Millisecond)
	defer ticker.Stop()
	for {
		g, _ := claim(t, e.rs, k, "d", e.long)
		if g.OK {
			next(g, "a claim after a record's retention")
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the record of retention %v still answers after %v", e.expiry, e.expiry+expiryLimit)
		}
		<-ticker.C
	}
	e.mustRelease(t, []string{k}, "d")
}

// testRecordSizes: a record of the store's MaxRecordBytes (or 8 MiB on a
// store without a smaller limit) is kept byte for byte; one byte more is
// refused with ErrInvalid before the store acts: the claim stays.
func testRecordSizes(t *testing.T, e *env) {
	size, bounded := e.bounds.MaxRecordBytes, true
	if size == 0 || size > maxTestedRecord {
		size, bounded = maxTestedRecord, false
	}
	fp := "fingerprint:" + randomHex(16)
	body := []byte(randomHex((size-len(fp))/2 + 1))[:size-len(fp)]
	k := e.key("at")
	g := e.mustClaim(t, k, "a", e.long)
	rec := stores.Record{Fingerprint: fp, Response: body, Fence: g.Fences[0]}
	if rec.Size() != size {
		t.Fatalf("storetest: a record of %d bytes, want %d", rec.Size(), size)
	}
	e.mustFinish(t, k, "a", rec, e.long)
	expectRecord(t, e.read(t, k), rec, "a record of "+strconv.Itoa(size)+" bytes")
	if !bounded {
		t.Logf("the store states no MaxRecordBytes up to %d bytes: a record of %d bytes was kept; nothing tried beyond", maxTestedRecord, size)
		return
	}
	over := e.key("over")
	g = e.mustClaim(t, over, "a", e.long)
	big := stores.Record{Fingerprint: fp, Response: append(body, 'x'), Fence: g.Fences[0]}
	err := e.rs.FinishRecord(t.Context(), over, "a", big, e.long)
	if !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("FinishRecord of %d bytes over MaxRecordBytes %d: %v, want ErrInvalid", big.Size(), size, err)
	}
	if err := e.s.Refresh(t.Context(), []string{over}, "a", e.long); err != nil {
		t.Fatalf("Refresh of the claim after a refused finish: %v (the store acted)", err)
	}
	if g, rec := claim(t, e.rs, over, "b", e.long); g.OK || rec != nil {
		t.Fatalf("a claim after the refused finish: %+v, record %+v; want refused by the claim", g, rec)
	}
	e.mustRelease(t, []string{over}, "a")
}

// testRecordRetentions: retentions out of the store's range (not positive,
// or above MaxRetention) are refused with ErrInvalid before the store acts;
// MaxRetention (or 25h on a store without one) is kept.
func testRecordRetentions(t *testing.T, e *env) {
	k := e.key("k")
	g := e.mustClaim(t, k, "a", e.long)
	bad := []time.Duration{0, -time.Second}
	if m := e.bounds.MinTTL; m > time.Nanosecond {
		bad = append(bad, m-1)
	}
	if m := e.bounds.MaxRetention; m > 0 {
		bad = append(bad, m+1)
	}
	for _, r := range bad {
		err := e.rs.FinishRecord(t.Context(), k, "a", recordOf(g, "a"), r)
		if !errors.Is(err, stores.ErrInvalid) {
			t.Fatalf("FinishRecord with retention %v (store range [%v, %v]): %v, want ErrInvalid", r, e.bounds.MinTTL, e.bounds.MaxRetention, err)
		}
	}
	if err := e.s.Refresh(t.Context(), []string{k}, "a", e.long); err != nil {
		t.Fatalf("Refresh of the claim after refused finishes: %v (the store acted)", err)
	}
	longest := e.bounds.MaxRetention
	if longest == 0 {
		longest = 25 * time.Hour // past the Locker's default of 24h
	}
	rec := recordOf(g, "a")
	e.mustFinish(t, k, "a", rec, longest)
	expectRecord(t, e.read(t, k), rec, "a record kept for "+longest.String())
}

// testRecordBinary: fingerprints and responses of any bytes, not only
// UTF-8, and empty ones, are kept byte for byte.
func testRecordBinary(t *testing.T, e *env) {
	all := make([]byte, 0, 2*256+4)
	for range 2 {
		for b := range 256 {
			all = append(all, byte(b))
		}
	}
	all = append(all, "\r\n\x00"...)
	for i, rec := range []stores.Record{
		{Fingerprint: "\x00\xff\xfe fp \r\n", Response: all},
		{Fingerprint: "", Response: nil},
		{Fingerprint: strings.Repeat("\x00", 64), Response: []byte{0}},
	} {
		k := e.key("k" + strconv.Itoa(i))
		g := e.mustClaim(t, k, "a", e.long)
		rec.Fence = g.Fences[0]
		e.mustFinish(t, k, "a", rec, e.long)
		expectRecord(t, e.read(t, k), rec, "binary record "+strconv.Itoa(i))
	}
}

// testRecordConcurrentClaimers: of many tokens claiming one key at once,
// each waiting (as the Locker does) while another's claim holds it, exactly
// one is granted and finishes, and every other reads its record.
func testRecordConcurrentClaimers(t *testing.T, e *env) {
	k := e.key("k")
	const n = 16
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var (
		wg       sync.WaitGroup
		start    = make(chan struct{})
		mu       sync.Mutex
		finished []string
		records  = make(map[string]*stores.Record)
	)
	for i := range n {
		token := "t" + strconv.Itoa(i)
		wg.Go(func() {
			<-start
			var released <-chan struct{}
			if e.n != nil {
				ch, stop := e.n.NotifyRelease(k, token)
				defer stop()
				released = ch
			}
			for {
				g, rec, err := e.rs.ClaimRecord(ctx, k, token, e.long)
				switch {
				case err != nil:
					t.Errorf("%s: ClaimRecord: %v", token, err)
					return
				case g.OK:
					if err := e.rs.FinishRecord(ctx, k, token, stores.Record{Fingerprint: "fp", Response: []byte(token), Fence: g.Fences[0]}, e.long); err != nil {
						t.Errorf("%s: FinishRecord of its claim: %v", token, err)
						return
					}
					mu.Lock()
					finished = append(finished, token)
					mu.Unlock()
					return
				case rec != nil:
					mu.Lock()
					records[token] = rec
					mu.Unlock()
					return
				}
				timer := time.NewTimer(min(max(g.Wait, time.Millisecond), 20*time.Millisecond))
				select {
				case <-released:
				case <-timer.C:
				case <-ctx.Done():
					timer.Stop()
					t.Errorf("%s: neither a claim nor a record before the deadline", token)
					return
				}
				timer.Stop()
			}
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	if len(finished) != 1 {
		t.Fatalf("%d claimers of one key: %v finished, want exactly one", n, finished)
	}
	winner := finished[0]
	if len(records) != n-1 {
		t.Fatalf("%d claimers: %d read a record, want %d", n, len(records), n-1)
	}
	for token, rec := range records {
		if string(rec.Response) != winner || rec.Fingerprint != "fp" {
			t.Fatalf("%s read %s, want the record of %s, which finished", token, describeRecord(rec), winner)
		}
	}
}

// testRecordFinishSignals: FinishRecord signals the key's waiters as a
// Release does, so that a claimer refused by the claim wakes and reads the
// record.
func testRecordFinishSignals(t *testing.T, e *env) {
	k := e.key("k")
	ch := e.quietSubscriptions(t, k)[0]
	g := e.mustClaim(t, k, "a", e.long)
	if g, rec := claim(t, e.rs, k, "waiter", e.long); g.OK || rec != nil {
		t.Fatalf("a claim by the waiter: %+v, record %+v; want refused", g, rec)
	}
	rec := recordOf(g, "a")
	e.mustFinish(t, k, "a", rec, e.long)
	expectSignal(t, ch, "after FinishRecord of a claim a waiter was refused")
	_, got := claim(t, e.rs, k, "waiter", e.long)
	expectRecord(t, got, rec, "the waiter's claim after the signal")
}

// proxiedRecords returns a store from Suite.Proxied as a RecordStore, and
// its backend, warmed up as proxied describes with claims of ttl and a
// record of retention, the durations the subtest's calls use.
func (e *env) proxiedRecords(t *testing.T, ttl, retention time.Duration) (stores.Store, stores.RecordStore, backend) {
	t.Helper()
	p, b := e.proxied(t)
	rs, ok := p.(stores.RecordStore)
	if !ok {
		t.Fatalf("storetest: %T from Suite.Proxied does not implement stores.RecordStore", p)
	}
	e.warmRecords(t, rs, ttl, retention)
	return p, rs, b
}

// warmRecords claims for ttl, finishes for retention and claims again
// (reading the record) a key of its own in the subtest keys' hash slot
// through rs, as warm does for locks, so that a fault armed next catches
// the request that carries the keys, not a statement's preparation or a
// lease for the durations the subtest's calls use (etcdstore shares a
// lease per duration between calls).
func (e *env) warmRecords(t *testing.T, rs stores.RecordStore, ttl, retention time.Duration) {
	t.Helper()
	k := "storetest:{" + e.tag + "}:warm:" + randomHex(8)
	g, _, err := rs.ClaimRecord(t.Context(), k, "warm", ttl)
	if err != nil || !g.OK {
		t.Fatalf("warming up the proxied store: ClaimRecord: %+v, %v", g, err)
	}
	if err := rs.FinishRecord(t.Context(), k, "warm", recordOf(g, "warm"), retention); err != nil {
		t.Fatalf("warming up the proxied store: FinishRecord: %v", err)
	}
	if _, rec, err := rs.ClaimRecord(t.Context(), k, "warm2", ttl); err != nil || rec == nil {
		t.Fatalf("warming up the proxied store: ClaimRecord of the finished key: %+v, %v", rec, err)
	}
}

// abandonedClaim: a ClaimRecord that the fault set by fault leaves
// unanswered leaves no claim, and no record, once the fault heals. The
// caller releases the claim after a failure other than ErrAbandoned, as the
// Locker does.
func (e *env) abandonedClaim(t *testing.T, fault func(backend), what string) {
	k := e.key("k")
	ttl := e.maxTTLOr(minFaultTTL)
	p, rs, b := e.proxiedRecords(t, ttl, e.short)
	reached := b.count(e.needle())
	fault(b)
	ctx, cancel := context.WithTimeout(t.Context(), abandonWait)
	start := time.Now()
	g, rec, err := rs.ClaimRecord(ctx, k, "t1", ttl)
	cancel()
	if took := time.Since(start); took > abandonWait+returnSlack {
		t.Errorf("ClaimRecord under the fault returned after %v, %v past its context's end", took, took-abandonWait)
	}
	switch {
	case err == nil:
		t.Fatalf("ClaimRecord under the fault: %+v, record %+v, with no error; want a failure", g, rec)
	case g.OK || rec != nil:
		t.Fatalf("ClaimRecord under the fault failed (%v) but reports a grant or a record", err)
	}
	expectNotUnreachable(t, err, "ClaimRecord under a fault, which may have reached the server")
	a := &abandoned{s: p, keys: []string{k}, token: "t1", err: err}
	if !errors.Is(err, stores.ErrAbandoned) {
		a.owed = !a.releaseOnce(t)
	}
	t.Logf("the abandoned ClaimRecord failed with %v; a release is still owed: %v", err, a.owed)
	<-time.After(faultHold) // the fault outlasts the call: the injected fault itself
	reachedServer(t, reached, what)
	b.heal()
	a.settle(t)
	e.expectFreeForGood(t, []string{k}, healLimit, "after "+what)
	if rec := e.read(t, k); rec != nil {
		t.Fatalf("after %s: record %s, want none", what, describeRecord(rec))
	}
}

// testRecordAbandonedReplyLost: a claim whose reply is lost leaves no claim.
func testRecordAbandonedReplyLost(t *testing.T, e *env) {
	e.abandonedClaim(t, func(b backend) { b.blackhole(faultproxy.ToClient) }, "a claim's lost reply")
}

// testRecordAbandonedReplyLate: a claim whose reply arrives after the call
// gave up leaves no claim.
func testRecordAbandonedReplyLate(t *testing.T, e *env) {
	e.abandonedClaim(t, func(b backend) { b.stall(faultproxy.ToClient) }, "a claim's late reply")
}

// testRecordFinishReplyLost: a FinishRecord whose reply is lost leaves the
// record or the claim, never both nor two records: once the fault heals,
// the caller's Release (which it owes after an unknown outcome) frees the
// claim or answers ErrNotHeld over the record, a retry of the finish
// answers nil over its own record and ErrNotHeld over a free key, and
// claims read that record, or are granted the free key, for good.
func testRecordFinishReplyLost(t *testing.T, e *env) {
	k := e.key("k")
	_, rs, b := e.proxiedRecords(t, e.long, e.long)
	g, _, err := rs.ClaimRecord(t.Context(), k, "t1", e.long)
	if err != nil || !g.OK {
		t.Fatalf("ClaimRecord through the proxy: %+v, %v", g, err)
	}
	rec := recordOf(g, "t1")
	reached := b.count(e.needle())
	b.blackhole(faultproxy.ToClient)
	ctx, cancel := context.WithTimeout(t.Context(), abandonWait)
	err = rs.FinishRecord(ctx, k, "t1", rec, e.long)
	cancel()
	t.Logf("FinishRecord with its reply lost: %v", err)
	expectNotUnreachable(t, err, "FinishRecord under a fault, which may have reached the server")
	<-time.After(faultHold) // the fault outlasts the call: the injected fault itself
	reachedServer(t, reached, "a finish's lost reply")
	b.heal()

	released := e.s.Release(t.Context(), []string{k}, "t1", 0) // the caller's
	finished := errors.Is(released, stores.ErrNotHeld)
	switch {
	case released != nil && !finished:
		t.Fatalf("the caller's Release after the finish: %v", released)
	case err == nil && !finished:
		t.Fatal("FinishRecord answered nil, but the caller's Release then found the claim")
	}
	retry := e.rs.FinishRecord(t.Context(), k, "t1", stores.Record{Fingerprint: "second", Fence: rec.Fence}, e.long)
	switch {
	case finished && retry != nil:
		t.Fatalf("FinishRecord retried over its own record: %v, want nil", retry)
	case !finished && !errors.Is(retry, stores.ErrNotHeld):
		t.Fatalf("FinishRecord retried after the claim's Release: %v, want ErrNotHeld", retry)
	}
	deadline := time.Now().Add(freeFor)
	for time.Now().Before(deadline) {
		got := e.read(t, k)
		switch {
		case finished:
			expectRecord(t, got, rec, "the record of a finish whose reply was lost")
		case got != nil:
			t.Fatalf("record %s after the claim was released: a finish left in flight landed", describeRecord(got))
		}
		<-time.After(20 * time.Millisecond) // between reads: a write still in flight would land meanwhile
	}
	t.Logf("the finish whose reply was lost had landed: %v", finished)
}

// testRecordFinishLate: a FinishRecord whose request is held up in the
// network until after its caller released the claim and another token
// claimed the key changes nothing: the stale claimer cannot finish over the
// newer claim.
func testRecordFinishLate(t *testing.T, e *env) {
	hold := max(e.callLimit, abandonWait) + faultHold + time.Second
	k := e.key("k")
	_, rs, b := e.proxiedRecords(t, e.long, e.long)
	g, _, err := rs.ClaimRecord(t.Context(), k, "t1", e.long)
	if err != nil || !g.OK {
		t.Fatalf("ClaimRecord through the proxy: %+v, %v", g, err)
	}
	needle := e.needle()
	reached := b.count(needle)
	start := time.Now()
	b.delayWhen(faultproxy.ToServer, func(chunk []byte) bool { return bytes.Contains(chunk, []byte(needle)) }, hold)
	ctx, cancel := context.WithTimeout(t.Context(), abandonWait)
	err = rs.FinishRecord(ctx, k, "t1", recordOf(g, "t1"), e.long)
	cancel()
	if err == nil {
		t.Fatal("FinishRecord held up in the network answered nil before its request reached the server")
	}
	if b.armed() == len(b) {
		t.Fatal("the finish's request never reached a proxy: the fault caught no call")
	}
	e.mustRelease(t, []string{k}, "t1") // the caller's, on another connection
	g2 := e.mustClaim(t, k, "t2", e.long)
	<-time.After(time.Until(start.Add(hold))) // the lateness itself: the request lands now
	deadline := time.Now().Add(returnSlack)
	for reached() == 0 && time.Now().Before(deadline) {
		<-time.After(10 * time.Millisecond) // until the proxy has passed the held request on
	}
	reachedServer(t, reached, "a late finish")
	deadline = time.Now().Add(freeFor)
	for time.Now().Before(deadline) { // a late request would land meanwhile
		if g, rec := claim(t, e.rs, k, "probe", e.long); g.OK || rec != nil {
			t.Fatalf("after the stale finish landed: a claim got %+v, record %+v; want refused by the newer claim", g, rec)
		}
		<-time.After(20 * time.Millisecond)
	}
	if err := e.s.Refresh(t.Context(), []string{k}, "t2", e.long); err != nil {
		t.Fatalf("Refresh of the newer claim after the stale finish landed: %v", err)
	}
	rec := recordOf(g2, "t2")
	e.mustFinish(t, k, "t2", rec, e.long)
	expectRecord(t, e.read(t, k), rec, "the newer claim's record")
}

// testRecordStaleClaimer: a claimer whose connection pauses past its claim's
// TTL, while another token claims the key, cannot finish over that claim
// once it resumes: its FinishRecord answers ErrNotHeld, never nil.
func testRecordStaleClaimer(t *testing.T, e *env) {
	k := e.key("k")
	_, rs, b := e.proxiedRecords(t, e.expiry, e.long)
	g, _, err := rs.ClaimRecord(t.Context(), k, "t1", e.expiry)
	if err != nil || !g.OK {
		t.Fatalf("ClaimRecord through the proxy: %+v, %v", g, err)
	}
	b.stall(faultproxy.Both)
	next := e.pollClaim(t, k, "t2", e.long, e.expiry+expiryLimit)
	expectStride(t, g.Fences[0], next.Fences[0], "the claim after the paused claimer's")
	b.heal()
	expectStaleCalls(t, []staleCall{
		{"FinishRecord", func(ctx context.Context) error {
			return rs.FinishRecord(ctx, k, "t1", recordOf(g, "t1"), e.long)
		}},
	})
	if err := e.s.Refresh(t.Context(), []string{k}, "t2", e.long); err != nil {
		t.Fatalf("Refresh of the newer claim after the stale finish: %v", err)
	}
	rec := recordOf(next, "t2")
	e.mustFinish(t, k, "t2", rec, e.long)
	expectRecord(t, e.read(t, k), rec, "the newer claim's record")
}

// pollClaim retries ClaimRecord until it is granted or limit passes.
func (e *env) pollClaim(t *testing.T, key, token string, ttl, limit time.Duration) stores.Grant {
	t.Helper()
	deadline := time.Now().Add(limit)
	ticker := time.NewTicker(5 * time.Millisecond)
	defer ticker.Stop()
	for {
		if g, _ := claim(t, e.rs, key, token, ttl); g.OK {
			return g
		}
		if time.Now().After(deadline) {
			t.Fatalf("ClaimRecord(%s) not granted within %v", stores.KeyForMessage(key), limit)
		}
		<-ticker.C
	}
}
