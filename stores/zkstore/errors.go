package zkstore

import "errors"

// Errors of the package, checkable with errors.Is.
var (
	// ErrClosed is returned by the calls made after Close.
	ErrClosed = errors.New("zkstore: store closed")

	// ErrFenceRange is returned by an Acquire whose transaction id times
	// stores.FenceStride does not fit an int64: the ensemble has gone
	// through more than 2^21 leader epochs. The grant is released.
	ErrFenceRange = errors.New("zkstore: fence out of the int64 range")

	// ErrShortSession marks the failure of a call whose TTL is longer than
	// the session timeout the server granted when the Store last
	// connected, below the Store's MaxTTL: a grant's validity would outlive
	// the session, and so its node, should the Store be cut off. Such
	// errors wrap stores.ErrUnreachable too: nothing was sent.
	ErrShortSession = errors.New("zkstore: the server granted a session timeout shorter than the TTL")

	// errNoSession marks a call made while the connection has no session.
	errNoSession = errors.New("zkstore: no ZooKeeper session")
)
