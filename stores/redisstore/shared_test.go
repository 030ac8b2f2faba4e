package redisstore

import (
	"bufio"
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores"
)

// monitor is a MONITOR connection to the test Redis.
type monitor struct {
	conn net.Conn
	r    *bufio.Reader
}

func newMonitor(t *testing.T) *monitor {
	t.Helper()
	conn, err := net.DialTimeout("tcp", testredis.Addr(t), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	m := &monitor{conn: conn, r: bufio.NewReader(conn)}
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	if line := m.line(t); line != "+OK" {
		t.Fatalf("MONITOR answered %q", line)
	}
	return m
}

func (m *monitor) line(t *testing.T) string {
	t.Helper()
	_ = m.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := m.r.ReadString('\n')
	if err != nil {
		t.Fatalf("reading MONITOR: %v", err)
	}
	return strings.TrimSuffix(line, "\r\n")
}

// scripts returns, for each script call that names prefix in its keys up
// to the ECHO of marker (which the caller sent after its calls), the
// commands it ran: the EVALSHA and the commands its script called, which
// MONITOR shows right after it (a script runs alone).
func (m *monitor) scripts(t *testing.T, prefix, marker string) [][]string {
	t.Helper()
	var calls [][]string
	inScript := false
	for {
		line := m.line(t)
		_, rest, _ := strings.Cut(line, " [")
		src, args, _ := strings.Cut(rest, "] ")
		name, _, _ := strings.Cut(args, " ")
		name = strings.ToLower(strings.Trim(name, `"`))
		switch {
		case name == "echo" && strings.Contains(args, marker):
			return calls
		case src == "0 lua" && inScript:
			calls[len(calls)-1] = append(calls[len(calls)-1], name)
		case name == "evalsha" && strings.Contains(args, prefix):
			calls = append(calls, []string{name})
			inScript = true
		default:
			inScript = false
		}
	}
}

// TestSharedCommandCounts pins what Redis runs for the plain path, which
// the shared grants must not make dearer: an uncontended Acquire and
// Release cost the commands the package documentation counts, and a
// Release by a token that holds nothing (a writer's withdrawal) costs one
// DEL more than before; and logs the costs of the shared operations.
func TestSharedCommandCounts(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	ctx := context.Background()
	prefix := testredis.Prefix(t)
	k := prefix + "k"
	cycle := func(k string) {
		mustAcquire(t, s, []string{k}, "t", time.Minute)
		mustRelease(t, s, []string{k}, "t")
	}
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	cycle(prefix + "warm-up")
	m := newMonitor(t)
	marker := "marker-" + prefix
	echo := func() {
		if err := client.Echo(ctx, marker).Err(); err != nil {
			t.Fatal(err)
		}
	}
	cycle(k) // a fresh key: its fence does not run ahead of the clock
	if err := s.Release(ctx, []string{k}, "nobody", 0); !errorsIsNotHeld(err) {
		t.Fatalf("Release of a free key: %v, want ErrNotHeld", err)
	}
	echo()
	calls := m.scripts(t, prefix, marker)
	want := [][]string{
		{"evalsha", "exists", "set", "time", "set"},
		{"evalsha", "get", "del"},
		{"evalsha", "get", "del"},
	}
	if !slices.EqualFunc(calls, want, slices.Equal) {
		t.Fatalf("uncontended acquire, release, and release by a non-holder ran %v, want %v", calls, want)
	}

	// The shared operations, and the plain path meeting holders.
	for _, step := range []func(){
		func() { mustShareOn(t, s, k, "r1", 0) },
		func() { mustShareOn(t, s, k, "r2", 2) },
		func() {
			if err := s.RefreshShared(ctx, k, "r1", time.Minute); err != nil {
				t.Fatal(err)
			}
		},
		func() {
			if g, err := s.Acquire(ctx, []string{k}, "w", time.Minute); err != nil || !g.SharedHeld {
				t.Fatalf("Acquire over holders: %+v, %v", g, err)
			}
		},
		func() {
			if err := s.Release(ctx, []string{k}, "w", 0); !errorsIsNotHeld(err) {
				t.Fatalf("the writer's withdrawal: %v", err)
			}
		},
		func() {
			if err := s.ReleaseShared(ctx, k, "r1", 0); err != nil {
				t.Fatal(err)
			}
		},
		func() {
			if err := s.ReleaseShared(ctx, k, "r2", 0); err != nil {
				t.Fatal(err)
			}
		},
	} {
		step()
	}
	echo()
	names := []string{"first holder", "second holder", "refresh", "acquire over holders", "writer's withdrawal", "release", "last release"}
	calls = m.scripts(t, prefix, marker)
	if len(calls) != len(names) {
		t.Fatalf("%d script calls seen, want %d: %v", len(calls), len(names), calls)
	}
	for i, c := range calls {
		t.Logf("%s: %d commands: %v", names[i], len(c), c)
	}
}

func mustShareOn(t *testing.T, s *Store, key, token string, limit int) {
	t.Helper()
	if g, err := s.AcquireShared(context.Background(), key, token, limit, time.Minute); err != nil || !g.OK {
		t.Fatalf("AcquireShared(%q): %+v, %v", token, g, err)
	}
}

func errorsIsNotHeld(err error) bool { return errors.Is(err, stores.ErrNotHeld) }
