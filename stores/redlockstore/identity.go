package redlockstore

import (
	"context"
	"fmt"
	"time"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// runIDScript returns the server's run_id, which is the same for every
// address and database a client reaches the server by; "" without one.
var runIDScript = redisstore.NewScript(`return string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or ''`)

// identify learns the run_id of each node at first contact and fails, with
// an error wrapping stores.ErrInvalid and ErrDuplicateNode, once two nodes
// turn out to be one server (under two addresses New could not tell apart,
// such as a host name and its IP address, or through a proxy). The first
// Acquire of a Store waits for every node's answer, each bounded by
// timeout; a node that did not answer is asked again in the background at
// later Acquires until it does. A Store whose nodes are all known pays
// nothing. timeout is the node timeout, not a third of the TTL: the first
// call to a node may have to dial and greet it too.
func (s *Store) identify(ctx context.Context, timeout time.Duration) error {
	if err := s.duplicate.Load(); err != nil {
		return *err
	}
	if int(s.identified.Load()) == len(s.nodes) {
		return nil
	}
	// The first caller asks every node and waits; the others wait for it.
	first := false
	s.firstProbe.Do(func() { first = true; s.probe(ctx, timeout, true) })
	if !first && int(s.identified.Load()) < len(s.nodes) {
		s.probe(ctx, timeout, false)
	}
	if err := s.duplicate.Load(); err != nil {
		return *err
	}
	return nil
}

// probe asks the nodes not yet identified (and not being asked) for their
// run_id, and records the answers; with wait, it returns once every node
// answered or timeout passed, or ctx ended, otherwise at once.
func (s *Store) probe(ctx context.Context, timeout time.Duration, wait bool) {
	var indexes []int
	for i, n := range s.nodes {
		// In the background, a node is asked again only once its last
		// call succeeded: a dead node is not dialled for this.
		if n.runID.Load() == nil && (wait || !n.failing.Load()) && n.probing.CompareAndSwap(false, true) {
			indexes = append(indexes, i)
		}
	}
	if len(indexes) == 0 {
		return
	}
	done := make(chan struct{}, len(indexes))
	base := context.WithoutCancel(ctx)
	for _, i := range indexes {
		if !s.track(1) {
			s.nodes[i].probing.Store(false)
			done <- struct{}{} // Close began: not asked
			continue
		}
		go func() {
			defer s.wg.Done()
			defer func() { done <- struct{}{} }()
			n := s.nodes[i]
			defer n.probing.Store(false)
			cctx, cancel := context.WithTimeout(base, timeout)
			r, err := n.driver.Eval(cctx, runIDScript, nil, nil)
			cancel()
			id := string(r.Bulk)
			n.failing.Store(err != nil)
			if err != nil {
				return
			}
			if id == "" {
				// A server that does not tell its run_id: known, but
				// never found to be another node.
				id = fmt.Sprintf("node %d without run_id", i)
			}
			s.learn(i, id)
		}()
	}
	if !wait {
		return
	}
	for range indexes {
		select {
		case <-done:
		case <-ctx.Done():
			return // the caller's Acquire returns ctx's error
		}
	}
}

// learn records that node i is the server of run_id id, and the duplicate
// error when another node is the same server.
func (s *Store) learn(i int, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodes[i].runID.Load() != nil {
		return
	}
	s.nodes[i].runID.Store(&id)
	s.identified.Add(1)
	for j, o := range s.nodes {
		if j != i && o.runID.Load() != nil && *o.runID.Load() == id {
			a, b := min(i, j), max(i, j)
			err := fmt.Errorf("%w: %w: nodes %d (%s) and %d (%s) are one server (run_id %s): it would count as two votes",
				stores.ErrInvalid, ErrDuplicateNode, a, s.nodes[a].name, b, s.nodes[b].name, id)
			s.duplicate.CompareAndSwap(nil, &err)
		}
	}
}

// known reports whether node i's server identity is known: only then does
// its grant count as a vote (it could be a second address of another node).
func (s *Store) known(i int) bool { return s.nodes[i].runID.Load() != nil }
