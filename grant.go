package reqlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/reqlock/reqlock/internal/localqueue"
	"github.com/reqlock/reqlock/stores"
)

// grant is one grant of the store: keys held together under one token, from
// the Acquire that issued it to the Release that ends it. On a single key it
// may pass from local holder to local holder on the way (a handoff), and a
// request that holds it may hold it again (reentry).
//
// Invariants, kept by the methods in this file alone, under mu:
//   - validUntil is a lower bound, confirmed by the store, of when the store
//     lets the keys go: the start of the call that set their TTL (the
//     acquire, or the last refresh that succeeded) plus that TTL, minus a
//     margin for clock drift.
//   - After a refresh whose outcome is unknown (the store failed or did not
//     answer in time, but may have applied it), validUntil is the smaller of
//     what it was and what that refresh would have set, and confirmed is
//     false: the grant is neither handed on nor re-entered until an
//     owner-checked refresh succeeds.
//   - A renewal whose outcome was unknown may still reach the store at any
//     later time (a request held up in the network) and set the keys' TTL
//     then, past every check of the token. So once one happened, unknownTTL
//     keeps the shortest such TTL for the rest of the grant: every later
//     confirmed validity counts no more than unknownTTL from its renewal's
//     start, and the grant is never handed on (the next holder gets a grant
//     of its own, with a new token the stale renewal cannot match).
//   - A handoff never passes on more validity than the recipient's own TTL
//     confirms: the recipient caps validUntil at its TTL (minus drift) from
//     the handoff, and renews first when less than half of it is left.
//   - epoch counts the handoffs. The holder of epoch n uses the fence
//     fences[0]+n, and n stays below stores.FenceStride, so every local
//     holder's fence exceeds its predecessor's and stays below the fence
//     of the store's next grant of the key.
//   - holds counts the holds of the current epoch: its holder's lock and
//     the reentrant locks that share it. The grant ends, or passes on, only
//     when the count falls to zero, and a lock acts on the grant only while
//     its epoch is current, so a refresh or a release of a lock that was
//     released or handed on never touches its successor's grant.
//   - refreshing counts refreshes in flight: no handoff happens while one
//     runs, since the store may apply it after the grant changed hands.
//   - lost is set when the store reported the grant gone; a lost grant is
//     never handed on or re-entered.
//   - watchers are the locks on the grant whose contexts (see NewContext)
//     have not ended: whenever validUntil moves earlier, each is watched
//     anew, so that its contexts end when the shorter validity runs out,
//     and when the store reports the grant gone, each is lost.
type grant struct {
	locker  *Locker
	keys    []string  // as stored, with the Locker's prefix; sorted
	one     [1]string // keys' storage for a single key
	token   string
	fences  []int64            // as the store issued them, per key
	turns   []localqueue.Turn  // each key's local turn, in the order of keys
	oneTurn [1]localqueue.Turn // turns' storage for a single key
	started time.Time          // when the attempt that obtained it began
	// shared acts on the key of a shared or limited grant as one of its
	// holders (see sharedOps); nil for an exclusive grant, which the
	// Locker's store acts on.
	shared *sharedOps

	mu         sync.Mutex
	epoch      int
	holds      int
	validUntil time.Time
	confirmed  bool
	ttl        time.Duration // the current holder's TTL
	refreshing int
	unknownTTL time.Duration // the shortest TTL of a renewal of unknown outcome; 0 if none
	lost       bool
	ended      bool // released in the store, or on its way there
	claim      bool // a claim of a record key (see Locker.ClaimRecord)
	// In unix nanoseconds, so that a grant and its first lock stay one
	// allocation of 704 bytes:
	keepUntil  int64     // hold-at-least: the keys stay held until then; 0 if not
	storeUntil int64     // the store lets the keys go by then, as its TTLs were asked
	label      string    // the current holder's metrics label
	since      time.Time // when the current holder got the grant
	watchers   []*Lock   // the locks with contexts on the grant
	oneWatcher [1]*Lock  // watchers' storage for the common lock
	first      keyLock   // the storage of the lock of a fresh grant of one key
}

