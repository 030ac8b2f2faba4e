package zkstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/reqlock/reqlock/stores"
)

var _ stores.SharedStore = (*Store)(nil)

// The znodes of a key's shared holders and waiting writers, beside its lock
// node (see names.go):
//
//	lock           while the key has shared holders: persistent, data markerData
//	s-<token>      a shared holder: ephemeral; data "<ttl ms>"
//	w-<token>      a waiting writer's record: ephemeral; data "<window ms>"
const (
	sharedPrefix = "s-"
	writerPrefix = "w-"
)

// markerData is the data of a lock node that marks a key held shared. A
// lock node of an exclusive grant has a newline in its data; this has none.
var markerData = []byte("shared")

// isMarker reports whether data is a shared marker's.
func isMarker(data []byte) bool { return string(data) == string(markerData) }

// sharedPath returns the path of token's place among the key's holders.
func (p paths) sharedPath(token string) string {
	return p.parent + "/" + sharedPrefix + encodeName(token)
}

// writerPath returns the path of token's waiting-writer record on the key.
func (p paths) writerPath(token string) string {
	return p.parent + "/" + writerPrefix + encodeName(token)
}

// contendedWait is the Wait of an AcquireShared refused because other
// writers changed the key under each of its attempts.
const contendedWait = 10 * time.Millisecond

// holderNode is a live shared holder, as read.
type holderNode struct {
	token   string
	version int32
	left    time.Duration
}

// keyState is what one read of a key's nodes found: its parent's version,
// then (read after it) the lock node, the live shared holders and the
// longest window left among the live writer records. stale deletes the
// expired holders and writer records at the versions read.
type keyState struct {
	pver      int32
	lock      lockNode
	holders   []holderNode
	writers   time.Duration
	ownWriter bool // the caller's writer record is among them, live or not
	stale     []any
	staleHold bool // stale deletes a holder
}

// soonest returns the shortest time left among the holders.
func (k *keyState) soonest() time.Duration {
	d := time.Duration(math.MaxInt64)
	for _, h := range k.holders {
		d = min(d, h.left)
	}
	return d
}

// longest returns the longest time left among the holders.
func (k *keyState) longest() time.Duration {
	var d time.Duration
	for _, h := range k.holders {
		d = max(d, h.left)
	}
	return d
}

// readKey reads the nodes of the key at p for token: the children and
// version of the parent first, then the lock node, holders and writer
// records, in parallel, so that a transaction that sets the parent at the
// version read fails once a grant of either kind (every grant sets the
// parent) or a writer's refusal was made since. found is false when the
// parent does not exist. A parent version of -1, which ZooKeeper takes for
// "any version", is moved on first.
func (s *Store) readKey(e *effects, p paths, token string) (k keyState, found bool, err error) {
	for {
		children, st, err := s.conn.Children(p.parent)
		if errors.Is(err, zk.ErrNoNode) {
			return keyState{}, false, nil
		}
		if err != nil {
			return keyState{}, false, err
		}
		if st.Version == -1 {
			if _, err := s.conn.Set(p.parent, nil, -1); e.note(err) != nil && !errors.Is(err, zk.ErrNoNode) {
				return keyState{}, false, err
			}
			continue
		}
		k = keyState{pver: st.Version}
		var names []string
		for _, c := range children {
			if strings.HasPrefix(c, sharedPrefix) || strings.HasPrefix(c, writerPrefix) {
				names = append(names, c)
			}
		}
		type read struct {
			data   []byte
			stat   *zk.Stat
			absent bool
		}
		got := make([]read, len(names))
		reads := len(names)
		if slices.Contains(children, lockName) {
			reads++ // the lock node is read last
		}
		err = forEach(reads, func(i int) error {
			if i == len(names) {
				return s.readLock(p.lock, &k.lock)
			}
			data, stat, err := s.conn.Get(p.parent + "/" + names[i])
			if errors.Is(err, zk.ErrNoNode) {
				got[i].absent = true
				return nil
			}
			got[i] = read{data: data, stat: stat}
			return err
		})
		if err != nil {
			return keyState{}, false, err
		}
		now := time.Now()
		for i, name := range names {
			r := got[i]
			if r.absent {
				continue
			}
			path := p.parent + "/" + name
			tok, derr := decodeName(name[len(sharedPrefix):]) // both prefixes are 2 bytes
			left := s.ages.remaining(path, r.stat.Mzxid, parseLeaseData(r.data), now)
			holder := strings.HasPrefix(name, sharedPrefix)
			switch {
			case left <= 0:
				k.stale = append(k.stale, &zk.DeleteRequest{Path: path, Version: r.stat.Version})
				k.staleHold = k.staleHold || holder
			case holder:
				if derr != nil {
					tok = "" // nobody's: it counts, and stands until it expires
				}
				k.holders = append(k.holders, holderNode{token: tok, version: r.stat.Version, left: left})
			default:
				k.writers = max(k.writers, left)
			}
			if !holder && derr == nil && tok == token {
				k.ownWriter = true
			}
		}
		// Read after the parent: the parent's version names what it is.
		k.lock.guarded, k.lock.pver = true, k.pver
		if k.lock.shared {
			k.lock.inspected, k.lock.holders, k.lock.left = true, len(k.holders), k.longest()
			k.lock.noHolder = true // a marker has no holder node
		}
		return k, true, nil
	}
}

