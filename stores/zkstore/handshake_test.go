package zkstore_test

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
	"github.com/reqlock/reqlock/stores/zkstore"
)

// TestUnansweredHandshakeIsLeft: a server that takes a new connection and
// never answers its connect request (as a ZooKeeper still starting did,
// failing to close it) holds the Store's session back for two thirds of
// the session timeout, not ten times that (go-zookeeper's own wait, 20s
// here): the Store connects again, and its calls succeed.
func TestUnansweredHandshakeIsLeft(t *testing.T) {
	const session = 3 * time.Second
	s, p := proxiedStore(t, zkstore.WithSessionTimeout(session))
	ctx := t.Context()
	call := func(key string) error {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := s.Acquire(cctx, []string{key}, "t", time.Second)
		return err
	}
	if err := call("warm"); err != nil {
		t.Fatal(err)
	}
	// A connect request: its length (44, or 45 with the read-only flag)
	// and protocol version 0, where another request has its xid.
	p.DelayWhen(faultproxy.ToServer, func(chunk []byte) bool {
		if len(chunk) < 8 {
			return false
		}
		n := binary.BigEndian.Uint32(chunk)
		return (n == 44 || n == 45) && binary.BigEndian.Uint32(chunk[4:]) == 0
	}, time.Minute)
	p.Cut()
	start := time.Now()
	pollUntil(t, 4*session, "a call with a session again", func() bool { return call("k") == nil })
	if p.Armed() != 0 {
		t.Fatal("no connect request was held back: the test did not test")
	}
	t.Logf("calls succeeded again %v after the cut", time.Since(start).Round(time.Millisecond))
}
