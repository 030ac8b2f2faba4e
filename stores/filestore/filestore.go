//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package filestore

import (
	"container/list"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/reqlock/reqlock/internal/storeargs"
	"github.com/reqlock/reqlock/stores"
)

// args checks the arguments of Store's methods; its errors start "filestore:".
const args storeargs.Checker = "filestore"

// Permissions of what New creates: the directory and the key files are the
// user's own. Every process that shares the directory must be able to open
// its files for reading and writing.
const (
	dirPerm  = 0o700
	filePerm = 0o600
)

// maxIdleFiles bounds the key files a Store keeps open and mapped while it
// holds no grant on them, so that a key locked again costs no open(2).
const maxIdleFiles = 1024

// shardCount is the number of shards of a Store's entries, each under a
// mutex of its own, so that calls on different keys seldom wait for each
// other.
const shardCount = 256

var (
	_ stores.Store        = (*Store)(nil)
	_ stores.Notifier     = (*Store)(nil)
	_ stores.WaitReporter = (*Store)(nil)
)

// Store is a stores.Store, stores.Notifier, stores.WaitReporter,
// stores.SharedStore and stores.Bounded on flock(2)ed files in one directory, shared by the
// processes of one host; see the package documentation. It is safe for
// concurrent use.
type Store struct {
	dir    string
	pid    uint32
	id     uint64 // random, never 0: names this Store in waiter marks
	closed atomic.Bool

	shards    [shardCount]shard
	idleFiles atomic.Int64 // entries in the shards' idle lists

	notify notifier // release notification; see notify.go
}

// shard holds the entries of the keys that hash to it.
type shard struct {
	mu      sync.Mutex
	entries map[string]*entry // keys in use, held or with an open file; guarded by mu
	idle    list.List         // of the entries with an open file only, most recently used first; guarded by mu
}

// shardOf returns the shard of key (FNV-1a).
func (s *Store) shardOf(key string) *shard {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint32(key[i])) * 16777619
	}
	return &s.shards[h%shardCount]
}

// entry is the state of one key in this Store.
//
// Invariants: calls take the mu of their keys' entries in key order, and
// hold them for their whole work, so a call's keys change as one in the
// eyes of this Store's other calls (and, for the flocks, of every other
// open file). An entry stays in its shard's entries while a call pins it
// (refs > 0), it holds a grant (h != nil) or its file is open (fd >= 0);
// in the last case alone it is in the shard's idle list, whose eviction
// closes the file. Only a pinned entry's mu is taken, so an idle entry is
// used by nobody.
type entry struct {
	key   string
	path  string
	shard *shard
	refs  int           // guarded by shard.mu
	idle  *list.Element // in shard.idle; guarded by shard.mu

	mu  sync.Mutex
	fd  int    // the key file, open and mapped, or -1
	mem []byte // the file's record, mapped
	h   *hold  // the grant of this Store on the key (a flock on fd); nil when it holds none
}

// hold is a grant of a key to a token, kept by the flock on its entry's
// file, and the grant's expiry, enforced by a timer.
type hold struct {
	token   string
	fence   int64
	expiry  time.Time // with the monotonic clock
	timer   *time.Timer
	granted int64 // Unix nanoseconds (wall clock) of the grant
	waited  bool  // this Store refused another token the key meanwhile
}

// New returns a Store on dir, an absolute path, which it creates (mode
// 0700, with its parents) when missing. Every process that locks the same
// keys must use the same directory. A key's file stays in the directory
// for good, to keep the key's fence: there is one small file per key ever
// locked.
//
// New returns an error wrapping stores.ErrInvalid that names the problem
// for an empty or relative dir, or a path that is not a directory or
// cannot be created; and one wrapping both stores.ErrInvalid and
// ErrUnsupported when the directory cannot hold these locks: on Linux, a
// network or cluster file system or FUSE (by its statfs(2) type), and on
// every platform, one where a probe shows that flock does not exclude.
func New(dir string) (*Store, error) {
	switch {
	case dir == "":
		return nil, fmt.Errorf("%w: filestore: the directory is empty", stores.ErrInvalid)
	case !filepath.IsAbs(dir):
		return nil, fmt.Errorf("%w: filestore: directory %q is relative; give an absolute path, so that every process finds the same one", stores.ErrInvalid, dir)
	}
	dir = filepath.Clean(dir)
	if err := os.MkdirAll(dir, dirPerm); err != nil {
		return nil, fmt.Errorf("%w: filestore: %w", stores.ErrInvalid, err)
	}
	if err := checkFileSystem(dir); err != nil {
		return nil, fmt.Errorf("%w: %w", stores.ErrInvalid, err)
	}
	if err := probeFlock(dir, filePerm); err != nil {
		return nil, fmt.Errorf("%w: %w", stores.ErrInvalid, err)
	}
	s := &Store{dir: dir, pid: uint32(os.Getpid()), id: newStoreID()}
	s.notify.dir = dir
	for i := range s.shards {
		s.shards[i].entries = make(map[string]*entry)
	}
	return s, nil
}

