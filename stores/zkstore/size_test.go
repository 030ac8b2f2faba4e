package zkstore

import (
	"errors"
	"io"
	"log"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/reqlock/reqlock/internal/testservers"
)

// TestRequestLimit: multiBytes counts a transaction as the server does: one
// of maxRequestBytes is answered, one byte more and the server closes the
// connection.
func TestRequestLimit(t *testing.T) {
	for _, tc := range []struct {
		size   int
		closed bool
	}{{maxRequestBytes, false}, {maxRequestBytes + 1, true}} {
		conn, _, err := zk.Connect([]string{testservers.ZooKeeperAddr(t)}, 10*time.Second,
			zk.WithLogger(log.New(io.Discard, "", 0)))
		if err != nil {
			t.Fatal(err)
		}
		// A check and a set of nodes that do not exist: the server answers
		// NoNode, unless it refused the request.
		op := &zk.SetDataRequest{Path: "/reqlock-test-no-such-node", Version: -1}
		ops := []any{&zk.CheckVersionRequest{Path: "/reqlock-test-no-such-node", Version: -1}, op}
		op.Data = make([]byte, tc.size-multiBytes(ops))
		if got := multiBytes(ops); got != tc.size {
			t.Fatalf("multiBytes %d, want %d", got, tc.size)
		}
		_, err = conn.Multi(ops...)
		conn.Close()
		switch {
		case tc.closed && !errors.Is(err, zk.ErrConnectionClosed):
			t.Errorf("a transaction of %d bytes: %v, want the connection closed by the server", tc.size, err)
		case !tc.closed && !errors.Is(err, zk.ErrNoNode):
			t.Errorf("a transaction of %d bytes: %v, want an answer (ErrNoNode)", tc.size, err)
		}
	}
}

// TestKeyRequestBytes: keyRequestBytes bounds the transactions that grant
// a key, plain and fair, taking over an expired grant; maxKeyBytes is the
// longest key whose fair grant fits.
func TestKeyRequestBytes(t *testing.T) {
	s := &Store{root: "/reqlock", acl: zk.WorldACL(zk.PermAll)}
	s.aclBytes = aclBytes(s.acl)
	max := maxKeyBytes(s.root, s.acl)
	token := strings.Repeat("\x01", boundsTokenBytes) // every byte escaped in the queue node's name
	for _, k := range []int{1, 100, max, max + 1} {
		key := strings.Repeat("\xff", k)
		p := s.pathsOf(key)
		old := []lockNode{{exists: true, readable: true, token: "old", version: 3, guarded: true, pver: 7}}
		grant, _, _, err := s.grantOps([]string{p.lock}, old, token, lockData(time.Hour, token))
		if err != nil {
			t.Fatal(err)
		}
		queue := &zk.DeleteRequest{Path: p.queuePrefix(token) + "0000000001", Version: -1}
		fair := append([]any{queue}, grant...)
		plainWant := requestHeaderBytes + multiHeaderBytes + keyRequestBytes(len(p.parent), len(token), s.aclBytes, false)
		fairWant := requestHeaderBytes + multiHeaderBytes + keyRequestBytes(len(p.parent), len(token), s.aclBytes, true)
		if got := multiBytes(grant); got > plainWant || got < plainWant-ttlDigits {
			t.Errorf("key of %d bytes: the grant is %d bytes, keyRequestBytes says %d", k, got, plainWant)
		}
		if got := multiBytes(fair); got > fairWant || got < fairWant-ttlDigits {
			t.Errorf("key of %d bytes: the fair grant is %d bytes, keyRequestBytes says %d", k, got, fairWant)
		}
		if fits := fairWant <= maxRequestBytes; fits != (k <= max) {
			t.Errorf("key of %d bytes, MaxKeyBytes %d: a fair grant of up to %d bytes", k, max, fairWant)
		}
		if err := s.checkSize([]string{key}, token, true); (err == nil) != (k <= max) {
			t.Errorf("key of %d bytes, MaxKeyBytes %d: checkSize %v", k, max, err)
		}
	}
}

// TestLockData: TTLs at the ends of the range are written and read back
// rounded up to the millisecond, without overflow; data another version
// may write is read as held, not as an error.
func TestLockData(t *testing.T) {
	for _, d := range []time.Duration{1, time.Millisecond, 1500 * time.Microsecond, time.Hour} {
		ttl, token, ok := parseLockData(lockData(d, "tok"))
		if !ok || token != "tok" || ttl < d || ttl-d >= time.Millisecond {
			t.Errorf("lockData(%v) read back: %v, %q, %v", d, ttl, token, ok)
		}
	}
	// math.MaxInt64 rounds up past what a time.Duration holds, without
	// overflowing into a negative value: read back as held while it stands.
	if got := string(lockData(math.MaxInt64, "tok")); got != "9223372036855\ntok" {
		t.Errorf("lockData(math.MaxInt64) = %q", got)
	}
	if ttl, _, ok := parseLockData(lockData(math.MaxInt64, "tok")); ok || ttl != forever {
		t.Errorf("lockData(math.MaxInt64) read back: %v, %v; want held for as long as it stands", ttl, ok)
	}
	for _, data := range []string{"", "x", "-1\nt", "9223372036854775807\nt", "1.5\nt", "v2:1000:t"} {
		if ttl, _, ok := parseLockData([]byte(data)); ok || ttl != forever {
			t.Errorf("parseLockData(%q): %v, %v; want unreadable, held for as long as it stands", data, ttl, ok)
		}
	}
	if got := parseLeaseData([]byte("soon")); got != forever {
		t.Errorf("parseLeaseData(soon): %v, want forever", got)
	}
}
