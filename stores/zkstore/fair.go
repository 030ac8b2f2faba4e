package zkstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/reqlock/reqlock/stores"
)

// place is a fair waiter's queue node, as this Store made it.
type place struct {
	name    string        // the node's name under the key's parent
	renewed time.Time     // the start of the call that last set its lease
	lease   time.Duration // the lease it set
}

// due reports whether the lease of the place should be set again, to lease,
// at now: it was set for another lease, or a quarter of it has passed, which
// leaves three quarters for the next attempt to come.
func (p place) due(lease time.Duration, now time.Time) bool {
	return p.lease != lease || now.Sub(p.renewed) >= lease/4
}

// AcquireFair is one attempt of a fair waiter; see stores.FairStore. The
// queue of a key is its ephemeral sequential queue nodes, in the order of
// their sequence numbers, which the server assigns: a waiter joins at the
// tail by creating its node, and its node is deleted in the transaction
// that grants it the key, or by LeaveFair, or, once its lease has passed
// unrenewed, by the next attempt of another waiter, or by the server when
// the waiter's session ends. A call renews the caller's lease only when a
// quarter of it has passed, so most attempts read three nodes (the queue, the
// lock, the head of the queue) and write nothing.
func (s *Store) AcquireFair(ctx context.Context, key, token string, ttl, lease time.Duration) (stores.FairGrant, error) {
	if err := args.CheckAcquireFair(ctx, key, ttl, lease); err != nil {
		return stores.FairGrant{}, err
	}
	if err := s.checkFair(key, token, ttl, lease); err != nil {
		return stores.FairGrant{}, err
	}
	return detached(ctx, s, func(e *effects) (stores.FairGrant, error) {
		return s.acquireFair(e, key, token, ttl, lease)
	}, func(stores.FairGrant, error) {
		// The waiter left: neither its grant nor its place stays.
		s.undo([]string{key}, token, true)
	})
}

// queued is a queue node as an attempt read it.
type queued struct {
	path    string
	version int32
	left    time.Duration // of its lease, per ages
}