// newGrant returns the grant to acquire keys (without the prefix) with,
// and its token. A single key and the token share one allocation.
func (l *Locker) newGrant(keys []string) *grant {
	g := &grant{locker: l}
	g.watchers = g.oneWatcher[:0:1]
	if len(keys) == 1 {
		var token [tokenLen]byte
		fillToken(&token)
		s := l.prefix + keys[0] + string(token[:])
		key := s[:len(s)-tokenLen]
		g.one[0], g.token = key, s[len(key):]
		g.keys = g.one[:]
	} else {
		g.keys = make([]string, len(keys))
		for i, k := range keys {
			g.keys[i] = l.prefix + k
		}
		g.token = newToken()
	}
	return g
}

// store returns what acts on the grant's keys in the store: the Locker's
// store, or for a shared or limited grant its SharedStore operations.
func (g *grant) store() stores.Store {
	if g.shared != nil {
		return g.shared
	}
	return g.locker.store
}

// granted records what the store granted to an acquire that began at start.
func (g *grant) granted(fences []int64, ttl time.Duration, start time.Time) {
	g.fences, g.started = fences, start
	g.validUntil, g.confirmed, g.ttl = start.Add(ttl-clockDrift(ttl)), true, ttl
	g.storeUntil = time.Now().Add(ttl).UnixNano()
}

// beginEpoch gives the fresh grant its first hold.
func (g *grant) beginEpoch(label string, ttl time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.holds, g.label, g.since, g.ttl = 1, label, time.Now(), ttl
}

// ValidUntil returns validUntil: the localqueue.Holder a leaked lock's
// waiters watch.
func (g *grant) ValidUntil() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.validUntil
}

// trustedTTL returns how long past its start a renewal to the holder's TTL
// keeps the grant valid: that TTL, or less after a renewal of unknown
// outcome (see unknownTTL).
func (g *grant) trustedTTL() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.trustedLocked(g.ttl)
}

// trustedLocked returns how long past its start a renewal to ttl keeps the
// grant valid: ttl, capped by a renewal of unknown outcome that may yet
// land. The caller holds g.mu.
func (g *grant) trustedLocked(ttl time.Duration) time.Duration {
	if g.unknownTTL > 0 && g.unknownTTL < ttl {
		return g.unknownTTL
	}
	return ttl
}

// holderTTL returns the current holder's TTL.
func (g *grant) holderTTL() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ttl
}

// fenceOf returns the fence of storeKey for the holder of epoch, and false
// when the grant does not hold storeKey.
func (g *grant) fenceOf(storeKey string, epoch int) (int64, bool) {
	i, ok := slices.BinarySearch(g.keys, storeKey)
	if !ok {
		return 0, false
	}
	return g.fences[i] + int64(epoch), true
}

// adopt makes the recipient of a handoff, with turn, the grant's holder,
// capping the validity at its TTL, and returns its epoch.
func (g *grant) adopt(turn localqueue.Turn, label string, ttl time.Duration) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	g.oneTurn[0] = turn
	g.turns = g.oneTurn[:]
	g.label, g.since, g.ttl = label, now, ttl
	if capped := now.Add(ttl - clockDrift(ttl)); capped.Before(g.validUntil) {
		g.validUntil = capped
	}
	return g.epoch
}

// enter takes a reentrant hold on the holder of epoch's grant. It refuses a
// grant that is lost, ended, handed on, or whose validity is not confirmed
// (the caller renews it first, see check).
func (g *grant) enter(epoch int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lost || g.ended || g.epoch != epoch || g.holds == 0 || !g.confirmed || !time.Now().Before(g.validUntil) {
		return false
	}
	g.holds++
	return true
}

// check reports, for a reentry by epoch's holder, whether the grant is
// known lost and whether it must be renewed before it is entered: its
// validity ran out or is not confirmed.
func (g *grant) check(epoch int) (lost, renew bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.epoch != epoch || g.ended {
		return false, false // not the caller's any more: enter refuses it
	}
	return g.lost, !g.confirmed || !time.Now().Before(g.validUntil)
}

