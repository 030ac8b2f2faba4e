//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package filestore

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/reqlock/reqlock/stores"
)

var _ stores.SharedStore = (*Store)(nil)

// Shared grants live in the key file's shared table (see record.go): the
// holders, each with its own expiry, and the waiting writers' records. A
// call reads and writes the table while it holds the file's exclusive
// flock for a moment; no flock is kept for a holder, so its place lasts
// until its expiry, or its release, whatever becomes of its process. An
// exclusive grant keeps the flock for its whole hold, as ever, and is only
// granted while the table has no unexpired holder.

// maxPlaces bounds the holders, and the writers' records, of one key: the
// header counts them in a uint16.
const maxPlaces = math.MaxUint16

// open opens and maps e's key file unless it is open already. The caller
// holds e.mu.
func (s *Store) open(e *entry) error {
	if e.fd >= 0 {
		return nil
	}
	fd, mem, err := mapKeyFile(e.path, filePerm)
	if err != nil {
		return fmt.Errorf("filestore: open the file of %s: %w", stores.KeyForMessage(e.key), err)
	}
	e.fd, e.mem = fd, mem
	return nil
}

// lockKey takes the flock of e's open file without waiting for an
// exclusive grant: held reports one (of another Store). A flock held
// otherwise, for a moment, by another Store's call that reads and writes
// the shared table or makes a grant, it waits for, polling, until ctx
// ends: then it returns an error wrapping ctx.Err(). Which of the two holds
// the flock it reads from the key file (see exclusive), again at every
// poll. Once it has the flock, it corrects a record that still tells of an
// exclusive grant (see settle). The caller holds e.mu, and this Store
// holds no grant on e.
func (s *Store) lockKey(ctx context.Context, e *entry) (held bool, err error) {
	var timer *time.Timer
	pause := 20 * time.Microsecond
	for {
		held, err := tryLock(e.fd)
		switch {
		case err != nil:
			return false, fmt.Errorf("filestore: flock the file of %s: %w", stores.KeyForMessage(e.key), err)
		case !held:
			s.settle(e)
			return false, nil
		case exclusive(e.mem, time.Now().UnixNano()):
			return true, nil
		}
		if timer == nil {
			timer = time.NewTimer(pause)
			defer timer.Stop()
		} else {
			timer.Reset(pause)
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("filestore: %s: waiting for another Store's call to let go of the key file: %w", stores.KeyForMessage(e.key), ctx.Err())
		case <-timer.C:
		}
		pause = min(2*pause, time.Millisecond)
	}
}

// exclusive reports whether the held flock of the key file mapped at mem is
// held by an exclusive grant, rather than for a moment by a call of another
// Store: whether the record tells of an exclusive grant (every exclusive
// grant writes its record as soon as it has the flocks of its keys, and
// its end, before it lets go of the flock, writes modeFree) and the header
// of no holder unexpired at now (Unix nanoseconds), which no exclusive
// grant coexists with. A record being written (which fails its checksum)
// or never written (a new file) tells nothing: not an exclusive grant, so
// the caller polls and reads it again. Read without the flock, the record
// is exact but for a grant whose process died holding it (the kernel let
// go of the flock, and the record still tells of it) until the next call
// that takes the flock corrects it (see settle).
func exclusive(mem []byte, now int64) bool {
	r, ok := readRecord(mem)
	return ok && r.mode == modeExclusive && !readHeader(mem).liveHolders(now)
}

// settle corrects e's record, under e's flock, when it tells of an
// exclusive grant: that grant ended without writing modeFree (its process
// died, or ran a version that does not write it), since this Store holds
// the flock. The correction is a hint for exclusive; its failure leaves
// the record as it was.
func (s *Store) settle(e *entry) {
	if r, ok := readRecord(e.mem); ok && r.mode == modeExclusive {
		_ = writeRecord(e.fd, record{fence: r.fence, pid: s.pid, mode: modeFree})
	}
}

// loadTable reads e's shared table, leaving out the places and records
// expired at now (Unix nanoseconds); since is the earliest grant among the
// holders left out, or 0 when none. The caller holds e's flock.
func loadTable(e *entry, now int64) (t table, since int64, err error) {
	h := readHeader(e.mem)
	if h.holders == 0 && h.writers == 0 {
		return table{}, 0, nil
	}
	t, err = readTable(e.fd, h)
	if err != nil {
		return table{}, 0, fmt.Errorf("filestore: read the shared table of %s: %w", stores.KeyForMessage(e.key), err)
	}
	holders := t.holders[:0]
	for _, p := range t.holders {
		if p.expiry > now {
			holders = append(holders, p)
		} else if since == 0 || p.granted < since {
			since = p.granted
		}
	}
	writers := t.writers[:0]
	for _, p := range t.writers {
		if p.expiry > now {
			writers = append(writers, p)
		}
	}
	return table{holders: holders, writers: writers}, since, nil
}