// acquireFair is AcquireFair, noting its writes in e.
func (s *Store) acquireFair(e *effects, key, token string, ttl, lease time.Duration) (stores.FairGrant, error) {
	p := s.pathsOf(key)
	id := waiterID{key, token}
	var bare *lockNode // a grant found without a holder node
	for attempt := 1; ; attempt++ {
		start := time.Now()
		queue, lock, parent, err := s.readQueue(p)
		if err != nil {
			return stores.FairGrant{}, fmt.Errorf("acquire fair: %w", err)
		}
		var ownWriter bool
		if lock.shared {
			if ownWriter, err = s.inspect(e, p.lock, token, &lock); err != nil {
				return stores.FairGrant{}, fmt.Errorf("acquire fair: %w", err)
			}
		}
		if lock.exists && lock.free(token) && !lock.guarded {
			// A grant this attempt may take over: named by its parent's
			// version (see guard), so that the takeover fails should
			// another grant be made meanwhile.
			if err := s.guard(e, p.lock, &lock, parent); err != nil {
				return stores.FairGrant{}, fmt.Errorf("acquire fair: %w", err)
			}
		}
		if bare != nil && lock.exists && lock.czxid == bare.czxid && lock.version == bare.version {
			lock.noHolder = true // the same grant, still without a holder node
		}
		mine := slices.IndexFunc(queue, func(q queueNode) bool { return q.token == token })
		retry := lock.exists && lock.token == token
		ahead := queue
		if mine >= 0 {
			ahead = queue[:mine]
		}
		head, count, drop, err := s.readAhead(p, ahead)
		if err != nil {
			return stores.FairGrant{}, fmt.Errorf("acquire fair: %w", err)
		}
		if fit := fitting(drop, maxRequestBytes-requestHeaderBytes-multiHeaderBytes-
			keyRequestBytes(len(p.parent), len(token), s.aclBytes, true)); fit < len(drop) {
			// Too many lapsed waiters ahead for one transaction with a
			// grant: drop as many as fit, alone, and look again.
			if _, err := s.multi(e, drop[:max(fit, 1)]...); err != nil {
				if err = s.retryable(e, err, nil, attempt); err != nil {
					return stores.FairGrant{}, fmt.Errorf("acquire fair: %w", err)
				}
			}
			continue
		}
		ops := drop
		if retry || (lock.free(token) && head == nil) {
			if mine >= 0 {
				ops = append(ops, &zk.DeleteRequest{Path: p.parent + "/" + queue[mine].name, Version: -1})
			}
			grant, stamps, holders, err := s.grantOps([]string{p.lock}, []lockNode{lock}, token, lockData(ttl, token))
			if err != nil {
				return stores.FairGrant{}, fmt.Errorf("acquire fair: %w", err)
			}
			for i := range stamps {
				stamps[i] += len(ops)
			}
			shifted := make(map[int]int, len(holders))
			for i, k := range holders {
				shifted[i+len(ops)] = k
			}
			ops = append(ops, grant...)
			resp, err := s.multi(e, ops...)
			if err != nil {
				if _, ok := missingHolder(ops, resp, shifted); ok && attempt < maxAttempts {
					// Another version's grant, without a holder node: the
					// next attempt reads it again and, when it is the same
					// node, takes it over without deleting one.
					bare = &lock
					continue
				}
				if err = s.retryable(e, err, []string{p.lock}, attempt); err != nil {
					return stores.FairGrant{}, fmt.Errorf("acquire fair: %w", err)
				}
				continue
			}
			if mine >= 0 {
				s.setPlace(id, nil)
			}
			g, err := s.granted(e, []string{p.lock}, token, ttl, start, resp, stamps)
			if err == nil {
				s.dropWriter(e, p.lock, token, ownWriter)
			}
			return stores.FairGrant{Grant: g}, err
		}
		if mine < 0 && lease > 0 {
			// Not queued, and the key is not to be had: join at the tail.
			// (A free key with nobody live in the queue was granted above,
			// as if the caller had joined and headed the queue at once.)
			if err := s.join(e, p, id, lease, start); err != nil {
				if err = s.retryable(e, err, []string{p.lock}, attempt); err != nil {
					return stores.FairGrant{}, fmt.Errorf("acquire fair: join: %w", err)
				}
			}
			continue // read the queue again, with the new node in it
		}
		var renew *place
		if mine >= 0 && lease > 0 {
			pl, ok := s.placeOf(id)
			if !ok || pl.name != queue[mine].name || pl.due(lease, start) {
				renew = &place{name: queue[mine].name, renewed: start, lease: lease}
				ops = append(ops, &zk.SetDataRequest{Path: p.parent + "/" + renew.name, Data: leaseData(lease), Version: -1})
			}
		}
		if len(ops) > 0 {
			if _, err := s.multi(e, ops...); err != nil {
				if err = s.retryable(e, err, nil, attempt); err != nil {
					return stores.FairGrant{}, fmt.Errorf("acquire fair: %w", err)
				}
				continue // a lapsed waiter came back, or the caller was dropped
			}
			if renew != nil {
				s.setPlace(id, renew)
			}
		}
		g := stores.FairGrant{Ahead: -1}
		if mine >= 0 {
			g.Ahead = count
		}
		if !lock.free(token) {
			g.Wait = lock.wait()
			if lock.shared {
				g.SharedHeld = true
				s.writerWaits(e, p.lock, token)
			}
		} else if head != nil {
			g.Wait = head.left
		}
		return g, nil
	}
}

// fitting returns how many of ops, from the first, fit in room bytes of a
// transaction.
func fitting(ops []any, room int) int {
	for i := range ops {
		if room -= multiBytes(ops[i:i+1]) - requestHeaderBytes - multiHeaderBytes; room < 0 {
			return i
		}
	}
	return len(ops)
}

// join queues the waiter id at the tail of the queue of the key at p, with
// lease, in a call that started at start, noting the write in e.
func (s *Store) join(e *effects, p paths, id waiterID, lease time.Duration, start time.Time) error {
	path, err := s.conn.Create(p.queuePrefix(id.token), leaseData(lease), zk.FlagEphemeralSequential, s.acl)
	if e.note(err) != nil {
		return err
	}
	s.setPlace(id, &place{name: path[len(p.parent)+1:], renewed: start, lease: lease})
	return nil
}