// newStoreID returns a random Store id, never 0.
func newStoreID() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
		if id := binary.LittleEndian.Uint64(b[:]); id != 0 {
			return id
		}
	}
}

// Dir returns the Store's directory.
func (s *Store) Dir() string { return s.dir }

// Close ends every grant the Store holds, as the end of its process would,
// signalling their release, and stops its release notifications. Calls
// after Close return an error wrapping ErrClosed, and NotifyRelease returns
// a nil channel. Close is idempotent and returns nil.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	var all []*entry
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, e := range sh.entries {
			s.pinLocked(e)
			all = append(all, e)
		}
		sh.mu.Unlock()
	}
	for _, e := range all {
		e.mu.Lock()
		if e.h != nil {
			s.drop(e)
		}
		e.mu.Unlock()
	}
	s.unpin(all) // closes every file, now that the Store is closed
	s.notify.close()
	return nil
}

// enter pins the entries of keys and locks them, in key order, for one
// call; leave undoes that. It fails with ErrClosed after Close.
func (s *Store) enter(keys []string) ([]*entry, error) {
	es, err := s.pin(keys)
	if err != nil {
		return nil, err
	}
	lock(es)
	if s.closed.Load() {
		s.leave(es)
		return nil, ErrClosed
	}
	return es, nil
}

// leave unlocks and unpins the entries of enter.
func (s *Store) leave(es []*entry) {
	unlock(es)
	s.unpin(es)
}

// pin returns the entries of keys, pinned in their shards.
func (s *Store) pin(keys []string) ([]*entry, error) {
	es := make([]*entry, 0, len(keys))
	for _, key := range keys {
		sh := s.shardOf(key)
		sh.mu.Lock()
		if s.closed.Load() {
			sh.mu.Unlock()
			s.unpin(es)
			return nil, ErrClosed
		}
		e := sh.entries[key]
		if e == nil {
			e = &entry{key: key, path: filepath.Join(s.dir, fileName(key)), shard: sh, fd: -1}
			sh.entries[key] = e
		}
		s.pinLocked(e)
		sh.mu.Unlock()
		es = append(es, e)
	}
	return es, nil
}

// pinLocked pins e. The caller holds e.shard.mu.
func (s *Store) pinLocked(e *entry) {
	e.refs++
	if e.idle != nil {
		e.shard.idle.Remove(e.idle)
		e.idle = nil
		s.idleFiles.Add(-1)
	}
}

// unpin ends the pins of es. An entry nobody uses any more is forgotten,
// or, with its file open, goes to the front of its shard's idle list. While
// the Store keeps more than maxIdleFiles idle files (or any, once it is
// closed), the least recently used of the shard are closed and forgotten.
func (s *Store) unpin(es []*entry) {
	for _, e := range es {
		sh := e.shard
		sh.mu.Lock()
		e.refs--
		if e.refs == 0 && sh.entries[e.key] == e {
			// Nobody else has e pinned, so nobody holds e.mu but a
			// timer about to find its hold gone (expire pins e first).
			e.mu.Lock()
			switch {
			case e.h != nil:
			case e.fd < 0:
				delete(sh.entries, e.key)
			default:
				e.idle = sh.idle.PushFront(e)
				s.idleFiles.Add(1)
			}
			e.mu.Unlock()
		}
		for sh.idle.Len() > 0 && (s.idleFiles.Load() > maxIdleFiles || s.closed.Load()) {
			old := sh.idle.Remove(sh.idle.Back()).(*entry)
			old.idle = nil
			s.idleFiles.Add(-1)
			delete(sh.entries, old.key)
			unmapKeyFile(old.fd, old.mem)
			old.fd, old.mem = -1, nil
		}
		sh.mu.Unlock()
	}
}

