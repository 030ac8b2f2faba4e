package redlockstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores/redlockstore"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// skippedCalls returns how many calls the Store did not send because their
// node was skipped, per node.
func skippedCalls(s *redlockstore.Store) []uint64 {
	var out []uint64
	for _, st := range s.NodeStats() {
		out = append(out, st.Skipped)
	}
	return out
}

// TestShortTimeoutsSkipNoNode: calls of a 10ms TTL (3ms each) that run out
// on slow but answering nodes, as they do on a loaded machine, skip no
// node: the next calls are all sent, and a longer TTL is granted once the
// nodes are quick again.
func TestShortTimeoutsSkipNoNode(t *testing.T) {
	s, proxies, _ := proxiedNodes(t, redlockstore.WithNodeTimeout(time.Second))
	warm(t, s)
	for _, p := range proxies {
		p.Delay(faultproxy.Both, 100*time.Millisecond)
	}
	for range 5 {
		k := []string{uniqueKey("shortttl")}
		g, err := s.Acquire(t.Context(), k, "t1", redlockstore.MinTTL)
		if err == nil && g.OK {
			t.Fatalf("granted through nodes 100ms slow with a 10ms TTL")
		}
		if errors.Is(err, redlockstore.ErrNodeSkipped) {
			t.Fatalf("a call of a 10ms TTL was not sent, its node skipped by the timeouts of such calls: %v", err)
		}
	}
	if n := skippedCalls(s); anyPositive(n) {
		t.Fatalf("calls not sent, per node: %v, want none", n)
	}
	for _, p := range proxies {
		p.Heal()
	}
	k := []string{uniqueKey("shortttl")}
	if g, err := s.Acquire(t.Context(), k, "t2", time.Second); err != nil || !g.OK {
		t.Fatalf("Acquire after the nodes are quick again: %+v, %v", g, err)
	}
	if n := skippedCalls(s); anyPositive(n) {
		t.Fatalf("calls not sent, per node: %v, want none", n)
	}
}

func anyPositive(n []uint64) bool {
	for _, v := range n {
		if v > 0 {
			return true
		}
	}
	return false
}
