package rueidisstore

import (
	"fmt"

	"github.com/redis/rueidis"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redlockstore"
)

// NewRedlock returns a redlockstore Store over nodes, one rueidis client
// per independent Redis master, each pipelining the calls of concurrent
// lock operations onto its connections (best made as Open makes its
// client: ForceSingleClient, AlwaysPipelining, DisableCache).
// It is redlockstore.NewWithNodes with each node's Driver from NewDriver
// (so a client with ClientOption.ConnLifetime must come wrapped by
// ExpiringConns) and its address from the client, which ranks the nodes
// as redlockstore's Algorithm says: every process must reach each node by
// the same address. Each call is bounded by the node timeout through its
// context, which rueidis honours. The caller owns the clients and closes
// them after the Store. It returns an error wrapping stores.ErrInvalid when
// there are fewer than 3 nodes, a node is nil, two nodes have one
// address, or an option is invalid.
func NewRedlock(nodes []rueidis.Client, opts ...redlockstore.Option) (*redlockstore.Store, error) {
	ns := make([]redlockstore.Node, len(nodes))
	for i, c := range nodes {
		if e, ok := c.(expiring); c == nil || ok && e.Client == nil {
			return nil, fmt.Errorf("%w: rueidisstore: redlock node %d is nil", stores.ErrInvalid, i)
		}
		ns[i] = redlockstore.Node{Driver: NewDriver(c), Addr: addrOf(c)}
	}
	return redlockstore.NewWithNodes(ns, opts...)
}

// addrOf returns the address of a client of one Redis, "" for a client of
// several (a Cluster's), which then is ranked by its position.
func addrOf(c rueidis.Client) string {
	if e, ok := c.(expiring); ok {
		c = e.Client
	}
	nodes := c.Nodes()
	if len(nodes) != 1 {
		return ""
	}
	for addr := range nodes {
		return addr
	}
	return ""
}
