package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/reqlock/reqlock/stores"
)

var _ stores.RecordStore = (*Store)(nil)

// recordVersion names the format of a record's value (see recordValue).
const recordVersion = "r1"

// recordLeaseSlack is the most a record's lease outlasts its retention, by
// which records of one retention finished within that time share a lease:
// an eighth of the retention, at most a minute (plus the rounding to
// seconds), so that a lease carries the records of a minute at most and
// they go soon after their retention.
const recordLeaseSlack = time.Minute

// recordLeaseSeconds is the TTL, in seconds, of the lease that keeps
// records of retention d, for d in (0, MaxTTL]: d plus an eighth of it, at
// most recordLeaseSlack, rounded up.
func recordLeaseSeconds(d time.Duration) int64 {
	slack := min(d/8, recordLeaseSlack)
	whole := int64(d/time.Second) + int64(slack/time.Second)
	frac := d%time.Second + slack%time.Second // below 2s
	return min(whole+int64((frac+time.Second-1)/time.Second), maxLeaseSeconds)
}

// Sizes of the estimate, from above, of a FinishRecord's request (see
// maxRecordBytes and checkFinish).
const (
	// recordKeyAllowance is the longest key whose FinishRecord takes every
	// record up to MaxRecordBytes; the Locker's record keys are far
	// shorter (a hash). A longer key takes a smaller record.
	recordKeyAllowance = 1 << 10
	// finishOccurrences is how many times FinishRecord's request names the
	// key's holder key, with the token: two conditions, the put, and the
	// two conditions of the check of a retry.
	finishOccurrences = 5
	// recordFraming bounds what a record's value holds besides the
	// record's bytes and the token: NUL bytes, the retention, the format's
	// version, the fence and the fingerprint's length.
	recordFraming = 128
)

// maxRecordBytes is the largest record (stores.Record.Size) whose
// FinishRecord fits a request of maxRequest bytes with a store prefix of
// prefixLen bytes, a key of up to recordKeyAllowance bytes (every byte
// escaped to three) and a token of up to tokenAllowance bytes, rounded down
// to KiB; at least 1. About 1498 KiB with the defaults.
func maxRecordBytes(prefixLen, maxRequest int) int {
	perOccurrence := prefixLen + 3*recordKeyAllowance + len("/holder") + tokenAllowance + opOverhead
	n := maxRequest - requestReserve - finishOccurrences*perOccurrence - recordFraming - tokenAllowance
	return max(n&^(1<<10-1), 1)
}

// isRecord reports whether v, the value of a holder key, is a finished
// record: it starts with a NUL byte, which a token never does (a token is
// not empty and has no NUL byte), so that no owner check of a lock (heldBy,
// heldUpTo) ever matches a record.
func isRecord(v []byte) bool { return len(v) > 0 && v[0] == 0 }

// recordOwner is the start of the value of every record token finished:
// a NUL byte, the token and a NUL byte.
func recordOwner(token string) string { return "\x00" + token + "\x00" }

// recordValue is the value of the holder key that holds rec, finished by
// token with retention:
//
//	NUL token NUL <retention ms> NUL "r1" NUL <fence> NUL <len(fingerprint)> NUL fingerprint response
//
// with the numbers in decimal. A holder key's value reads as a lock's
// (holderTTL): so a plain Acquire refused by a record reports its retention
// as Wait.
func recordValue(token string, retention time.Duration, rec stores.Record) string {
	var b strings.Builder
	b.Grow(len(token) + recordFraming + rec.Size())
	b.WriteString(recordOwner(token))
	b.WriteString(millis(retention))
	b.WriteString("\x00" + recordVersion + "\x00")
	b.WriteString(strconv.FormatInt(rec.Fence, 10))
	b.WriteByte(0)
	b.WriteString(strconv.Itoa(len(rec.Fingerprint)))
	b.WriteByte(0)
	b.WriteString(rec.Fingerprint)
	b.Write(rec.Response)
	return b.String()
}

// decodeRecord returns the record of v, a recordValue.
func decodeRecord(v []byte) (*stores.Record, error) {
	fields := make([]string, 0, 5)
	rest := string(v[1:]) // the leading NUL byte
	for range 5 {
		f, r, ok := strings.Cut(rest, "\x00")
		if !ok {
			return nil, errors.New("a record's value has too few fields")
		}
		fields, rest = append(fields, f), r
	}
	// token, retention, version, fence, fingerprint's length
	if fields[2] != recordVersion {
		return nil, fmt.Errorf("a record's value of format %q, not %q", fields[2], recordVersion)
	}
	fence, err := strconv.ParseInt(fields[3], 10, 64)
	if err != nil {
		return nil, fmt.Errorf("a record's value has a bad fence: %w", err)
	}
	fpLen, err := strconv.Atoi(fields[4])
	if err != nil || fpLen < 0 || fpLen > len(rest) {
		return nil, errors.New("a record's value has a bad fingerprint length")
	}
	return &stores.Record{Fingerprint: rest[:fpLen], Response: []byte(rest[fpLen:]), Fence: fence}, nil
}

// ownRecord compares true when key holds a record token finished: its
// value starts with recordOwner(token).
func ownRecord(key, token string) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(key), ">", recordOwner(token)),
		clientv3.Compare(clientv3.Value(key), "<", "\x00"+token+"\x01"),
	}
}

