// Package holders is what the SQL stores (pgstore, mysqlstore) share to keep
// a key's shared or limited holders (stores.SharedStore) beside its lease
// row: the marker that the key's row holds while it has holders, the
// writer's record among them, and the digests that name a holder.
//
// While a key has holders its lease row holds Marker(limit) as its token,
// with the expiry of the longest holder, so that a plain Acquire, which
// takes a row only when it is free, expired or holds the caller's token,
// reads the key as held, unchanged. The holders live in a second table, a
// row each (the key's digest, the token's digest, its own expiry), and a
// waiting writer is a row of that table under WriterDigest.
package holders

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// MarkerPrefix starts every marker. A NUL byte first: no token a Locker
// makes starts with one, and the stores document tokens that do as
// reserved.
const MarkerPrefix = "\x00reqlock:shared:"

// Marker is the token of the lease row of a key held by holders granted
// under limit (0: any number).
func Marker(limit int) []byte {
	return strconv.AppendInt([]byte(MarkerPrefix), int64(limit), 10)
}

// IsMarker reports whether token is a marker.
func IsMarker(token []byte) bool {
	return bytes.HasPrefix(token, []byte(MarkerPrefix))
}

// WriterDigest stands for the token of a waiting writer's record among a
// key's holders: 15 bytes, so that no holder's digest (32 bytes) equals it.
const WriterDigest = "\x00reqlock:writer"

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
func Table(table string, maxLen int) string {
	schema, name, qualified := strings.Cut(table, ".")
	if !qualified {
		name = table
	}
	h := name + "_holders"
	if len(h) > maxLen {
		sum := sha256.Sum256([]byte(name))
		h = "reqlock_holders_" + hex.EncodeToString(sum[:16])
	}
	if qualified {
		return schema + "." + h
	}
	return h
}
