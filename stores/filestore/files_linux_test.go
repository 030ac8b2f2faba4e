package filestore

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// openFiles counts the process's open file descriptors.
func openFiles(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// TestOpenFilesBounded: a Store keeps at most maxIdleFiles key files open
// for keys it no longer holds, and Close closes them all.
func TestOpenFilesBounded(t *testing.T) {
	s, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	before := openFiles(t)
	for i := range maxIdleFiles + 200 {
		keys := []string{"k" + strconv.Itoa(i)}
		if g, err := s.Acquire(ctx, keys, "t", time.Minute); err != nil || !g.OK {
			t.Fatalf("Acquire: %+v, %v", g, err)
		}
		if err := s.Release(ctx, keys, "t", 0); err != nil {
			t.Fatal(err)
		}
	}
	if n := openFiles(t) - before; n > maxIdleFiles || n < maxIdleFiles-10 {
		t.Fatalf("%d more files open after %d keys, want about %d", n, maxIdleFiles+200, maxIdleFiles)
	}
	entries := 0
	for i := range s.shards {
		s.shards[i].mu.Lock()
		entries += len(s.shards[i].entries)
		s.shards[i].mu.Unlock()
	}
	if entries != maxIdleFiles {
		t.Fatalf("%d entries kept, want %d", entries, maxIdleFiles)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := openFiles(t) - before; n > 0 {
		t.Fatalf("%d more files open after Close", n)
	}
}
