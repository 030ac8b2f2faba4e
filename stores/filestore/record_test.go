//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package filestore

import (
	"os"
	"path/filepath"
	"strconv"
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

// TestOldKeyFileShared: key files of versions without shared grants (32
// bytes, before the waiter mark, or 64 with the shared table's header
// zero) read as keys without holders: a shared grant keeps their fence, and
// its record still reads as version 1, as those versions read it.
func TestOldKeyFileShared(t *testing.T) {
	dir := t.TempDir()
	const last = int64(1) << 60 // ahead of the clock, so the fence follows it
	for _, size := range []int{recordSize, fileSize} {
		key := "k" + strconv.Itoa(size)
		buf := make([]byte, size)
		record{fence: last}.encode(buf)
		if err := os.WriteFile(filepath.Join(dir, fileName(key)), buf, filePerm); err != nil {
			t.Fatal(err)
		}
	}
	s, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, size := range []int{recordSize, fileSize} {
		key := "k" + strconv.Itoa(size)
		g, err := s.AcquireShared(t.Context(), key, "r", 1, time.Minute)
		if err != nil || !g.OK || g.Fences[0] != last+stores.FenceStride {
			t.Fatalf("AcquireShared of a %d-byte old file: %+v, %v; want granted with fence %d", size, g, err, last+stores.FenceStride)
		}
		b, err := os.ReadFile(filepath.Join(dir, fileName(key)))
		if err != nil {
			t.Fatal(err)
		}
		r, ok := decodeRecord(b)
		if !ok || b[4] != 1 || r.fence != g.Fences[0] || r.mode != modeShared {
			t.Fatalf("record after a shared grant: %+v, %v, version %d; want version 1, fence %d, shared", r, ok, b[4], g.Fences[0])
		}
		if g, err := s.AcquireShared(t.Context(), key, "r2", 1, time.Minute); err != nil || g.OK {
			t.Fatalf("a second holder under a limit of 1: %+v, %v; want refused", g, err)
		}
	}
}
