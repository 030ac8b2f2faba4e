package zkstore

import (
	"sync"
	"time"
)

// ages tells how long a lock node, or a fair waiter's queue node, has been
// seen unchanged, on this process's monotonic clock: the Store's way of
// expiring grants and leases without comparing the wall clocks of different
// machines.
//
// A node's version is its path and mzxid (the transaction that last wrote
// it). The first time this Store sees a version, by reading it or by writing
// it itself, it notes the time: for its own write the start of the call,
// which is before the server applied it; for a read the time of the read,
// which is after. The version then lives until that time plus the TTL or
// lease in the node's data. The writer wrote the version no later than the
// reader first saw it, so the reader's deadline is never before the
// writer's: no contender takes a grant over before its holder's TTL has
// passed on the holder's own clock, whatever the clocks read, as long as
// they run at about the same rate. The price is that a contender that first
// sees a stale version waits one full TTL from then.
//
// For its own writes the Store also notes the token and the session that
// made them, so that Release and Refresh of its own grants skip the read,
// and so that a grant of a session that has ended (its nodes went with it)
// is known not held without asking the server. The server still checks the
// token of every owner-checked write (see holderName): a record is never
// trusted to name a grant.
//
// Entries are dropped when the Store deletes the node, and swept a while
// after their deadline (a sight of a version whose entry was swept starts a
// new, later deadline, which only delays a takeover).
type ages struct {
	mu      sync.Mutex
	seen    map[string]sighting // by node path
	sweepAt int                 // len(seen) at which the next write sweeps
}

// sighting is the first sight of one version of a node.
type sighting struct {
	mzxid int64
	since time.Time
	life  time.Duration // the TTL or lease in the node's data

	// Set for the Store's own writes only: the token, and the session
	// that made the write.
	token   string
	session int64
	own     bool
}

const (
	// minSweep is the least size of ages.seen at which a sweep runs.
	minSweep = 1024

	// sweepGrace is how long past its deadline a sighting is kept.
	sweepGrace = time.Minute
)

// wrote records this Store's own write, in session, of a node's version,
// made by a call that started at start. A write whose session is unknown
// (zero: it ended as the write returned) is aged, but not owned.
func (a *ages) wrote(path string, mzxid int64, token string, session int64, life time.Duration, start time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.putLocked(path, sighting{mzxid: mzxid, since: start, life: life, token: token, session: session, own: session != 0})
}

// remaining returns how long the version mzxid of the node at path, whose
// data gives it life, has left, recording the version's first sight when it
// is new. Zero or less means it has expired.
func (a *ages) remaining(path string, mzxid int64, life time.Duration, now time.Time) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.seen[path]
	if !ok || s.mzxid != mzxid {
		s = sighting{mzxid: mzxid, since: now, life: life}
		a.putLocked(path, s)
	}
	return s.since.Add(s.life).Sub(now)
}

// Ownership of a node, as this Store's records tell it.
type ownership int

const (
	ownUnknown ownership = iota // no record of a write of this Store for the token
	ownLive                     // written for the token in session, not expired
	ownGone                     // written for the token, but expired or in another session
)

// owned returns what this Store's last write of the node at path tells of
// token's grant at now, when the Store's session is session.
func (a *ages) owned(path, token string, session int64, now time.Time) ownership {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.seen[path]
	switch {
	case !ok || !s.own || s.token != token:
		return ownUnknown
	case s.session != session || !now.Before(s.since.Add(s.life)):
		return ownGone
	}
	return ownLive
}

// live reports whether a version of the node at path was seen, or
// written, and has not expired: a grant likely still stands.
func (a *ages) live(path string, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.seen[path]
	return ok && now.Before(s.since.Add(s.life))
}

// forget drops what is known of the node at path, once it is gone.
func (a *ages) forget(path string) {
	a.mu.Lock()
	delete(a.seen, path)
	a.mu.Unlock()
}

// putLocked stores s, sweeping the map first when it has grown. The caller
// holds a.mu.
func (a *ages) putLocked(path string, s sighting) {
	if a.seen == nil {
		a.seen = make(map[string]sighting)
	}
	if len(a.seen) >= max(a.sweepAt, minSweep) {
		// A new map, since a map never returns its memory on its own.
		now := time.Now()
		kept := make(map[string]sighting, len(a.seen)/2)
		for p, old := range a.seen {
			if !now.After(old.since.Add(old.life + sweepGrace)) {
				kept[p] = old
			}
		}
		a.seen = kept
		a.sweepAt = 2 * len(kept)
	}
	a.seen[path] = s
}
