package pgstore

import "errors"

var (
	// ErrUnexpectedReply means the server answered in a shape this package
	// does not expect, such as a table of the same name made by another
	// program.
	ErrUnexpectedReply = errors.New("pgstore: unexpected reply from PostgreSQL")

	// ErrClosed means the Store was closed.
	ErrClosed = errors.New("pgstore: store closed")
)
