package zkstore

import (
	"context"
	"errors"
	"fmt"
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
	exists  bool
	token   string
	version int32         // the node's data version
	pver    int32         // the parent's data version, read before the node; -1 unread
	left    time.Duration // of the holder's TTL, per ages; <= 0 once expired
}

// ref is a grant as an owner-checked write names it: the lock node's data
// version, and its parent's, which every grant of the key increments in its
// transaction. A lock node's version starts again at 0 when the node is
// deleted and created anew, so a version alone could match another grant's
// node; the parent's version never repeats while a lock node exists under
// it, so the pair names one grant, and its unchanged state.
type ref struct {
	version, pver int32
}

// checked returns the operations that apply op to the lock node at path
// only while it is still the grant r.
func checked(path string, r ref, op func(path string, version int32) any) []any {
	return []any{&zk.CheckVersionRequest{Path: parentOf(path), Version: r.pver}, op(path, r.version)}
}

// free reports whether a grant to token may take the node: it is absent,
// expired, or token's own (a retried acquire).
func (n lockNode) free(token string) bool {
	return !n.exists || n.token == token || n.left <= 0
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
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return stores.Grant{}, err
	}
	return call(ctx, s, func() (stores.Grant, error) {
		return s.acquire(s.lockPaths(keys), token, ttl)
	}, func(g stores.Grant, err error) {
		if err == nil && !g.OK {
			return
		}
		_ = s.release(keys, token, 0) // owner-checked: a no-op when nothing was granted
	})
}

// acquire is Acquire on the lock nodes at paths.
func (s *Store) acquire(paths []string, token string, ttl time.Duration) (stores.Grant, error) {
	data := lockData(ttl, token)
	var nodes []lockNode // nil until read: first try to create every node
	now := time.Now()
	if slices.ContainsFunc(paths, func(p string) bool { return s.ages.live(p, now) }) {
		// A key seen held: read first, so a refusal costs one round trip.
		var err error
		if nodes, err = s.peekLocks(paths); err != nil {
			return stores.Grant{}, fmt.Errorf("acquire: %w", err)
		}
	}
	for attempt := 1; ; attempt++ {
		start := time.Now()
		if nodes != nil {
			for i, n := range nodes {
				if !n.free(token) {
					return stores.Grant{Held: i, Wait: n.left}, nil
				}
			}
			if slices.ContainsFunc(nodes, func(n lockNode) bool { return n.exists && n.pver < 0 }) {
				// A takeover names the grant it replaces: read again, in
				// order, and decide anew.
				var err error
				if nodes, err = s.readLocks(paths); err != nil {
					return stores.Grant{}, fmt.Errorf("acquire: %w", err)
				}
				continue
			}
		}
		ops, stamps := s.grantOps(paths, nodes, data)
		resp, err := s.conn.Multi(ops...)
		if err == nil {
			return s.granted(paths, token, ttl, start, resp, stamps)
		}
		if attempt >= maxAttempts && errors.Is(err, zk.ErrNodeExists) {
			// Every attempt lost a race for a key that was free when read:
			// others keep taking it. A refusal, for how long unknown.
			return stores.Grant{Held: failedKey(ops, resp, paths)}, nil
		}
		if err = s.retryable(err, paths, attempt); err != nil {
			return stores.Grant{}, fmt.Errorf("acquire: %w", err)
		}
		if nodes, err = s.peekLocks(paths); err != nil {
			return stores.Grant{}, fmt.Errorf("acquire: %w", err)
		}
	}
}

