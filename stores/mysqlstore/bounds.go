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
// within a BIGINT; records of up to what FinishRecord's statement takes
// within the server's max_allowed_packet (about half of it, escaped), at
// most MaxRecordBytes, kept for any such duration. It implements
// stores.Bounded.
//
// The Store reads max_allowed_packet when it starts (Open, or the first
// call after New or a lazy Open). Bounds read before then assume 4 MiB,
// MySQL 5.7's default (records of 2 MiB less 5 KiB), and the Store keeps to
// them once started, lest it take a record larger than it stated; a server
// whose max_allowed_packet is smaller lowers them when the Store starts.
// So build the Locker after Open, or after a first call, for the server's
// bound.
func (s *Store) Bounds() stores.Bounds {
	if !s.ready.Load() {
		s.packetMu.Lock()
		s.stated = true
		s.packetMu.Unlock()
	}
	return s.bounds()
}

// bounds is Bounds without stating them (see Store.packet): the checks of
// the Store's calls.
func (s *Store) bounds() stores.Bounds {
	packet := int(s.packet.Load())
	return stores.Bounds{MaxKeyBytes: MaxKeyLen, MaxRecordBytes: recordBytes(packet),
		Reason: fmt.Sprintf("mysqlstore's key column (lock_key VARBINARY(512), its primary key); records: "+
			"FinishRecord's statement, every byte escaped, within the server's max_allowed_packet (%d bytes), "+
			"at most mysqlstore.MaxRecordBytes", packet)}
}

// checkArgs returns an error wrapping stores.ErrInvalid when a key is longer
// than the table holds (see Bounds), there are more than MaxKeysPerCall
// keys, a duration is out of Bounds, the token is longer than the table
// holds or it is empty (a token names one acquisition).
func (s *Store) checkArgs(keys []string, token string, durations ...time.Duration) error {
	if err := args.CheckBounds(s.bounds(), keys, durations...); err != nil {
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