// refresh resets the TTL of the grant's keys to ttl, or to the holder's TTL
// when ttl is zero, for the holder of epoch. It returns ErrNotHeld, without
// a store call, when that holder has let go of the grant, and when the
// grant changed hands or ended while the call ran.
func (g *grant) refresh(ctx context.Context, epoch int, ttl time.Duration) error {
	g.mu.Lock()
	if g.epoch != epoch || g.ended || g.holds == 0 {
		g.mu.Unlock()
		return fmt.Errorf("%w: %q was released", ErrNotHeld, g.keys[0])
	}
	if g.lost {
		g.mu.Unlock()
		return fmt.Errorf("%w: %q was lost", ErrNotHeld, g.keys[0])
	}
	if ttl == 0 {
		ttl = g.ttl
	}
	g.refreshing++
	g.mu.Unlock()

	start := time.Now()
	err := g.store().Refresh(ctx, g.keys, g.token, ttl)

	g.mu.Lock()
	g.refreshing--
	before, wasLost := g.validUntil, g.lost
	if err == nil || !(errors.Is(err, ErrNotHeld) || errors.Is(err, ErrInvalid)) {
		// The store may have set the TTL at any time until now.
		g.storeUntil = max(g.storeUntil, time.Now().Add(ttl).UnixNano())
	}
	err = g.refreshedLocked(epoch, ttl, start, err)
	var shortened, lost []*Lock
	switch {
	case g.lost && !wasLost:
		lost = slices.Clone(g.watchers) // the store said the grant is gone
	case g.validUntil.Before(before):
		shortened = slices.Clone(g.watchers)
	}
	g.mu.Unlock()
	for _, l := range shortened {
		l.life.rewatch(l)
	}
	for _, l := range lost {
		l.lose(fmt.Errorf("%w: a renewal found %q no longer held: %w", ErrLockLost, g.keys[0], err))
	}
	return err
}

// refreshedLocked records the outcome err of a refresh to ttl that began at
// start. The caller holds g.mu.
func (g *grant) refreshedLocked(epoch int, ttl time.Duration, start time.Time, err error) error {
	trusted := g.trustedLocked(ttl) // what the keys surely keep from start on
	until := start.Add(trusted - clockDrift(trusted))
	switch {
	case err == nil:
		if g.epoch != epoch || g.ended {
			return fmt.Errorf("%w: %q was released while it was renewed", ErrNotHeld, g.keys[0])
		}
		g.validUntil, g.confirmed, g.ttl = until, true, ttl
		return nil
	case errors.Is(err, ErrNotHeld):
		g.lost = true
		return err
	case errors.Is(err, ErrInvalid):
		return err // refused before it acted
	}
	// The store may have applied the new TTL, or not, or may yet: only the
	// smaller of the two validities is sure, the grant is not trusted
	// further until a refresh succeeds, and never handed on.
	if until.Before(g.validUntil) {
		g.validUntil = until
	}
	if g.unknownTTL == 0 || ttl < g.unknownTTL {
		g.unknownTTL = ttl
	}
	g.confirmed = false
	return wrapStoreError(err)
}

// unwatchedBy takes l, whose contexts have ended, off the watchers.
func (g *grant) unwatchedBy(l *Lock) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if i := slices.Index(g.watchers, l); i >= 0 {
		g.watchers = slices.Delete(g.watchers, i, i+1)
	}
}

// watchedBy registers l, a lock on the grant with a context, to be watched
// anew whenever the grant's validity moves earlier.
func (g *grant) watchedBy(l *Lock) {
	g.mu.Lock()
	g.watchers = append(g.watchers, l)
	g.mu.Unlock()
}

// holdAtLeast keeps the keys held until d after the current holder got the
// grant, for the holder of epoch.
func (g *grant) holdAtLeast(epoch int, d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.epoch == epoch && d > 0 {
		if until := g.since.Add(d).UnixNano(); until > g.keepUntil {
			g.keepUntil = until
		}
	}
}

// abandon marks a handed-off grant that turned out lost as ended; its
// recipient keeps the key's turn and contends anew.
func (g *grant) abandon() {
	g.mu.Lock()
	g.ended = true
	g.mu.Unlock()
}