// lock takes the entries' mutexes, in key order, the order of es.
func lock(es []*entry) {
	for _, e := range es {
		e.mu.Lock()
	}
}

// unlock releases the entries' mutexes.
func unlock(es []*entry) {
	for i := len(es) - 1; i >= 0; i-- {
		es[i].mu.Unlock()
	}
}

// live returns e's grant when it has one that has not expired at now; an
// expired one it ends first, as its timer would have. The caller holds
// e.mu.
func (s *Store) live(e *entry, now time.Time) *hold {
	h := e.h
	if h != nil && !now.Before(h.expiry) {
		s.drop(e)
		return nil
	}
	return h
}

// drop ends e's grant: it stops the timer, marks the record free (see
// exclusive) and drops the flock, which frees the key for every other
// process, and signals the key's release: to this
// Store's subscribers, and, when another Store marked the key waited for
// during the grant, to every process's (see ring). The caller holds e.mu.
func (s *Store) drop(e *entry) {
	h := e.h
	e.h = nil
	h.timer.Stop()
	foreign := s.markedByOther(e, h)
	// Tell other Stores that the flock is no longer an exclusive grant's
	// (see exclusive): a failure leaves that to the next call that takes it.
	last, _ := readRecord(e.mem)
	_ = writeRecord(e.fd, record{fence: max(last.fence, h.fence), pid: s.pid, mode: modeFree})
	s.unlockOrClose(e)
	s.notify.signal(e.key)
	if foreign && e.fd >= 0 {
		ring(e.fd)
	}
}

// markedByOther reports whether another Store marked e's key waited for
// during h, e's grant (see record.go). The caller holds e.mu.
func (s *Store) markedByOther(e *entry, h *hold) bool {
	m, ok := readMark(e.mem)
	return ok && m.store != s.id && m.at >= h.granted
}

// waited reports whether another token was refused e's key during h, e's
// grant: by this Store, or by another (its mark). The caller holds e.mu.
func (s *Store) waited(e *entry, h *hold) bool {
	return h.waited || s.markedByOther(e, h)
}

// arm sets h to expire at expiry, which is ttl from now.
func (s *Store) arm(e *entry, h *hold, expiry time.Time, ttl time.Duration) {
	h.expiry = expiry
	if h.timer == nil {
		h.timer = time.AfterFunc(ttl, func() { s.expire(e, h) })
		return
	}
	h.timer.Reset(ttl)
}

// expire is h's timer: it ends the grant on e when h is still e's grant and
// its expiry has passed, and sets the timer again when it was refreshed.
func (s *Store) expire(e *entry, h *hold) {
	e.shard.mu.Lock()
	s.pinLocked(e)
	e.shard.mu.Unlock()
	defer s.unpin([]*entry{e})
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.h != h {
		return // released, or ended by a call that saw it expired
	}
	if left := time.Until(h.expiry); left > 0 {
		h.timer.Reset(left)
		return
	}
	s.drop(e)
}

// hint is the record of a grant made now with that expiry, for the
// processes it refuses.
func (s *Store) hint(fence int64, expiry time.Time) record {
	return record{fence: fence, expiry: expiry.UnixNano(), pid: s.pid}
}

// nextFence returns the fence of a key's next grant: a stride above its
// last, and at least the wall clock in microseconds. The clock is what keeps
// fences growing when a crash of the host loses the last fences written
// (see the package documentation).
func nextFence(last int64) int64 {
	return max(last+stores.FenceStride, time.Now().UnixMicro())
}

// expiryAfter returns now plus ttl, saturating: ttl is within maxTTL
// after the argument checks, and this keeps a caller's mistake from
// overflowing.
func expiryAfter(now time.Time, ttl time.Duration) time.Time {
	return now.Add(min(ttl, time.Duration(math.MaxInt64/2)))
}

