package etcdstore

import (
	"fmt"
	"strings"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// MaxKeys is the most keys one call takes: etcd limits a transaction to 128
// operations by default (--max-txn-ops), and an acquire compares two ranges
// per key.
const MaxKeys = 64

// reservedToken starts a finished record's value (see isRecord): Release and
// Refresh answer stores.ErrNotHeld for a token that starts with it, which
// holds no key (checkToken refuses it to every grant), as the other stores
// do for the tokens they reserve.
const reservedToken = "\x00"

// checkToken refuses an empty token, and one with a NUL byte, which ends
// the token in a holder key's value.
func checkToken(token string) error {
	if token == "" || strings.Contains(token, "\x00") {
		return fmt.Errorf("%w: etcdstore: empty token, or one with a NUL byte", stores.ErrInvalid)
	}
	return nil
}

// Sizes of the estimate, from above, of a request's size (see
// Store.checkKeys): etcd refuses a request larger than --max-request-bytes.
const (
	// requestReserve is what a request holds besides its keys: etcd's
	// raft header, the transaction's framing.
	requestReserve = 16 << 10
	// opOverhead is what each occurrence of a key in a request adds to
	// the key and the token: protobuf tags and lengths, nested
	// transactions, a value's TTL.
	opOverhead = 64
	// tokenAllowance is the longest token that every call on a key of
	// MaxKeyBytes takes; a longer one may make a call too large.
	tokenAllowance = 1 << 10
	// keyOccurrences is how many times a request of a plain call names
	// each of its keys, with the token: Acquire's condition (a range,
	// which counts twice), put, delete of the writer's record and read (a
	// range); Refresh's two conditions and put; Release's two conditions
	// and delete or put.
	keyOccurrences = 6
	// fairOccurrences is how many times AcquireFair's first transaction
	// names its key's directory, with the token: five conditions (one a
	// range), a put and two deletes when granted, two range reads and a
	// put when not.
	fairOccurrences = 14
	// sharedOccurrences is how many times AcquireShared's transactions
	// name the key's directory, with the token: four conditions (two of
	// them ranges), a put, and two range reads.
	sharedOccurrences = 11
	// abandonedOccurrences is how many times a request names the
	// token's abandon marks: a condition and a read (each a range, so
	// twice), or an undo's marks.
	abandonedOccurrences = 4
)

// maxKeyBytes is the longest key whose every call fits a request of
// maxRequest bytes with a store prefix of prefixLen bytes, the key's
// every byte escaped to three and a token of tokenAllowance bytes,
// rounded down to KiB: fairOccurrences times the key, plus the abandon
// marks, plus requestReserve. About 35 KiB with the defaults.
func maxKeyBytes(prefixLen, maxRequest int) int {
	marks := abandonedOccurrences * (prefixLen + len("/abandoned/") + 3*tokenAllowance + 1 + 16 + opOverhead)
	perOccurrence := (maxRequest - requestReserve - marks) / fairOccurrences
	n := (perOccurrence - prefixLen - len("/holder") - tokenAllowance - opOverhead) / 3
	if n >= 1<<10 {
		n &^= 1<<10 - 1
	}
	return n
}

// Bounds returns the keys and TTLs the Store honours (see stores.Bounded):
//
//   - MaxKeyBytes follows from etcd's request size limit
//     (--max-request-bytes, DefaultMaxRequestBytes unless
//     WithMaxRequestBytes says otherwise): AcquireFair's transaction names
//     its key's directory 14 times, and a key's every '%' and '/' takes
//     three bytes escaped, so a key may take up to about a 42nd of a
//     request: 35 KiB with the defaults. A call whose keys together, or
//     with a token longer than 1 KiB, make a request too large for etcd
//     is refused with stores.ErrInvalid too.
//   - MaxTTL is MaxTTL (8e9s, about 253 years): its lease, an eighth
//     longer so that calls share it, is etcd's longest (9e9s).
//   - MinTTL is none: every positive TTL is honoured. etcd raises a lease
//     below its minimum (2s with the default election timeout) to that
//     minimum, so a key of a shorter TTL is held at least that TTL, and in
//     practice up to 2.5s when its holder dies without releasing it.
func (s *Store) Bounds() stores.Bounds { return s.bounds }

// checkKeys refuses more keys than MaxKeys, a key longer than the Store's
// MaxKeyBytes, and keys that with token make a request larger than etcd
// takes, each key named occ times in it.
func (s *Store) checkKeys(keys []string, token string, occ int) error {
	if len(keys) > MaxKeys {
		return fmt.Errorf("%w: etcdstore: %d keys in one call, at most %d", stores.ErrInvalid, len(keys), MaxKeys)
	}
	if err := args.CheckBounds(s.bounds, keys); err != nil {
		return err
	}
	n := requestReserve + abandonedOccurrences*(len(s.abandonedKey(token, 0))+16+opOverhead)
	for _, k := range keys {
		n += occ * (len(holderKey(s.dir(k))) + len(token) + opOverhead)
	}
	if n > s.maxRequest {
		return fmt.Errorf("%w: etcdstore: %d keys of %d bytes with a token of %d bytes make a request of up to %d bytes, above etcd's limit of %d (--max-request-bytes)",
			stores.ErrInvalid, len(keys), keyBytes(keys), len(token), n, s.maxRequest)
	}
	return nil
}

// keyBytes is the length of keys together.
func keyBytes(keys []string) int {
	n := 0
	for _, k := range keys {
		n += len(k)
	}
	return n
}

// checkTTL refuses a duration out of the Store's Bounds, naming it what.
func (s *Store) checkTTL(what string, d time.Duration) error {
	if err := s.bounds.CheckTTL(what, d); err != nil {
		return fmt.Errorf("%w: etcdstore: %s", stores.ErrInvalid, strings.TrimPrefix(err.Error(), stores.ErrInvalid.Error()+": "))
	}
	return nil
}