// drop ends one hold of epoch's holder. The last hold ends the epoch: the
// grant passes to the next local waiter when the handoff bounds allow, or
// is released in the store.
func (g *grant) drop(ctx context.Context, epoch int) error {
	g.mu.Lock()
	if g.epoch != epoch || g.holds == 0 {
		g.mu.Unlock()
		return fmt.Errorf("%w: %q was handed on or released", ErrNotHeld, g.keys[0])
	}
	g.holds--
	last := g.holds == 0
	label, since := g.label, g.since
	g.mu.Unlock()
	if !last {
		return nil
	}
	l := g.locker
	if l.metrics != nil && !g.claim {
		l.metrics.Held(label, time.Since(since))
	}
	var waiting bool
	if l.handoffCount > 0 {
		var handed bool
		if handed, waiting = g.handOff(); handed {
			return nil
		}
	}
	return g.end(ctx, waiting)
}

// handOff passes the grant to the next local waiter when one waits and the
// bounds allow. It reports whether it did, and whether waiters were left
// without it.
func (g *grant) handOff() (handed, waiting bool) {
	if len(g.turns) != 1 {
		return false, false // several keys are never handed on
	}
	return g.turns[0].HandOff(func() (localqueue.Holder, bool) {
		g.mu.Lock()
		defer g.mu.Unlock()
		now := time.Now()
		switch {
		case g.lost, g.ended, !g.confirmed, g.refreshing > 0, g.unknownTTL > 0,
			now.UnixNano() < g.keepUntil,
			g.epoch+1 > g.locker.handoffCount,
			now.Sub(g.started) >= g.locker.handoffTime,
			!now.Before(g.validUntil):
			return nil, false
		}
		g.epoch++
		g.holds = 1
		return g, true
	})
}

// end releases the grant in the store, or with hold-at-least leaves its keys
// to expire when the time is up, and gives each key's turn to its next local
// waiter. waiting says local waiters were left without a handoff.
func (g *grant) end(ctx context.Context, waiting bool) error {
	g.mu.Lock()
	g.ended = true
	keepUntil, storeUntil := g.keepUntil, g.storeUntil
	g.mu.Unlock()
	keep := max(time.Until(time.Unix(0, keepUntil)), 0)
	if keep > 0 {
		// Within what the store can keep a key for (see HoldAtLeast); a
		// route's HoldAtLeast was checked against it at start-up.
		keep = g.locker.clampKeep(keep)
	}
	start := time.Now()
	// Owner-checked, also when a key was found lost: the others may still
	// hold the token.
	var (
		waited bool
		err    error
	)
	if g.shared != nil {
		err = g.locker.release(ctx, g.shared, g.keys, g.token, keep)
	} else {
		waited, err = g.locker.releaseWaited(ctx, g.keys, g.token, keep)
	}
	if err != nil && !errors.Is(err, ErrNotHeld) && !errors.Is(err, ErrInvalid) {
		// A store failure: retried in the background until the keys are
		// free, and shared with the waiters, who answer it at once.
		g.locker.retryRelease(err, g.store(), g.keys, g.token, time.Unix(0, keepUntil), time.Unix(0, storeUntil))
		passOn(g.turns, err)
		return err
	}
	// The store confirmed the keys free (released, or no longer this
	// token's): the next turns' store calls have not seen them held, so one
	// the store leaves unanswered is a store failure, not a timeout. Not so
	// with hold-at-least, which leaves them held.
	freed := keep == 0 && (err == nil || errors.Is(err, ErrNotHeld))
	if !waiting || keep > 0 {
		for _, t := range g.turns {
			if freed {
				t.PassFreed(0, false)
			} else {
				t.Pass(0, true)
			}
		}
		return err
	}
	// The bounds cut the chain while this process still has waiters: other
	// processes' waiters need a head start, or the next local waiter,
	// already awake, would win nearly every time.
	yield, courtesy := g.locker.yieldAfter(g.turns, waited, time.Since(start))
	for _, t := range g.turns {
		switch {
		case freed:
			t.PassFreed(yield, courtesy)
		case courtesy:
			t.PassCourtesy(yield)
		default:
			t.Pass(yield, true)
		}
	}
	return err
}

