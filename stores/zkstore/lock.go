package zkstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/reqlock/reqlock/stores"
)

// maxAttempts bounds the rounds of one call that lose a race to another
// writer of the same nodes (a version conflict) and read them again.
const maxAttempts = 10

// lockNode is what a read of one key's lock node found.
type lockNode struct {
	exists   bool
	readable bool   // its data parsed; otherwise it is held, by nobody's token, while it stands
	token    string // when readable
	version  int32  // the node's data version
	czxid    int64  // the transaction that created it, which names one grant
	left     time.Duration
	noHolder bool // it has no holder node (another version's grant): a takeover deletes none

	// guarded is set once pver names the node's grant for a takeover: the
	// data version of the key's parent node (see guard).
	guarded bool
	pver    int32
}

// free reports whether a grant to token may take the node: it is absent,
// expired, or token's own (a retried acquire).
func (n lockNode) free(token string) bool {
	return !n.exists || (n.readable && (n.token == token || n.left <= 0))
}

// heldBy reports whether the node holds token's grant, not expired.
func (n lockNode) heldBy(token string) bool {
	return n.exists && n.readable && n.token == token && n.left > 0
}

// wait is a refusal's Wait for the node: its holder's remaining TTL, or
// zero (unknown) for data this Store cannot read.
func (n lockNode) wait() time.Duration {
	if !n.readable {
		return 0
	}
	return n.left
}

// ownerChecked returns the operations that apply op to the lock node at
// lock only while it holds token's grant: a check of the grant's holder
// node first, in the same transaction (see holderName).
func ownerChecked(lock, token string, op any) []any {
	return []any{&zk.CheckVersionRequest{Path: holderOf(lock, token), Version: -1}, op}
}

// Acquire sets every key to token for ttl when none is held by another
// token, in one ZooKeeper transaction, and returns each key's fence: the
// transaction's zxid times stores.FenceStride. See stores.Store. A refusal's
// Wait is the holder's remaining TTL as this Store ages it, or zero when
// every attempt lost its race for a key found free to other callers.
// Errors wrap stores.ErrInvalid (bad arguments), stores.ErrUnreachable (no
// session: nothing sent), stores.ErrAbandoned (ctx ended in flight; undone),
// ErrClosed, ErrFenceRange, or a go-zookeeper error (outcome unknown).
func (s *Store) Acquire(ctx context.Context, keys []string, token string, ttl time.Duration) (stores.Grant, error) {
	if err := s.checkCall(ctx, keys, token, "ttl", ttl, false); err != nil {
		return stores.Grant{}, err
	}
	return call(ctx, s, func(e *effects) (stores.Grant, error) {
		return s.acquire(e, s.lockPaths(keys), token, ttl)
	}, func(g stores.Grant, err error) {
		if err == nil && !g.OK {
			return
		}
		s.undo(keys, token, false) // owner-checked: a no-op when nothing was granted
	})
}

