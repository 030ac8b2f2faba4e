package reqlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// RecordKeyPrefix is put in front of every record key, after the Locker's
// key prefix, so that the keys of idempotency records stay apart from lock
// keys in the store: package middleware refuses a key template that starts
// with it at start-up, and answers 400 to a request whose values render a
// lock key that does; code that calls Obtain itself must not use it.
const RecordKeyPrefix = "idem:"

// recordOps is a stores.Store over the keys of a stores.RecordStore for
// claims: Acquire is ClaimRecord of keys[0], and a finished record it finds
// comes back as a *recordFound error, which ends the acquire loop; Release
// and Refresh are the store's own, which end and extend a claim.
type recordOps struct {
	stores.Store
	records stores.RecordStore
}

// Acquire is ClaimRecord of keys[0], the only key of a claim.
func (o recordOps) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	g, rec, err := o.records.ClaimRecord(ctx, keys[0], token, ttl)
	if err == nil && rec != nil {
		return stores.Grant{}, &recordFound{rec: rec}
	}
	return g, err
}

// errRecorded is matched by the error with which a claim's acquire loop
// ends when the key holds a finished record: not a failure of the store.
var errRecorded = errors.New("reqlock: the key holds a finished record")

// recordFound is the error that carries the record ClaimRecord found.
type recordFound struct{ rec *stores.Record }

func (e *recordFound) Error() string        { return errRecorded.Error() }
func (e *recordFound) Is(target error) bool { return target == errRecorded }

// CheckRecords returns an error wrapping ErrInvalid, naming the store, when
// the Locker's store cannot keep idempotency records (it does not implement
// stores.RecordStore). ClaimRecord refuses then; the middleware checks
// idempotent routes with it at start-up.
func (l *Locker) CheckRecords() error {
	if l.records == nil {
		return fmt.Errorf("%w: idempotency records need a store that implements stores.RecordStore; %T does not",
			ErrInvalid, l.store)
	}
	return nil
}

// CheckRecord returns an error wrapping ErrInvalid, naming the store and its
// limit, when the store cannot keep a record of size bytes (see
// stores.Record.Size) for retention (see stores.Bounds). FinishRecord
// refuses such a record; the middleware checks each idempotent route's
// largest record and its retention with it at start-up.
func (l *Locker) CheckRecord(size int, retention time.Duration) error {
	if err := l.CheckRecords(); err != nil {
		return err
	}
	if err := l.bounds.CheckRecord(stores.Record{Response: make([]byte, 0)}, retention); err != nil {
		return fmt.Errorf("%w (store %T)", err, l.store)
	}
	if limit := l.bounds.MaxRecordBytes; limit > 0 && size > limit {
		return fmt.Errorf("%w: a record of up to %d bytes is larger than the limit of %d bytes of store %T%s",
			ErrInvalid, size, limit, l.store, reasonSuffix(l.bounds))
	}
	return nil
}

// ClaimRecord claims the idempotency record key for ttl, or returns the
// record that a request with the same key finished. The key is stored as
// RecordKeyPrefix+key, after the Locker's prefix.
//
// When the key is free, it returns a claim: a Lock on the record key, with
// its token and fence, which Release ends, Refresh and KeepAlive renew, and
// FinishRecord turns into the record. When the key holds a finished record,
// it returns the record and no lock, with no wait. When another request's
// claim holds the key, it waits as Obtain waits for a held key (backoff,
// the store's release signals, cut short by the holder's TTL, up to wait
// and ctx's deadline, the breaker and pending releases alike), and then
// claims the key or reads the record its holder finished.
//
// A claim is never handed to a waiter of this process, nor re-entered: each
// claim is a grant of its own. Its events are not counted in the Locker's
// Metrics (the middleware counts idempotency events of its own), but its
// store calls are seen by the breaker (see WithBreaker).
//
// Errors are Obtain's, and when the key was held by another claim until
// the wait ended they also match ErrRecordInProgress (with ErrHeld and, for
// a wait that ran out, ErrWaitEnded and the context's error). On a store
// that does not implement stores.RecordStore it returns an error wrapping
// ErrInvalid (see CheckRecords).
func (l *Locker) ClaimRecord(ctx context.Context, key string, ttl, wait time.Duration) (*Lock, *stores.Record, error) {
	switch {
	case l.records == nil:
		return nil, nil, l.CheckRecords()
	case key == "":
		return nil, nil, fmt.Errorf("%w: empty key", ErrInvalid)
	case ttl <= 0:
		return nil, nil, fmt.Errorf("%w: ttl %v is not positive", ErrInvalid, ttl)
	case wait < 0:
		return nil, nil, fmt.Errorf("%w: wait %v is negative", ErrInvalid, wait)
	}
	key = RecordKeyPrefix + key
	if err := l.checkArgs([]string{key}, ttl); err != nil {
		return nil, nil, err
	}
	ctx = requestContext(ctx)
	label := labelOf(ctx)
	if err := ctx.Err(); err != nil {
		return nil, nil, errors.Join(ErrWaitEnded, err)
	}
	h, rec, err := l.acquireClaim(ctx, key, ttl, wait)
	switch {
	case err != nil:
		if l.breaker != nil && errors.Is(err, ErrStoreDown) {
			l.breaker.rejected.Add(1)
			if l.outage != nil {
				l.outage.RejectedStoreDown(label)
			}
		}
		if errors.Is(err, ErrHeld) {
			err = errors.Join(ErrRecordInProgress, err)
		}
		return nil, nil, err
	case rec != nil:
		return nil, rec, nil
	}
	h.g.beginEpoch(label, ttl)
	return l.newKeyLock(label, key, h), nil, nil
}