// Acquire takes every key for token when none is held by another token,
// and issues each its fence: it takes the keys in order, each by an
// exclusive flock of its file without waiting for a grant (opening and
// mapping the file unless it is open already), and undoes what it took when
// one is held. A flock held for a moment by another Store's call it waits
// for, as long as ctx lasts (see the package documentation). A key held by a grant of this Store refuses another token without
// a system call; a key this Store holds for token (a retried Acquire) is
// granted again with a fresh fence and TTL. A refusal names the first held
// key and, in Wait, its holder's remaining TTL: exact for a grant of this
// Store, read from the key file for one of another process or Store (zero
// when the file does not tell).
//
// The fence is read from the key file's mapped record and written back
// (pwrite), grown, while the flock is held (see nextFence). The grant ends
// at the first of: Release; its TTL, by a timer of this Store; Close; the
// end of the process.
//
// It returns ctx.Err() without acting when ctx has ended, and an error
// wrapping it, having taken nothing, when ctx ends while it waits for a
// flock; an error wrapping stores.ErrInvalid for invalid keys, or a ttl
// out of Bounds; ErrClosed after Close; and the file system's error when a
// key file cannot be opened, mapped, locked or written, having taken
// nothing.
func (s *Store) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return stores.Grant{}, err
	}
	if err := args.CheckBounds(bounds, nil, ttl); err != nil {
		return stores.Grant{}, err
	}
	es, err := s.enter(keys)
	if err != nil {
		return stores.Grant{}, err
	}
	defer s.leave(es)

	// Take every key: flock its file, or find it held for token already.
	now := time.Now()
	took := make([]bool, len(es))
	ends := make([]bool, len(es)) // token's writer records to end
	undo := func(n int) {
		for i, e := range es[:n] {
			if took[i] {
				s.unlockOrClose(e)
			}
		}
	}
	for i, e := range es {
		if h := s.live(e, now); h != nil {
			if h.token == token {
				continue
			}
			undo(i)
			h.waited = true
			return stores.Grant{Held: i, Wait: h.expiry.Sub(now)}, nil
		}
		if err := s.open(e); err != nil {
			undo(i)
			return stores.Grant{}, err
		}
		switch held, err := s.lockKey(ctx, e); {
		case err != nil:
			undo(i)
			return stores.Grant{}, err
		case held:
			undo(i)
			// Tell the holder that a waiter was refused: a hint, whose
			// loss costs only fairness.
			s.refusedBy(e)
			return stores.Grant{Held: i, Wait: waitHint(e.mem)}, nil
		}
		took[i] = true
		// Holders of the key refuse it, and record token as a waiting
		// writer (see shared.go).
		wait, shared, recorded, err := s.holdersOver(e, token, now)
		if err != nil {
			undo(i + 1)
			return stores.Grant{}, err
		}
		if shared {
			undo(i + 1)
			return stores.Grant{Held: i, Wait: wait, SharedHeld: true}, nil
		}
		ends[i] = recorded
	}

	// Issue the fences, under the flocks.
	expiry := expiryAfter(now, ttl)
	fences := make([]int64, len(es))
	for i, e := range es {
		last, _ := readRecord(e.mem)
		fences[i] = nextFence(last.fence)
		if err := writeRecord(e.fd, s.hint(fences[i], expiry)); err != nil {
			undo(len(es))
			return stores.Grant{}, fmt.Errorf("filestore: write the fence of %s: %w", stores.KeyForMessage(e.key), err)
		}
	}
	for i, e := range es {
		if ends[i] {
			_ = endWriterRecord(e, token) // else the record lapses within stores.WriterWindow
		}
	}
	granted := now.UnixNano()
	for i, e := range es {
		if took[i] {
			e.h = &hold{token: token}
		}
		e.h.fence, e.h.granted = fences[i], granted
		s.arm(e, e.h, expiry, ttl)
	}
	return stores.Grant{OK: true, Fences: fences}, nil
}

// unlockOrClose drops the flock on e's file, closing the file when that
// fails. The caller holds e.mu.
func (s *Store) unlockOrClose(e *entry) {
	if err := unlockFile(e.fd); err != nil {
		// Not expected of a local file system; closing the file surely
		// drops the flock.
		unmapKeyFile(e.fd, e.mem)
		e.fd, e.mem = -1, nil
	}
}

