package redlockstore

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/testservers"
)

// TestSweepOfTokenWithTwoDebts: when the debts are at their bound, the
// sweep gives up the expired ones, also two of one token (one token, two
// key sets, as a test that reuses a token owes), and makes room.
func TestSweepOfTokenWithTwoDebts(t *testing.T) {
	var nodes []redis.Scripter
	for _, a := range testservers.RedisNodeAddrs(t)[:3] {
		c := redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		nodes = append(nodes, c)
	}
	s, err := New(nodes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	expired := time.Now().Add(-time.Second)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, keys := range [][]string{{"a"}, {"b"}} {
		d := &debt{keys: keys, token: "t", until: expired, calls: map[int]*owedCall{0: {}}, size: debtOverhead}
		s.debts["t"] = append(s.debts["t"], d)
		s.nodes[0].clean.owed++
		s.debtBytes += d.size
	}
	s.debtCount = maxDebts // the rest of the bound, as if held
	if !s.roomLocked(debtOverhead) {
		t.Fatal("no room after the sweep of two expired debts")
	}
	if len(s.debts) != 0 || s.nodes[0].clean.owed != 0 || s.nodes[0].clean.givenUp != 2 {
		t.Fatalf("after the sweep: %d tokens owed, node 0 owed %d, given up %d; want 0, 0 and 2",
			len(s.debts), s.nodes[0].clean.owed, s.nodes[0].clean.givenUp)
	}
}
