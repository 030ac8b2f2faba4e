package reqlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"
)

// multiKeys are the keys of a lock granted on several keys together.
type multiKeys struct {
	keys      []string // sorted, without the Locker's prefix
	storeKeys []string // keys with the prefix, in the same order
	fences    []int64  // per key
}

func (m *multiKeys) fenceOf(key string) (int64, bool) {
	if i, ok := slices.BinarySearch(m.keys, key); ok {
		return m.fences[i], true
	}
	return 0, false
}

func (m *multiKeys) holds(storeKey string) bool {
	_, ok := slices.BinarySearch(m.storeKeys, storeKey)
	return ok
}

// ObtainAll acquires every one of keys as one lock, for ttl: all of them or
// none. It waits like Obtain, with the same errors, until all are free at
// once; it never holds some keys while it waits for others, and never leaves
// a partial grant behind.
//
// The keys are sorted and de-duplicated first, so two requests whose key
// sets overlap never wait for each other in a cycle. With a store that
// implements MultiStore (memstore and redisstore do) each attempt is one
// atomic store call, one round trip on Redis; with another store the keys
// are taken one by one in that order, and those taken are given back when
// one is held. The lock has a fence per key (Lock.FenceOf).
//
// A lock of several keys does not take part in the local queue and handoff
// of single keys (see Locker): it goes to the store each attempt, and wakes
// on a release signal of the key that held it up last. One key alone is
// Obtain.
//
// Keys that ctx's locks already hold are held reentrantly (see Obtain), and
// only the others are acquired.
func (l *Locker) ObtainAll(ctx context.Context, keys []string, ttl, wait time.Duration) (*Lock, error) {
	start := time.Now()
	lock, err := l.obtainAll(ctx, keys, ttl, wait)
	l.observe(ctx, start, lock, err)
	return lock, err
}

func (l *Locker) obtainAll(ctx context.Context, keys []string, ttl, wait time.Duration) (*Lock, error) {
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no keys", ErrInvalid)
	}
	for _, k := range keys {
		if k == "" {
			return nil, fmt.Errorf("%w: empty key", ErrInvalid)
		}
	}
	if err := checkTimes(ttl, wait); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(ErrWaitEnded, err)
	}
	sorted := slices.Compact(slices.Sorted(slices.Values(keys)))
	var err error

	var borrowed []*Lock
	rest := sorted
	if holdsLocks(ctx) {
		borrowed, rest, err = l.reenterAll(ctx, sorted)
		if err != nil {
			return nil, err
		}
	}
	if len(rest) == 0 {
		return l.newView(sorted, borrowed, nil), nil
	}
	var owned *Lock
	if len(rest) == 1 {
		owned, err = l.obtainOne(ctx, rest[0], ttl, wait)
	} else {
		owned, err = l.obtainMulti(ctx, rest, ttl, wait)
	}
	if err != nil {
		leaveAll(ctx, borrowed)
		return nil, err
	}
	if len(borrowed) == 0 {
		return owned, nil
	}
	return l.newView(sorted, borrowed, owned), nil
}

// reenterAll takes a view hold on each lock ctx carries that holds some of
// keys (sorted), and returns those locks and the keys none of them holds.
func (l *Locker) reenterAll(ctx context.Context, keys []string) (borrowed []*Lock, rest []string, err error) {
	for _, k := range keys {
		sk := l.prefix + k
		if slices.ContainsFunc(borrowed, func(b *Lock) bool { return b.holds(sk) }) {
			continue
		}
		held, err := l.reenter(ctx, sk)
		if err != nil {
			leaveAll(ctx, borrowed)
			return nil, nil, err
		}
		if held != nil {
			borrowed = append(borrowed, held)
			continue
		}
		rest = append(rest, k)
	}
	return borrowed, rest, nil
}

// obtainMulti acquires several keys, sorted and distinct, from the store.
func (l *Locker) obtainMulti(ctx context.Context, keys []string, ttl, wait time.Duration) (*Lock, error) {
	storeKeys := make([]string, len(keys))
	for i, k := range keys {
		storeKeys[i] = l.prefix + k
	}
	if wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
	token := newToken()
	var (
		schedule *backoffSchedule
		sawHeld  bool
		released <-chan struct{}
		stop     func()
		watched  = -1 // the index of the key whose releases wake us
	)
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	for {
		attemptStart := time.Now()
		grant, err := l.acquireAll(ctx, storeKeys, token, ttl)
		if errors.Is(err, ErrInvalid) {
			// The store refused the keys before acting (Redis Cluster keys
			// in different slots, say): a configuration mistake, not an
			// outage, so never a reason to run unlocked.
			return nil, err
		}
		if err != nil || (grant.OK && ctx.Err() != nil) {
			// As in contend: the store may have granted what we cannot use.
			go l.releaseAbandonedAll(storeKeys, token)
		}
		if cerr := ctx.Err(); cerr != nil {
			return nil, waitEnded(sawHeld || (err == nil && !grant.OK), cerr)
		}
		switch {
		case err != nil:
			return nil, wrapStoreError(err)
		case grant.OK:
			if len(grant.Fences) != len(keys) {
				go l.releaseAbandonedAll(storeKeys, token)
				return nil, fmt.Errorf("%w: store granted %d fences for %d keys", ErrStore, len(grant.Fences), len(keys))
			}
			lock := l.newLock(keys[0], storeKeys[0], token, grant.Fences[0], ttl, attemptStart)
			lock.multi = &multiKeys{keys: keys, storeKeys: storeKeys, fences: grant.Fences}
			return lock, nil
		case wait == 0:
			return nil, ErrHeld
		}
		sawHeld = true
		if l.notifier != nil && grant.Held >= 0 && grant.Held < len(storeKeys) && grant.Held != watched {
			// Wake on a release of the key that is held now: the first
			// one, or another once that one was released.
			if stop != nil {
				stop()
			}
			released, stop = l.notifier.NotifyRelease(storeKeys[grant.Held])
			watched = grant.Held
			if released != nil {
				continue // a release just before we subscribed would go unseen
			}
		}
		if schedule == nil {
			schedule = newBackoffSchedule(l.backoff)
		}
		if !schedule.sleep(ctx, grant.HolderTTL, released) {
			return nil, waitEnded(true, ctx.Err())
		}
	}
}

