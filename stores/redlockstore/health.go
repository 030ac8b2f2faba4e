package redlockstore

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/stores/redisstore"
)

// A node that keeps timing out (frozen, partitioned) is skipped: calls to
// it fail at once with ErrNodeSkipped, as if they had not reached it, while
// one probe at a time (a script call bounded by the node timeout, then a
// pause of probePause) checks it in the background. The first probe, or
// any call, that it answers brings it back. A node is skipped after
// skipAfter calls in a row timed out, or as soon as a call of it has had
// no answer for its stall time (16 of its mean round trips, at least
// minStall) while other nodes answered calls sent after it (when none was
// sent, they are pinged then): that call is then ended (its outcome unknown, so undone as a timeout is). So a frozen
// minority costs its calls a fraction of the node timeout, once. Only a
// call given at least skipFloor counts toward skipping: a short TTL's call
// (a third of the TTL) runs out on a loaded but healthy client.
const (
	// skipAfter is how many calls in a row must time out, each after its
	// full timeout, before the node is skipped.
	skipAfter = 2
	// probePause separates two probes of a skipped node.
	probePause = 50 * time.Millisecond
	// rttWeight is the weight of the last call in a node's mean round trip.
	rttWeight = 8 // 1/8
	// minPatience is the least a contended Acquire waits for the gate alone.
	minPatience = 2 * time.Millisecond
	// minStall is the shortest time without an answer that makes a node
	// stalled (see stallAfter).
	minStall = 200 * time.Millisecond
	// skipFloor is the least time a call must have been given for its
	// timeout to count toward skipping its node: a 10ms TTL's calls get
	// 3ms each, which a loaded process (or -race) overruns on a healthy
	// node, and such calls must not skip it for every caller.
	skipFloor = 50 * time.Millisecond
)

// skipped reports whether node i is skipped.
func (s *Store) skipped(i int) bool { return s.nodes[i].skipped.Load() }

// health records the outcome of a call of node i that took took and was
// given timeout. A success brings the node back; skipAfter timeouts in a
// row skip it and start its probe, counting only calls given at least
// skipFloor that used at least half of it (not one that its caller's
// deadline cut short: that may end a call to a healthy node early).
func (s *Store) health(i int, err error, took, timeout time.Duration) {
	n := s.nodes[i]
	if err == nil || (!isTimeout(err) && !errors.Is(err, errStalled)) {
		n.lastReply.Store(time.Now().UnixNano()) // it answered
	}
	if err == nil {
		n.timeouts.Store(0)
		if old := n.rtt.Load(); old == 0 {
			n.rtt.Store(int64(took))
		} else {
			n.rtt.Store(old + (int64(took)-old)/rttWeight)
		}
		n.skipped.Store(false)
		return
	}
	if timeout < skipFloor || took < timeout/2 || !isTimeout(err) {
		return
	}
	if n.timeouts.Add(1) >= skipAfter {
		s.skip(i)
	}
}

// skip skips node i and starts its probe, unless it is skipped already.
func (s *Store) skip(i int) {
	if n := s.nodes[i]; n.skipped.CompareAndSwap(false, true) {
		n.skips.Add(1)
		s.startProbe(i)
	}
}

// stallAfter is how long a call of node i may go unanswered before the
// node counts as stalled: 16 of its mean round trips, at least minStall and
// at most a quarter of the node timeout (when that is more than minStall):
// slow calls under load (a full connection pool) make the mean large, and
// a frozen node must be found well within the timeout all the same.
func (s *Store) stallAfter(i int) time.Duration {
	return max(minStall, min(s.nodeTimeout/4, 16*time.Duration(s.nodes[i].rtt.Load())))
}

