// Package faultproxy is a loopback TCP proxy that stands between a store's
// client and its real server and injects the faults of a network and of a
// server: latency, a stalled (paused) server, lost bytes, lost and late
// replies, cut connections and a server that refuses connections. Every
// fault applies per direction: to the server (requests) or to the client
// (replies). It knows no protocol: a chunk is what one read returned, which
// for the request-reply protocols of lock stores is one request or one reply
// while the client waits for each reply before it sends again.
//
// The conformance suite (package storetest) runs its fault scenarios through
// it; a store's own tests use it for the faults particular to the store:
//
//	p := faultproxy.New(t, serverAddr)
//	s := openStore(p.Addr())
//	p.Stall(faultproxy.Both) // as if the server were paused (SIGSTOP)
//	...
//	p.Heal()
//
// Standing faults (Delay, Stall, Blackhole, Refuse) last until Heal; armed
// ones (DropNext, DelayNext, DelayNextRequest, DelayWhen, CutWhen) apply to
// the next chunks that match, from any connection, and Heal disarms those
// not yet used. A Proxy is safe for concurrent use; it stops, closing every
// connection, when the test that made it ends.
package faultproxy

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

// Direction is the way bytes travel through the proxy.
type Direction uint8

const (
	// ToServer is the client's requests.
	ToServer Direction = 1 << iota
	// ToClient is the server's replies.
	ToClient
	// Both is both ways.
	Both = ToServer | ToClient
)

// String names d.
func (d Direction) String() string {
	switch d {
	case ToServer:
		return "to server"
	case ToClient:
		return "to client"
	case Both:
		return "both ways"
	}
	return "no direction"
}

// ways lists the single directions of d, as indexes of Proxy.faults.
func (d Direction) ways() []int {
	var w []int
	if d&ToServer != 0 {
		w = append(w, toServer)
	}
	if d&ToClient != 0 {
		w = append(w, toClient)
	}
	return w
}

const (
	toServer = 0
	toClient = 1
)

// Proxy forwards TCP connections from Addr to the server, through the
// faults armed on it. The zero value is not usable: call New.
type Proxy struct {
	tb       testing.TB
	upstream string
	addr     string // the proxy's own address, kept across Refuse

	mu       sync.Mutex
	ln       net.Listener  // nil while refusing
	faults   [2]faults     // by direction: toServer, toClient
	healed   chan struct{} // closed by Heal, to end the delays under way
	links    map[*link]struct{}
	watches  []*watch
	accepted int  // connections accepted in all
	closed   bool // the test ended
	wg       sync.WaitGroup
}

// watch counts the chunks forwarded in some directions that contain needle.
type watch struct {
	ways   Direction
	needle []byte
	n      int // under Proxy.mu
}

// faults are the faults of one direction.
type faults struct {
	delay     time.Duration // added to every chunk
	stalled   chan struct{} // non-nil while stalled; closed by Heal
	blackhole bool          // chunks are discarded

	dropNext  int             // chunks still to swallow, closing their connection
	delayNext time.Duration   // added to the next chunk
	delayWhen []delayRule     // delay the next chunk that matches
	cutWhen   []cutRule       // cut the connection of the next chunk that matches
	delayReq  *delayedRequest // toServer only: the next request to hold back
}

// delayRule delays the first chunk that matches.
type delayRule struct {
	match func(chunk []byte) bool
	d     time.Duration
}

// cutRule cuts the connection of the first chunk that matches.
type cutRule struct {
	match   func(chunk []byte) bool
	forward bool // pass the chunk on before the cut
}

// delayedRequest is a request DelayNextRequest holds back.
type delayedRequest struct {
	d        time.Duration
	answered chan struct{} // closed when the first reply after it passes
}

// link is one client connection and its connection to the server.
type link struct {
	client, server net.Conn
	done           chan struct{} // closed when the link is closed
	closeOnce      sync.Once
	lost           bool          // bytes were discarded: the stream is broken (under Proxy.mu)
	answered       chan struct{} // closed at the next reply; under Proxy.mu
}

func (l *link) close() {
	l.closeOnce.Do(func() {
		close(l.done)
		_ = l.client.Close()
		_ = l.server.Close()
	})
}

// New starts a proxy to upstream (host:port) on a free loopback port. It
// stops, closing every connection, when tb ends.
func New(tb testing.TB, upstream string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("faultproxy: listen: %v", err)
	}
	p := &Proxy{tb: tb, upstream: upstream, addr: ln.Addr().String(), ln: ln,
		healed: make(chan struct{}), links: make(map[*link]struct{})}
	p.wg.Add(1)
	go p.accept(ln)
	tb.Cleanup(p.close)
	return p
}

