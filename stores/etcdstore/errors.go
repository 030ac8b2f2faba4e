package etcdstore

import (
	"errors"
	"fmt"
	"strings"

	"github.com/reqlock/reqlock/stores"
)

var (
	// ErrUnexpectedReply means etcd answered in a shape this package does
	// not expect.
	ErrUnexpectedReply = errors.New("etcdstore: unexpected reply from etcd")

	// ErrClosed means the Store was closed. It wraps stores.ErrUnreachable:
	// a call on a closed Store changes nothing.
	ErrClosed = fmt.Errorf("%w: etcdstore: store closed", stores.ErrUnreachable)

	// ErrOvertaken means that a Refresh, or a Release with keep, found
	// its keys set by a later call of the same token first, which keeps
	// them for less than this call asked: it changed nothing. It is a
	// store failure (the Locker then trusts no more than this call's TTL).
	ErrOvertaken = errors.New("etcdstore: a later call of the token set the keys first, for a shorter time; this one changed nothing")

	// ErrUndoPending is Close's error when etcd answered neither the undo
	// of some abandoned acquires nor the revocation of their leases in
	// time: each may still be granted, and hold its keys until its lease
	// expires.
	ErrUndoPending = errors.New("etcdstore: abandoned acquires may still be granted")
)

// keysForMessage names keys in an error message: the first few, each
// shortened by stores.KeyForMessage, and how many more there are.
func keysForMessage(keys []string) string {
	const shown = 3
	var b strings.Builder
	b.WriteByte('[')
	for i, k := range keys[:min(len(keys), shown)] {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(stores.KeyForMessage(k))
	}
	if len(keys) > shown {
		fmt.Fprintf(&b, " and %d more", len(keys)-shown)
	}
	b.WriteByte(']')
	return b.String()
}
