//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package filestore_test

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/filestore"
	"github.com/reqlock/reqlock/stores/storetest"
)

// TestNewRefusesBadDirectories: an empty, relative or non-directory path is
// refused with ErrInvalid and a message naming the problem.
func TestNewRefusesBadDirectories(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]string{
		"":                       "empty",
		"locks":                  "relative",
		"./locks":                "relative",
		file:                     "not a directory",
		filepath.Join(file, "x"): "not a directory",
	} {
		s, err := filestore.New(dir)
		if !errors.Is(err, stores.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("New(%q): %v, %v; want stores.ErrInvalid saying %q", dir, s, err, want)
		}
	}
	// A missing directory is created, with its parents, and leaves only
	// key files behind (the flock probe removes its own).
	dir := filepath.Join(t.TempDir(), "a", "b")
	s := newStore(t, dir)
	if _, err := s.Acquire(t.Context(), []string{"sku:1"}, "t", time.Minute); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "k-sku_3a1" {
		t.Fatalf("directory holds %v, want the key file k-sku_3a1 alone", entries)
	}
}

// TestOpen: file:///abs/dir opens a Store there; other forms are refused
// with ErrInvalid naming the problem.
func TestOpen(t *testing.T) {
	dir := t.TempDir()
	ctx := t.Context()
	for _, u := range []string{"file://" + dir, "file://localhost" + dir, "file://" + dir + "/", "file://" + dir + "?connect=lazy"} {
		s, err := filestore.Open(ctx, u)
		if err != nil {
			t.Fatalf("Open(%q): %v", u, err)
		}
		if s.Dir() != dir {
			t.Errorf("Open(%q).Dir() = %q, want %q", u, s.Dir(), dir)
		}
		_ = s.Close()
	}
	for u, want := range map[string]string{
		"redis://localhost:6379": `scheme "redis"`,
		dir:                      `scheme ""`,
		"file:locks":             "relative path",
		"file://locks/x":         `host "locks"`,
		"file://u@localhost/x":   "user information",
		"file:///x?mode=0777":    `unknown URL option "mode"`,
		"file:///x#f":            "fragment",
		"file:///x?connect=soon": `connect="soon"`,
		"file://":                "no directory",
		"file:///tmp/%zz":        "invalid URL escape",
	} {
		s, err := filestore.Open(ctx, u)
		if !errors.Is(err, stores.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%q): %v, %v; want stores.ErrInvalid saying %q", u, s, err, want)
		}
	}
	// A directory that cannot be made is a configuration error, lazy or not.
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := filestore.Open(ctx, "file://"+notDir+"/locks?connect=lazy"); !errors.Is(err, stores.ErrInvalid) {
		t.Errorf("Open with connect=lazy under a file: %v; want stores.ErrInvalid", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := filestore.Open(cctx, "file://"+dir); !errors.Is(err, context.Canceled) {
		t.Errorf("Open on a cancelled context: %v", err)
	}
}

// TestClose: Close frees the Store's grants for others at once, signals
// their release, and makes later calls fail with ErrClosed.
func TestClose(t *testing.T) {
	dir := t.TempDir()
	s, other := newStore(t, dir), newStore(t, dir)
	ctx := t.Context()
	keys := []string{"a", "b"}
	if g, err := s.Acquire(ctx, keys, "t1", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	released, stop := s.NotifyRelease("a", "waiter")
	defer stop()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-released:
	default:
		t.Error("Close did not signal the release of a held key")
	}
	if g, err := other.Acquire(ctx, keys, "t2", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire in another Store after Close: %+v, %v; want granted", g, err)
	}
	if _, err := s.Acquire(ctx, []string{"c"}, "t3", time.Minute); !errors.Is(err, filestore.ErrClosed) {
		t.Errorf("Acquire after Close: %v, want ErrClosed", err)
	}
	if err := s.Release(ctx, keys, "t1", 0); !errors.Is(err, filestore.ErrClosed) {
		t.Errorf("Release after Close: %v, want ErrClosed", err)
	}
	if err := s.Refresh(ctx, keys, "t1", time.Minute); !errors.Is(err, filestore.ErrClosed) {
		t.Errorf("Refresh after Close: %v, want ErrClosed", err)
	}
	if ch, _ := s.NotifyRelease("a", "w"); ch != nil {
		t.Error("NotifyRelease after Close returned a channel")
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestFencesSurviveRestart: a new Store on the directory (a restarted
// process) issues fences a stride above the last ones, which the key file
// kept. The grants are retries of one token, which issue fences as any
// grant does.
func TestFencesSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := t.Context()
	s1, err := filestore.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	var last int64
	for range 200 {
		g, err := s1.Acquire(ctx, []string{"k"}, "t1", time.Minute)
		if err != nil || !g.OK {
			t.Fatalf("Acquire: %+v, %v", g, err)
		}
		last = g.Fences[0]
	}
	// Fences run ahead of the clock (a stride a grant, faster than one a
	// millisecond): only the key file can tell the new Store where they
	// stopped.
	if ahead := last - time.Now().UnixMicro(); ahead < 2*stores.FenceStride {
		t.Fatalf("precondition: the last fence %d is only %dµs ahead of the clock", last, ahead)
	}
	_ = s1.Close()
	g, err := newStore(t, dir).Acquire(ctx, []string{"k"}, "t2", time.Minute)
	if err != nil || !g.OK || g.Fences[0]-last < stores.FenceStride {
		t.Fatalf("Acquire in a new Store: %+v, %v; want a fence a stride above %d", g, err, last)
	}
}

// TestBounds: the Store takes keys of any length and TTLs up to 100 years,
// which another process reads back from the key file without overflow; a
// longer TTL or keep is refused with ErrInvalid, changing nothing.
func TestBounds(t *testing.T) {
	dir := t.TempDir()
	s, other := newStore(t, dir), newStore(t, dir)
	ctx := t.Context()
	b := s.Bounds()
	const century = 100 * 365 * 24 * time.Hour
	if b.MaxKeyBytes != 0 || b.MinTTL != 0 || b.MaxTTL != century || b.Reason == "" {
		t.Fatalf("Bounds %+v, want no key limit and TTLs up to 100 years, with a reason", b)
	}
	k := []string{"k"}
	for _, ttl := range []time.Duration{century + 1, math.MaxInt64} {
		if _, err := s.Acquire(ctx, k, "t1", ttl); !errors.Is(err, stores.ErrInvalid) {
			t.Fatalf("Acquire with TTL %v: %v, want ErrInvalid", ttl, err)
		}
	}
	g, err := s.Acquire(ctx, k, "t1", century)
	if err != nil || !g.OK {
		t.Fatalf("Acquire with the longest TTL: %+v, %v", g, err)
	}
	g, err = other.Acquire(ctx, k, "t2", time.Second)
	if err != nil || g.OK || g.Wait < century-time.Hour || g.Wait > century {
		t.Fatalf("another Store's Acquire: %+v, %v; want refused with Wait about 100 years", g, err)
	}
	if err := s.Refresh(ctx, k, "t1", century+1); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("Refresh beyond the longest TTL: %v, want ErrInvalid", err)
	}
	if err := s.Release(ctx, k, "t1", century+1); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("Release keeping the key beyond the longest TTL: %v, want ErrInvalid", err)
	}
	if g, err := other.Acquire(ctx, k, "t2", time.Second); err != nil || g.OK {
		t.Fatalf("after the refused calls: %+v, %v; want the key still held", g, err)
	}
	if err := s.Release(ctx, k, "t1", 0); err != nil {
		t.Fatal(err)
	}
}

// newStore returns a Store on a fresh temporary directory, closed when the
// test ends.
func newStore(t testing.TB, dir string) *filestore.Store {
	t.Helper()
	s, err := filestore.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Suite{
		New:    func(t *testing.T) stores.Store { return newStore(t, t.TempDir()) },
		Notify: true,
		Shared: true,
		// A refusal by another process's grant reads the holder's expiry
		// from the key file, which may not tell (see Store.Acquire).
		WaitUnknown: true,
		// Local files: no network to fail.
		InProcess: true,
	})
}
