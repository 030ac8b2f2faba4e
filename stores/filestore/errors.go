package filestore

import "errors"

var (
	// ErrUnsupported means that a directory cannot hold the store's locks:
	// its file system is a network, cluster or FUSE one, or flock does not
	// exclude there. New and Open return it wrapped with
	// stores.ErrInvalid.
	ErrUnsupported = errors.New("filestore: flock cannot lock across this host's processes here")

	// ErrClosed is returned by the calls of a Store after Close.
	ErrClosed = errors.New("filestore: store closed")
)