// acquire is Acquire on the lock nodes at paths, noting its writes in e.
func (s *Store) acquire(e *effects, paths []string, token string, ttl time.Duration) (stores.Grant, error) {
	data := lockData(ttl, token)
	var nodes []lockNode // nil until read: first try to create every node
	now := time.Now()
	if slices.ContainsFunc(paths, func(p string) bool { return s.ages.live(p, now) }) {
		// A key seen held: read first, so a refusal costs one round trip.
		var err error
		if nodes, err = s.readLocks(paths); err != nil {
			return stores.Grant{}, fmt.Errorf("acquire: %w", err)
		}
	}
	for attempt := 1; ; attempt++ {
		start := time.Now()
		if err := s.guardAll(e, paths, nodes, token); err != nil {
			return stores.Grant{}, fmt.Errorf("acquire: %w", err)
		}
		for i, n := range nodes {
			if !n.free(token) {
				return stores.Grant{Held: i, Wait: n.wait()}, nil
			}
		}
		ops, stamps, holders, err := s.grantOps(paths, nodes, token, data)
		if err != nil {
			return stores.Grant{}, fmt.Errorf("acquire: %w", err)
		}
		resp, err := s.multi(e, ops...)
		if err == nil {
			return s.granted(e, paths, token, ttl, start, resp, stamps)
		}
		if k, ok := missingHolder(ops, resp, holders); ok && attempt < maxAttempts {
			// The grant read has no holder node: another version's grant.
			// It is still the key's grant (its guard, before the delete of
			// the holder node, passed): take it over without deleting one,
			// under the same guard, which fails should another grant be
			// made in between.
			nodes[k].noHolder = true
			continue
		}
		if attempt >= maxAttempts && errors.Is(err, zk.ErrNodeExists) {
			// Every attempt lost a race for a key that was free when read:
			// others keep taking it. A refusal, for how long unknown.
			return stores.Grant{Held: failedKey(ops, resp, paths)}, nil
		}
		if err = s.retryable(e, err, paths, attempt); err != nil {
			return stores.Grant{}, fmt.Errorf("acquire: %w", err)
		}
		if nodes, err = s.readLocks(paths); err != nil {
			return stores.Grant{}, fmt.Errorf("acquire: %w", err)
		}
	}
}

// grantOps returns the transaction that grants the lock nodes at paths,
// found as nodes (nil: assumed absent), to token with data. For each key,
// it first sets the parent's data: at the version that names the grant
// read (see guard) when the lock node is present, so that the transaction
// fails should another grant of the key have been made since; and in any
// case so that the next grant's guard changes, and because the reply
// carries the transaction's zxid, the fence, which a create in a
// transaction does not report. Then a lock node present is deleted at the
// version read, with its holder's node, and the lock node is created anew
// as an ephemeral node, with token's holder node. stamps holds the index of
// each key's SetData, and holders maps the index of each delete of a holder
// node to its key. Every node present must be guarded.
func (s *Store) grantOps(paths []string, nodes []lockNode, token string, data []byte) (ops []any, stamps []int, holders map[int]int, err error) {
	ops = make([]any, 0, 5*len(paths))
	stamps = make([]int, len(paths))
	for i, p := range paths {
		present := nodes != nil && nodes[i].exists
		guard := int32(-1) // absent: the create fails should the node exist
		if present {
			if !nodes[i].guarded {
				return nil, nil, nil, errors.New("internal error: a takeover of a grant not guarded")
			}
			guard = nodes[i].pver
		}
		stamps[i] = len(ops)
		ops = append(ops, &zk.SetDataRequest{Path: parentOf(p), Version: guard})
		if present {
			ops = append(ops, &zk.DeleteRequest{Path: p, Version: nodes[i].version})
			if !nodes[i].noHolder {
				if holders == nil {
					holders = make(map[int]int)
				}
				holders[len(ops)] = i
				ops = append(ops, &zk.DeleteRequest{Path: holderOf(p, nodes[i].token), Version: -1})
			}
		}
		ops = append(ops,
			&zk.CreateRequest{Path: p, Data: data, Acl: s.acl, Flags: zk.FlagEphemeral},
			&zk.CreateRequest{Path: holderOf(p, token), Acl: s.acl, Flags: zk.FlagEphemeral})
	}
	return ops, stamps, holders, nil
}

// guardAll guards (see guard) every node of nodes, read at paths, that a
// grant to token would take over, in parallel.
func (s *Store) guardAll(e *effects, paths []string, nodes []lockNode, token string) error {
	return forEach(len(nodes), func(i int) error {
		if n := &nodes[i]; n.exists && n.free(token) && !n.guarded {
			return s.guard(e, paths[i], n, nil)
		}
		return nil
	})
}

