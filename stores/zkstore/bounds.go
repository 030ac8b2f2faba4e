package zkstore

import (
	"context"
	"fmt"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// sessionBounds returns the Bounds of a Store that takes keys of up to
// maxKey bytes and asked for a session timeout of asked, of which the server
// granted granted.
//
// MaxTTL is the session timeout granted: a grant's validity must end before
// the server can delete its node, which it does once it has heard nothing
// from the Store's session for that long. The server restarts a session's
// timer on each request it receives, after the Store sent it, so a grant or
// renewal that started at t stands, on the server, until t plus the timeout
// at the earliest; a holder's validity counts from t as well (the Locker's
// margin for clock drift covers clocks that run at slightly different
// rates). A TTL up to the session timeout therefore ends first.
func sessionBounds(maxKey int, asked, granted time.Duration) stores.Bounds {
	reason := fmt.Sprintf("the ZooKeeper session timeout (URL parameter session=%v, or WithSessionTimeout)", asked)
	if granted != asked {
		reason = fmt.Sprintf("the ZooKeeper session timeout of %v the server granted (the store asked for %v: URL parameter session=, "+
			"or WithSessionTimeout; the server keeps it within its minSessionTimeout and maxSessionTimeout)", granted, asked)
	}
	return stores.Bounds{
		MaxKeyBytes: maxKey,
		MinTTL:      MinTTL,
		MaxTTL:      granted,
		Reason:      reason + ", ZooKeeper's 1 MiB request limit (jute.maxbuffer) and TTLs kept in whole milliseconds",
	}
}

// Bounds returns the keys and TTLs the Store takes; see stores.Bounded and
// the package documentation. MaxTTL is the session timeout the server
// granted on the Store's first connection (a later connection granted less
// makes calls with longer TTLs fail, see ErrShortSession); MaxKeyBytes is
// what fits ZooKeeper's request limit with the Store's root.
func (s *Store) Bounds() stores.Bounds { return s.bounds }

// checkCall checks the arguments of Acquire and Refresh (what "ttl"), or of
// Release (what "keep", for which d may be zero or less), as storeargs does,
// and against the Store's bounds; see stores.Bounded.
func (s *Store) checkCall(ctx context.Context, keys []string, token, what string, d time.Duration, fair bool) error {
	var err error
	if what == "keep" {
		err = args.CheckRelease(ctx, keys)
	} else {
		err = args.CheckAcquire(ctx, keys, d)
	}
	if err != nil {
		return err
	}
	if d > 0 {
		if err := s.bounds.CheckTTL(what, d); err != nil {
			return fmt.Errorf("zkstore: %w", err)
		}
	}
	for _, k := range keys {
		if err := s.bounds.CheckKey(k); err != nil {
			return fmt.Errorf("zkstore: %w", err)
		}
	}
	if err := s.checkSize(keys, token, fair); err != nil {
		return err
	}
	if what == "ttl" {
		return s.checkSession(d)
	}
	return nil
}

// checkSession returns an error wrapping ErrShortSession and
// stores.ErrUnreachable when ttl, the validity of a grant, is longer than
// the session timeout the server granted when the Store last connected:
// the Store's MaxTTL is the timeout granted by the first connection, and a
// server of an ensemble configured with a lower maxSessionTimeout (or a
// larger tickTime) grants less. Should the Store then be cut off, the
// server would delete the grant's node before its validity ends. A keep
// or a lease is no validity: a kept key or a queue place held for less
// than asked, when its Store is cut off for longer than the session
// timeout, lets nobody in early who could then clash with a holder.
func (s *Store) checkSession(ttl time.Duration) error {
	granted := time.Duration(s.sessionMs.Load()) * time.Millisecond
	if ttl <= granted || granted == 0 { // 0: no session yet, and the call fails for that
		return nil
	}
	return fmt.Errorf("%w: %w: ttl %v is longer than the session timeout of %v that the server granted when the store last connected "+
		"(less than the store's MaxTTL of %v: a server of the ensemble has a lower maxSessionTimeout or a larger tickTime); "+
		"refused so that no grant outlives its session", stores.ErrUnreachable, ErrShortSession, ttl, granted, s.bounds.MaxTTL)
}

// checkFair checks key, ttl and lease of AcquireFair (zero ttl and lease
// for LeaveFair) against the Store's bounds.
func (s *Store) checkFair(key, token string, ttl, lease time.Duration) error {
	for _, d := range []struct {
		what string
		d    time.Duration
	}{{"ttl", ttl}, {"lease", lease}} {
		if d.d > 0 {
			if err := s.bounds.CheckTTL(d.what, d.d); err != nil {
				return fmt.Errorf("zkstore: %w", err)
			}
		}
	}
	if err := s.bounds.CheckKey(key); err != nil {
		return fmt.Errorf("zkstore: %w", err)
	}
	if err := s.checkSize([]string{key}, token, true); err != nil {
		return err
	}
	if ttl > 0 {
		return s.checkSession(ttl)
	}
	return nil
}
