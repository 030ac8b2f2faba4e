package reqlock_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
)

// TestClaimRecordFinishAndRead: a free record key is claimed (a lock on
// RecordKeyPrefix+key, with a fence); FinishRecord turns it into the
// record, with the claim's fence; a later ClaimRecord returns the record,
// byte for byte, and claims nothing.
func TestClaimRecordFinishAndRead(t *testing.T) {
	l, store := newLocker(t)
	ctx := context.Background()
	claim, rec, err := l.ClaimRecord(ctx, "r:1", time.Minute, time.Second)
	if err != nil || rec != nil || claim == nil {
		t.Fatalf("ClaimRecord of a free key = %v, %v, %v; want a claim", claim, rec, err)
	}
	if claim.Key() != reqlock.RecordKeyPrefix+"r:1" || claim.Fence() <= 0 {
		t.Fatalf("claim key %q fence %d", claim.Key(), claim.Fence())
	}
	resp := []byte{0, 1, 2, 0xff, 'x'}
	if err := claim.FinishRecord(ctx, stores.Record{Fingerprint: "fp", Response: resp}, time.Hour); err != nil {
		t.Fatalf("FinishRecord: %v", err)
	}
	if !claim.Released() {
		t.Fatal("a finished claim is not released")
	}
	if err := claim.Release(ctx); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("Release after FinishRecord: %v, want ErrNotHeld", err)
	}
	if err := claim.FinishRecord(ctx, stores.Record{Fingerprint: "fp2"}, time.Hour); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("a second FinishRecord: %v, want ErrNotHeld", err)
	}
	for range 2 {
		again, got, err := l.ClaimRecord(ctx, "r:1", time.Minute, 0)
		if err != nil || again != nil || got == nil {
			t.Fatalf("ClaimRecord of a finished key = %v, %v, %v; want the record", again, got, err)
		}
		if got.Fingerprint != "fp" || !bytes.Equal(got.Response, resp) || got.Fence != claim.Fence() {
			t.Fatalf("record %+v, want fingerprint fp, response %v, fence %d", got, resp, claim.Fence())
		}
	}
	if n := store.Len(); n != 1 {
		t.Fatalf("the store holds %d entries, want the record alone", n)
	}
}