// Addr returns the proxy's host:port, the address to give the client. It
// stays the same across Refuse and Heal.
func (p *Proxy) Addr() string { return p.addr }

// Upstream returns the server's host:port.
func (p *Proxy) Upstream() string { return p.upstream }

// Delay adds d to every chunk in dir from now until Heal: a slow network
// or a slow server. Each chunk passes d after it arrived (a latency, not a
// queue: a chunk that arrives while another waits is not held d more), and
// chunks keep their order.
func (p *Proxy) Delay(dir Direction, d time.Duration) {
	p.each(dir, func(f *faults) { f.delay = d })
}

// Stall holds every chunk in dir until Heal, keeping the connections open:
// a server in a long pause (SIGSTOP, a GC), or a partition that heals
// without loss. New connections are accepted and stall too.
func (p *Proxy) Stall(dir Direction) {
	p.each(dir, func(f *faults) {
		if f.stalled == nil {
			f.stalled = make(chan struct{})
		}
	})
}

// Blackhole discards every chunk in dir until Heal, keeping the connections
// open: a partition that loses what crosses it. A connection that lost bytes
// is cut at Heal, since its stream is broken; new connections are accepted
// and lose their bytes too.
func (p *Proxy) Blackhole(dir Direction) {
	p.each(dir, func(f *faults) { f.blackhole = true })
}

// DropNext swallows the next n chunks in dir, of any connection, and cuts the
// connection of each: in ToClient, a reply lost after the server acted.
func (p *Proxy) DropNext(dir Direction, n int) {
	p.each(dir, func(f *faults) { f.dropNext += n })
}

// DelayNext holds the next chunk in dir, of any connection, back for d: in
// ToClient, a late reply.
func (p *Proxy) DelayNext(dir Direction, d time.Duration) {
	p.each(dir, func(f *faults) { f.delayNext = d })
}

// DelayNextRequest holds the next request of any connection back for d
// before it reaches the server, on its connection alone, as a lost packet
// does until its retransmission: the client may give up on the call and
// close the connection meanwhile, and the server still receives the request
// when it arrives, after requests that other connections sent later. The
// channel is closed once the server has answered it.
func (p *Proxy) DelayNextRequest(d time.Duration) (answered <-chan struct{}) {
	r := &delayedRequest{d: d, answered: make(chan struct{})}
	p.mu.Lock()
	p.faults[toServer].delayReq = r
	p.mu.Unlock()
	return r.answered
}

// DelayWhen holds the next chunk in dir for which match reports true back
// for d, and the chunks after it on its connection in the same direction:
// in ToServer, one request that arrives late, such as the write that follows
// a client's read, while other connections' requests pass. Heal lets it
// pass at once. match runs with the proxy's lock held: it must not block
// nor call the Proxy.
func (p *Proxy) DelayWhen(dir Direction, match func(chunk []byte) bool, d time.Duration) {
	p.each(dir, func(f *faults) { f.delayWhen = append(f.delayWhen, delayRule{match: match, d: d}) })
}

// CutWhen cuts the connection of the next chunk in dir for which match
// reports true: after passing it on when forward is set (the server gets
// the request but the client never sees the reply), before otherwise (the
// request never reaches the server). match runs with the proxy's lock held:
// it must not block nor call the Proxy.
func (p *Proxy) CutWhen(dir Direction, match func(chunk []byte) bool, forward bool) {
	p.each(dir, func(f *faults) { f.cutWhen = append(f.cutWhen, cutRule{match: match, forward: forward}) })
}

// Cut closes every connection open through the proxy, as a connection reset
// or a server crash does; new connections are accepted.
func (p *Proxy) Cut() {
	p.mu.Lock()
	links := p.takeLinksLocked(func(*link) bool { return true })
	p.mu.Unlock()
	for _, l := range links {
		l.close()
	}
}

// Refuse makes the proxy refuse new connections until Heal, as a server
// that is down does (its port closed); with Cut, a server that died.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	ln := p.ln
	p.ln = nil
	p.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
}