// guard names the grant n, read at the lock node at path, for a
// transaction that takes it over (grantOps): n.pver is the data version of
// the key's parent node, which every grant's transaction sets, so that a
// takeover that sets the parent at that version fails once another grant
// of the key has been made since n was read, and never deletes that grant.
// The lock node's own version cannot name a grant: it starts again at 0
// with each node, and two contenders that take over the same expired grant
// would each find the other's new node at the version they read.
//
// parent is the parent's stat as read alongside n, or nil. Its version
// names n's grant when the parent's last write is n's creation; otherwise
// (another grant in between, or a node made by another writer) the parent
// and then the node are read again, in that order, which may change n. A
// parent version of -1, which ZooKeeper takes for "any version" (versions
// wrap there after 2^32-1 writes), is moved on first.
func (s *Store) guard(e *effects, path string, n *lockNode, parent *zk.Stat) error {
	after := false // n was read after parent
	for {
		if parent == nil {
			ok, st, err := s.conn.Exists(parentOf(path))
			if err != nil {
				return err
			}
			if !ok {
				*n = lockNode{} // the node went with its parent
				return nil
			}
			parent, after = st, false
		}
		switch {
		case parent.Version == -1:
			if _, err := s.conn.Set(parentOf(path), nil, -1); e.note(err) != nil && !errors.Is(err, zk.ErrNoNode) {
				return err
			}
			parent = nil
			continue
		case after || parent.Mzxid == n.czxid:
			n.guarded, n.pver = true, parent.Version
			return nil
		}
		if err := s.readLock(path, n); err != nil {
			return err
		}
		if !n.exists {
			return nil
		}
		after = true
	}
}

// missingHolder reports whether the transaction ops failed, per resp, on the
// delete of a holder node that did not exist, and returns its key's index
// in holders.
func missingHolder(ops []any, resp []zk.MultiResponse, holders map[int]int) (int, bool) {
	for i, r := range resp {
		if r.Error == nil || i >= len(ops) {
			continue
		}
		k, ok := holders[i]
		return k, ok && errors.Is(r.Error, zk.ErrNoNode)
	}
	return 0, false
}

// failedKey returns the index in paths of the node of the first operation
// of ops that failed, per resp, or 0 when none is known.
func failedKey(ops []any, resp []zk.MultiResponse, paths []string) int {
	for i, r := range resp {
		if r.Error == nil || i >= len(ops) {
			continue
		}
		if c, ok := ops[i].(*zk.CreateRequest); ok {
			if k := slices.Index(paths, c.Path); k >= 0 {
				return k
			}
		}
		break
	}
	return 0
}

// granted returns the Grant of a transaction that created the lock nodes at
// paths, whose last operation's stat is stat, and records the grant as this
// Store's write, made by a call that started at start.
//
// Fences: every create of a lock node is a transaction of its own (a
// release deletes the node, a retry or takeover deletes and creates it), and
// ZooKeeper numbers transactions with zxids that grow strictly, ensemble-wide,
// and survive restarts in the transaction log. So the zxid of a grant's
// transaction, its nodes' czxid, is above the previous grant's by at least
// one, and times stores.FenceStride by at least the stride.
func (s *Store) granted(e *effects, paths []string, token string, ttl time.Duration, start time.Time, resp []zk.MultiResponse, stamps []int) (stores.Grant, error) {
	var zxid int64
	session := s.conn.SessionID() // the session that made the grant, or a later one
	for i, p := range paths {
		st := resp[stamps[i]].Stat
		if st == nil {
			return stores.Grant{}, errors.New("acquire: the transaction's reply has no stat")
		}
		zxid = st.Mzxid // the same for every key: one transaction
		s.ages.wrote(p, zxid, token, session, ttl, start)
	}
	if zxid <= 0 || zxid > math.MaxInt64/stores.FenceStride {
		_ = s.releasePaths(e, paths, token, 0, time.Now())
		return stores.Grant{}, fmt.Errorf("%w: zxid %#x", ErrFenceRange, zxid)
	}
	fences := make([]int64, len(paths))
	for i := range fences {
		fences[i] = zxid * stores.FenceStride
	}
	return stores.Grant{OK: true, Fences: fences}, nil
}

