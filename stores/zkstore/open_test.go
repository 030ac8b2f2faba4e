package zkstore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
	"github.com/reqlock/reqlock/stores/zkstore"
)

// TestOpenInvalid: a bad URL is refused with ErrInvalid and a message
// naming the problem, before any connection.
func TestOpenInvalid(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"redis://127.0.0.1:2181/x", `scheme "redis"`},
		{"zk:127.0.0.1:2181", "no //host"},
		{"zk:///reqlock", "no host:port"},
		{"zk://127.0.0.1/reqlock", `"127.0.0.1" is not host:port`},
		{"zk://127.0.0.1:2181,,127.0.0.2:2181/", `"" is not host:port`},
		{"zk://user:pw@127.0.0.1:2181/", "user"},
		{"zk://127.0.0.1:2181/x#frag", "fragment"},
		{"zk://127.0.0.1:2181/x?session=soon", `session "soon"`},
		{"zk://127.0.0.1:2181/x?session=10ms", "below 1s"},
		{"zk://127.0.0.1:2181/x?timeout=1s", `unknown URL option "timeout"`},
		{"zk://127.0.0.1:2181/a//b", "empty, . or .. element"},
		{"zk://127.0.0.1:2181/a/", "ends with a slash"},
		{"zk://127.0.0.1:2181/a/../b", "empty, . or .. element"},
		{"zk://127.0.0.1:2181/%00", "control character"},
		{"::", "bad URL"},
		{"zk://127.0.0.1:2181/x?connect=later", `connect="later"`},
	} {
		s, err := zkstore.Open(t.Context(), tc.url)
		if s != nil {
			_ = s.Close()
		}
		if !errors.Is(err, stores.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q): %v; want stores.ErrInvalid naming %q", tc.url, err, tc.want)
		}
	}
}

// TestNewInvalid: New refuses no servers, a bad server and bad options.
func TestNewInvalid(t *testing.T) {
	for name, tc := range map[string]struct {
		servers []string
		opts    []zkstore.Option
		want    string
	}{
		"no servers": {nil, nil, "no servers"},
		"bad server": {[]string{"a:1/x"}, nil, "not host:port"},
		"nil option": {[]string{"127.0.0.1:1"}, []zkstore.Option{nil}, "nil option"},
		"root":       {[]string{"127.0.0.1:1"}, []zkstore.Option{zkstore.WithRoot("/")}, "root is /"},
		"relative":   {[]string{"127.0.0.1:1"}, []zkstore.Option{zkstore.WithRoot("x")}, "not an absolute path"},
		"session":    {[]string{"127.0.0.1:1"}, []zkstore.Option{zkstore.WithSessionTimeout(0)}, "below 1s"},
		"empty ACL":  {[]string{"127.0.0.1:1"}, []zkstore.Option{zkstore.WithACL(nil)}, "ACL is empty"},
	} {
		s, err := zkstore.New(t.Context(), tc.servers, tc.opts...)
		if s != nil {
			_ = s.Close()
		}
		if !errors.Is(err, stores.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New: %v; want stores.ErrInvalid naming %q", name, err, tc.want)
		}
	}
}

// TestOpen: a Store from a URL keeps its keys under the URL's root, and two
// Stores on one root exclude each other.
func TestOpen(t *testing.T) {
	root := testRoot() + "/open"
	url := "zk://" + testservers.ZooKeeperAddr(t) + root + "?session=5s"
	a, err := zkstore.Open(t.Context(), url)
	if err != nil {
		t.Fatalf("Open(%q): %v", url, err)
	}
	defer a.Close()
	b, err := zkstore.Open(t.Context(), url)
	if err != nil {
		t.Fatalf("Open(%q): %v", url, err)
	}
	defer b.Close()
	if a.Root() != root {
		t.Fatalf("Root() = %q, want %q", a.Root(), root)
	}
	if g, err := a.Acquire(t.Context(), []string{"k"}, "ta", 5*time.Second); err != nil || !g.OK {
		t.Fatalf("Acquire on a: %+v, %v", g, err)
	}
	if g, err := b.Acquire(t.Context(), []string{"k"}, "tb", 5*time.Second); err != nil || g.OK {
		t.Fatalf("Acquire on b of a key a holds: %+v, %v; want refused", g, err)
	}
	// Close ends a's session: the server frees its lock at once.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if g, err := b.Acquire(t.Context(), []string{"k"}, "tb", 5*time.Second); err != nil || !g.OK {
		t.Fatalf("Acquire on b after a closed: %+v, %v; want granted", g, err)
	}
	if _, err := a.Acquire(t.Context(), []string{"k"}, "ta", 5*time.Second); !errors.Is(err, zkstore.ErrClosed) {
		t.Fatalf("Acquire on a closed Store: %v, want ErrClosed", err)
	}
}

// TestOpenNoServer: Open against a port nobody listens on returns once its
// context ends.
func TestOpenNoServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	s, err := zkstore.Open(ctx, "zk://127.0.0.1:1/x")
	if err == nil {
		_ = s.Close()
		t.Fatal("Open of a dead server succeeded")
	}
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second {
		t.Fatalf("Open of a dead server: %v after %v; want context.DeadlineExceeded at its deadline", err, time.Since(start))
	}
}

// TestOpenUnreachable: Open fails at start-up when no server can be
// reached, naming the servers, within 5s or its context, unless
// connect=lazy; a lazy Store gets its session in the background, creates its
// root and works once a server answers (issue 19 item 6).
func TestOpenUnreachable(t *testing.T) {
	p := faultproxy.New(t, testservers.ZooKeeperAddr(t))
	root := "/reqlock-startup-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	storetest.Startup(t, []*faultproxy.Proxy{p}, func(ctx context.Context, addrs []string, lazy bool) (stores.Store, error) {
		u := "zk://" + addrs[0] + root
		if lazy {
			u += "?connect=lazy"
		}
		return zkstore.Open(ctx, u)
	})
}