// Heal ends every fault: held chunks pass, delays end (chunks being
// delayed pass at once), armed faults not yet used are disarmed, connections
// that lost bytes to Blackhole are cut, and a refusing proxy listens again
// on its address.
func (p *Proxy) Heal() {
	p.mu.Lock()
	for i := range p.faults {
		f := &p.faults[i]
		if f.stalled != nil {
			close(f.stalled)
		}
		*f = faults{}
	}
	close(p.healed)
	p.healed = make(chan struct{})
	broken := p.takeLinksLocked(func(l *link) bool { return l.lost })
	relisten := p.ln == nil && !p.closed
	p.mu.Unlock()
	for _, l := range broken {
		l.close()
	}
	if relisten {
		p.listenAgain()
	}
}

// Armed returns how many armed faults (DropNext's chunks, DelayNext,
// DelayNextRequest, DelayWhen, CutWhen) wait for a chunk to apply to: a test
// arms a fault, makes the call, and can check that the fault caught it.
func (p *Proxy) Armed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, f := range p.faults {
		n += f.dropNext + len(f.delayWhen) + len(f.cutWhen)
		if f.delayNext > 0 {
			n++
		}
		if f.delayReq != nil {
			n++
		}
	}
	return n
}

// Count starts counting the chunks forwarded in dir that contain needle,
// such as a key that only one call carries, and returns a function that
// reports the count: a test can check that a call reached the server.
func (p *Proxy) Count(dir Direction, needle []byte) (count func() int) {
	w := &watch{ways: dir, needle: bytes.Clone(needle)}
	p.mu.Lock()
	p.watches = append(p.watches, w)
	p.mu.Unlock()
	return func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return w.n
	}
}

// forwarded counts chunk, about to be forwarded in way, for the watches.
func (p *Proxy) forwarded(way int, chunk []byte) {
	dir := ToServer
	if way == toClient {
		dir = ToClient
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.watches {
		if w.ways&dir != 0 && bytes.Contains(chunk, w.needle) {
			w.n++
		}
	}
}

// Conns returns how many client connections are open through the proxy.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Accepted returns how many client connections the proxy has accepted.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// each applies set to the faults of every direction of dir.
func (p *Proxy) each(dir Direction, set func(*faults)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range dir.ways() {
		set(&p.faults[w])
	}
}

// takeLinksLocked removes the links for which pick reports true and returns
// them, for the caller to close outside p.mu.
func (p *Proxy) takeLinksLocked(pick func(*link) bool) []*link {
	var taken []*link
	for l := range p.links {
		if pick(l) {
			taken = append(taken, l)
			delete(p.links, l)
		}
	}
	return taken
}

// listenAgain listens on the proxy's address again after Refuse. Another
// process may have taken the port meanwhile; on loopback, in a test, that is
// rare enough to retry for a second and then fail the test.
func (p *Proxy) listenAgain() {
	deadline := time.Now().Add(time.Second)
	for {
		ln, err := net.Listen("tcp", p.addr)
		if err == nil {
			p.mu.Lock()
			if p.closed || p.ln != nil {
				p.mu.Unlock()
				_ = ln.Close()
				return
			}
			p.ln = ln
			p.wg.Add(1)
			p.mu.Unlock()
			go p.accept(ln)
			return
		}
		if time.Now().After(deadline) {
			p.tb.Errorf("faultproxy: cannot listen on %s again after Refuse: %v", p.addr, err)
			return
		}
		time.Sleep(10 * time.Millisecond) // the port is still in use: wait for the kernel to free it
	}
}

func (p *Proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		client, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		server, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = client.Close()
			continue
		}
		l := &link{client: client, server: server, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			l.close()
			return
		}
		p.links[l] = struct{}{}
		p.accepted++
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pump(l, toServer)
		go p.pump(l, toClient)
	}
}

// verdict is what the proxy does with one chunk.
type verdict struct {
	stalled   chan struct{}
	healed    chan struct{} // ends the delay
	delay     time.Duration
	held      *delayedRequest
	drop      bool // swallow it and cut the connection
	cutBefore bool // cut the connection without passing it
	cutAfter  bool // pass it, then cut the connection
}