// clean deletes the stale nodes of k, the key at p, in one transaction (or
// the first of them that fit one) that checks the parent's version read, so
// that it fails should a grant have been made since. A holder's place freed
// so goes with a release's signal (see releaseOps).
func (s *Store) clean(e *effects, p paths, k *keyState) error {
	var ops []any
	ops = append(ops, &zk.CheckVersionRequest{Path: p.parent, Version: k.pver})
	room := maxRequestBytes / 2
	for _, op := range k.stale {
		if room -= multiBytes([]any{op}); room < 0 {
			break
		}
		ops = append(ops, op)
	}
	if k.staleHold && k.lock.shared {
		ops = append(ops, s.signalOps(p)...)
	}
	_, err := s.multi(e, ops...)
	return err
}

// retryClean reports whether err, the failure of clean, is a change of the
// key since it was read, worth a new read.
func retryClean(err error) bool {
	return transient(err) || errors.Is(err, zk.ErrNoNode)
}

// signalOps deletes and creates again the shared marker of the key at p, in
// the transaction that frees a holder's place: the deletion wakes the
// subscriptions that watch the lock node (see NotifyRelease), and nobody
// sees the key without its marker. The last operation sets the new
// marker's data, so that its reply stamps the transaction.
func (s *Store) signalOps(p paths) []any {
	return []any{
		&zk.DeleteRequest{Path: p.lock, Version: -1},
		&zk.CreateRequest{Path: p.lock, Data: markerData, Acl: s.acl, Flags: 0},
		&zk.SetDataRequest{Path: p.lock, Data: markerData, Version: 0},
	}
}

// inspect reads, for an exclusive grant to token, the holders of the key
// whose lock node n, at path, is a shared marker, after cleaning up the
// stale ones: n then tells whether live holders stand, for how long, and
// is guarded for a takeover. ownWriter reports whether token has a writer
// record on the key.
func (s *Store) inspect(e *effects, path, token string, n *lockNode) (ownWriter bool, err error) {
	p := paths{parent: parentOf(path), lock: path}
	for attempt := 1; ; attempt++ {
		k, found, err := s.readKey(e, p, token)
		if err != nil || !found {
			*n = lockNode{}
			return false, err
		}
		if len(k.stale) > 0 {
			if err := s.clean(e, p, &k); err != nil && (attempt >= maxAttempts || !retryClean(err)) {
				return false, err
			}
			continue
		}
		*n = k.lock
		return k.ownWriter, nil
	}
}