// Yields: how long a process whose grant of a hot key went back to the
// store holds back before its next local waiter contends for it.
const (
	// minYield is the shortest head start a cut chain gives other
	// processes.
	minYield = 100 * time.Microsecond

	// hotPollMax caps the sleep of a waiter that no release signal wakes,
	// while the key it waits for changes hands (see Locker.contend).
	hotPollMax = 10 * time.Millisecond

	// hotFor is for how many hotPolls a waiter keeps polling that often
	// after it last saw the key change hands.
	hotFor = 20

	// probeEvery is how often a process that passes a hot key among its
	// own requests, on a store that neither signals releases nor reports
	// waiters, holds back for other processes it cannot know of.
	probeEvery = time.Second

	// contendedFor is how long after the store last refused a process a
	// key, the process counts the key as wanted by another, on a store
	// that neither signals releases nor reports waiters.
	contendedFor = time.Second

	// minTurn is, in hotPolls, how long a process keeps a key wanted by
	// other owners, across handoff chains, before it holds back for them.
	minTurn = 5
)

// hotPoll is the longest sleep of a waiter that no release signal wakes,
// while the key changes hands: hotPollMax, or the backoff's cap when that
// is shorter.
func (l *Locker) hotPoll() time.Duration { return min(l.backoffMax, hotPollMax) }

// yieldAfter returns how long the next local waiter holds back after a
// grant of turns' keys went back to the store while it waited, and whether
// that is a courtesy to other owners. rtt is how long the release took;
// waited reports that the store refused another token the keys while the
// grant stood.
//
// A waiter of another process that a release signal wakes needs about a
// round trip to reach the store: two of them are its head start. One that
// polls (a store without release signals, or one whose signals do not
// reach it) sleeps at most hotPoll while the key changes hands: a courtesy
// of twice that plus the two round trips lets it find the key free.
// Holding back costs nothing when another owner takes the key meanwhile,
// but leaves it idle when that owner is done before the courtesy ends; so
// a process gives one only at the end of a turn of at least minTurn
// hotPolls on the key (from when it got the key after a refusal or a
// courtesy), and the idle time is a small part of the turns.
//
//   - A store that reports waiters (stores.WaitReporter) says whether one
//     wants the key: the grant refused one.
//   - On a store that signals releases, its waiters' signals make the head
//     start enough.
//   - On a store that does neither, this process learns of other owners
//     only from its own refusals: it counts the key wanted for
//     contendedFor after the store last refused it the key (it cannot tell
//     a courtesy nobody used from one whose taker was done before it
//     ended), and holds back once every probeEvery for owners it cannot
//     know of.
//
// In fair mode the store's queue orders the processes, and the yield stays
// short.
func (l *Locker) yieldAfter(turns []localqueue.Turn, waited bool, rtt time.Duration) (time.Duration, bool) {
	short := max(2*rtt, minYield)
	var wanted, probe bool
	switch {
	case l.fair != nil:
		return short, false
	case l.waits != nil:
		wanted = waited
	case l.notifier != nil:
		return short, false
	default:
		probe = true
	}
	turnDone := true
	for _, t := range turns {
		c := t.Contention()
		wanted = wanted || (l.waits == nil && time.Since(c.RefusedAt) < contendedFor)
		probe = probe && time.Since(c.CourtesyAt) >= probeEvery
		turnDone = turnDone && time.Since(c.TurnAt) >= minTurn*l.hotPoll()
	}
	if (wanted && turnDone) || probe {
		return 2*l.hotPoll() + short, true
	}
	return short, false
}

var _ localqueue.Holder = (*grant)(nil)

// holdTurns makes g the holder of turns, one per key in the order of keys.
func (g *grant) holdTurns(turns []localqueue.Turn) {
	g.turns = turns
	for _, t := range turns {
		t.Hold(g)
	}
}

// holdTurn makes g, a grant of one key, the holder of its turn.
func (g *grant) holdTurn(turn localqueue.Turn) {
	g.oneTurn[0] = turn
	g.turns = g.oneTurn[:]
	turn.Hold(g)
}