// judge decides the fate of chunk in direction way on l, consuming the
// armed faults it uses.
func (p *Proxy) judge(l *link, way int, chunk []byte) verdict {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := &p.faults[way]
	v := verdict{stalled: f.stalled, healed: p.healed, delay: f.delay + f.delayNext}
	f.delayNext = 0
	for i, r := range f.delayWhen {
		if r.match(chunk) {
			f.delayWhen = append(f.delayWhen[:i:i], f.delayWhen[i+1:]...)
			v.delay += r.d
			break
		}
	}
	for i, r := range f.cutWhen {
		if r.match(chunk) {
			f.cutWhen = append(f.cutWhen[:i:i], f.cutWhen[i+1:]...)
			v.cutAfter, v.cutBefore = r.forward, !r.forward
			break
		}
	}
	if f.dropNext > 0 {
		f.dropNext--
		v.drop = true
	}
	switch way {
	case toServer:
		if v.held = f.delayReq; v.held != nil {
			f.delayReq = nil
			v.delay += v.held.d
		}
	case toClient:
		if l.answered != nil {
			close(l.answered)
			l.answered = nil
		}
	}
	return v
}

// blackholed reports whether chunks in way are discarded now, marking l as
// broken when they are.
func (p *Proxy) blackholed(l *link, way int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.faults[way].blackhole {
		l.lost = true
		return true
	}
	return false
}

// pump copies one direction of l through the faults.
func (p *Proxy) pump(l *link, way int) {
	defer p.wg.Done()
	src, dst := l.client, l.server
	if way == toClient {
		src, dst = l.server, l.client
	}
	halfClose := false
	defer func() {
		if halfClose {
			// The client has gone, but the server still gets what it
			// sent, as over a direct connection: the replies' pump closes
			// the link once the server has answered, or closed.
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
				return
			}
		}
		p.forget(l)
		l.close()
	}()
	// A reader of its own notes when each chunk arrived, while earlier
	// ones wait out their delay: a delay is latency, d after arrival, not
	// d after the chunk before was passed (which made a reply behind
	// another, a keep-alive's say, take twice the link's delay).
	arrivals := make(chan arrival, 16)
	p.wg.Add(1)
	go p.read(l, src, arrivals)
	for {
		var a arrival
		select {
		case a = <-arrivals:
		case <-l.done:
			return
		}
		n, err := len(a.chunk), a.err
		if n > 0 {
			chunk := a.chunk
			v := p.judge(l, way, chunk)
			if v.stalled != nil {
				select {
				case <-v.stalled:
				case <-l.done:
					return
				}
				if isClosed(l.done) {
					return // the proxy closed: what it held goes nowhere
				}
			}
			if v.drop || v.cutBefore {
				return
			}
			if p.blackholed(l, way) {
				continue
			}
			if d := time.Until(a.at.Add(v.delay)); v.delay > 0 && d > 0 && !sleep(d, v.healed, l.done) {
				return
			}
			if v.held != nil {
				// Its reply is the next on this connection: the client
				// waits for each reply before it sends again.
				p.mu.Lock()
				l.answered = v.held.answered
				p.mu.Unlock()
			}
			if v.cutAfter && way == toServer {
				// The client must never see the reply: its side goes
				// first, and the request still reaches the server.
				_ = l.client.Close()
			}
			p.forwarded(way, chunk)
			if _, werr := dst.Write(chunk); werr != nil {
				return
			}
			if v.cutAfter {
				return
			}
		}
		if err != nil {
			halfClose = way == toServer && !isClosed(l.done)
			return
		}
	}
}

// forget removes l from the open links.
func (p *Proxy) forget(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// sleep waits for d, or until healed is closed; it reports false, at once,
// when done is closed.
// arrival is a chunk read from one side of a link, or the error that
// ended the reads, and when it came.
type arrival struct {
	chunk []byte
	err   error
	at    time.Time
}

// read reads src into arrivals until a read fails or l closes.
func (p *Proxy) read(l *link, src net.Conn, arrivals chan<- arrival) {
	defer p.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		a := arrival{chunk: bytes.Clone(buf[:n]), err: err, at: time.Now()}
		select {
		case arrivals <- a:
		case <-l.done:
			return
		}
		if err != nil {
			return
		}
	}
}

func sleep(d time.Duration, healed, done <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-healed:
		return true
	case <-done:
		return false
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// close stops the proxy when the test ends: it stops listening, lets held
// chunks go, closes every connection and waits for its goroutines.
func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	ln := p.ln
	p.ln = nil
	links := p.takeLinksLocked(func(*link) bool { return true })
	p.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	// The links close before the stalls end, so that nothing held reaches
	// the server after the test.
	for _, l := range links {
		l.close()
	}
	p.mu.Lock()
	for i := range p.faults {
		if f := &p.faults[i]; f.stalled != nil {
			close(f.stalled)
			f.stalled = nil
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}
