//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package filestore

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// TestShortKeyFileExtended: a key file of 32 bytes, as versions without the
// waiter mark made, keeps its fence and is extended to hold the mark.
func TestShortKeyFileExtended(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, fileName("k"))
	const last = int64(1) << 60 // ahead of the clock, so the fence follows it
	var buf [recordSize]byte
	record{fence: last}.encode(buf[:])
	if err := os.WriteFile(path, buf[:], filePerm); err != nil {
		t.Fatal(err)
	}
	s1, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	s2, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	ctx := t.Context()
	g, err := s1.Acquire(ctx, []string{"k"}, "t1", time.Minute)
	if err != nil || !g.OK || g.Fences[0] != last+stores.FenceStride {
		t.Fatalf("Acquire: %+v, %v; want granted with fence %d", g, err, last+stores.FenceStride)
	}
	if st, err := os.Stat(path); err != nil || st.Size() != fileSize {
		t.Fatalf("the key file after a grant: %v, %v; want %d bytes", st, err, fileSize)
	}
	if g, err := s2.Acquire(ctx, []string{"k"}, "t2", time.Minute); err != nil || g.OK {
		t.Fatalf("Acquire by another Store: %+v, %v; want refused", g, err)
	}
	if waited, err := s1.ReleaseWaited(ctx, []string{"k"}, "t1", 0); err != nil || !waited {
		t.Fatalf("ReleaseWaited after another Store's refusal: %v, %v; want true", waited, err)
	}
}