// grantOps returns the transaction that grants the lock nodes at paths,
// found as nodes (nil: assumed absent), with data: each is deleted, when
// present, at the versions read, and created anew as an ephemeral node, and
// its parent's data version is incremented (see ref) by a SetData, whose
// reply carries the transaction's zxid, the fence, which a create in a
// transaction does not report. stamps holds the index of each key's
// SetData.
func (s *Store) grantOps(paths []string, nodes []lockNode, data []byte) (ops []any, stamps []int) {
	ops = make([]any, 0, 3*len(paths))
	stamps = make([]int, len(paths))
	for i, p := range paths {
		pver := int32(-1)
		if nodes != nil && nodes[i].exists {
			pver = nodes[i].pver
			ops = append(ops, &zk.DeleteRequest{Path: p, Version: nodes[i].version})
		}
		ops = append(ops, &zk.CreateRequest{Path: p, Data: data, Acl: s.acl, Flags: zk.FlagEphemeral})
		stamps[i] = len(ops)
		ops = append(ops, &zk.SetDataRequest{Path: parentOf(p), Version: pver})
	}
	return ops, stamps
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
func (s *Store) granted(paths []string, token string, ttl time.Duration, start time.Time, resp []zk.MultiResponse, stamps []int) (stores.Grant, error) {
	var zxid int64
	for i, p := range paths {
		st := resp[stamps[i]].Stat
		if st == nil {
			return stores.Grant{}, errors.New("acquire: the transaction's reply has no stat")
		}
		zxid = st.Mzxid // the same for every key: one transaction
		s.ages.wrote(p, zxid, 0, st.Version, token, ttl, start)
	}
	if zxid <= 0 || zxid > math.MaxInt64/stores.FenceStride {
		_ = s.releasePaths(paths, token, 0)
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
// of the lock nodes at paths when one was missing; and err otherwise.
func (s *Store) retryable(err error, paths []string, attempt int) error {
	switch {
	case attempt >= maxAttempts:
		return fmt.Errorf("gave up after %d conflicting attempts: %w", attempt, err)
	case errors.Is(err, zk.ErrNoNode):
		return s.makeParents(paths)
	case errors.Is(err, zk.ErrNodeExists), errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNotEmpty):
		return nil
	}
	return err
}

// makeParents creates the parents of the nodes at paths, as container nodes
// (the server deletes them once empty), when missing.
func (s *Store) makeParents(paths []string) error {
	return forEach(len(paths), func(i int) error {
		_, err := s.conn.CreateContainer(parentOf(paths[i]), nil, zk.FlagContainer, s.acl)
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
		return nil
	})
}

// readLocks reads the lock nodes at paths, in parallel: for each, first its
// parent's version, then the node (see ref).
func (s *Store) readLocks(paths []string) ([]lockNode, error) {
	nodes := make([]lockNode, len(paths))
	err := forEach(len(paths), func(i int) error {
		ok, pstat, err := s.conn.Exists(parentOf(paths[i]))
		if err != nil || !ok {
			return err
		}
		return s.readLock(paths[i], pstat.Version, &nodes[i])
	})
	return nodes, err
}

// peekLocks reads the lock nodes at paths, in parallel, without their
// parents' versions: enough to refuse, or to create a node found absent.
func (s *Store) peekLocks(paths []string) ([]lockNode, error) {
	nodes := make([]lockNode, len(paths))
	err := forEach(len(paths), func(i int) error { return s.readLock(paths[i], -1, &nodes[i]) })
	return nodes, err
}

// readLock reads the lock node at path, whose parent's version was pver
// before, into n.
func (s *Store) readLock(path string, pver int32, n *lockNode) error {
	data, stat, err := s.conn.Get(path)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return nil
	case err != nil:
		return err
	}
	ttl, token, err := parseLockData(data)
	if err != nil {
		return err
	}
	*n = lockNode{exists: true, token: token, version: stat.Version, pver: pver,
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
// whichever comes first (see the package documentation).
func (s *Store) Release(ctx context.Context, keys []string, token string, keep time.Duration) error {
	if err := args.CheckRelease(ctx, keys); err != nil {
		return err
	}
	_, err := call(ctx, s, func() (struct{}, error) {
		return struct{}{}, s.release(keys, token, keep)
	}, nil)
	return err
}

// release is Release.
func (s *Store) release(keys []string, token string, keep time.Duration) error {
	return s.releasePaths(s.lockPaths(keys), token, keep)
}

// releasePaths is Release on the lock nodes at paths.
func (s *Store) releasePaths(paths []string, token string, keep time.Duration) error {
	data := lockData(keep, token)
	op := func(p string, version int32) any {
		if keep > 0 {
			return &zk.SetDataRequest{Path: p, Data: data, Version: version}
		}
		return &zk.DeleteRequest{Path: p, Version: version}
	}
	del := func(p string, version int32) any { return &zk.DeleteRequest{Path: p, Version: version} }
	start := time.Now()
	// This Store's own grant, unchanged since: no read needed.
	if refs, ok := s.ownRefs(paths, token, start); ok {
		var ops []any
		for i, p := range paths {
			ops = append(ops, checked(p, refs[i], op)...)
		}
		resp, err := s.conn.Multi(ops...)
		if err == nil {
			s.released(paths, refs, resp, token, keep, start)
			return nil
		}
		if err = s.retryable(err, nil, 1); err != nil {
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
			refs    []ref
			notHeld int
		)
		for i, n := range nodes {
			r := ref{n.version, n.pver}
			switch {
			case !n.exists || n.token != token:
				notHeld++
			case n.left <= 0: // expired, not yet taken over: cleaned up
				notHeld++
				ops = append(ops, checked(paths[i], r, del)...)
				touched, refs = append(touched, paths[i]), append(refs, r)
			default:
				ops = append(ops, checked(paths[i], r, op)...)
				touched, refs = append(touched, paths[i]), append(refs, r)
			}
		}
		if len(ops) > 0 {
			resp, err := s.conn.Multi(ops...)
			if err != nil {
				if err = s.retryable(err, nil, attempt); err != nil {
					return fmt.Errorf("release: %w", err)
				}
				continue
			}
			s.released(touched, refs, resp, token, keep, start)
		}
		if notHeld > 0 {
			return fmt.Errorf("%w: zkstore: release: %d of %d keys not held by the token", stores.ErrNotHeld, notHeld, len(paths))
		}
		return nil
	}
}

// released records a release transaction on the grants refs of the nodes
// at paths, each a check of its parent and a delete or set, whose replies
// are resp.
func (s *Store) released(paths []string, refs []ref, resp []zk.MultiResponse, token string, keep time.Duration, start time.Time) {
	for i, p := range paths {
		if st := resp[2*i+1].Stat; st != nil && keep > 0 { // kept: a SetData
			s.ages.wrote(p, st.Mzxid, st.Version, refs[i].pver, token, keep, start)
		} else {
			s.ages.forget(p)
		}
	}
}

// ownRefs returns the grants of the lock nodes at paths when this Store
// granted them all to token, or kept or refreshed them since, and none has
// expired; the nodes may have changed since, which the refs then tell the
// server.
func (s *Store) ownRefs(paths []string, token string, now time.Time) ([]ref, bool) {
	refs := make([]ref, len(paths))
	for i, p := range paths {
		v, pv, ok := s.ages.owned(p, token, now)
		if !ok {
			return nil, false
		}
		refs[i] = ref{v, pv}
	}
	return refs, true
}

// Refresh sets the TTL of every key to ttl when each still holds token and
// its TTL has not passed; otherwise it changes nothing and returns an error
// wrapping stores.ErrNotHeld. A key whose holder's session has ended
// (expired, or closed) is gone, and so not held: a holder learns of a lost
// session from its next Refresh.
func (s *Store) Refresh(ctx context.Context, keys []string, token string, ttl time.Duration) error {
	if err := args.CheckAcquire(ctx, keys, ttl); err != nil {
		return err
	}
	_, err := call(ctx, s, func() (struct{}, error) {
		return struct{}{}, s.refresh(s.lockPaths(keys), token, ttl)
	}, nil)
	return err
}

// refresh is Refresh on the lock nodes at paths.
func (s *Store) refresh(paths []string, token string, ttl time.Duration) error {
	data := lockData(ttl, token)
	set := func(p string, version int32) any { return &zk.SetDataRequest{Path: p, Data: data, Version: version} }
	refs, known := s.ownRefs(paths, token, time.Now())
	for attempt := 1; ; attempt++ {
		start := time.Now()
		if !known {
			nodes, err := s.readLocks(paths)
			if err != nil {
				return fmt.Errorf("refresh: %w", err)
			}
			refs = make([]ref, len(paths))
			for i, n := range nodes {
				if !n.exists || n.token != token || n.left <= 0 {
					return fmt.Errorf("%w: zkstore: refresh: key %d of %d not held by the token", stores.ErrNotHeld, i+1, len(paths))
				}
				refs[i] = ref{n.version, n.pver}
			}
		}
		var ops []any
		for i, p := range paths {
			ops = append(ops, checked(p, refs[i], set)...)
		}
		resp, err := s.conn.Multi(ops...)
		if err == nil {
			for i, p := range paths {
				st := resp[2*i+1].Stat
				s.ages.wrote(p, st.Mzxid, st.Version, refs[i].pver, token, ttl, start)
			}
			return nil
		}
		if err = s.retryable(err, nil, attempt); err != nil {
			return fmt.Errorf("refresh: %w", err)
		}
		known = false
	}
}
