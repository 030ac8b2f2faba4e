package mysqlstore

import (
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/holders"
)

// TestSharedLeaseCoversHolders: after every grant of a place, the key's
// lease row (which plain Acquire reads) ends no sooner than each holder's
// place, by the server's clock, so that no exclusive grant can come while
// a holder's place runs (issue 22). The grant set the lease row one
// statement before the place, each from its own reading of the clock, so
// that the place outlasted the lease row by that statement's round trip.
func TestSharedLeaseCoversHolders(t *testing.T) {
	db := openDB(t)
	s := newStore(t, db)
	ctx := t.Context()
	key := "lease-covers:" + t.Name()
	for i, token := range []string{"a", "b", "a", "c"} {
		if g, err := s.AcquireShared(ctx, key, token, 0, time.Minute); err != nil || !g.OK {
			t.Fatalf("AcquireShared %d (%s): %+v, %v", i, token, g, err)
		}
		// How long the longest place outlasts the lease row, in µs.
		var over int64
		if err := db.QueryRowContext(ctx, "SELECT TIMESTAMPDIFF(MICROSECOND, l.expires_at, MAX(h.expires_at)) FROM "+
			quoteTable(s.Table())+" AS l JOIN "+quoteTable(holdersTable(s.Table()))+" AS h ON h.key_sum = ? AND h.writer = 0 "+
			"WHERE l.lock_key = ? GROUP BY l.expires_at", holders.Digest(key), key).Scan(&over); err != nil {
			t.Fatal(err)
		}
		if over > 0 {
			t.Fatalf("grant %d (%s): the lease row ends %dµs before the longest place: a plain Acquire takes the key then while a holder holds it",
				i, token, over)
		}
	}
}
