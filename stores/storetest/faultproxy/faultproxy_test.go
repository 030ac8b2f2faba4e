package faultproxy_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// echoServer answers every line with the same line, and reports each line
// it received on got.
type echoServer struct {
	ln  net.Listener
	got chan string
}

func newEchoServer(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: ln, got: make(chan string, 100)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					s.got <- strings.TrimSpace(line)
					if _, err := io.WriteString(c, line); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return s
}

// client is one connection through the proxy.
type client struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, p *faultproxy.Proxy) *client {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &client{t: t, c: c, r: bufio.NewReader(c)}
}

func (c *client) send(line string) {
	c.t.Helper()
	if _, err := io.WriteString(c.c, line+"\n"); err != nil {
		c.t.Fatalf("send %q: %v", line, err)
	}
}

// recv reads a line within d; it returns the error instead on a timeout or
// a closed connection.
func (c *client) recv(d time.Duration) (string, error) {
	_ = c.c.SetReadDeadline(time.Now().Add(d))
	line, err := c.r.ReadString('\n')
	return strings.TrimSpace(line), err
}

func (c *client) roundTrip(line string) string {
	c.t.Helper()
	c.send(line)
	got, err := c.recv(5 * time.Second)
	if err != nil {
		c.t.Fatalf("round trip %q: %v", line, err)
	}
	return got
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// received waits for the server to have received line.
func (s *echoServer) received(t *testing.T, line string) {
	t.Helper()
	select {
	case got := <-s.got:
		if got != line {
			t.Fatalf("server received %q, want %q", got, line)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("server never received %q", line)
	}
}

func TestPassThrough(t *testing.T) {
	s := newEchoServer(t)
	p := faultproxy.New(t, s.ln.Addr().String())
	c := dial(t, p)
	if got := c.roundTrip("a"); got != "a" {
		t.Fatalf("got %q", got)
	}
	if p.Conns() != 1 || p.Accepted() != 1 {
		t.Errorf("Conns %d, Accepted %d; want 1, 1", p.Conns(), p.Accepted())
	}
}

// TestStall: a stalled direction holds its bytes, and Heal lets them through
// in order on the same connection.
func TestStall(t *testing.T) {
	for _, dir := range []faultproxy.Direction{faultproxy.ToServer, faultproxy.ToClient, faultproxy.Both} {
		t.Run(dir.String(), func(t *testing.T) {
			s := newEchoServer(t)
			p := faultproxy.New(t, s.ln.Addr().String())
			c := dial(t, p)
			c.roundTrip("warm")
			<-s.got
			p.Stall(dir)
			c.send("held")
			if _, err := c.recv(100 * time.Millisecond); !isTimeout(err) {
				t.Fatalf("recv while stalled: %v, want a timeout", err)
			}
			if dir == faultproxy.ToClient {
				s.received(t, "held") // the server got it; its reply is held
			}
			p.Heal()
			if got, err := c.recv(5 * time.Second); err != nil || got != "held" {
				t.Fatalf("after Heal: %q, %v", got, err)
			}
		})
	}
}

// TestBlackhole: the server acts on a request whose reply is lost; Heal cuts
// the broken connection, and new ones work.
func TestBlackhole(t *testing.T) {
	s := newEchoServer(t)
	p := faultproxy.New(t, s.ln.Addr().String())
	c := dial(t, p)
	p.Blackhole(faultproxy.ToClient)
	c.send("lost")
	s.received(t, "lost")
	if _, err := c.recv(100 * time.Millisecond); !isTimeout(err) {
		t.Fatalf("recv of a lost reply: %v, want a timeout", err)
	}
	p.Heal()
	if _, err := c.recv(5 * time.Second); err == nil || isTimeout(err) {
		t.Fatalf("the broken connection after Heal: %v, want it closed", err)
	}
	if got := dial(t, p).roundTrip("b"); got != "b" {
		t.Fatalf("new connection after Heal: %q", got)
	}
}

// TestDropNext: the next reply is swallowed and its connection cut, after
// the server acted; the reply after it passes.
func TestDropNext(t *testing.T) {
	s := newEchoServer(t)
	p := faultproxy.New(t, s.ln.Addr().String())
	c := dial(t, p)
	p.DropNext(faultproxy.ToClient, 1)
	c.send("x")
	s.received(t, "x")
	if _, err := c.recv(5 * time.Second); err == nil || isTimeout(err) {
		t.Fatalf("recv of a dropped reply: %v, want the connection closed", err)
	}
	if got := dial(t, p).roundTrip("y"); got != "y" {
		t.Fatalf("next connection: %q", got)
	}
}

// TestDelay: a standing delay adds to every chunk; DelayNext to one.
func TestDelay(t *testing.T) {
	s := newEchoServer(t)
	p := faultproxy.New(t, s.ln.Addr().String())
	c := dial(t, p)
	p.Delay(faultproxy.ToServer, 50*time.Millisecond)
	for range 2 {
		start := time.Now()
		c.roundTrip("d")
		if el := time.Since(start); el < 50*time.Millisecond {
			t.Errorf("round trip with a 50ms delay took %v", el)
		}
	}
	p.Heal()
	p.DelayNext(faultproxy.ToClient, 200*time.Millisecond)
	start := time.Now()
	c.roundTrip("late")
	if el := time.Since(start); el < 200*time.Millisecond {
		t.Errorf("a reply delayed 200ms came after %v", el)
	}
}

// TestDelayIsLatency: a reply that comes while an earlier one waits out
// the delay is passed d after it came, not d after the earlier one was
// passed: on a connection that carries several calls' replies (gRPC), a
// serial delay made a round trip take twice the link's delay or more.
func TestDelayIsLatency(t *testing.T) {
	const d = time.Second
	s := newEchoServer(t)
	p := faultproxy.New(t, s.ln.Addr().String())
	c := dial(t, p)
	c.roundTrip("warm")
	<-s.got
	p.Delay(faultproxy.ToClient, d)
	sent := time.Now()
	c.send("a")
	s.received(t, "a")
	c.send("b")
	s.received(t, "b")
	answeredB := time.Now() // the echo of b is on its way to the proxy
	for _, want := range []string{"a", "b"} {
		if got, err := c.recv(5 * time.Second); err != nil || got != want {
			t.Fatalf("reply %q, %v; want %q", got, err, want)
		}
	}
	if el := time.Since(sent); el < d {
		t.Errorf("the replies came after %v, within the %v delay", el, d)
	}
	// Serially, b would come d after a was passed: at 2d from a's echo.
	if late := time.Since(answeredB); late > d+d/2 {
		t.Errorf("b's reply came %v after its echo, want about the %v delay", late, d)
	}
}

// TestDelayNextRequest: a held request reaches the server after a later
// connection's, and the channel tells when it was answered.
func TestDelayNextRequest(t *testing.T) {
	s := newEchoServer(t)
	p := faultproxy.New(t, s.ln.Addr().String())
	a, b := dial(t, p), dial(t, p)
	a.roundTrip("warm a")
	b.roundTrip("warm b")
	<-s.got
	<-s.got
	answered := p.DelayNextRequest(300 * time.Millisecond)
	a.send("first")
	waitDisarmed(t, p) // the proxy holds a's request
	b.roundTrip("second")
	s.received(t, "second")
	s.received(t, "first")
	select {
	case <-answered:
	case <-time.After(5 * time.Second):
		t.Fatal("the held request was never answered")
	}
}

// TestDelayWhen: a matching request is held back, on its connection alone,
// while an earlier one and another connection's pass; Heal lets it pass.
func TestDelayWhen(t *testing.T) {
	s := newEchoServer(t)
	p := faultproxy.New(t, s.ln.Addr().String())
	a, b := dial(t, p), dial(t, p)
	p.DelayWhen(faultproxy.ToServer, func(chunk []byte) bool { return strings.Contains(string(chunk), "write") }, time.Minute)
	a.roundTrip("read")
	s.received(t, "read")
	if p.Armed() != 1 {
		t.Fatalf("Armed %d after a chunk that does not match, want 1", p.Armed())
	}
	a.send("write")
	waitDisarmed(t, p) // the proxy holds a's write
	b.roundTrip("other")
	s.received(t, "other")
	p.Heal()
	s.received(t, "write")
	if got, err := a.recv(5 * time.Second); err != nil || got != "write" {
		t.Fatalf("the held write's reply after Heal: %q, %v", got, err)
	}
}

// TestCutWhen: a matching request is cut before or after it reaches the
// server.
func TestCutWhen(t *testing.T) {
	for _, forward := range []bool{false, true} {
		s := newEchoServer(t)
		p := faultproxy.New(t, s.ln.Addr().String())
		c := dial(t, p)
		p.CutWhen(faultproxy.ToServer, func(b []byte) bool { return strings.Contains(string(b), "commit") }, forward)
		c.roundTrip("begin")
		s.received(t, "begin")
		c.send("commit")
		if _, err := c.recv(5 * time.Second); err == nil || isTimeout(err) {
			t.Fatalf("forward %v: recv after the cut: %v, want the connection closed", forward, err)
		}
		if forward {
			s.received(t, "commit")
		} else {
			c2 := dial(t, p)
			c2.roundTrip("after")
			s.received(t, "after") // the next the server saw: never the commit
		}
	}
}

// TestCutAndRefuse: Cut closes open connections; Refuse refuses new ones
// (connection refused) until Heal, on the same address.
func TestCutAndRefuse(t *testing.T) {
	s := newEchoServer(t)
	p := faultproxy.New(t, s.ln.Addr().String())
	c := dial(t, p)
	c.roundTrip("a")
	p.Cut()
	if _, err := c.recv(5 * time.Second); err == nil || isTimeout(err) {
		t.Fatalf("recv after Cut: %v, want the connection closed", err)
	}
	p.Refuse()
	if _, err := net.Dial("tcp", p.Addr()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial while refusing: %v, want connection refused", err)
	}
	p.Heal()
	if got := dial(t, p).roundTrip("back"); got != "back" {
		t.Fatalf("after Heal: %q", got)
	}
}

// waitDisarmed polls until the proxy's armed faults have all applied.
func waitDisarmed(t *testing.T, p *faultproxy.Proxy) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for p.Armed() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d armed faults never applied", p.Armed())
		}
		time.Sleep(time.Millisecond) // polling the proxy's state, which has no channel to wait on
	}
}

