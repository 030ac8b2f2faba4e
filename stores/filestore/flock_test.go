//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package filestore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// holdFlock takes the exclusive flock of key's file in dir through an open
// file description of its own, as another Store's call does, and returns
// the file and a func that lets go of it.
func holdFlock(t *testing.T, dir, key string) (fd int, unlock func()) {
	t.Helper()
	fd, err := openKeyFile(filepath.Join(dir, fileName(key)), filePerm)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(fd, syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	done := false
	unlock = func() {
		if !done {
			done = true
			closeFile(fd)
		}
	}
	t.Cleanup(unlock)
	return fd, unlock
}

// readFileRecord reads key's record from its file in dir.
func readFileRecord(t *testing.T, dir, key string) record {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, fileName(key)))
	if err != nil {
		t.Fatal(err)
	}
	r, ok := decodeRecord(b)
	if !ok {
		t.Fatalf("the record of %s does not decode", key)
	}
	return r
}

// TestStalledUpdateWaitedFor (issue 22): a call that finds the key file's
// flock held, and the record telling of no exclusive grant, waits for it as
// long as its context lasts, well past the 50ms after which it used to
// refuse a free key (AcquireShared) or fail (ReleaseShared); and it returns
// once its context ends.
func TestStalledUpdateWaitedFor(t *testing.T) {
	dir := t.TempDir()
	s := newInternalStore(t, dir)
	ctx := t.Context()
	if g, err := s.AcquireShared(ctx, "k", "r0", 0, time.Minute); err != nil || !g.OK {
		t.Fatalf("AcquireShared r0: %+v, %v", g, err)
	}

	type result struct {
		g   stores.Grant
		err error
	}
	for _, call := range []string{"AcquireShared", "ReleaseShared"} {
		_, unlock := holdFlock(t, dir, "k") // a stalled call of another Store
		done := make(chan result, 1)
		go func() {
			if call == "AcquireShared" {
				g, err := s.AcquireShared(ctx, "k", "r1", 0, time.Minute)
				done <- result{g, err}
				return
			}
			done <- result{stores.Grant{OK: true}, s.ReleaseShared(ctx, "k", "r0", 0)}
		}()
		select {
		case r := <-done:
			t.Fatalf("%s returned %+v, %v while another Store's call held the flock; want it to wait", call, r.g, r.err)
		case <-time.After(500 * time.Millisecond):
		}
		unlock()
		select {
		case r := <-done:
			if r.err != nil || !r.g.OK {
				t.Fatalf("%s once the flock was free: %+v, %v", call, r.g, r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s did not return within 10s of the flock's release", call)
		}
	}

	_, unlock := holdFlock(t, dir, "k")
	defer unlock()
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if g, err := s.AcquireShared(short, "k", "r2", 0, time.Minute); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AcquireShared with a context that ends while the flock is held: %+v, %v; want context.DeadlineExceeded", g, err)
	}
}

// TestExclusiveGrantRefusesAtOnce (issue 22): a flock held with a record
// that tells of an exclusive grant refuses AcquireShared at once, and
// ReleaseShared answers ErrNotHeld; an exclusive grant's end writes
// modeFree before it lets go, and a call that takes the flock corrects a
// record left by a grant whose process died.
func TestExclusiveGrantRefusesAtOnce(t *testing.T) {
	dir := t.TempDir()
	s := newInternalStore(t, dir)
	ctx := t.Context()
	if g, err := s.Acquire(ctx, []string{"k"}, "w", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	if r := readFileRecord(t, dir, "k"); r.mode != modeExclusive {
		t.Fatalf("record during an exclusive grant: %+v; want mode %d", r, modeExclusive)
	}
	if err := s.Release(ctx, []string{"k"}, "w", 0); err != nil {
		t.Fatal(err)
	}
	r := readFileRecord(t, dir, "k")
	if r.mode != modeFree {
		t.Fatalf("record after the release: %+v; want mode %d", r, modeFree)
	}

	// Another process's exclusive grant.
	fd, unlock := holdFlock(t, dir, "k")
	if err := writeRecord(fd, record{fence: nextFence(r.fence), expiry: time.Now().Add(time.Minute).UnixNano(), pid: 1}); err != nil {
		t.Fatal(err)
	}
	quick, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if g, err := s.AcquireShared(quick, "k", "r", 0, time.Minute); err != nil || g.OK || g.Wait <= 0 {
		t.Fatalf("AcquireShared of a key held exclusively: %+v, %v; want refused with a Wait", g, err)
	}
	if err := s.ReleaseShared(quick, "k", "r", 0); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("ReleaseShared of a key held exclusively: %v; want ErrNotHeld", err)
	}
	unlock() // the grant's process died: its record stays

	if g, err := s.AcquireShared(ctx, "k", "r", 0, time.Minute); err != nil || !g.OK {
		t.Fatalf("AcquireShared after the exclusive holder died: %+v, %v", g, err)
	}
	if r := readFileRecord(t, dir, "k"); r.mode != modeShared {
		t.Fatalf("record after a shared grant: %+v; want mode %d", r, modeShared)
	}
}

// TestTornTableKeepsHolders (issue 22 review): a shared table whose
// checksum fails (a write torn by SIGKILL or a crash of the host) reads as
// the header's count of holders, until its latest expiry: a limit still
// counts them and an exclusive grant still waits for them; only their
// tokens are forgotten.
func TestTornTableKeepsHolders(t *testing.T) {
	dir := t.TempDir()
	s := newInternalStore(t, dir)
	ctx := t.Context()
	for _, token := range []string{"a", "b"} {
		if g, err := s.AcquireShared(ctx, "k", token, 3, time.Minute); err != nil || !g.OK {
			t.Fatalf("AcquireShared %s: %+v, %v", token, g, err)
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, fileName("k")), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt([]byte{0xff, 0xee, 0xdd}, fileSize+3) // the first place's token
	f.Close()
	if err != nil {
		t.Fatal(err)
	}

	if g, err := s.Acquire(ctx, []string{"k"}, "w", time.Minute); err != nil || g.OK || !g.SharedHeld || g.Wait < 50*time.Second {
		t.Fatalf("Acquire over a torn table of 2 holders: %+v, %v; want refused, SharedHeld, Wait about a minute", g, err)
	}
	if err := s.Release(ctx, []string{"k"}, "w", 0); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("Release of the refused writer (withdraws its record): %v", err)
	}
	if g, err := s.AcquireShared(ctx, "k", "c", 3, time.Minute); err != nil || !g.OK {
		t.Fatalf("AcquireShared c, the third under a limit of 3: %+v, %v", g, err)
	}
	if g, err := s.AcquireShared(ctx, "k", "d", 3, time.Minute); err != nil || g.OK {
		t.Fatalf("AcquireShared d, a fourth under a limit of 3: %+v, %v; want refused", g, err)
	}
	if err := s.ReleaseShared(ctx, "k", "a", 0); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("ReleaseShared of a holder the torn table forgot: %v; want ErrNotHeld", err)
	}
	if err := s.ReleaseShared(ctx, "k", "c", 0); err != nil {
		t.Fatalf("ReleaseShared c: %v", err)
	}

	h := header{holders: 2, writers: 1, until: 42}
	for _, buf := range [][]byte{nil, make([]byte, 3*tableEntrySize+4)} {
		tt := decodeTable(h, buf)
		if len(tt.holders) != 2 || len(tt.writers) != 0 || tt.holders[0].expiry != 42 || tt.holders[1].expiry != 42 {
			t.Fatalf("decodeTable of a torn table (%d bytes): %+v; want 2 holders until 42", len(buf), tt)
		}
	}
}

// newInternalStore returns a Store on dir, closed at the end of the test.
func newInternalStore(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