// retryable returns nil when err, the failure of attempt, is a conflict with
// another writer worth a new read and attempt, after creating the parents
// of the lock nodes at paths when one was missing (noted in e); and err
// otherwise.
func (s *Store) retryable(e *effects, err error, paths []string, attempt int) error {
	switch {
	case attempt >= maxAttempts:
		return fmt.Errorf("gave up after %d conflicting attempts: %w", attempt, err)
	case errors.Is(err, zk.ErrNoNode):
		return s.makeParents(e, paths)
	case errors.Is(err, zk.ErrNodeExists), errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNotEmpty):
		return nil
	}
	return err
}

// makeParents creates the parents of the nodes at paths, as container nodes
// (the server deletes them once empty), when missing.
func (s *Store) makeParents(e *effects, paths []string) error {
	return forEach(len(paths), func(i int) error {
		_, err := s.conn.CreateContainer(parentOf(paths[i]), nil, zk.FlagContainer, s.acl)
		if e.note(err) != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
		return nil
	})
}

// readLocks reads the lock nodes at paths, in parallel.
func (s *Store) readLocks(paths []string) ([]lockNode, error) {
	nodes := make([]lockNode, len(paths))
	err := forEach(len(paths), func(i int) error { return s.readLock(paths[i], &nodes[i]) })
	return nodes, err
}

// readLock reads the lock node at path into n.
func (s *Store) readLock(path string, n *lockNode) error {
	data, stat, err := s.conn.Get(path)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		*n = lockNode{}
		return nil
	case err != nil:
		return err
	}
	ttl, token, ok := parseLockData(data)
	*n = lockNode{exists: true, readable: ok, token: token, version: stat.Version, czxid: stat.Czxid,
		left: s.ages.remaining(path, stat.Mzxid, ttl, time.Now())}
	return nil
}

