package mysqlstore

import (
	"bytes"
	"database/sql"
	"errors"
	"net"
	"sync"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/reqlock/reqlock/internal/testservers"
)

// proxy forwards TCP connections to the test MariaDB on loopback, and lets a
// test stall them (as a server or network that stops answering), cut them
// (as a lost connection) or cut one when the client sends a COMMIT (a
// COMMIT whose outcome the client cannot know).
type proxy struct {
	t      testing.TB
	ln     net.Listener
	target string

	mu       sync.Mutex
	resumed  chan struct{} // nil while not paused; closed by resume
	conns    map[net.Conn]struct{}
	onCommit commitAction
	closed   bool
	wg       sync.WaitGroup
}

// commitAction is what the proxy does with a client's COMMIT.
type commitAction int

const (
	commitPass          commitAction = iota // forward it
	commitDropAndCut                        // cut the connection without forwarding it
	commitForwardAndCut                     // forward it, then cut the connection before the reply
)

// newProxy starts a proxy to the test MariaDB, stopped when the test ends.
func newProxy(t testing.TB) *proxy {
	t.Helper()
	cfg, err := mysql.ParseDSN(testservers.MySQLDSN(t))
	if err != nil {
		t.Fatalf("ParseDSN: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	p := &proxy{t: t, ln: ln, target: cfg.Addr, conns: make(map[net.Conn]struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// db returns a *sql.DB that reaches the server through the proxy.
func (p *proxy) db(t testing.TB) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(testservers.MySQLDSN(t))
	if err != nil {
		t.Fatalf("ParseDSN: %v", err)
	}
	cfg.Addr = p.ln.Addr().String()
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatalf("NewConnector: %v", err)
	}
	db := sql.OpenDB(c)
	db.SetMaxIdleConns(maxIdleConns)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func (p *proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			return
		}
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.forward(client, server, true) })
		p.wg.Go(func() { p.forward(server, client, false) })
	}
}

// forward copies src to dst, holding each chunk while the proxy is paused.
func (p *proxy) forward(src, dst net.Conn, fromClient bool) {
	defer func() {
		_ = src.Close()
		_ = dst.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.waitResumed()
			action := commitPass
			if fromClient && isCommit(buf[:n]) {
				p.mu.Lock()
				action = p.onCommit
				p.mu.Unlock()
			}
			if action == commitDropAndCut {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if action == commitForwardAndCut {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// isCommit reports whether chunk is a COM_QUERY packet of COMMIT.
func isCommit(chunk []byte) bool {
	return len(chunk) >= 5 && chunk[4] == 0x03 && bytes.EqualFold(bytes.TrimSpace(chunk[5:]), []byte("COMMIT"))
}

func (p *proxy) waitResumed() {
	p.mu.Lock()
	ch := p.resumed
	p.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// pause holds every byte from now on, both ways, until resume.
func (p *proxy) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resumed == nil {
		p.resumed = make(chan struct{})
	}
}

// resume forwards the held bytes and those that follow.
func (p *proxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resumed != nil {
		close(p.resumed)
		p.resumed = nil
	}
}

// setOnCommit sets what the proxy does with the next COMMITs.
func (p *proxy) setOnCommit(a commitAction) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onCommit = a
}

// cut closes every connection open through the proxy: the server sees its
// clients leave, and the clients see their connections fail.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// close stops listening, cuts every connection and waits for the
// forwarders. A client then finds the port refused.
func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.resume()
	p.cut()
	p.wg.Wait()
}

// errIsNot fails the test when err wraps any of targets.
func errIsNot(t *testing.T, err error, what string, targets ...error) {
	t.Helper()
	for _, target := range targets {
		if errors.Is(err, target) {
			t.Fatalf("%s: %v, which wraps %v", what, err, target)
		}
	}
}
