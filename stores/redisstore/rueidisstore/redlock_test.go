package rueidisstore

import (
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/internal/redlocktest"
	"github.com/reqlock/reqlock/stores/redlockstore"
)

// redlockClient runs redlockstore's suites on rueidis nodes: NewRedlock over
// a client per node as Open makes them (one Redis, every call pipelined, no
// client-side cache).
var redlockClient = redlocktest.Client{Name: "rueidis", Pipelined: true,
	New: func(t testing.TB, nodes []redis.Scripter, opts ...redlockstore.Option) (*redlockstore.Store, func(), error) {
		addrs := redlocktest.Addrs(nodes)
		clients := make([]rueidis.Client, 0, len(addrs))
		closeAll := func() {
			for _, c := range clients {
				c.Close()
			}
		}
		t.Cleanup(closeAll) // after the Store's Close, registered later
		for _, a := range addrs {
			// A node that refuses connections now still gets a client
			// (ForceSingleClient), which dials again at its first call.
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{a},
				ForceSingleClient: true, AlwaysPipelining: true, DisableCache: true})
			if c == nil {
				return nil, nil, err
			}
			clients = append(clients, c)
		}
		s, err := NewRedlock(clients, opts...)
		return s, closeAll, err
	}}

// TestRedlock runs every suite of redlockstore (conformance, faults,
// shared and limited grants, node failures) on rueidis nodes.
func TestRedlock(t *testing.T) { redlocktest.Run(t, redlockClient) }

// TestNewRedlockRejectsInvalid: too few nodes, a nil node, and one Redis
// given twice are refused with ErrInvalid.
func TestNewRedlockRejectsInvalid(t *testing.T) {
	addrs := testservers.RedisNodeAddrs(t)
	client := func(addr string) rueidis.Client {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	a, b, c := client(addrs[0]), client(addrs[1]), client(addrs[2])
	for name, nodes := range map[string][]rueidis.Client{
		"two nodes":   {a, b},
		"nil node":    {a, b, nil},
		"nil wrapped": {a, b, ExpiringConns(nil)},
		"duplicate":   {a, b, client(addrs[0])},
	} {
		if _, err := NewRedlock(nodes); !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", name, err)
		}
	}
	if _, err := NewRedlock([]rueidis.Client{a, b, client(addrs[0])}); !errors.Is(err, redlockstore.ErrDuplicateNode) {
		t.Errorf("one Redis twice: got %v, want ErrDuplicateNode", err)
	}
	s, err := NewRedlock([]rueidis.Client{a, b, c})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.NodeStats()[0].Node; got != addrs[0] {
		t.Errorf("node 0 is named %q, want its address %q", got, addrs[0])
	}
	_ = s.Close()
}