// forEach runs fn for 0..n-1, in parallel when n > 1 (go-zookeeper
// pipelines the requests on its connection), and returns the first error.
func forEach(n int, fn func(i int) error) error {
	if n == 1 {
		return fn(0)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = fn(i) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Release ends token's grant on every key that still holds it: it deletes
// the key's lock node, which wakes the key's waiters, or with keep positive
// sets the node's TTL to keep, which wakes nobody. A key whose TTL has
// passed counts as not held. It returns an error wrapping stores.ErrNotHeld
// when some key did not hold token, after ending the grant on the others.
// A kept key stays held until keep has passed or the Store's session ends,
// whichever comes first (see the package documentation). Without a session,
// a Release of keys whose grants this Store knows ended (their TTL passed,
// or their session is gone) returns stores.ErrNotHeld without the server.
func (s *Store) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	if err := s.checkCall(ctx, keys, token, "keep", keep, false); err != nil {
		return err
	}
	paths := s.lockPaths(keys)
	if s.conn.State() != zk.StateHasSession && s.allGone(paths, token) {
		return fmt.Errorf("%w: zkstore: release: the grant's TTL has passed or its session ended", stores.ErrNotHeld)
	}
	_, err := call(ctx, s, func(e *effects) (struct{}, error) {
		return struct{}{}, s.releasePaths(e, paths, token, keep, time.Now())
	}, nil)
	return err
}

// release is Release, without its checks.
func (s *Store) release(keys []string, token string, keep time.Duration) error {
	return s.releasePaths(nil, s.lockPaths(keys), token, keep, time.Now())
}

// allGone reports whether this Store's records show that token's grant of
// every lock node at paths has ended.
func (s *Store) allGone(paths []string, token string) bool {
	session, now := s.conn.SessionID(), time.Now()
	for _, p := range paths {
		if s.ages.owned(p, token, session, now) != ownGone {
			return false
		}
	}
	return true
}

// undo releases token's grant of keys, and with fair its queue place, after
// an abandoned call, trying again while the server cannot be reached: the
// grant must not stand for its whole TTL because a first try failed. It
// returns once the grant is released or found gone, or the Store closed, or
// the session of the call ended (the server deleted its ephemeral nodes),
// or on an error that trying again would not cure (logged: the grant then
// stands until its TTL passes or the session ends).
func (s *Store) undo(keys []string, token string, fair bool) {
	// The call's requests, all returned, went out in this session or an
	// earlier one: once it has ended, every node they made is gone.
	session := s.conn.SessionID()
	pause := rearmDelay
	for {
		if session == 0 || s.conn.SessionID() != session {
			return
		}
		err := s.release(keys, token, 0)
		if err == nil || errors.Is(err, stores.ErrNotHeld) {
			if !fair {
				return
			}
			if err = s.leaveFair(nil, keys[0], token); err == nil {
				return
			}
		}
		if !transient(err) {
			if s.isClosed() {
				return // the session is closed: the server deleted every node of it
			}
			s.log.Warn("zkstore: the clean-up of an abandoned call failed; what it made stands until its TTL passes or the session ends",
				slog.String("key", stores.KeyForMessage(keys[0])), slog.Int("keys", len(keys)), slog.Any("error", err))
			return
		}
		select {
		case <-s.done:
			return // the session is closed: the server deleted every node of it
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}

// transient reports whether err, the failure of a request, may not happen
// again: the connection was lost or no server could be reached, the
// session moved or ended, or other writers kept changing the nodes.
func transient(err error) bool {
	for _, t := range []error{zk.ErrConnectionClosed, zk.ErrNoServer, zk.ErrSessionExpired, zk.ErrSessionMoved,
		zk.ErrNodeExists, zk.ErrBadVersion, zk.ErrNotEmpty} {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// releasePaths is Release on the lock nodes at paths, by a call that
// started at start, noting its writes in e.
func (s *Store) releasePaths(e *effects, paths []string, token string, keep time.Duration, start time.Time) error {
	data := lockData(keep, token)
	end := func(p string, version int32) []any {
		if keep > 0 {
			return ownerChecked(p, token, &zk.SetDataRequest{Path: p, Data: data, Version: version})
		}
		return append(ownerChecked(p, token, &zk.DeleteRequest{Path: p, Version: version}),
			&zk.DeleteRequest{Path: holderOf(p, token), Version: -1})
	}
	// This Store's own grant in its current session: no read needed.
	if s.ownAll(paths, token, start) {
		var ops []any
		for _, p := range paths {
			ops = append(ops, end(p, -1)...)
		}
		resp, err := s.multi(e, ops...)
		if err == nil {
			s.released(paths, ops, resp, token, keep, start)
			return nil
		}
		if err = s.retryable(e, err, nil, 1); err != nil {
			return fmt.Errorf("release: %w", err)
		}
	}
	for attempt := 1; ; attempt++ {
		start = time.Now()
		nodes, err := s.readLocks(paths)
		if err != nil {
			return fmt.Errorf("release: %w", err)
		}
		var (
			ops     []any
			touched []string
			notHeld int
		)
		for i, n := range nodes {
			switch {
			case !n.exists || !n.readable || n.token != token:
				notHeld++
			case n.left <= 0: // expired, not yet taken over: cleaned up
				notHeld++
				ops = append(ops, ownerChecked(paths[i], token, &zk.DeleteRequest{Path: paths[i], Version: n.version})...)
				ops = append(ops, &zk.DeleteRequest{Path: holderOf(paths[i], token), Version: -1})
				touched = append(touched, paths[i])
			default:
				ops = append(ops, end(paths[i], n.version)...)
				touched = append(touched, paths[i])
			}
		}
		if len(ops) > 0 {
			resp, err := s.multi(e, ops...)
			if err != nil {
				if err = s.retryable(e, err, nil, attempt); err != nil {
					return fmt.Errorf("release: %w", err)
				}
				continue
			}
			s.released(touched, ops, resp, token, keep, start)
		}
		if notHeld > 0 {
			return fmt.Errorf("%w: zkstore: release: %d of %d keys not held by the token", stores.ErrNotHeld, notHeld, len(paths))
		}
		return nil
	}
}

// released records a release transaction ops of the lock nodes at paths,
// whose replies are resp: a kept node's new version is this Store's write,
// a deleted node is forgotten.
func (s *Store) released(paths []string, ops []any, resp []zk.MultiResponse, token string, keep time.Duration, start time.Time) {
	session := s.conn.SessionID()
	for i, op := range ops {
		switch op := op.(type) {
		case *zk.SetDataRequest:
			if st := resp[i].Stat; st != nil && keep > 0 {
				s.ages.wrote(op.Path, st.Mzxid, token, session, keep, start)
			}
		case *zk.DeleteRequest:
			if slices.Contains(paths, op.Path) {
				s.ages.forget(op.Path)
			}
		}
	}
}

// ownAll reports whether this Store granted the lock nodes at paths to
// token, or kept or refreshed them since, in its current session, and none
// has expired at now. The nodes may have changed since: the holder node
// checks the token on the server.
func (s *Store) ownAll(paths []string, token string, now time.Time) bool {
	session := s.conn.SessionID()
	for _, p := range paths {
		if s.ages.owned(p, token, session, now) != ownLive {
			return false
		}
	}
	return true
}

// Refresh sets the TTL of every key to ttl when each still holds token and
// its TTL has not passed; otherwise it changes nothing and returns an error
// wrapping stores.ErrNotHeld. A key whose holder's session has ended
// (expired, or closed) is gone, and so not held. A key whose grant this
// Store made and knows ended (its TTL passed, or its session is gone) is
// not held either: Refresh answers so without the server, even while it
// cannot reach one.
func (s *Store) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	if err := s.checkCall(ctx, keys, token, "ttl", ttl, false); err != nil {
		return err
	}
	paths := s.lockPaths(keys)
	session, now := s.conn.SessionID(), time.Now()
	for i, p := range paths {
		if s.ages.owned(p, token, session, now) == ownGone {
			return fmt.Errorf("%w: zkstore: refresh: key %d of %d: the grant's TTL has passed or its session ended",
				stores.ErrNotHeld, i+1, len(paths))
		}
	}
	_, err := call(ctx, s, func(e *effects) (struct{}, error) {
		return struct{}{}, s.refresh(e, paths, token, ttl)
	}, nil)
	return err
}

// refresh is Refresh on the lock nodes at paths, noting its writes in e.
func (s *Store) refresh(e *effects, paths []string, token string, ttl time.Duration) error {
	data := lockData(ttl, token)
	known := s.ownAll(paths, token, time.Now())
	versions := make([]int32, len(paths))
	for i := range versions {
		versions[i] = -1 // this Store's own grants: the holder nodes check them
	}
	for attempt := 1; ; attempt++ {
		start := time.Now()
		if !known {
			nodes, err := s.readLocks(paths)
			if err != nil {
				return fmt.Errorf("refresh: %w", err)
			}
			for i, n := range nodes {
				if !n.heldBy(token) {
					return fmt.Errorf("%w: zkstore: refresh: key %d of %d not held by the token", stores.ErrNotHeld, i+1, len(paths))
				}
				versions[i] = n.version
			}
		}
		var ops []any
		for i, p := range paths {
			ops = append(ops, ownerChecked(p, token, &zk.SetDataRequest{Path: p, Data: data, Version: versions[i]})...)
		}
		resp, err := s.multi(e, ops...)
		if err == nil {
			session := s.conn.SessionID()
			for i, p := range paths {
				if st := resp[2*i+1].Stat; st != nil {
					s.ages.wrote(p, st.Mzxid, token, session, ttl, start)
				}
			}
			return nil
		}
		if err = s.retryable(e, err, nil, attempt); err != nil {
			return fmt.Errorf("refresh: %w", err)
		}
		known = false
	}
}
