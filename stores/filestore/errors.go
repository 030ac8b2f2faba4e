package filestore

import (
	"errors"
	"strings"

	"github.com/reqlock/reqlock/stores"
)

var (
	// ErrUnsupported means that a directory cannot hold the store's locks:
	// its file system is a network, cluster or FUSE one, or flock does not
	// exclude there. New and Open return it wrapped with
	// stores.ErrInvalid.
	ErrUnsupported = errors.New("filestore: flock cannot lock across this host's processes here")

	// ErrClosed is returned by the calls of a Store after Close.
	ErrClosed = errors.New("filestore: store closed")
)

// keysForMessage lists keys for an error message, each shortened by
// stores.KeyForMessage.
func keysForMessage(keys []string) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(stores.KeyForMessage(k))
	}
	b.WriteByte(']')
	return b.String()
}
