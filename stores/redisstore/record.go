package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/reqlock/reqlock/stores"
)

var (
	//go:embed claim_record.lua
	claimRecordSrc string
	//go:embed finish_record.lua
	finishRecordSrc string

	claimRecordScript  = newScript(withLib(claimRecordSrc))
	finishRecordScript = newScript(finishRecordSrc)
)

// recordPrefix starts the value of every record key that holds a finished
// record. The value is
//
//	recordPrefix <len(token)> ":" token <fence> ":" <len(fingerprint)> ":" fingerprint response
//
// with the lengths and the fence in decimal: the prefix up to the token
// names the token that finished it (see finish_record.lua), and no token of
// a claim starts with recordPrefix (ClaimRecord refuses one), so a record
// is never mistaken for a claim, nor a claim for a record.
const recordPrefix = "\x00reqlock:record:1\x00"

// DefaultMaxRecordBytes is the largest record (stores.Record.Size) a Store
// keeps unless WithMaxRecordBytes says otherwise: 16 MiB, far below what
// Redis's default client-output-buffer-limit lets through a replica's link
// (64mb soft for 60 s, 256mb hard). A larger record makes the master drop
// its replicas and resync them in full, and a failover meanwhile loses the
// record.
const DefaultMaxRecordBytes = 16 << 20

// MaxRecordBytesLimit is the most WithMaxRecordBytes takes: half of Redis's
// 512 MB limit on a string value (proto-max-bulk-len), which leaves room
// for the token and the encoding. Above 16 MiB, raise the replicas'
// client-output-buffer-limit first.
const MaxRecordBytesLimit = 256 << 20

// WithMaxRecordBytes sets the largest record (stores.Record.Size) the Store
// keeps, stated in its Bounds; FinishRecord refuses a larger one with
// stores.ErrInvalid. Between 1 and MaxRecordBytesLimit; default
// DefaultMaxRecordBytes.
func WithMaxRecordBytes(n int) Option {
	return func(s *Store) { s.maxRecordBytes = n }
}

// Bounds states the largest record the Store keeps (see WithMaxRecordBytes).
// Keys, TTLs and retentions have no bound but Redis's own.
func (s *Store) Bounds() stores.Bounds {
	reason := "redisstore's default record limit (DefaultMaxRecordBytes: what a replica's link carries safely)"
	if s.maxRecordBytes != DefaultMaxRecordBytes {
		reason = "redisstore.WithMaxRecordBytes(" + strconv.Itoa(s.maxRecordBytes) + ")"
	}
	return stores.Bounds{MaxRecordBytes: s.maxRecordBytes, Reason: reason}
}

// ClaimRecord is Acquire of key for token, as stores.RecordStore describes,
// in one script and one round trip, unless key holds a finished record: it
// then returns a copy of it with a Grant whose OK is false, and changes
// nothing. A claim is a plain grant of the key, with Acquire's fence,
// release signals, abandon marks and waiting writers; Release and Refresh
// end and extend it. A record is a string value of the key that no token
// equals, so that no Release, Refresh or Acquire acts on it.
//
// Its errors, and what it does when ctx ends while the script is in flight,
// are Acquire's: a claim it may have made is released, owner-checked. It
// returns an error wrapping stores.ErrInvalid for an empty key, a
// non-positive ttl or a token that starts with the prefix of a record's
// value (a NUL byte, then "reqlock:record:"), and one wrapping
// ErrCrossSlot, and so stores.ErrInvalid, when a Cluster refuses the key
// because its sibling keys hash to another slot (a key with a '}' and no
// hash tag; see fenceKey).
func (s *Store) ClaimRecord(ctx context.Context, key, token string, ttl time.Duration) (stores.Grant, *stores.Record, error) {
	if err := checkRecordArgs(ctx, key, token); err != nil {
		return stores.Grant{}, nil, err
	}
	if err := args.CheckTTL(ttl); err != nil {
		return stores.Grant{}, nil, err
	}
	call := &scriptCall{store: s, script: claimRecordScript,
		keys: []string{key, fenceKey(key), waitingKey(key), abandonKey(key, token), writerMarkKey(key, token), writersKey(key)},
		args: []any{token, milliseconds(ttl), s.fenceRetention.Milliseconds(), stores.FenceStride, writerWindowMS, recordPrefix},
		undo: undoRelease, undoKeys: []string{key}, undoToken: token, ttl: ttl}
	r, err := call.run(ctx)
	if err != nil {
		return stores.Grant{}, nil, s.mapCrossSlot(err, []string{key}, true)
	}
	reply := r.Ints
	switch {
	case r.Bulk != nil:
		rec, err := decodeRecord(r.Bulk)
		if err != nil {
			return stores.Grant{}, nil, fmt.Errorf("%w: claim of %s: %w", ErrUnexpectedReply, stores.KeyForMessage(key), err)
		}
		return stores.Grant{}, rec, nil
	case len(reply) == 2 && reply[0] == 1:
		return stores.Grant{OK: true, Fences: reply[1:]}, nil, nil
	case len(reply) == 3 && reply[0] == 0:
		return stores.Grant{Wait: holderTTL(reply[1]), SharedHeld: reply[2] == 1}, nil, nil
	}
	return stores.Grant{}, nil, fmt.Errorf("%w: claim of %s answered %v", ErrUnexpectedReply, stores.KeyForMessage(key), reply)
}

