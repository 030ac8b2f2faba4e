package testredis

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a loopback TCP proxy in front of the test Redis that injects
// the faults a network causes: a reply lost after Redis ran the command, a
// reply that arrives late, a command that arrives late, and a connection
// that stalls. Commands always reach Redis unless the proxy is frozen. Arm a
// fault with the proxy idle between calls: it applies to the next reply, or
// command, of any connection.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu        sync.Mutex
	dropNext  int             // replies still to drop, closing their connection
	delayNext time.Duration   // delay of the next reply
	delayReq  *delayedRequest // the next command to hold back; nil: none
	thawed    chan struct{}   // closed while the proxy is not frozen
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

// delayedRequest is a command that DelayNextRequest holds back.
type delayedRequest struct {
	d        time.Duration
	answered chan struct{} // closed when Redis has answered it
}

// link is one client connection's pair of pumps.
type link struct {
	answered chan struct{} // closed at the next reply, under Proxy.mu; nil: none
}

// DelayNextRequest holds the next command of any connection back for d
// before it reaches Redis, on its connection alone, as a lost packet does
// until its retransmission: the client may give up on the call and close
// the connection meanwhile, and Redis still runs the command when it
// arrives, after commands that other connections sent later. The channel
// is closed once Redis has answered it: it has run.
func (p *Proxy) DelayNextRequest(d time.Duration) (answered <-chan struct{}) {
	r := &delayedRequest{d: d, answered: make(chan struct{})}
	p.mu.Lock()
	p.delayReq = r
	p.mu.Unlock()
	return r.answered
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
		l := new(link)
		go p.pump(server, client, false, l)
		go p.pump(client, server, true, l)
	}
}

// pump copies from src to dst, through the armed faults: of replies (from
// Redis) or of commands.
func (p *Proxy) pump(dst, src net.Conn, replies bool, l *link) {
	defer p.wg.Done()
	halfClose := false
	defer func() {
		if tc, ok := dst.(*net.TCPConn); ok && halfClose {
			// The client is gone, but Redis still runs what it sent, as
			// over a direct connection; the replies' pump closes both
			// once Redis has answered, or closed.
			_ = tc.CloseWrite()
			return
		}
		_ = dst.Close()
		_ = src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			thawed := p.thawed
			var drop bool
			var delay time.Duration
			var held *delayedRequest
			if replies {
				if p.dropNext > 0 {
					p.dropNext--
					drop = true
				}
				delay, p.delayNext = p.delayNext, 0
				if l.answered != nil {
					close(l.answered)
					l.answered = nil
				}
			} else if held = p.delayReq; held != nil {
				p.delayReq = nil
				delay = held.d
			}
			p.mu.Unlock()
			<-thawed
			if drop {
				return
			}
			if delay > 0 {
				time.Sleep(delay) // the injected lateness itself
			}
			if held != nil {
				// Its reply is the next on this connection: the client
				// waits for each reply before it sends the next command.
				p.mu.Lock()
				l.answered = held.answered
				p.mu.Unlock()
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			// EOF or a closed connection: close the other side too, but
			// once the client has gone, only after Redis has answered.
			halfClose = !replies
			return
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
