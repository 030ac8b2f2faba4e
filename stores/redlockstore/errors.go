package redlockstore

import (
	"errors"
	"fmt"
	"strings"

	"github.com/reqlock/reqlock/stores"
)

// Errors of the package.
var (
	// ErrNoQuorum means too few nodes answered for a quorum: a store
	// failure, not a refusal. The error names each failed node.
	ErrNoQuorum = errors.New("redlockstore: too few nodes for a quorum")

	// ErrQuarantined is a node's failure while it stays out of quorums
	// after losing its data.
	ErrQuarantined = errors.New("redlockstore: node quarantined after losing its data")

	// ErrUnexpectedReply means a script answered in a shape this package
	// does not expect.
	ErrUnexpectedReply = errors.New("redlockstore: unexpected reply from Redis")

	// ErrDuplicateNode means two of the nodes given are one Redis server,
	// which would count as two votes. Errors that wrap it also wrap
	// stores.ErrInvalid.
	ErrDuplicateNode = errors.New("redlockstore: two nodes are the same Redis server")
)

// NodeError is the failure of one node in a call.
type NodeError struct {
	Node string // the node's address, or "node <index>"
	Err  error
}

// Error returns "node <name>: <error>".
func (e *NodeError) Error() string { return "node " + e.Node + ": " + e.Err.Error() }

// Unwrap returns the node's error.
func (e *NodeError) Unwrap() error { return e.Err }

// keysForMessage quotes keys for an error message, each shortened as
// stores.KeyForMessage does, and at most 4 of them.
func keysForMessage(keys []string) string {
	const maxShown = 4
	parts := make([]string, 0, min(len(keys), maxShown)+1)
	for i, k := range keys {
		if i == maxShown {
			parts = append(parts, fmt.Sprintf("and %d more", len(keys)-maxShown))
			break
		}
		parts = append(parts, stores.KeyForMessage(k))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// ErrClosed is the failure of a node call asked for after Close began: it
// is not sent.
var ErrClosed = errors.New("redlockstore: store closed")

// ErrNodeSkipped is the failure of a call that was not sent because its
// node is skipped: its recent calls timed out, and a background probe
// brings it back as soon as it answers.
var ErrNodeSkipped = errors.New("redlockstore: node skipped: its last calls timed out; it is probed in the background")
