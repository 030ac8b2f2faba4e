package testredis

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a loopback TCP proxy in front of the test Redis that injects
// the faults a network causes: a reply lost after Redis ran the command, a
// reply that arrives late, and a connection that stalls. Commands always
// reach Redis unless the proxy is frozen; only what comes back is altered.
// Arm a fault with the proxy idle between calls: it applies to the next
// reply of any connection.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu        sync.Mutex
	dropNext  int           // replies still to drop, closing their connection
	delayNext time.Duration // delay of the next reply
	thawed    chan struct{} // closed while the proxy is not frozen
	conns     []net.Conn
	wg        sync.WaitGroup
}

// NewProxy starts a proxy to Addr(tb). It stops, closing every
// connection, when the test ends.
func NewProxy(tb testing.TB) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("testredis: listen: %v", err)
	}
	p := &Proxy{ln: ln, upstream: Addr(tb), thawed: make(chan struct{})}
	close(p.thawed)
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.close)
	return p
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// DropNextReply makes the proxy swallow the next reply from Redis and close
// the connection it belongs to: the command ran, but the client sees EOF.
func (p *Proxy) DropNextReply() {
	p.mu.Lock()
	p.dropNext++
	p.mu.Unlock()
}

// DelayNextReply holds the next reply from Redis back for d.
func (p *Proxy) DelayNextReply(d time.Duration) {
	p.mu.Lock()
	p.delayNext = d
	p.mu.Unlock()
}

// Freeze stops every byte in both directions until Thaw, as a Redis that
// stopped answering (SIGSTOP, a partition) would.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.thawed:
		p.thawed = make(chan struct{})
	default: // frozen already
	}
}

// Thaw lets the bytes that Freeze held back through.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.thawed:
	default:
		close(p.thawed)
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pump(server, client, false)
		go p.pump(client, server, true)
	}
}

// pump copies from src to dst; replies (from Redis) pass the armed faults.
func (p *Proxy) pump(dst, src net.Conn, replies bool) {
	defer p.wg.Done()
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			thawed := p.thawed
			var drop bool
			var delay time.Duration
			if replies {
				if p.dropNext > 0 {
					p.dropNext--
					drop = true
				}
				delay, p.delayNext = p.delayNext, 0
			}
			p.mu.Unlock()
			<-thawed
			if drop {
				return
			}
			if delay > 0 {
				time.Sleep(delay) // the injected lateness itself
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a closed connection: close the other side too
		}
	}
}

func (p *Proxy) close() {
	_ = p.ln.Close()
	p.Thaw()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