// storeTable writes t as e's shared table. The caller holds e's flock.
func storeTable(e *entry, t table) error {
	_, b := t.encode()
	if err := writeTable(e.fd, b); err != nil {
		return fmt.Errorf("filestore: write the shared table of %s: %w", stores.KeyForMessage(e.key), err)
	}
	return nil
}

// find returns the index of id among ps, or -1.
func find(ps []place, id [16]byte) int {
	for i, p := range ps {
		if p.token == id {
			return i
		}
	}
	return -1
}

// freed signals the waiters of e's key that places were freed, the
// earliest of them granted at since (Unix nanoseconds): this Store's
// subscribers, and every process's (see ring) when a Store marked the key
// waited for since then. The mark is one slot: a refusal of this Store's
// own (with a limit, a process both holds and waits) may have overwritten
// another Store's, so a mark of this Store rings too. The caller holds
// e.mu, and no longer the flock, so that a signalled waiter finds the key
// free.
func (s *Store) freed(e *entry, since int64) {
	s.notify.signal(e.key)
	if m, ok := readMark(e.mem); ok && m.at >= since && e.fd >= 0 {
		ring(e.fd)
	}
}

// refusedBy marks e's key as waited for by this Store (see record.go), so
// that the holder's or writer's Store rings the file when it lets go.
func (s *Store) refusedBy(e *entry) {
	_ = writeMark(e.fd, mark{store: s.id, at: time.Now().UnixNano()}) // a hint
}

// AcquireShared makes token a holder of key for ttl, as stores.SharedStore
// describes: under the key file's flock, taken for a moment, it reads the
// shared table, and, when no exclusive grant holds the key, no writer
// waits and fewer than limit (0: any number, up to 65535) hold it, adds
// token's place with its expiry, and issues the next fence of the key's
// one sequence (see nextFence). A token that holds the key already is
// granted again with a fresh fence and expiry. A refusal's Wait is the
// exclusive holder's remaining TTL (exact for a grant of this Store, read
// from the key file for another's, zero when it does not tell), the
// longest remaining window among the waiting writers, or the soonest
// expiry among the holders.
//
// It returns ctx.Err() without acting when ctx has ended, and an error
// wrapping it, having changed nothing, when ctx ends while it waits for
// the key file's flock, held for a moment by another Store's call; an error
// wrapping stores.ErrInvalid for an empty key, a negative limit or a ttl
// out of Bounds; ErrClosed after Close; and the file system's error when
// the key file cannot be opened, locked, read or written.
func (s *Store) AcquireShared(ctx context.Context, key, token string, limit int, ttl time.Duration) (stores.Grant, error) {
	if err := args.CheckShared(ctx, key, limit); err != nil {
		return stores.Grant{}, err
	}
	if err := args.CheckTTL(ttl); err != nil {
		return stores.Grant{}, err
	}
	if err := args.CheckBounds(bounds, nil, ttl); err != nil {
		return stores.Grant{}, err
	}
	es, err := s.enter([]string{key})
	if err != nil {
		return stores.Grant{}, err
	}
	defer s.leave(es)
	e := es[0]
	now := time.Now()
	if h := s.live(e, now); h != nil {
		h.waited = true
		return stores.Grant{Wait: h.expiry.Sub(now)}, nil
	}
	if err := s.open(e); err != nil {
		return stores.Grant{}, err
	}
	switch held, err := s.lockKey(ctx, e); {
	case err != nil:
		return stores.Grant{}, err
	case held:
		s.refusedBy(e)
		return stores.Grant{Wait: waitHint(e.mem)}, nil
	}
	g, since, err := s.share(e, token, limit, ttl)
	s.unlockOrClose(e)
	if since != 0 {
		s.freed(e, since)
	}
	return g, err
}