// acquireClaim obtains a claim of key (with RecordKeyPrefix) from the store,
// or the record the key holds: no local queue, no handoff, as a shared
// grant.
func (l *Locker) acquireClaim(ctx context.Context, key string, ttl, wait time.Duration) (hold, *stores.Record, error) {
	if l.breaker != nil && l.breaker.rejecting() {
		return hold{}, nil, l.breaker.downError()
	}
	g := l.newGrant([]string{key})
	g.claim = true
	bound := wait
	if wait == 0 {
		bound = l.releaseTimeout // as in acquire
	}
	outer := ctx
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	if err := l.contend(outer, ctx, g, nil, ttl, wait, heldSeen{joined: time.Now()}); err != nil {
		if found, ok := errors.AsType[*recordFound](err); ok {
			return hold{}, found.rec, nil
		}
		return hold{}, nil, storeSilent(outer, err)
	}
	return hold{g: g}, nil, nil
}

// FinishRecord turns the claim l (from ClaimRecord) into the record rec,
// kept for retention, and signals the waiters for its key, who then read
// the record. rec.Fence is set to the claim's fence. The lock is released
// by it: its watchdog stops and its contexts end first, as with Release.
// The store call runs on a context that ctx's cancellation cannot end,
// bounded by the Locker's release timeout.
//
// Errors: ErrNotHeld when the claim expired, was lost or was already
// released or finished (nothing is recorded); ErrInvalid when l is not a
// claim, or rec or retention is out of the store's bounds (see
// CheckRecord; the claim is then released); ErrStore when the store failed
// (the outcome is unknown: the record may stand or not, and the claim is
// released, owner-checked, with the retries of WithPendingReleases, so
// that a key never stays claimed with nobody to finish it).
func (l *Lock) FinishRecord(ctx context.Context, rec stores.Record, retention time.Duration) error {
	if len(l.holds) != 1 || !l.holds[0].g.claim {
		return fmt.Errorf("%w: FinishRecord of a lock that ClaimRecord did not return (%q)", ErrInvalid, l.keys[0])
	}
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return fmt.Errorf("%w: the claim of %q was already released or finished", ErrNotHeld, l.keys[0])
	}
	l.released = true
	l.mu.Unlock()
	l.endLife(errReleased)
	rec.Fence = l.fences[0]
	return l.holds[0].g.finish(ctx, l.holds[0].epoch, rec, retention)
}

// finish ends the claim g of epoch's holder by a record: FinishRecord in the
// store, or, when the store refused or failed, a release of the claim.
func (g *grant) finish(ctx context.Context, epoch int, rec stores.Record, retention time.Duration) error {
	g.mu.Lock()
	if g.epoch != epoch || g.holds == 0 || g.ended {
		g.mu.Unlock()
		return fmt.Errorf("%w: the claim of %q was released", ErrNotHeld, g.keys[0])
	}
	g.holds = 0
	lost := g.lost
	g.mu.Unlock()
	l := g.locker
	if lost {
		_ = g.end(ctx, false) // owner-checked: the store says whether any claim is left
		return fmt.Errorf("%w: the claim of %q was lost", ErrNotHeld, g.keys[0])
	}
	err := l.finishRecord(ctx, g.keys[0], g.token, rec, retention)
	switch {
	case err == nil || errors.Is(err, ErrNotHeld):
		g.mu.Lock()
		g.ended = true
		g.mu.Unlock()
		return err
	}
	// Refused, or an unknown outcome: no claim may stay behind. A release
	// after a finish that landed answers ErrNotHeld and leaves the record.
	_ = g.end(ctx, false)
	return err
}

// finishRecord is FinishRecord in the store, on a context the caller's
// cancellation cannot end, bounded by the release timeout; while the breaker
// counts the store down, it answers ErrStoreDown without a store call.
func (l *Locker) finishRecord(ctx context.Context, storeKey, token string, rec stores.Record, retention time.Duration) error {
	if l.breaker != nil && l.breaker.rejecting() {
		return l.breaker.downError()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.releaseTimeout)
	defer cancel()
	return wrapStoreError(l.records.FinishRecord(ctx, storeKey, token, rec, retention))
}

// isClaim reports whether a lock is a claim of ClaimRecord.
func (l *Lock) isClaim() bool {
	return slices.ContainsFunc(l.holds, func(h hold) bool { return h.g.claim })
}

// StoreKey returns Key as the store holds it, with the Locker's key prefix:
// for a claim of ClaimRecord, the record key, which a script of the
// application may owner-check against Token and replace by the record in
// its own atomic step (see redisstore.NewRecordWrite).
func (l *Lock) StoreKey() string { return l.locker.prefix + l.keys[0] }