// readQueue reads the queue of the key at p, in sequence order, and its
// lock node, in parallel. parent is the stat of the key's parent node, nil
// when it is missing.
func (s *Store) readQueue(p paths) (queue []queueNode, lock lockNode, parent *zk.Stat, err error) {
	var children []string
	err = forEach(2, func(i int) error {
		if i == 1 {
			return s.readLock(p.lock, &lock)
		}
		var err error
		children, parent, err = s.conn.Children(p.parent)
		if errors.Is(err, zk.ErrNoNode) {
			parent = nil
			return nil
		}
		return err
	})
	if err != nil {
		return nil, lockNode{}, nil, err
	}
	return parseQueue(children), lock, parent, nil
}

// parseQueue returns the queue nodes among children, in sequence order.
func parseQueue(children []string) []queueNode {
	var queue []queueNode
	for _, c := range children {
		if q, ok := parseQueueNode(c); ok {
			queue = append(queue, q)
		}
	}
	slices.SortFunc(queue, func(a, b queueNode) int { return cmp.Compare(a.seq, b.seq) })
	return queue
}

// readAhead reads the queue nodes ahead, in order, until it finds one whose
// lease is live, the head, and returns it (nil when none is), how many
// nodes are ahead counting from it, and the deletes of the nodes before it
// whose lease has passed, at the version read. Most attempts read one node:
// a node further back is aged and dropped only once it would head the
// queue, so Ahead may count waiters that have lapsed behind a live head.
func (s *Store) readAhead(p paths, ahead []queueNode) (head *queued, count int, drop []any, err error) {
	for i, q := range ahead {
		path := p.parent + "/" + q.name
		data, stat, err := s.conn.Get(path)
		switch {
		case errors.Is(err, zk.ErrNoNode):
			continue
		case err != nil:
			return nil, 0, nil, err
		}
		left := s.ages.remaining(path, stat.Mzxid, parseLeaseData(data), time.Now())
		if left <= 0 {
			drop = append(drop, &zk.DeleteRequest{Path: path, Version: stat.Version})
			continue
		}
		return &queued{path: path, version: stat.Version, left: left}, len(ahead) - i, drop, nil
	}
	return nil, 0, drop, nil
}

// LeaveFair takes token out of key's queue by deleting its queue node; see
// stores.FairStore. The waiter behind it, watching that node, is signalled.
func (s *Store) LeaveFair(ctx context.Context, key, token string) error {
	if err := args.CheckRelease(ctx, []string{key}); err != nil {
		return err
	}
	if err := s.checkFair(key, token, 0, 0); err != nil {
		return err
	}
	_, err := detached(ctx, s, func(e *effects) (struct{}, error) {
		return struct{}{}, s.leaveFair(e, key, token)
	}, nil)
	return err
}

// leaveFair is LeaveFair, noting its writes in e.
func (s *Store) leaveFair(e *effects, key, token string) error {
	p := s.pathsOf(key)
	id := waiterID{key, token}
	var names []string
	if pl, ok := s.placeOf(id); ok {
		names = []string{pl.name}
	} else {
		children, _, err := s.conn.Children(p.parent)
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("leave fair: %w", err)
		}
		for _, q := range parseQueue(children) {
			if q.token == token {
				names = append(names, q.name)
			}
		}
	}
	for _, name := range names {
		if err := e.note(s.conn.Delete(p.parent+"/"+name, -1)); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return fmt.Errorf("leave fair: %w", err)
		}
	}
	s.setPlace(id, nil)
	return nil
}

// placeOf returns the queue place this Store made for the waiter id.
func (s *Store) placeOf(id waiterID) (place, bool) {
	s.joinedMu.Lock()
	defer s.joinedMu.Unlock()
	pl, ok := s.joined[id]
	return pl, ok
}

// setPlace records the queue place of the waiter id, or with pl nil that it
// has none, and has the waiter's release subscriptions watch anew.
func (s *Store) setPlace(id waiterID, pl *place) {
	s.joinedMu.Lock()
	old, had := s.joined[id]
	if pl == nil {
		delete(s.joined, id)
	} else {
		s.joined[id] = *pl
	}
	s.joinedMu.Unlock()
	if had != (pl != nil) || (pl != nil && old.name != pl.name) {
		s.notify.nudgeWaiter(id)
	}
}