// inspectAll inspects (see inspect) the shared markers among nodes, read
// at paths, in parallel, and reports for each key whether token has a
// writer record on it.
func (s *Store) inspectAll(e *effects, paths []string, nodes []lockNode, token string) ([]bool, error) {
	if !slices.ContainsFunc(nodes, func(n lockNode) bool { return n.shared && !n.inspected }) {
		return nil, nil
	}
	writers := make([]bool, len(nodes))
	err := forEach(len(nodes), func(i int) error {
		if n := &nodes[i]; n.shared && !n.inspected {
			var err error
			writers[i], err = s.inspect(e, paths[i], token, n)
			return err
		}
		return nil
	})
	return writers, err
}

// writerWaits records token as a writer waiting for the holders of the key
// of the lock node at lock to drain: its record lasts stores.WriterWindow from this call's
// start. The transaction also sets the parent, so that an AcquireShared
// that read the key before fails and reads it again. The record serves
// fairness, never safety: a failure to write it is ignored.
func (s *Store) writerWaits(e *effects, lock, token string) {
	p := paths{parent: parentOf(lock), lock: lock}
	path, data, start := p.writerPath(token), leaseData(stores.WriterWindow), time.Now()
	resp, err := s.multi(e, &zk.SetDataRequest{Path: p.parent, Version: -1},
		&zk.CreateRequest{Path: path, Data: data, Acl: s.acl, Flags: zk.FlagEphemeral})
	if errors.Is(err, zk.ErrNodeExists) {
		resp, err = s.multi(e, &zk.SetDataRequest{Path: p.parent, Version: -1},
			&zk.SetDataRequest{Path: path, Data: data, Version: -1})
	}
	if err == nil && resp[0].Stat != nil {
		s.ages.wrote(path, resp[0].Stat.Mzxid, token, s.conn.SessionID(), stores.WriterWindow, start)
	}
}

// dropWriter deletes token's writer record on the key of the lock node at
// path, when it has one as far as this Store knows (known, or this Store
// wrote it): best effort, since the record lapses on its own.
func (s *Store) dropWriter(e *effects, path, token string, known bool) {
	w := writerOf(path, token)
	if !known && s.ages.owned(w, token, s.conn.SessionID(), time.Now()) == ownUnknown {
		return
	}
	if err := e.note(s.conn.Delete(w, -1)); err == nil || errors.Is(err, zk.ErrNoNode) {
		s.ages.forget(w)
	}
}

// withdraw deletes token's writer records on the keys of the lock nodes at
// paths, in parallel: a Release by a token that does not hold them.
func (s *Store) withdraw(e *effects, paths []string, token string) error {
	return forEach(len(paths), func(i int) error {
		w := writerOf(paths[i], token)
		if err := e.note(s.conn.Delete(w, -1)); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return err
		}
		s.ages.forget(w)
		return nil
	})
}

// writerOf returns the path of token's writer record on the key of the
// lock node at lock.
func writerOf(lock, token string) string {
	return paths{parent: parentOf(lock), lock: lock}.writerPath(token)
}

// AcquireShared makes token a holder of key for at least ttl, as
// stores.SharedStore describes. A holder is an ephemeral node of its own,
// s-<token>, beside the key's lock node, which marks the key held shared
// while it has holders (see the package documentation). A free key costs
// one round trip; otherwise the Store reads the key's nodes and grants in
// a transaction that sets the parent at the version read, so that it
// fails, and the Store reads again, once another grant of either kind was
// made since: a limit is counted atomically. When other writers change the
// key under each attempt, it refuses with a Wait of 10ms.
//
// A refusal's Wait is the exclusive holder's remaining TTL, the longest
// window left among the waiting writers, or the soonest expiry among the
// holders of a full key. Errors are as Acquire's, and a negative limit is
// refused with stores.ErrInvalid.
func (s *Store) AcquireShared(ctx context.Context, key, token string, limit int, ttl time.Duration) (stores.Grant, error) {
	if err := args.CheckShared(ctx, key, limit); err != nil {
		return stores.Grant{}, err
	}
	if err := s.checkCall(ctx, []string{key}, token, "ttl", ttl, true); err != nil {
		return stores.Grant{}, err
	}
	return detached(ctx, s, func(e *effects) (stores.Grant, error) {
		return s.acquireShared(e, s.pathsOf(key), token, limit, ttl)
	}, func(g stores.Grant, err error) {
		if err == nil && !g.OK {
			return
		}
		s.retryUndo(key, 1, func() error { return s.releaseShared(nil, s.pathsOf(key), token, 0) })
	})
}

