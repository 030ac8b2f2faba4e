package mysqlstore

import (
	"fmt"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// Bounds returns the keys and durations the Store honours: keys of up to
// MaxKeyLen bytes, the width of the table's key column; every duration from
// 1ns, rounded up to the microsecond of DATETIME(6), to math.MaxInt64, 292
// years, which the server's clock plus the duration keeps far within
// DATETIME's range (to the year 9999) and TIMESTAMPDIFF's microseconds
// within a BIGINT; records of up to MaxRecordBytes, kept for any such
// duration. It implements stores.Bounded.
func (s *Store) Bounds() stores.Bounds {
	return stores.Bounds{MaxKeyBytes: MaxKeyLen, MaxRecordBytes: MaxRecordBytes,
		Reason: "mysqlstore's key column (lock_key VARBINARY(512), its primary key); records: mysqlstore.MaxRecordBytes, " +
			"within MySQL 5.7's default max_allowed_packet (4 MB)"}
}

// checkArgs returns an error wrapping stores.ErrInvalid when a key is longer
// than the table holds (see Bounds), there are more than MaxKeysPerCall
// keys, a duration is out of Bounds, the token is longer than the table
// holds or it is empty (a token names one acquisition).
func (s *Store) checkArgs(keys []string, token string, durations ...time.Duration) error {
	if err := args.CheckBounds(s.Bounds(), keys, durations...); err != nil {
		return err
	}
	switch {
	case len(keys) > MaxKeysPerCall:
		return fmt.Errorf("%w: mysqlstore: %d keys in one call, more than %d", stores.ErrInvalid, len(keys), MaxKeysPerCall)
	case token == "":
		return fmt.Errorf("%w: mysqlstore: empty token", stores.ErrInvalid)
	case len(token) > MaxTokenLen:
		return fmt.Errorf("%w: mysqlstore: token of %d bytes is longer than %d", stores.ErrInvalid, len(token), MaxTokenLen)
	}
	return nil
}
