package testredis

import (
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// Proxy is a faultproxy.Proxy in front of the test Redis, with names for the
// faults the Redis tests inject most: a reply lost after Redis ran the
// command, a late reply, and a Redis that stops answering. Every other fault
// of faultproxy (DelayNextRequest, Blackhole, Cut, Refuse...) is there too.
// Arm a fault with the proxy idle between calls: it applies to the next
// reply, or command, of any connection.
type Proxy struct {
	*faultproxy.Proxy
}

// NewProxy starts a proxy to Addr(tb). It stops, closing every
// connection, when the test ends.
func NewProxy(tb testing.TB) *Proxy {
	tb.Helper()
	return &Proxy{faultproxy.New(tb, Addr(tb))}
}

// DropNextReply makes the proxy swallow the next reply from Redis and close
// the connection it belongs to: the command ran, but the client sees EOF.
func (p *Proxy) DropNextReply() { p.DropNext(faultproxy.ToClient, 1) }

// DelayNextReply holds the next reply from Redis back for d.
func (p *Proxy) DelayNextReply(d time.Duration) { p.DelayNext(faultproxy.ToClient, d) }

// Freeze stops every byte in both directions until Thaw, as a Redis that
// stopped answering (SIGSTOP, a partition) would.
func (p *Proxy) Freeze() { p.Stall(faultproxy.Both) }

// Thaw lets the bytes that Freeze held back through, and ends every other
// fault (faultproxy.Proxy.Heal).
func (p *Proxy) Thaw() { p.Heal() }
