package filestore

import (
	"time"

	"github.com/reqlock/reqlock/stores"
)

var _ stores.Bounded = (*Store)(nil)

// maxTTL is the longest TTL (and keep) the Store takes: the key file
// records a grant's expiry in Unix nanoseconds, an int64, which ends in
// the year 2262; a century from now stays far below that.
const maxTTL = 100 * 365 * 24 * time.Hour

// bounds are the Store's stores.Bounds. Keys have no length limit: a key
// too long for a file name of its own is named by its SHA-256 (see
// names.go). TTLs have no floor: the holding Store's timer ends a grant,
// however short.
var bounds = stores.Bounds{
	MaxTTL: maxTTL,
	Reason: "the key file's expiry, int64 Unix nanoseconds (MaxTTL 100 years)",
}

// Bounds returns the keys and TTLs the Store honours: keys of any length,
// and TTLs up to 100 years (see stores.Bounded).
func (*Store) Bounds() stores.Bounds { return bounds }
