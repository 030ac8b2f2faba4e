//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package filestore_test

import (
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// TestReleaseWaited: a release reports whether another token was refused
// its keys while the grant stood, by this Store or by another one on the
// directory (another process); not a refusal of an earlier grant, and not
// the releasing Store's own refusal by another's grant (issue 18, defect
// 21).
func TestReleaseWaited(t *testing.T) {
	dir := t.TempDir()
	s1, s2 := newStore(t, dir), newStore(t, dir)
	ctx := t.Context()
	acquire := func(s stores.Store, keys []string, token string, want bool) {
		t.Helper()
		g, err := s.Acquire(ctx, keys, token, 10*time.Second)
		if err != nil || g.OK != want {
			t.Fatalf("Acquire %q by %s: %+v, %v; want granted %v", keys, token, g, err, want)
		}
	}
	waited := func(s stores.WaitReporter, keys []string, token string, want bool, what string) {
		t.Helper()
		got, err := s.ReleaseWaited(ctx, keys, token, 0)
		if err != nil || got != want {
			t.Fatalf("%s: ReleaseWaited %v, %v; want %v", what, got, err, want)
		}
	}
	k := []string{"k"}

	acquire(s1, k, "t1", true)
	waited(s1, k, "t1", false, "nobody refused")

	acquire(s1, k, "t1", true)
	acquire(s2, k, "t2", false)
	waited(s1, k, "t1", true, "another Store refused")

	acquire(s1, k, "t1", true) // s2's refusal was of the grant before
	waited(s1, k, "t1", false, "a refusal of the grant before")

	acquire(s2, k, "t2", true) // its own refusal, by s1's grant, is in the file
	waited(s2, k, "t2", false, "the releasing Store's own refusal")

	acquire(s1, k, "t1", true)
	acquire(s1, k, "t2", false)
	waited(s1, k, "t1", true, "a refusal by the same Store")

	both := []string{"a", "b"}
	acquire(s1, both, "t1", true)
	acquire(s2, []string{"b"}, "t2", false)
	waited(s1, both, "t1", true, "a refusal of one of the keys")

	acquire(s1, k, "t1", true)
	acquire(s2, k, "t2", false)
	if got, err := s1.ReleaseWaited(ctx, k, "t1", time.Minute); err != nil || !got {
		t.Fatalf("a release that keeps the key: ReleaseWaited %v, %v; want true", got, err)
	}
}