// waitHint returns the remaining TTL of the grant recorded in the key
// file's record mem, which another open file holds; zero when the record
// does not tell (it is being written, or its expiry passed while its
// holder, stopped or about to let go, still holds the flock).
func waitHint(mem []byte) time.Duration {
	r, ok := readRecord(mem)
	if !ok {
		return 0
	}
	return max(time.Until(time.Unix(0, r.expiry)), 0)
}

// Release ends token's grant on every key that holds it. With keep zero or
// negative it drops the key file's flock, which frees the key for every
// process at once, and signals the key's subscribers; with keep positive
// it sets the grant to end keep from now instead (shorter or longer than
// its TTL left), signalling nothing. It returns an error wrapping
// stores.ErrNotHeld, naming the keys, when some keys held no live grant of
// token in this Store (released, expired, or never granted here), after
// ending the grant on the others.
//
// It returns ctx.Err() without acting when ctx has ended; an error
// wrapping stores.ErrInvalid for invalid keys, or a keep out of Bounds;
// and ErrClosed after Close.
func (s *Store) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	_, err := s.ReleaseWaited(ctx, keys, token, keep)
	return err
}

// ReleaseWaited is Release, and also reports whether another token was
// refused one of keys while token's grant stood: by this Store (which
// notes it in the grant), or by another Store or process (which marks it
// in the key file, read from memory here: no system call). A Locker that
// passes a hot key among its own requests then holds back long enough for
// the waiters of other processes to take it (see stores.WaitReporter).
func (s *Store) ReleaseWaited(ctx context.Context, keys []string, token string, keep time.Duration) (waited bool, err error) {
	if err := args.CheckRelease(ctx, keys); err != nil {
		return false, err
	}
	if keep > 0 {
		if err := args.CheckBounds(bounds, nil, keep); err != nil {
			return false, err
		}
	}
	es, err := s.enter(keys)
	if err != nil {
		return false, err
	}
	defer s.leave(es)
	now := time.Now()
	var notHeld []string
	for _, e := range es {
		h := s.live(e, now)
		if h != nil && h.token == token && s.waited(e, h) {
			waited = true
		}
		switch {
		case h == nil || h.token != token:
			notHeld = append(notHeld, e.key)
			s.withdraw(ctx, e, token, h) // a waiting writer's record (see shared.go)
		case keep > 0:
			expiry := expiryAfter(now, keep)
			s.arm(e, h, expiry, keep)
			_ = writeRecord(e.fd, s.hint(h.fence, expiry)) // a hint for other processes
		default:
			s.drop(e)
		}
	}
	if len(notHeld) > 0 {
		return false, fmt.Errorf("%w: filestore: %d of %d keys not held by the token: %s", stores.ErrNotHeld, len(notHeld), len(keys), keysForMessage(notHeld))
	}
	return waited, nil
}

// Refresh sets every key's grant to end ttl from now when each holds a
// live grant of token in this Store; when one does not, it changes nothing
// and returns an error wrapping stores.ErrNotHeld that names it. Only the
// Store that made a grant refreshes it: its timer is what ends it.
//
// It returns ctx.Err() without acting when ctx has ended; an error
// wrapping stores.ErrInvalid for invalid keys, or a ttl out of Bounds;
// and ErrClosed after Close.
func (s *Store) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return err
	}
	if err := args.CheckBounds(bounds, nil, ttl); err != nil {
		return err
	}
	es, err := s.enter(keys)
	if err != nil {
		return err
	}
	defer s.leave(es)
	now := time.Now()
	for _, e := range es {
		if h := s.live(e, now); h == nil || h.token != token {
			return fmt.Errorf("%w: filestore: %s is not held by the token (none of the %d keys refreshed)", stores.ErrNotHeld, stores.KeyForMessage(e.key), len(keys))
		}
	}
	expiry := expiryAfter(now, ttl)
	for _, e := range es {
		s.arm(e, e.h, expiry, ttl)
		_ = writeRecord(e.fd, s.hint(e.h.fence, expiry)) // a hint for other processes
	}
	return nil
}
