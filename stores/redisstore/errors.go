package redisstore

import (
	"errors"
	"fmt"

	"github.com/reqlock/reqlock/stores"
)

// ErrUnexpectedReply means a script answered in a shape this package does not
// expect, such as a key name clash with data of another program.
var ErrUnexpectedReply = errors.New("redisstore: unexpected reply from Redis")

// ErrCrossSlot means the keys of one multi-key call (Acquire, Release,
// Refresh), with their fence keys, do not share one Redis Cluster hash
// slot, or one Ring shard, so no single script can lock them together. The
// error names two keys that differ and how to fix the key template.
//
// It is a mistake in the key template, not a failure of the store: retrying
// cannot help, and a route that runs unlocked when the store fails must not
// run unlocked because of it. So ErrCrossSlot wraps stores.ErrInvalid, and
// every error that wraps ErrCrossSlot, whether the Store found the keys apart
// before sending them or mapped Redis's CROSSSLOT reply, matches both.
var ErrCrossSlot = fmt.Errorf("%w: redisstore: the keys of one multi-key call are not in one Redis Cluster hash slot (or Ring shard)",
	stores.ErrInvalid)