// FinishRecord replaces token's claim on key by rec, kept for retention
// (Redis's PX), as stores.RecordStore describes, in one script and one
// round trip, and publishes the key's release when a claimer was refused
// meanwhile. It returns an error wrapping stores.ErrNotHeld, changing
// nothing, when key does not hold token's claim, and nil, changing nothing,
// when key holds the record token finished (a retry).
//
// A FinishRecord that fails with an unknown outcome is not undone: it
// either replaced the claim or will change nothing. It returns an error
// wrapping stores.ErrInvalid for an empty key, a non-positive retention,
// a record larger than the Store's MaxRecordBytes or a token refused as
// in ClaimRecord; one wrapping ErrCrossSlot as in ClaimRecord; the
// client's error, wrapped with stores.ErrUnreachable when the call never
// reached Redis; and ctx.Err() without acting when ctx has ended.
func (s *Store) FinishRecord(ctx context.Context, key, token string, rec stores.Record, retention time.Duration) error {
	if err := checkRecordArgs(ctx, key, token); err != nil {
		return err
	}
	if err := args.CheckRecord(s.Bounds(), rec, retention); err != nil {
		return err
	}
	owner := recordOwner(token)
	call := &scriptCall{store: s, script: finishRecordScript, keys: []string{key, waitingKey(key)},
		args: []any{token, encodeRecord(owner, rec), owner, milliseconds(retention)}}
	r, err := call.run(ctx)
	if err != nil {
		return s.mapCrossSlot(err, []string{key}, true)
	}
	switch {
	case r.Ints != nil || r.Bulk != nil || r.Int < 0 || r.Int > 2:
		return fmt.Errorf("%w: finish of %s answered %v", ErrUnexpectedReply, stores.KeyForMessage(key), r)
	case r.Int == 0:
		return fmt.Errorf("%w: %s does not hold the token's claim", stores.ErrNotHeld, stores.KeyForMessage(key))
	}
	return nil
}

// checkRecordArgs checks the key and token of ClaimRecord and FinishRecord.
func checkRecordArgs(ctx context.Context, key, token string) error {
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	return checkGrantToken(token)
}

// checkGrantToken returns an error wrapping stores.ErrInvalid when token
// starts like a record's value (see recordPrefix): no claim or lock is
// granted to such a token, so that no record is taken for a grant of its
// value, nor a grant for a record.
func checkGrantToken(token string) error { return args.CheckGrantToken(token, recordPrefix) }

// notHeldByRecordToken returns an error wrapping stores.ErrNotHeld when
// token starts like a record's value: it holds no key (see
// checkGrantToken), and a Release or Refresh of it must not act on a
// record whose value it equals.
func notHeldByRecordToken(keys []string, token string) error {
	return args.CheckHeldToken(keys, token, recordPrefix)
}

// recordOwner returns the start of the value of a record token finished,
// up to the token (see recordPrefix).
func recordOwner(token string) string {
	return recordPrefix + strconv.Itoa(len(token)) + ":" + token
}

// encodeRecord returns the value of rec finished by the token whose
// recordOwner is owner.
func encodeRecord(owner string, rec stores.Record) string {
	var b strings.Builder
	b.Grow(len(owner) + 40 + len(rec.Fingerprint) + len(rec.Response))
	b.WriteString(owner)
	b.WriteString(strconv.FormatInt(rec.Fence, 10))
	b.WriteByte(':')
	b.WriteString(strconv.Itoa(len(rec.Fingerprint)))
	b.WriteByte(':')
	b.WriteString(rec.Fingerprint)
	b.Write(rec.Response)
	return b.String()
}