// ClaimRecord is Acquire of key for token, as stores.RecordStore describes,
// unless key holds a finished record: it then returns a copy of it with a
// Grant whose OK is false, and claims nothing. It is Acquire's transaction
// on the one key (its lease, fence, abandon marks, undo and errors are
// Acquire's): a record is the value of the key's holder key (see
// FinishRecord), so that the transaction refused by it reads it, and a
// replay costs one round trip. A claim is a lock: Release and Refresh end
// and extend it, its lease's end frees the key, and NotifyRelease
// subscribers hear of both.
//
// It returns an error wrapping stores.ErrInvalid for invalid arguments or
// arguments out of the Store's Bounds, or a token whose acquire was
// abandoned; when ctx ends while its transaction is in flight, an error
// wrapping stores.ErrAbandoned, and the Store undoes the claim it may make.
func (s *Store) ClaimRecord(ctx context.Context, key, token string, ttl time.Duration) (stores.Grant, *stores.Record, error) {
	start, seq := s.begin()
	keys := []string{key}
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return stores.Grant{}, nil, err
	}
	if err := errors.Join(checkToken(token), s.checkTTL("ttl", ttl), s.checkKeys(keys, token, keyOccurrences)); err != nil {
		return stores.Grant{}, nil, err
	}
	var (
		g   stores.Grant
		rec *stores.Record
		fl  flight
	)
	err := s.detached(ctx, func(ctx context.Context) error {
		var err error
		g, err = s.acquire(ctx, start, seq, keys, token, ttl, &fl, &rec)
		return err
	}, func() *pendingUndo { return s.newUndo(keys, token, false, &fl) })
	switch {
	case err != nil:
		return stores.Grant{}, nil, err
	case rec != nil:
		return stores.Grant{}, rec, nil
	}
	return g, nil, nil
}

// FinishRecord replaces token's claim on key by rec, kept for retention, as
// stores.RecordStore describes, in one transaction: when the key's holder
// key holds token (the owner check of Release), it puts the record as its
// value (see recordValue), on a lease that lasts retention from the call's
// start and at most a minute more (records of one retention finished
// within that time share a lease), which etcd ends by itself: so records
// never grow beyond what a retention's worth of finishes puts, whatever
// becomes of the Store. Close does not revoke those leases: a record
// outlives the Store that wrote it. etcd renews every lease at a leader
// change, so that a record may then stand up to once more its lease.
//
// The put is a change of the holder key, which the watches of
// NotifyRelease see as the claim's release: the key's waiters claim again
// and read the record. When the key does not hold token's claim, the same
// transaction compares whether it holds the record token finished (a
// retry): nil, changing nothing; else an error wrapping stores.ErrNotHeld,
// changing nothing.
//
// While etcd does not answer, the transaction is sent again, as Release's
// is (see "Leader changes" in the package documentation): each copy is
// owner-checked, and a copy that finds the record of an earlier one
// answers nil. A FinishRecord that fails with an unknown outcome is not
// undone: it replaced the claim, or will change nothing.
//
// It returns an error wrapping stores.ErrInvalid, before any request, for
// invalid arguments, a key out of the Store's Bounds, a record larger than
// MaxRecordBytes or a retention above MaxRetention (Bounds), or a key or
// token so long that the request would exceed etcd's request size limit
// with this record (MaxRecordBytes holds for keys up to 1 KiB and tokens
// up to 1 KiB); ErrClosed after Close; one wrapping stores.ErrUnreachable
// when no member could be dialled; and ctx.Err() without acting when ctx
// has ended.
func (s *Store) FinishRecord(ctx context.Context, key, token string, rec stores.Record, retention time.Duration) error {
	start, _ := s.begin()
	keys := []string{key}
	if err := args.CheckRelease(ctx, keys); err != nil {
		return err
	}
	if err := errors.Join(checkToken(token), s.checkKeys(keys, token, keyOccurrences)); err != nil {
		return err
	}
	if err := args.CheckRecord(s.bounds, rec, retention); err != nil {
		return err
	}
	h := holderKey(s.dir(key))
	val := recordValue(token, retention, rec)
	if n := requestReserve + finishOccurrences*(len(h)+len(token)+opOverhead) + len(val); n > s.maxRequest {
		return fmt.Errorf("%w: etcdstore: finish of %s: a record of %d bytes with a key of %d bytes and a token of %d bytes make a request of up to %d bytes, above etcd's limit of %d (--max-request-bytes)",
			stores.ErrInvalid, stores.KeyForMessage(key), rec.Size(), len(key), len(token), n, s.maxRequest)
	}
	if s.isClosed() {
		return ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	send := func(ctx context.Context) (resp *clientv3.TxnResponse, err error) {
		err = s.withPoolLeases(ctx, s.records, start, []time.Duration{retention}, func(ids []clientv3.LeaseID) error {
			var err error
			resp, err = s.kv.Txn(ctx).If(heldBy(h, token)...).
				Then(clientv3.OpPut(h, val, clientv3.WithLease(ids[0]))).
				Else(clientv3.OpTxn(ownRecord(h, token), nil, nil)).Commit()
			return err
		})
		return resp, err
	}
	answers, err := s.resend(ctx, send, finished)
	if err != nil {
		return s.failed("finish record", keys, err)
	}
	for _, resp := range answers {
		if finished(resp) {
			return nil
		}
	}
	return fmt.Errorf("%w: etcdstore: finish of %s: the key does not hold the token's claim", stores.ErrNotHeld, stores.KeyForMessage(key))
}

// finished reports whether a FinishRecord's transaction, answered resp,
// replaced the claim by the record, or found the record of its token.
func finished(resp *clientv3.TxnResponse) bool {
	if resp.Succeeded {
		return true
	}
	return len(resp.Responses) == 1 && resp.Responses[0].GetResponseTxn().GetSucceeded()
}