// acquireAll is one attempt on every key: one MultiStore call, or, with a
// store that is not one, Acquire key by key, giving back what it took when a
// key is held or the store fails.
func (l *Locker) acquireAll(ctx context.Context, storeKeys []string, token string, ttl time.Duration) (MultiGrant, error) {
	if ms, ok := l.store.(MultiStore); ok {
		return ms.AcquireAll(ctx, storeKeys, token, ttl)
	}
	fences := make([]int64, 0, len(storeKeys))
	for i, k := range storeKeys {
		g, err := l.store.Acquire(ctx, k, token, ttl)
		if err != nil || !g.OK {
			for _, taken := range storeKeys[:i] {
				_ = l.release(ctx, taken, token, 0)
			}
			return MultiGrant{Held: i, HolderTTL: g.HolderTTL}, err
		}
		fences = append(fences, g.Fence)
	}
	return MultiGrant{OK: true, Fences: fences}, nil
}

// releaseMulti releases a lock of several keys in the store, or with keep
// positive leaves its keys to expire after keep.
func (l *Locker) releaseMulti(ctx context.Context, lock *Lock, keep time.Duration) error {
	m := lock.multi
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.releaseTimeout)
	defer cancel()
	var err error
	if ms, ok := l.store.(MultiStore); ok {
		err = ms.ReleaseAll(ctx, m.storeKeys, lock.token, m.fences, keep)
	} else {
		var errs []error
		for _, k := range m.storeKeys {
			// A multi-key grant is never handed off locally: the store
			// already knows its fences.
			errs = append(errs, l.releaseKey(ctx, k, lock.token, 0, keep))
		}
		err = errors.Join(errs...)
	}
	if err != nil && !onlyNotHeld(err) {
		return wrapStoreError(err)
	}
	return err
}

// releaseKey releases one key of a grant, or with keep positive leaves it
// to expire after keep.
func (l *Locker) releaseKey(ctx context.Context, storeKey, token string, lastFence int64, keep time.Duration) error {
	if keep <= 0 {
		return l.store.Release(ctx, storeKey, token, lastFence)
	}
	if kr, ok := l.store.(KeepReleaser); ok {
		return kr.ReleaseKeep(ctx, storeKey, token, lastFence, keep)
	}
	if lastFence > 0 {
		// Only Release records the fences of local handoffs on a store
		// without ReleaseKeep: keep the fences right and give up the hold.
		l.logger.Warn("reqlock: the store cannot hold a handed-off lock on after release; released it at once",
			slog.String("key", storeKey), slog.Duration("hold_left", keep))
		return l.store.Release(ctx, storeKey, token, lastFence)
	}
	return l.store.Refresh(ctx, storeKey, token, keep)
}

// refreshStore renews every key of a real lock.
func (l *Lock) refreshStore(ctx context.Context, ttl time.Duration) error {
	store := l.locker.store
	if l.multi == nil {
		return store.Refresh(ctx, l.storeKey, l.token, ttl)
	}
	if ms, ok := store.(MultiStore); ok {
		return ms.RefreshAll(ctx, l.multi.storeKeys, l.token, ttl)
	}
	var errs []error
	for _, k := range l.multi.storeKeys {
		errs = append(errs, store.Refresh(ctx, k, l.token, ttl))
	}
	return errors.Join(errs...)
}

// releaseAbandonedAll releases a multi-key grant nobody will use.
func (l *Locker) releaseAbandonedAll(storeKeys []string, token string) {
	ctx, cancel := context.WithTimeout(context.Background(), l.releaseTimeout)
	defer cancel()
	var err error
	if ms, ok := l.store.(MultiStore); ok {
		err = ms.ReleaseAll(ctx, storeKeys, token, make([]int64, len(storeKeys)), 0)
	} else {
		var errs []error
		for _, k := range storeKeys {
			errs = append(errs, l.store.Release(ctx, k, token, 0))
		}
		err = errors.Join(errs...)
	}
	if err != nil && !onlyNotHeld(err) {
		l.logger.Warn("reqlock: release of abandoned multi-key grant failed; it will expire with its TTL",
			slog.Any("keys", storeKeys), slog.Any("error", err))
	}
}

// onlyNotHeld reports whether err is ErrNotHeld, or a join of nothing else.
func onlyNotHeld(err error) bool {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range joined.Unwrap() {
			if !onlyNotHeld(e) {
				return false
			}
		}
		return true
	}
	return errors.Is(err, ErrNotHeld)
}