// share is AcquireShared once it holds e's flock; since is as loadTable's
// when it wrote the table without the expired holders, else 0.
func (s *Store) share(e *entry, token string, limit int, ttl time.Duration) (g stores.Grant, since int64, err error) {
	now := time.Now()
	nowNs := now.UnixNano()
	t, since, err := loadTable(e, nowNs)
	if err != nil {
		return stores.Grant{}, 0, err
	}
	refuse := func(wait int64) (stores.Grant, int64, error) {
		s.refusedBy(e)
		if since != 0 {
			if err := storeTable(e, t); err != nil {
				return stores.Grant{}, 0, err
			}
		}
		return stores.Grant{Wait: time.Duration(max(wait-nowNs, 0))}, since, nil
	}
	id := tokenID(token)
	expiry := expiryAfter(now, ttl)
	switch i := find(t.holders, id); {
	case i >= 0: // a retry of token's own grant
		t.holders[i].expiry = expiry.UnixNano()
	case len(t.writers) > 0:
		var last int64
		for _, w := range t.writers {
			last = max(last, w.expiry)
		}
		return refuse(last)
	case (limit > 0 && len(t.holders) >= limit) || len(t.holders) >= maxPlaces:
		soonest := int64(math.MaxInt64)
		for _, p := range t.holders {
			soonest = min(soonest, p.expiry)
		}
		return refuse(soonest)
	default:
		t.holders = append(t.holders, place{token: id, expiry: expiry.UnixNano(), granted: nowNs})
	}
	last, _ := readRecord(e.mem)
	fence := nextFence(last.fence)
	if err := writeRecord(e.fd, record{fence: fence, expiry: expiry.UnixNano(), pid: s.pid, mode: modeShared}); err != nil {
		return stores.Grant{}, 0, fmt.Errorf("filestore: write the fence of %s: %w", stores.KeyForMessage(e.key), err)
	}
	if err := storeTable(e, t); err != nil {
		return stores.Grant{}, 0, err
	}
	return stores.Grant{OK: true, Fences: []int64{fence}}, since, nil
}

// ReleaseShared ends token's place among key's holders: with keep zero or
// negative it takes the place out of the key file's shared table and
// signals the key's waiters (this Store's subscribers, and, on Linux,
// other Stores' that were refused the key: see ring); with keep positive
// it sets the place to end keep from now. It returns an error wrapping
// stores.ErrNotHeld when token holds no unexpired place on key, having
// changed nothing.
//
// It returns ctx.Err() without acting when ctx has ended, and an error
// wrapping it, having changed nothing, when ctx ends while it waits for
// the key file's flock, held for a moment by another Store's call; an error
// wrapping stores.ErrInvalid for an empty key or a keep out of Bounds;
// ErrClosed after Close; and the file system's error when the key file
// cannot be opened, locked, read or written.
func (s *Store) ReleaseShared(ctx context.Context, key, token string, keep time.Duration) error {
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	if keep > 0 {
		if err := args.CheckBounds(bounds, nil, keep); err != nil {
			return err
		}
	}
	return s.updatePlace(ctx, key, token, func(now time.Time) int64 {
		if keep > 0 {
			return expiryAfter(now, keep).UnixNano()
		}
		return 0
	})
}

// RefreshShared sets token's place among key's holders to end ttl from now.
// It returns an error wrapping stores.ErrNotHeld when token holds no
// unexpired place on key, having changed nothing.
//
// It returns ctx.Err() without acting when ctx has ended, and an error
// wrapping it, having changed nothing, when ctx ends while it waits for
// the key file's flock, held for a moment by another Store's call; an error
// wrapping stores.ErrInvalid for an empty key or a ttl out of Bounds;
// ErrClosed after Close; and the file system's error when the key file
// cannot be opened, locked, read or written.
func (s *Store) RefreshShared(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	if err := args.CheckTTL(ttl); err != nil {
		return err
	}
	if err := args.CheckBounds(bounds, nil, ttl); err != nil {
		return err
	}
	return s.updatePlace(ctx, key, token, func(now time.Time) int64 { return expiryAfter(now, ttl).UnixNano() })
}