// TestHealEndsDelays: a chunk being delayed passes at Heal.
func TestHealEndsDelays(t *testing.T) {
	s := newEchoServer(t)
	p := faultproxy.New(t, s.ln.Addr().String())
	c := dial(t, p)
	p.DelayNext(faultproxy.ToClient, time.Minute)
	c.send("x")
	waitDisarmed(t, p)
	s.received(t, "x")
	start := time.Now()
	p.Heal()
	if got, err := c.recv(5 * time.Second); err != nil || got != "x" {
		t.Fatalf("after Heal: %q, %v", got, err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("a reply delayed a minute came %v after Heal", el)
	}
}

// TestNothingHeldReachesTheServerAfterClose: bytes a stall held when the
// test ended are dropped, never delivered.
func TestNothingHeldReachesTheServerAfterClose(t *testing.T) {
	s := newEchoServer(t)
	t.Run("inner", func(t *testing.T) {
		p := faultproxy.New(t, s.ln.Addr().String())
		c := dial(t, p)
		c.roundTrip("warm")
		<-s.got
		p.Stall(faultproxy.ToServer)
		c.send("held")
		count := p.Count(faultproxy.ToServer, []byte("held"))
		t.Cleanup(func() {
			if n := count(); n != 0 {
				t.Errorf("the held request was forwarded %d times", n)
			}
		})
	})
	select {
	case got := <-s.got:
		t.Fatalf("the server received %q after the proxy closed", got)
	case <-time.After(100 * time.Millisecond): // nothing arrives: the absence itself is checked
	}
}

// TestCount counts the chunks that carry a needle, per direction.
func TestCount(t *testing.T) {
	s := newEchoServer(t)
	p := faultproxy.New(t, s.ln.Addr().String())
	toServer := p.Count(faultproxy.ToServer, []byte("needle"))
	both := p.Count(faultproxy.Both, []byte("needle"))
	c := dial(t, p)
	c.roundTrip("hay")
	c.roundTrip("a needle")
	if toServer() != 1 || both() != 2 {
		t.Errorf("counts %d to the server and %d both ways, want 1 and 2", toServer(), both())
	}
}