// acquireShared is AcquireShared on the key at p, noting its writes in e.
func (s *Store) acquireShared(e *effects, p paths, token string, limit int, ttl time.Duration) (stores.Grant, error) {
	mine, data := p.sharedPath(token), leaseData(ttl)
	var bare *lockNode // an expired grant found without a holder node
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		start := time.Now()
		k, found, err := s.readKey(e, p, token)
		if err != nil {
			return stores.Grant{}, fmt.Errorf("shared acquire: %w", err)
		}
		if !found {
			if err := s.makeParents(e, []string{p.lock}); err != nil {
				return stores.Grant{}, fmt.Errorf("shared acquire: %w", err)
			}
			continue
		}
		if len(k.stale) > 0 {
			if err := s.clean(e, p, &k); err != nil && !retryClean(err) {
				return stores.Grant{}, fmt.Errorf("shared acquire: %w", err)
			}
			continue
		}
		lock := k.lock
		if bare != nil && lock.exists && lock.czxid == bare.czxid && lock.version == bare.version {
			lock.noHolder = true // the same grant, still without a holder node
		}
		if lock.exists && !lock.shared && !(lock.readable && lock.left <= 0) {
			return stores.Grant{Wait: lock.wait()}, nil // held exclusively
		}
		own := -1
		for i, h := range k.holders {
			if h.token == token {
				own = i
			}
		}
		var ops []any
		switch {
		case own >= 0:
			// A retry: granted again, whatever the count and the writers.
			ops = []any{&zk.SetDataRequest{Path: p.parent, Version: -1},
				&zk.SetDataRequest{Path: mine, Data: data, Version: k.holders[own].version}}
		case k.writers > 0:
			return stores.Grant{Wait: min(k.writers, stores.WriterWindow)}, nil
		case limit > 0 && len(k.holders) >= limit:
			return stores.Grant{Wait: k.soonest()}, nil
		default:
			ops = []any{&zk.SetDataRequest{Path: p.parent, Version: k.pver}}
			if lock.exists && !lock.shared { // an expired exclusive grant: taken over
				ops = append(ops, &zk.DeleteRequest{Path: p.lock, Version: lock.version})
				if !lock.noHolder {
					ops = append(ops, &zk.DeleteRequest{Path: holderOf(p.lock, lock.token), Version: -1})
				}
			}
			if !lock.shared {
				ops = append(ops, &zk.CreateRequest{Path: p.lock, Data: markerData, Acl: s.acl, Flags: 0})
			}
			ops = append(ops, &zk.CreateRequest{Path: mine, Data: data, Acl: s.acl, Flags: zk.FlagEphemeral})
		}
		resp, err := s.multi(e, ops...)
		if err == nil {
			return s.sharedGranted(e, p, mine, token, ttl, start, resp[0].Stat)
		}
		if lock.exists && !lock.shared && !lock.noHolder && len(resp) > 2 && errors.Is(resp[2].Error, zk.ErrNoNode) {
			// The expired grant has no holder node (another version's):
			// taken over without deleting one, should it be read again.
			bare = &lock
		}
		if !transient(err) && !errors.Is(err, zk.ErrNoNode) {
			return stores.Grant{}, fmt.Errorf("shared acquire: %w", err)
		}
	}
	// Others keep changing the key faster than the reads: a refusal, tried
	// again by the caller as any other.
	return stores.Grant{Wait: contendedWait}, nil
}