// updatePlace sets the expiry of token's place on key to expiry(now), or,
// when that is 0, frees it; it returns an error wrapping stores.ErrNotHeld
// when token holds no unexpired place.
func (s *Store) updatePlace(ctx context.Context, key, token string, expiry func(now time.Time) int64) error {
	es, err := s.enter([]string{key})
	if err != nil {
		return err
	}
	defer s.leave(es)
	e := es[0]
	notHeld := fmt.Errorf("%w: filestore: %s is not held shared by the token", stores.ErrNotHeld, stores.KeyForMessage(key))
	if h := s.live(e, time.Now()); h != nil {
		return notHeld // held exclusively, by this Store: no holder
	}
	if err := s.open(e); err != nil {
		return err
	}
	switch held, err := s.lockKey(ctx, e); {
	case err != nil:
		return err
	case held:
		return notHeld // held exclusively: no holder
	}
	since, err := func() (int64, error) {
		now := time.Now()
		t, since, err := loadTable(e, now.UnixNano())
		if err != nil {
			return 0, err
		}
		i := find(t.holders, tokenID(token))
		if i >= 0 {
			if x := expiry(now); x != 0 {
				t.holders[i].expiry = x
			} else {
				if g := t.holders[i].granted; since == 0 || g < since {
					since = g
				}
				t.holders = append(t.holders[:i], t.holders[i+1:]...)
			}
		}
		if i >= 0 || since != 0 {
			if err := storeTable(e, t); err != nil {
				return 0, err
			}
		}
		if i < 0 {
			return since, notHeld
		}
		return since, nil
	}()
	s.unlockOrClose(e)
	if since != 0 {
		s.freed(e, since)
	}
	return err
}

// holdersOver checks, for an exclusive Acquire of token that took e's
// flock, whether the key has unexpired holders; if so it records token as
// a waiting writer on the key for stores.WriterWindow and returns the
// longest remaining TTL among the holders. It also reports whether token
// has a writer's record on the key, which the grant ends (see
// endWriterRecord). It reads nothing when the header in the mapping shows
// an empty table: an uncontended Acquire costs no system call more. The
// caller holds e's flock.
func (s *Store) holdersOver(e *entry, token string, now time.Time) (wait time.Duration, shared, recorded bool, err error) {
	if h := readHeader(e.mem); h.holders == 0 && h.writers == 0 {
		return 0, false, false, nil
	}
	nowNs := now.UnixNano()
	t, _, err := loadTable(e, nowNs)
	if err != nil {
		return 0, false, false, err
	}
	id := tokenID(token)
	w := find(t.writers, id)
	if len(t.holders) == 0 {
		return 0, false, w >= 0, nil
	}
	var last int64
	for _, p := range t.holders {
		last = max(last, p.expiry)
	}
	until := now.Add(stores.WriterWindow).UnixNano()
	switch {
	case w >= 0:
		t.writers[w].expiry = until
	case len(t.writers) < maxPlaces:
		t.writers = append(t.writers, place{token: id, expiry: until, granted: nowNs})
	}
	if err := storeTable(e, t); err != nil {
		return 0, false, false, err
	}
	s.refusedBy(e)
	return time.Duration(last - nowNs), true, false, nil
}

// withdraw ends token's waiting-writer record on e's key, if it has one,
// for a Release by a token that does not hold the key; when no writer is
// left, it signals the key's waiters, so that refused holders come in at
// once. A record that cannot be reached now (another Store's exclusive
// grant holds the flock) is left to lapse within stores.WriterWindow.
// The caller holds e.mu; h is this Store's live grant on e, of another
// token, or nil.
func (s *Store) withdraw(ctx context.Context, e *entry, token string, h *hold) {
	if e.fd < 0 || readHeader(e.mem).writers == 0 {
		return
	}
	if h == nil {
		if held, err := s.lockKey(ctx, e); err != nil || held {
			return
		}
	}
	since := func() int64 {
		t, since, err := loadTable(e, time.Now().UnixNano())
		if err != nil {
			return 0
		}
		w := find(t.writers, tokenID(token))
		if w < 0 && since == 0 {
			return 0
		}
		if w >= 0 {
			granted := t.writers[w].granted
			t.writers = append(t.writers[:w], t.writers[w+1:]...)
			if len(t.writers) == 0 && (since == 0 || granted < since) {
				since = granted
			}
		}
		if storeTable(e, t) != nil {
			return 0
		}
		return since
	}()
	if h == nil {
		s.unlockOrClose(e)
	}
	if since != 0 {
		s.freed(e, since)
	}
}

// endWriterRecord ends token's waiting-writer record on e's key, for an
// exclusive grant of token (see holdersOver). The caller holds e's flock.
func endWriterRecord(e *entry, token string) error {
	t, _, err := loadTable(e, time.Now().UnixNano())
	if err != nil {
		return err
	}
	if w := find(t.writers, tokenID(token)); w >= 0 {
		t.writers = append(t.writers[:w], t.writers[w+1:]...)
		return storeTable(e, t)
	}
	return nil
}