// decodeRecord returns the record of value, as encodeRecord made it.
func decodeRecord(value []byte) (*stores.Record, error) {
	rest, ok := strings.CutPrefix(string(value), recordPrefix)
	if !ok {
		return nil, fmt.Errorf("a record's value does not start with the record prefix")
	}
	tokenLen, rest, err := cutNumber(rest)
	if err != nil || tokenLen < 0 || tokenLen > int64(len(rest)) {
		return nil, fmt.Errorf("a record's value has a bad token length")
	}
	rest = rest[tokenLen:]
	fence, rest, err := cutNumber(rest)
	if err != nil {
		return nil, fmt.Errorf("a record's value has a bad fence")
	}
	fpLen, rest, err := cutNumber(rest)
	if err != nil || fpLen < 0 || fpLen > int64(len(rest)) {
		return nil, fmt.Errorf("a record's value has a bad fingerprint length")
	}
	return &stores.Record{Fingerprint: rest[:fpLen], Response: []byte(rest[fpLen:]), Fence: fence}, nil
}

// cutNumber parses the decimal number before the first ':' of s and
// returns it and what follows the ':'.
func cutNumber(s string) (int64, string, error) {
	num, rest, ok := strings.Cut(s, ":")
	if !ok {
		return 0, "", fmt.Errorf("no ':'")
	}
	n, err := strconv.ParseInt(num, 10, 64)
	return n, rest, err
}

// RecordLua defines two Lua functions for a script of the application that
// writes an idempotency record in the same atomic step as its own writes
// (see RecordWrite): prepend it to the script's source.
//
//	reqlock_claimed(key, token)
//	    true when key holds token's claim: check it before changing anything.
//	reqlock_recorded(key, value)
//	    true when key holds the record value: this very write ran already.
//	    A client that resends a script whose reply it lost (go-redis does,
//	    on a dropped connection) finds the claim gone and its own record
//	    in its place; the script must then answer as when it wrote it, not
//	    as for a lost claim, or the request answers that nothing changed
//	    while its side effect is there.
//	reqlock_record(key, waiting, token, value, retention_ms)
//	    replaces token's claim on key by the record value, kept for
//	    retention_ms, and wakes the key's waiters, as FinishRecord does;
//	    false, changing nothing, when key does not hold token's claim.
//
// FinishRecord of the same token afterwards answers nil and changes
// nothing, so the record stays the script's.
const RecordLua = `
local function reqlock_claimed(key, token)
  return redis.pcall('GET', key) == token
end
local function reqlock_recorded(key, value)
  return redis.pcall('GET', key) == value
end
local function reqlock_record(key, waiting, token, value, retention_ms)
  if redis.pcall('GET', key) ~= token then
    return false
  end
  redis.call('SET', key, value, 'PX', retention_ms)
  if redis.call('DEL', waiting) == 1 then
    redis.call('PUBLISH', key, 'released')
  end
  return true
end
`

// RecordWrite is what a script (see RecordLua) needs to write a record in
// its own atomic step: pass Key and WaitingKey among the script's KEYS and
// Token, Value and RetentionMS among its ARGV.
//
// On Redis Cluster every key of a script must be in one slot: WaitingKey
// is in Key's, and the script's own keys must be too. A key's first hash
// tag decides its slot, so with a hash tag in the Locker's key prefix
// (reqlock.WithKeyPrefix("{shop}:")) and the same tag in the application's
// keys ("{shop}:stock:A-1") the records (whose own tag comes later) and
// those keys share one slot, and one shard.
type RecordWrite struct {
	Key         string // the record key, as the store holds it
	WaitingKey  string // the key of its waiters, in Key's slot
	Token       string // the claim's token: Key's value while the claim holds it
	Value       string // the record, encoded as FinishRecord stores it
	RetentionMS int64  // the record's retention, in milliseconds
}

// NewRecordWrite returns the RecordWrite of rec, finished by the claim of
// token on key (the record key as the store holds it, such as
// middleware.IdempotentRequest's Key), kept for retention. It returns an
// error wrapping stores.ErrInvalid as FinishRecord does for an empty key, a
// token refused by ClaimRecord, a non-positive retention or a record over
// MaxRecordBytesLimit (the middleware checks its routes' records against
// the Store's own limit at start-up).
func NewRecordWrite(key, token string, rec stores.Record, retention time.Duration) (RecordWrite, error) {
	if err := checkRecordArgs(context.Background(), key, token); err != nil {
		return RecordWrite{}, err
	}
	if err := args.CheckRecord(stores.Bounds{MaxRecordBytes: MaxRecordBytesLimit, Reason: "redisstore's MaxRecordBytesLimit"},
		rec, retention); err != nil {
		return RecordWrite{}, err
	}
	return RecordWrite{Key: key, WaitingKey: waitingKey(key), Token: token,
		Value: encodeRecord(recordOwner(token), rec), RetentionMS: milliseconds(retention)}, nil
}