// sharedGranted returns the Grant of a transaction that made token a holder
// at mine, whose first operation set the key's parent with reply stat, and
// records the place as this Store's write, by a call that started at start.
// The fence is the transaction's zxid times stores.FenceStride, as an
// exclusive grant's: both are transactions that set the parent.
func (s *Store) sharedGranted(e *effects, p paths, mine, token string, ttl time.Duration, start time.Time, stat *zk.Stat) (stores.Grant, error) {
	if stat == nil {
		return stores.Grant{}, errors.New("shared acquire: the transaction's reply has no stat")
	}
	zxid := stat.Mzxid
	s.ages.wrote(mine, zxid, token, s.conn.SessionID(), ttl, start)
	if zxid <= 0 || zxid > math.MaxInt64/stores.FenceStride {
		_ = s.releaseShared(e, p, token, 0)
		return stores.Grant{}, fmt.Errorf("%w: zxid %#x", ErrFenceRange, zxid)
	}
	return stores.Grant{OK: true, Fences: []int64{zxid * stores.FenceStride}}, nil
}

// ReleaseShared ends token's place among key's holders: it deletes its
// node, in a transaction that deletes and creates again the key's marker,
// which wakes the key's waiters; with keep positive it sets the place's TTL
// to keep instead, which wakes nobody. The last holder's release then
// deletes the marker, once no holder stands. It returns an error wrapping
// stores.ErrNotHeld when token does not hold key (its place expired, or its
// session ended); a place this Store made and knows has ended is answered
// so without the server.
func (s *Store) ReleaseShared(ctx context.Context, key, token string, keep time.Duration) error {
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	if err := s.checkCall(ctx, []string{key}, token, "keep", keep, true); err != nil {
		return err
	}
	p := s.pathsOf(key)
	if s.conn.State() != zk.StateHasSession && s.ages.owned(p.sharedPath(token), token, s.conn.SessionID(), time.Now()) == ownGone {
		return fmt.Errorf("%w: zkstore: shared release: the place's TTL has passed or its session ended", stores.ErrNotHeld)
	}
	_, err := detached(ctx, s, func(e *effects) (struct{}, error) {
		return struct{}{}, s.releaseShared(e, p, token, keep)
	}, nil)
	return err
}

// releaseShared is ReleaseShared on the key at p, noting its writes in e.
func (s *Store) releaseShared(e *effects, p paths, token string, keep time.Duration) error {
	mine := p.sharedPath(token)
	for attempt := 1; ; attempt++ {
		start := time.Now()
		version := int32(-1) // this Store's own live place: the node is token's
		if s.ages.owned(mine, token, s.conn.SessionID(), start) != ownLive {
			data, st, err := s.conn.Get(mine)
			if errors.Is(err, zk.ErrNoNode) {
				s.ages.forget(mine)
				return fmt.Errorf("%w: zkstore: shared release: the token holds no place", stores.ErrNotHeld)
			}
			if err != nil {
				return fmt.Errorf("shared release: %w", err)
			}
			if s.ages.remaining(mine, st.Mzxid, parseLeaseData(data), time.Now()) <= 0 {
				// Expired, not yet cleaned up: freed, as its expiry did.
				if _, err := s.multi(e, append([]any{&zk.DeleteRequest{Path: mine, Version: st.Version}}, s.signalOps(p)...)...); err == nil {
					s.ages.forget(mine)
				}
				return fmt.Errorf("%w: zkstore: shared release: the place's TTL has passed", stores.ErrNotHeld)
			}
			version = st.Version
		}
		if keep > 0 {
			st, err := s.conn.Set(mine, leaseData(keep), version)
			switch {
			case e.note(err) == nil:
				s.ages.wrote(mine, st.Mzxid, token, s.conn.SessionID(), keep, start)
				return nil
			case errors.Is(err, zk.ErrNoNode):
				s.ages.forget(mine)
				return fmt.Errorf("%w: zkstore: shared release: the token holds no place", stores.ErrNotHeld)
			case errors.Is(err, zk.ErrBadVersion) && attempt < maxAttempts:
				continue
			}
			return fmt.Errorf("shared release: %w", err)
		}
		ops := append([]any{&zk.DeleteRequest{Path: mine, Version: version}}, s.signalOps(p)...)
		resp, err := s.multi(e, ops...)
		if err == nil {
			s.ages.forget(mine)
			s.tidy(e, p, resp[len(resp)-1].Stat)
			return nil
		}
		switch {
		case len(resp) > 0 && errors.Is(resp[0].Error, zk.ErrNoNode):
			s.ages.forget(mine)
			return fmt.Errorf("%w: zkstore: shared release: the token holds no place", stores.ErrNotHeld)
		case len(resp) > 1 && errors.Is(resp[1].Error, zk.ErrNoNode):
			// No marker (another version's nodes): free the place alone.
			if err := e.note(s.conn.Delete(mine, version)); err != nil && !errors.Is(err, zk.ErrNoNode) {
				return fmt.Errorf("shared release: %w", err)
			}
			s.ages.forget(mine)
			return nil
		case errors.Is(err, zk.ErrBadVersion) && attempt < maxAttempts:
			continue
		}
		return fmt.Errorf("shared release: %w", err)
	}
}