// TestClaimRecordWaitsForTheClaim: a second ClaimRecord waits while the
// first claim holds the key and reads the record once the first finishes
// (woken by the store's release signal, long before its backoff or the
// claim's TTL); one whose wait runs out first fails with
// ErrRecordInProgress, ErrHeld, ErrWaitEnded and DeadlineExceeded, and a
// try-once at once with ErrRecordInProgress and ErrHeld.
func TestClaimRecordWaitsForTheClaim(t *testing.T) {
	store := subscribedStore{memstore.New(), make(chan struct{}, 16)}
	l := reqlock.MustNew(store, reqlock.WithBackoff(time.Second, 10*time.Second))
	ctx := context.Background()
	first, _, err := l.ClaimRecord(ctx, "r:2", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = l.ClaimRecord(ctx, "r:2", time.Minute, 20*time.Millisecond)
	for _, want := range []error{reqlock.ErrRecordInProgress, reqlock.ErrHeld, reqlock.ErrWaitEnded, context.DeadlineExceeded} {
		if !errors.Is(err, want) {
			t.Fatalf("a wait that ran out: %v, want it to match %v", err, want)
		}
	}
	if reqlock.OutcomeOf(ctx, err) != reqlock.OutcomeTimeout {
		t.Fatalf("OutcomeOf(%v) = %v, want timeout", err, reqlock.OutcomeOf(ctx, err))
	}
	_, _, err = l.ClaimRecord(ctx, "r:2", time.Minute, 0)
	if !errors.Is(err, reqlock.ErrRecordInProgress) || !errors.Is(err, reqlock.ErrHeld) {
		t.Fatalf("a try-once on a claimed key: %v, want ErrRecordInProgress and ErrHeld", err)
	}

	type result struct {
		claim *reqlock.Lock
		rec   *stores.Record
		err   error
		took  time.Duration
	}
	for len(store.subscribed) > 0 {
		<-store.subscribed // the waits above
	}
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		c, rec, err := l.ClaimRecord(ctx, "r:2", time.Minute, 30*time.Second)
		done <- result{c, rec, err, time.Since(start)}
	}()
	<-store.subscribed // the waiter was refused, and waits for a signal or its backoff of 1s or more
	if err := first.FinishRecord(ctx, stores.Record{Fingerprint: "fp", Response: []byte("answer")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.claim != nil || r.rec == nil || string(r.rec.Response) != "answer" {
		t.Fatalf("the waiter got %v, %+v, %v; want the record", r.claim, r.rec, r.err)
	}
	if r.took > 900*time.Millisecond {
		t.Fatalf("the waiter took %v: the finish's signal did not wake it", r.took)
	}
}

// TestClaimRecordReleaseAndLoss: a released claim frees the key for the
// next claim, which gets a higher fence; a claim whose TTL ran out cannot
// finish (ErrNotHeld), nothing is recorded, and the key is free.
func TestClaimRecordReleaseAndLoss(t *testing.T) {
	l, store := newLocker(t)
	ctx := context.Background()
	a, _, err := l.ClaimRecord(ctx, "r:3", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	mustRelease(t, a)
	b, _, err := l.ClaimRecord(ctx, "r:3", 30*time.Millisecond, 0)
	if err != nil || b.Fence() <= a.Fence() {
		t.Fatalf("claim after a release: %v, fence %d after %d", err, b.Fence(), a.Fence())
	}
	deadline := time.Now().Add(10 * time.Second)
	for store.Len() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // poll the claim's expiry
	}
	if err := b.FinishRecord(ctx, stores.Record{Fingerprint: "fp"}, time.Hour); !errors.Is(err, reqlock.ErrNotHeld) {
		t.Fatalf("FinishRecord of an expired claim: %v, want ErrNotHeld", err)
	}
	c, rec, err := l.ClaimRecord(ctx, "r:3", time.Minute, 0)
	if err != nil || rec != nil || c == nil {
		t.Fatalf("the key after a claim expired unfinished: %v, %v, %v; want a new claim", c, rec, err)
	}
	mustRelease(t, c)
}

// TestClaimRecordRefusals: a store without records refuses ClaimRecord and
// CheckRecords with ErrInvalid naming the store; FinishRecord of a lock
// that is not a claim is ErrInvalid; a record over the store's bound is
// refused at the check and at the finish, which releases the claim.
func TestClaimRecordRefusals(t *testing.T) {
	ctx := context.Background()
	plain := reqlock.MustNew(struct{ stores.Store }{memstore.New()})
	if _, _, err := plain.ClaimRecord(ctx, "r", time.Second, 0); !errors.Is(err, reqlock.ErrInvalid) ||
		!strings.Contains(err.Error(), "RecordStore") {
		t.Fatalf("ClaimRecord on a store without records: %v", err)
	}
	if err := plain.CheckRecords(); !errors.Is(err, reqlock.ErrInvalid) {
		t.Fatalf("CheckRecords: %v", err)
	}

	l, store := newLocker(t)
	lock, err := l.Obtain(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := lock.FinishRecord(ctx, stores.Record{}, time.Hour); !errors.Is(err, reqlock.ErrInvalid) {
		t.Fatalf("FinishRecord of a plain lock: %v, want ErrInvalid", err)
	}
	mustRelease(t, lock)

	bounded := reqlock.MustNew(recordBoundStore{store, stores.Bounds{MaxRecordBytes: 10, MaxRetention: time.Hour, Reason: "the test's bound"}})
	if err := bounded.CheckRecord(11, time.Minute); !errors.Is(err, reqlock.ErrInvalid) || !strings.Contains(err.Error(), "10 bytes") {
		t.Fatalf("CheckRecord over the size bound: %v", err)
	}
	if err := bounded.CheckRecord(10, 2*time.Hour); !errors.Is(err, reqlock.ErrInvalid) {
		t.Fatalf("CheckRecord over the retention bound: %v", err)
	}
	if err := bounded.CheckRecord(10, time.Hour); err != nil {
		t.Fatalf("CheckRecord within bounds: %v", err)
	}
	claim, _, err := bounded.ClaimRecord(ctx, "big", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := claim.FinishRecord(ctx, stores.Record{Response: make([]byte, 11)}, time.Minute); !errors.Is(err, reqlock.ErrInvalid) {
		t.Fatalf("FinishRecord over the bound: %v, want ErrInvalid", err)
	}
	if n := store.Len(); n != 0 {
		t.Fatalf("a refused finish left %d entries, want the claim released", n)
	}
}

// recordBoundStore is memstore with bounds on its records, checked as a
// bounded store checks them.
type recordBoundStore struct {
	*memstore.Store
	b stores.Bounds
}

func (s recordBoundStore) Bounds() stores.Bounds { return s.b }

func (s recordBoundStore) FinishRecord(ctx context.Context, key, token string, rec stores.Record, retention time.Duration) error {
	if err := s.b.CheckRecord(rec, retention); err != nil {
		return err
	}
	return s.Store.FinishRecord(ctx, key, token, rec, retention)
}

// subscribedStore is memstore that tells when a waiter subscribes to a
// key's release signals: after a refusal, before its sleep.
type subscribedStore struct {
	*memstore.Store
	subscribed chan struct{}
}

func (s subscribedStore) NotifyRelease(key, token string) (<-chan struct{}, func()) {
	ch, stop := s.Store.NotifyRelease(key, token)
	s.subscribed <- struct{}{}
	return ch, stop
}
