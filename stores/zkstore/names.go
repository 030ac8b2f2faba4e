package zkstore

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// The znodes of one key live under its parent, root/<encoded key>, a
// container node that the server deletes some time after its last child is
// gone:
//
//	lock               the grant: ephemeral; data "<ttl ms>\n<token>"
//	h-<token hash>     the grant's holder: ephemeral, empty; created and
//	                   deleted with lock, in the same transactions
//	q-<token>-<seq>    a fair waiter: ephemeral sequential; data "<lease ms>"
//
// and the shared holders and writer records of shared.go.
const (
	lockName     = "lock"
	holderPrefix = "h-"
	queuePrefix  = "q-"
	seqDigits    = 10 // the width of the suffix of a sequential znode
)

// holderName returns the name of the holder node of a grant to token: a
// hash of the token, so that its length does not depend on the token's. The
// holder node exists exactly while the lock node holds token, so an
// operation that checks it in a transaction checks the token on the server
// (ZooKeeper has no compare-data operation, and a node's versions start
// again at 0 when it is created anew, so versions alone cannot name a grant).
// Tokens are unique per acquisition; two that share 128 bits of SHA-256 are
// not a practical concern.
func holderName(token string) string {
	sum := sha256.Sum256([]byte(token))
	return holderPrefix + hex.EncodeToString(sum[:16])
}

// holderNameLen is the length of every holderName.
const holderNameLen = len(holderPrefix) + 32

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

// encodedLen returns len(encodeName(s)) without building it.
func encodedLen(s string) int {
	switch s {
	case "":
		return 1
	case ".", "..":
		return 3 * len(s)
	}
	n := len(s)
	for i := 0; i < len(s); i++ {
		if !plainByte(s[i]) {
			n += 2
		}
	}
	return n
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

// holder returns the path of the holder node of a grant of the key to
// token.
func (p paths) holder(token string) string { return p.parent + "/" + holderName(token) }

// holderOf returns the path of the holder node of a grant to token of the
// lock node at lock.
func holderOf(lock, token string) string { return parentOf(lock) + "/" + holderName(token) }

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
// age the grant, and the token, which readers compare.
func lockData(ttl time.Duration, token string) []byte {
	return []byte(strconv.FormatInt(ceilMillis(ttl), 10) + "\n" + token)
}

// ceilMillis returns d in whole milliseconds, rounded up, so that a stored
// duration is never shorter than the one asked for. It does not overflow.
func ceilMillis(d time.Duration) int64 {
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond > 0 {
		ms++
	}
	return ms
}

// forever is the life of a node whose TTL or lease this Store cannot read:
// it stands until its owner deletes it or its owner's session ends. (A
// century, not math.MaxInt64, so that adding it to a time cannot overflow.)
const forever = 100 * 365 * 24 * time.Hour

// parseMillis parses a duration in whole milliseconds as lockData and
// leaseData write it, and reports false for anything else, such as a
// negative value or one that does not fit a time.Duration.
func parseMillis(s string) (time.Duration, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/int64(time.Millisecond) {
		return 0, false
	}
	return time.Duration(n) * time.Millisecond, true
}

// parseLockData reverses lockData. Data it cannot read (written by another
// version, or overflowed by one) is not an error, which would fail every
// caller of the key: ok is false, and the node counts as held by a token
// nobody has, for as long as it stands.
func parseLockData(data []byte) (ttl time.Duration, token string, ok bool) {
	ms, token, found := strings.Cut(string(data), "\n")
	if !found {
		return forever, "", false
	}
	if ttl, ok = parseMillis(ms); !ok {
		return forever, "", false
	}
	return ttl, token, true
}

// leaseData is the data of a queue node: the waiter's lease.
func leaseData(lease time.Duration) []byte {
	return []byte(strconv.FormatInt(ceilMillis(lease), 10))
}

// parseLeaseData reverses leaseData. A lease it cannot read counts as one
// that never lapses: the waiter leaves the queue when its owner deletes its
// node or its session ends.
func parseLeaseData(data []byte) time.Duration {
	if lease, ok := parseMillis(string(data)); ok {
		return lease
	}
	return forever
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