// tidy deletes the shared marker of the key at p once it has no holder,
// after a release whose transaction's last reply is stat: the marker is
// the one that release made when no grant has set the parent since, and the
// deletion sets the parent at the version read, so that it fails should a
// grant be made in between. Best effort: a marker left behind is taken
// over by the next exclusive grant.
func (s *Store) tidy(e *effects, p paths, stat *zk.Stat) {
	if stat == nil {
		return
	}
	children, st, err := s.conn.Children(p.parent)
	if err != nil || st.Version == -1 || st.Mzxid > stat.Mzxid {
		return
	}
	for _, c := range children {
		if strings.HasPrefix(c, sharedPrefix) {
			return
		}
	}
	_, _ = s.multi(e, &zk.SetDataRequest{Path: p.parent, Version: st.Version},
		&zk.DeleteRequest{Path: p.lock, Version: -1})
}

// RefreshShared sets the TTL of token's place among key's holders to ttl
// while token holds it and its TTL has not passed; otherwise it changes
// nothing and returns an error wrapping stores.ErrNotHeld. A place this
// Store made and knows has ended is answered so without the server.
func (s *Store) RefreshShared(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	if err := s.checkCall(ctx, []string{key}, token, "ttl", ttl, true); err != nil {
		return err
	}
	mine := s.pathsOf(key).sharedPath(token)
	if s.ages.owned(mine, token, s.conn.SessionID(), time.Now()) == ownGone {
		return fmt.Errorf("%w: zkstore: shared refresh: the place's TTL has passed or its session ended", stores.ErrNotHeld)
	}
	_, err := detached(ctx, s, func(e *effects) (struct{}, error) {
		return struct{}{}, s.refreshShared(e, mine, token, ttl)
	}, nil)
	return err
}

// refreshShared is RefreshShared on the place at mine, noting its writes in e.
func (s *Store) refreshShared(e *effects, mine, token string, ttl time.Duration) error {
	notHeld := fmt.Errorf("%w: zkstore: shared refresh: the token holds no place", stores.ErrNotHeld)
	for attempt := 1; ; attempt++ {
		start := time.Now()
		version := int32(-1)
		if s.ages.owned(mine, token, s.conn.SessionID(), start) != ownLive {
			data, st, err := s.conn.Get(mine)
			if errors.Is(err, zk.ErrNoNode) {
				return notHeld
			}
			if err != nil {
				return fmt.Errorf("shared refresh: %w", err)
			}
			if s.ages.remaining(mine, st.Mzxid, parseLeaseData(data), time.Now()) <= 0 {
				return notHeld
			}
			version = st.Version
		}
		st, err := s.conn.Set(mine, leaseData(ttl), version)
		switch {
		case e.note(err) == nil:
			s.ages.wrote(mine, st.Mzxid, token, s.conn.SessionID(), ttl, start)
			return nil
		case errors.Is(err, zk.ErrNoNode):
			s.ages.forget(mine)
			return notHeld
		case errors.Is(err, zk.ErrBadVersion) && attempt < maxAttempts:
			continue
		}
		return fmt.Errorf("shared refresh: %w", err)
	}
}