// watchStall arms the stall check of a call of node i sent at start, which
// end ends (and answers), when its deadline leaves room for it; the
// returned function disarms it, waiting for a check that runs, and reports
// whether the check ended the call.
func (s *Store) watchStall(i int, start, deadline time.Time, end context.CancelFunc) (stop func() bool) {
	d := s.stallAfter(i)
	if deadline.Sub(start) <= d {
		return func() bool { return false }
	}
	var ended, done atomic.Bool
	var running sync.Mutex // held while the check runs
	t := time.AfterFunc(d, func() {
		running.Lock()
		defer running.Unlock()
		if done.Load() || s.nodes[i].lastReply.Load() >= start.UnixNano() {
			return
		}
		if !s.stalled(i, start, d) {
			// No other node answered lately: every caller may be waiting
			// for this one. Ask the others.
			s.pingOthers(i, d/2)
		}
		if !done.Load() && s.stalled(i, start, d) {
			ended.Store(true)
			s.skip(i)
			end()
		}
	})
	return func() bool {
		done.Store(true)
		t.Stop()
		running.Lock() // a check that runs ends first
		defer running.Unlock()
		return ended.Load()
	}
}

// pingOthers sends the probe script to every node but i that is not
// skipped, at once, and waits for them, each bounded by timeout (and
// Close): those that answer record it (see health).
func (s *Store) pingOthers(i int, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(s.stop, timeout)
	defer cancel()
	var wg sync.WaitGroup
	for j, n := range s.nodes {
		if j == i || s.skipped(j) {
			continue
		}
		wg.Go(func() {
			start := time.Now()
			if err := s.probeNode(ctx, n); err == nil {
				s.health(j, nil, time.Since(start), timeout)
			}
		})
	}
	wg.Wait()
}

// stalled reports whether node i has answered nothing since start while
// most of the other nodes that are not skipped answered after start+d/2:
// the client and the network work, the node does not (one slow node among
// many is not singled out when most are slow).
func (s *Store) stalled(i int, start time.Time, d time.Duration) bool {
	if s.nodes[i].lastReply.Load() >= start.UnixNano() {
		return false
	}
	since := start.Add(d / 2).UnixNano()
	others, answered := 0, 0
	for j, o := range s.nodes {
		if j == i || s.skipped(j) {
			continue
		}
		others++
		if o.lastReply.Load() > since {
			answered++
		}
	}
	return answered > 0 && 2*answered > others
}

// errStalled is the failure of a call ended because its node stalled.
var errStalled = errors.New("redlockstore: no answer while the other nodes answered: node skipped")

// startProbe probes skipped node i in the background until it answers (it
// is then no longer skipped) or the Store closes.
func (s *Store) startProbe(i int) {
	n := s.nodes[i]
	if !n.pinging.CompareAndSwap(false, true) {
		return
	}
	if !s.track(1) {
		n.pinging.Store(false) // Close began
		return
	}
	go func() {
		defer s.wg.Done()
		defer n.pinging.Store(false)
		pause := time.NewTimer(0)
		defer pause.Stop()
		for n.skipped.Load() {
			select {
			case <-s.stop.Done():
				return
			case <-pause.C:
			}
			ctx, cancel := context.WithTimeout(s.stop, s.nodeTimeout)
			start := time.Now()
			err := s.probeNode(ctx, n)
			cancel()
			if s.stop.Err() != nil {
				return
			}
			if err == nil {
				s.health(i, nil, time.Since(start), s.nodeTimeout)
				return
			}
			pause.Reset(probePause)
		}
	}()
}

// probeScript is the probe of a skipped node: a script, as the Store's
// calls are (a client that only runs scripts may be all it has).
var probeScript = redisstore.NewScript(`return 1`)

// probeNode sends the probe script to n.
func (s *Store) probeNode(ctx context.Context, n *node) error {
	_, err := n.driver.Eval(ctx, probeScript, nil, nil)
	return err
}

// patience is how long a contended Acquire waits for the gate alone before
// it asks the other nodes too: four times the gate's mean round trip plus
// minPatience, at most timeout.
func (s *Store) patience(gate int, timeout time.Duration) time.Duration {
	return min(timeout, 4*time.Duration(s.nodes[gate].rtt.Load())+minPatience)
}

// isTimeout reports whether err is a call that ran out of time: its
// deadline, a network timeout, or no connection free in time.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrPoolTimeout) ||
		(errors.As(err, &ne) && ne.Timeout())
}
