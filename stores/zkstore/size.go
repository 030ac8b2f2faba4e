package zkstore

import (
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"

	"github.com/reqlock/reqlock/stores"
)

// ZooKeeper takes a request of at most jute.maxbuffer bytes (its length
// prefix aside; default 0xfffff, one byte under 1 MiB) and closes the
// connection of a larger one, failing every call in flight on it, whatever
// their keys. A Store therefore refuses, before sending anything, a call
// whose largest request would exceed it: a key appears, escaped, in the
// path of up to six operations of one transaction (a fair grant that takes
// over an expired grant deletes the waiter's queue node, the lock node and
// its holder node, creates both anew and sets the parent), and a call on
// several keys puts all of them in one transaction.
const maxRequestBytes = 0xfffff

// boundsTokenBytes is the longest token for which Bounds.MaxKeyBytes holds
// with any key. reqlock's Locker uses 22-byte tokens; a call with a longer
// token and a key near the limit may be refused as too large.
const boundsTokenBytes = 64

// errTooLarge marks a call refused because a request it would send exceeds
// maxRequestBytes.
var errTooLarge = errors.New("zkstore: request larger than ZooKeeper takes (jute.maxbuffer, 1 MiB)")

// The sizes of the parts of a request, in the jute encoding of ZooKeeper's
// protocol: a string or a byte buffer is a 4-byte length and its bytes;
// each operation of a transaction follows a 9-byte header (type, done,
// error), and a 9-byte header ends the transaction; a request starts with
// an 8-byte header (xid, opcode).
const (
	requestHeaderBytes = 8
	multiHeaderBytes   = 9
	lenBytes           = 4 // of a string or a buffer, and of an int32
	versionBytes       = 4
	flagsBytes         = 4
	ttlDigits          = 20 // of the longest int64 a lock node's data starts with
)

func deleteBytes(pathLen int) int { return multiHeaderBytes + lenBytes + pathLen + versionBytes }
func checkBytes(pathLen int) int  { return multiHeaderBytes + lenBytes + pathLen + versionBytes }
func setDataBytes(pathLen, dataLen int) int {
	return multiHeaderBytes + lenBytes + pathLen + lenBytes + dataLen + versionBytes
}
func createBytes(pathLen, dataLen, aclBytes int) int {
	return multiHeaderBytes + lenBytes + pathLen + lenBytes + dataLen + aclBytes + flagsBytes
}

// aclBytes returns the encoded size of acl.
func aclBytes(acl []zk.ACL) int {
	n := lenBytes
	for _, a := range acl {
		n += 4 + lenBytes + len(a.Scheme) + lenBytes + len(a.ID)
	}
	return n
}

// multiBytes returns the size of the transaction of ops, as go-zookeeper
// sends it (its length prefix aside).
func multiBytes(ops []any) int {
	n := requestHeaderBytes + multiHeaderBytes
	for _, op := range ops {
		switch op := op.(type) {
		case *zk.CreateRequest:
			n += createBytes(len(op.Path), len(op.Data), aclBytes(op.Acl))
		case *zk.DeleteRequest:
			n += deleteBytes(len(op.Path))
		case *zk.SetDataRequest:
			n += setDataBytes(len(op.Path), len(op.Data))
		case *zk.CheckVersionRequest:
			n += checkBytes(len(op.Path))
		}
	}
	return n
}

// keyRequestBytes bounds what one key, whose parent node's path is
// parentLen bytes long, adds to the largest transaction of a call with
// token: a grant taking over an expired grant, which deletes the lock node
// and the holder node, creates both anew and sets the parent (Release and
// Refresh send less). With fair, it adds the delete of token's queue node
// of a fair grant.
func keyRequestBytes(parentLen, tokenLen, acl int, fair bool) int {
	lock := parentLen + 1 + len(lockName)
	holder := parentLen + 1 + holderNameLen
	n := deleteBytes(lock) + deleteBytes(holder) +
		createBytes(lock, ttlDigits+1+tokenLen, acl) + createBytes(holder, 0, acl) +
		setDataBytes(parentLen, 0)
	if fair {
		n += deleteBytes(parentLen + 1 + len(queuePrefix) + 3*tokenLen + 1 + seqDigits)
	}
	return n
}

// maxKeyBytes returns the longest key a Store with the root and acl takes:
// one whose every byte is escaped (three bytes in its node name), in the
// largest request of a fair grant with a token of boundsTokenBytes.
func maxKeyBytes(root string, acl []zk.ACL) int {
	fixed := requestHeaderBytes + multiHeaderBytes + keyRequestBytes(len(root)+1, boundsTokenBytes, aclBytes(acl), true)
	perByte := keyRequestBytes(len(root)+1+3, boundsTokenBytes, aclBytes(acl), true) -
		keyRequestBytes(len(root)+1, boundsTokenBytes, aclBytes(acl), true) // 3 bytes of path per key byte, in each path
	return (maxRequestBytes - fixed) / perByte
}

// checkSize returns an error wrapping stores.ErrInvalid when the largest
// request of a call on keys with token would exceed maxRequestBytes.
func (s *Store) checkSize(keys []string, token string, fair bool) error {
	n := requestHeaderBytes + multiHeaderBytes
	for _, k := range keys {
		n += keyRequestBytes(len(s.root)+1+encodedLen(k), len(token), s.aclBytes, fair)
	}
	if n > maxRequestBytes {
		return fmt.Errorf("%w: %w: %d keys of %d bytes in all, with a token of %d bytes, make a request of up to %d bytes",
			stores.ErrInvalid, errTooLarge, len(keys), keysLen(keys), len(token), n)
	}
	return nil
}

// keysLen returns the total length of keys.
func keysLen(keys []string) int {
	n := 0
	for _, k := range keys {
		n += len(k)
	}
	return n
}

// multi sends ops as one transaction, noting it in e, unless it exceeds
// maxRequestBytes: then it returns an error wrapping stores.ErrInvalid and
// sends nothing. (Calls check their keys beforehand, so this is a guard
// against data the checks did not foresee, such as a long token of another
// version's grant.)
func (s *Store) multi(e *effects, ops ...any) ([]zk.MultiResponse, error) {
	if n := multiBytes(ops); n > maxRequestBytes {
		return nil, fmt.Errorf("%w: %w: a transaction of %d bytes", stores.ErrInvalid, errTooLarge, n)
	}
	resp, err := s.conn.Multi(ops...)
	return resp, e.note(err)
}
