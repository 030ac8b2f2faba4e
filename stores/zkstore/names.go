package zkstore

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The znodes of one key live under its parent, root/<encoded key>, a
// container node that the server deletes some time after its last child is
// gone:
//
//	lock               the grant: ephemeral; data "<ttl ms>\n<token>"
//	q-<token>-<seq>    a fair waiter: ephemeral sequential; data "<lease ms>"
const (
	lockName    = "lock"
	queuePrefix = "q-"
	seqDigits   = 10 // the width of the suffix of a sequential znode
)

// encodeName turns s (a key or a token) into one valid znode name that
// decodeName turns back into s. Bytes outside printable ASCII, '/' and '%'
// become %XX; "." and ".." (names ZooKeeper refuses) become %2E and %2E%2E;
// the empty string becomes "%".
func encodeName(s string) string {
	switch s {
	case "":
		return "%"
	case ".", "..":
		return strings.Repeat("%2E", len(s))
	}
	clean := true
	for i := 0; i < len(s); i++ {
		if !plainByte(s[i]) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plainByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// plainByte reports whether c stands for itself in an encoded name.
func plainByte(c byte) bool {
	return c > 0x20 && c < 0x7F && c != '/' && c != '%'
}

// decodeName reverses encodeName.
func decodeName(name string) (string, error) {
	if name == "%" {
		return "", nil
	}
	if !strings.Contains(name, "%") {
		return name, nil
	}
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		if name[i] != '%' {
			b.WriteByte(name[i])
			continue
		}
		if i+2 >= len(name) {
			return "", fmt.Errorf("zkstore: bad escape at the end of %q", name)
		}
		v, err := strconv.ParseUint(name[i+1:i+3], 16, 8)
		if err != nil {
			return "", fmt.Errorf("zkstore: bad escape in %q", name)
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}

// paths are the znodes of one key.
type paths struct {
	parent string
	lock   string
}

// pathsOf returns the znodes of key.
func (s *Store) pathsOf(key string) paths {
	parent := s.root + "/" + encodeName(key)
	return paths{parent: parent, lock: parent + "/" + lockName}
}

// queuePrefix returns the path that the server completes with a sequence
// number to make token's queue node.
func (p paths) queuePrefix(token string) string {
	return p.parent + "/" + queuePrefix + encodeName(token) + "-"
}

// queueNode is a fair waiter's znode, as a child name parses.
type queueNode struct {
	name  string // the child's name
	token string
	seq   int64
}

// parseQueueNode parses a child name of the form q-<token>-<seq>, and
// reports false for other names.
func parseQueueNode(name string) (queueNode, bool) {
	if !strings.HasPrefix(name, queuePrefix) || len(name) < len(queuePrefix)+seqDigits+1 {
		return queueNode{}, false
	}
	dash := len(name) - seqDigits - 1
	if name[dash] != '-' {
		return queueNode{}, false
	}
	seq, err := strconv.ParseInt(name[dash+1:], 10, 64)
	if err != nil {
		return queueNode{}, false
	}
	token, err := decodeName(name[len(queuePrefix):dash])
	if err != nil {
		return queueNode{}, false
	}
	return queueNode{name: name, token: token, seq: seq}, true
}

// lockData is the data of a lock node: the TTL, which contenders need to
// age the grant, and the token, which owner checks compare.
func lockData(ttl time.Duration, token string) []byte {
	return []byte(strconv.FormatInt(ceilMillis(ttl), 10) + "\n" + token)
}

// ceilMillis returns d in whole milliseconds, rounded up, so that a stored
// duration is never shorter than the one asked for.
func ceilMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// parseLockData reverses lockData.
func parseLockData(data []byte) (ttl time.Duration, token string, err error) {
	ms, token, ok := strings.Cut(string(data), "\n")
	if !ok {
		return 0, "", fmt.Errorf("zkstore: lock node data %q is not <ttl ms>\\n<token>", data)
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n < 0 {
		return 0, "", fmt.Errorf("zkstore: lock node data %q has a bad TTL", data)
	}
	return time.Duration(n) * time.Millisecond, token, nil
}

// leaseData is the data of a queue node: the waiter's lease.
func leaseData(lease time.Duration) []byte {
	return []byte(strconv.FormatInt(ceilMillis(lease), 10))
}

// parseLeaseData reverses leaseData.
func parseLeaseData(data []byte) (time.Duration, error) {
	n, err := strconv.ParseInt(string(data), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("zkstore: queue node data %q is not a lease in ms", data)
	}
	return time.Duration(n) * time.Millisecond, nil
}

// lockPaths returns the lock nodes of keys.
func (s *Store) lockPaths(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = s.pathsOf(k).lock
	}
	return out
}

// parentOf returns the parent of the node at path.
func parentOf(path string) string {
	return path[:strings.LastIndexByte(path, '/')]
}
