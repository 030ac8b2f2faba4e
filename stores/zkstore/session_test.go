package zkstore_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/zkstore"
)

// shrinkConn asks, in its connect request, for a session timeout of ms
// milliseconds: what a reconnection to a member of an ensemble with a lower
// maxSessionTimeout (or a server restarted with a larger tickTime)
// negotiates. The connect request is the first write on a connection: a
// 4-byte length, a 4-byte protocol version, an 8-byte zxid, the timeout.
type shrinkConn struct {
	net.Conn
	ms    uint32
	wrote bool
}

func (c *shrinkConn) Write(b []byte) (int, error) {
	if !c.wrote && len(b) >= 20 {
		c.wrote = true
		b = bytes.Clone(b)
		binary.BigEndian.PutUint32(b[16:20], c.ms)
	}
	return c.Conn.Write(b)
}

// logBuffer collects a logger's output; safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(l.b.String(), s)
}

// TestShortSessionOnReconnect (issue 18, from review): when a reconnection
// gets a session timeout below the Store's MaxTTL, the Store refuses TTLs
// above it (a store failure that changes nothing, wrapping ErrShortSession
// and ErrUnreachable, logged once), so that no grant's validity outlives
// the session should the Store then be cut off; keeps are still taken. The
// next connection asks for the configured timeout again and, granted it,
// takes every TTL up to MaxTTL. Before the fix, the Store kept granting
// TTLs of MaxTTL (6s) on a 2s session: a holder cut off right after lost
// its key to another Store 2.5s into its 6s validity; and once shortened,
// the timeout asked for never came back.
func TestShortSessionOnReconnect(t *testing.T) {
	var shrink atomic.Bool
	dial := func(network, addr string, timeout time.Duration) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, timeout)
		if err != nil || !shrink.Load() {
			return c, err
		}
		return &shrinkConn{Conn: c, ms: 2000}, nil
	}
	var logs logBuffer
	holder, p := proxiedStore(t, zkstore.WithSessionTimeout(6*time.Second), zkstore.WithDialer(dial),
		zkstore.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	next := sameRootStore(t, holder)
	ctx := t.Context()
	maxTTL, short := holder.Bounds().MaxTTL, 2*time.Second
	if maxTTL != 6*time.Second {
		t.Fatalf("MaxTTL %v, want 6s", maxTTL)
	}
	session := holder.SessionID()

	shrink.Store(true)
	p.Cut() // the Store reconnects, keeping its session, and is granted 2s
	pollUntil(t, 10*time.Second, "the short session is logged", func() bool {
		return logs.contains("below the store's MaxTTL") && logs.contains("granted=2s")
	})
	if holder.SessionID() != session {
		t.Fatal("the Store got a new session; the test needs its session kept across the reconnection")
	}
	if holder.Bounds().MaxTTL != maxTTL {
		t.Fatalf("Bounds().MaxTTL changed to %v: bounds are fixed for a Store's lifetime", holder.Bounds().MaxTTL)
	}
	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, zkstore.ErrShortSession) || !errors.Is(err, stores.ErrUnreachable) || !strings.Contains(err.Error(), "2s") {
			t.Errorf("%s with a TTL of MaxTTL on a 2s session: %v; want ErrShortSession and ErrUnreachable, naming 2s", what, err)
		}
	}
	keys := []string{"k"}
	refused("Acquire", second(holder.Acquire(ctx, keys, "t1", maxTTL)))
	refused("AcquireFair", second(holder.AcquireFair(ctx, "k", "f", maxTTL, time.Second)))
	if g, err := holder.Acquire(ctx, keys, "t1", short); err != nil || !g.OK {
		t.Fatalf("Acquire with a TTL of the session timeout granted: %+v, %v", g, err)
	}
	start := time.Now()
	refused("Refresh", holder.Refresh(ctx, keys, "t1", maxTTL))
	if err := holder.Refresh(ctx, keys, "t1", short); err != nil {
		t.Fatalf("Refresh with a TTL of the session timeout granted: %v", err)
	}
	// A keep is no validity: taken.
	if g, err := holder.Acquire(ctx, []string{"kept"}, "t9", short); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	if err := holder.Release(ctx, []string{"kept"}, "t9", maxTTL); err != nil {
		t.Fatalf("Release with a keep of MaxTTL: %v", err)
	}

	// The holder is cut off: its validity ends before the next holder is
	// granted the key.
	cutOff(p)
	pollUntil(t, 20*time.Second, "the next holder obtains the key", func() bool {
		g, err := next.Acquire(ctx, keys, "t2", time.Second)
		return err == nil && g.OK
	})
	if d := time.Since(start); d < short {
		t.Errorf("another Store was granted the key %v after the holder's renewal, within its TTL of %v", d, short)
	}

	// A server that grants the configured timeout again: every TTL up to
	// MaxTTL is taken again.
	shrink.Store(false)
	p.Heal()
	pollUntil(t, 20*time.Second, "the session timeout of MaxTTL is logged again", func() bool {
		return logs.contains("MaxTTL again")
	})
	if g, err := holder.Acquire(ctx, []string{"k2"}, "t3", maxTTL); err != nil || !g.OK {
		t.Fatalf("Acquire with a TTL of MaxTTL once granted 6s again: %+v, %v", g, err)
	}
}
