// Package holders is what the SQL stores (pgstore, mysqlstore) share to keep
// a key's shared or limited holders (stores.SharedStore) beside its lease
// row: the marker that the key's row holds while it has holders, the
// digests that name keys and tokens in the holders table, the table's name,
// and the Store's note of the writer records it made; and the same for a
// key's idempotency record (stores.RecordStore): the owner marker its row
// holds while it holds a record, and the records table's name.
//
// While a key has holders its lease row holds Marker as its token, with the
// expiry of the longest holder, so that a plain Acquire, which takes a row
// only when it is free, expired or holds the caller's token, reads the key
// as held, unchanged. The holders live in a second table, a row each (the
// key's digest, the token's digest, its own expiry), beside the records of
// the key's waiting writers, a row each too.
package holders

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"sync"
	"time"
)

// Reserved starts every token of a lease row that is not a caller's
// (Marker, RecordOwner): no token a Locker makes starts with it, and the
// stores refuse tokens that do (storeargs.Checker.CheckGrantToken and
// CheckHeldToken), so that no caller's token equals one of them.
const Reserved = "\x00"

// Marker is the token of the lease row of a key held by holders; it starts
// with Reserved.
const Marker = "\x00reqlock:shared"

// IsMarker reports whether token is Marker.
func IsMarker(token []byte) bool { return bytes.Equal(token, []byte(Marker)) }

// RecordPrefix starts the token of the lease row of a key that holds a
// finished idempotency record: the row is then held, for the record's
// retention, by a token no caller has, so that Acquire, Release and
// Refresh, unchanged, leave it alone.
const RecordPrefix = "\x00reqlock:record:"

// RecordOwner returns the token of the lease row of a record that token
// finished: RecordPrefix and the token's digest (48 bytes, whatever the
// token's length), so that a retried finish knows its own record.
func RecordOwner(token string) string { return RecordPrefix + string(Digest(token)) }

// Digest is the 32-byte SHA-256 of a key or a token, as the holders table
// stores them: fixed-length, whatever the key's or token's length, so that
// the table's primary key fits any key the lease table takes.
func Digest(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

// Table names the holders table of the lease table table, a name of at
// most maxLen bytes, optionally qualified by a schema: table_holders in the
// same schema or, when that is longer than maxLen, reqlock_holders_ and a
// digest of the table's name.
func Table(table string, maxLen int) string { return sibling(table, "holders", maxLen) }

// RecordsTable names the records table of the lease table table, as Table
// names its holders table: table_records, or reqlock_records_ and a digest.
func RecordsTable(table string, maxLen int) string { return sibling(table, "records", maxLen) }

// sibling names the table of kind beside the lease table table.
func sibling(table, kind string, maxLen int) string {
	schema, name, qualified := strings.Cut(table, ".")
	if !qualified {
		name = table
	}
	h := name + "_" + kind
	if len(h) > maxLen {
		sum := sha256.Sum256([]byte(name))
		h = "reqlock_" + kind + "_" + hex.EncodeToString(sum[:16])
	}
	if qualified {
		return schema + "." + h
	}
	return h
}

// Writers notes the waiting-writer records a Store made (a token's Acquire
// refused by holders), so that its grant of the key to that token, and its
// Release of the key by that token, end the record, as stores.SharedStore
// requires, at the cost of a statement for those calls alone: the Locker
// that was refused withdraws through the same Store. A note outlives its
// record (stores.WriterWindow from the refusal, by the server's clock) by
// a margin, then goes. The zero value is ready; it is safe for concurrent
// use.
type Writers struct {
	mu    sync.Mutex
	notes map[note]time.Time // until when
}

type note struct{ key, token string }

// noteFor is how long a note lasts: the record's window and a margin for
// the clocks' drift and the statement's flight.
const noteFor = 2 * time.Second

// pruneAt is the size from which Add drops expired notes.
const pruneAt = 1024

// Add notes a record of token on key.
func (w *Writers) Add(key, token string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	if w.notes == nil {
		w.notes = make(map[note]time.Time)
	}
	if len(w.notes) >= pruneAt {
		for n, until := range w.notes {
			if now.After(until) {
				delete(w.notes, n)
			}
		}
	}
	w.notes[note{key, token}] = now.Add(noteFor)
}

// Take returns those of keys on which token has a noted, unexpired record,
// and forgets them: the caller ends the records.
func (w *Writers) Take(keys []string, token string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.notes) == 0 {
		return nil
	}
	var taken []string
	now := time.Now()
	for _, k := range keys {
		n := note{k, token}
		if until, ok := w.notes[n]; ok {
			delete(w.notes, n)
			if !now.After(until) {
				taken = append(taken, k)
			}
		}
	}
	return taken
}
