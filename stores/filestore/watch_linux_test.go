package filestore_test

import (
	"testing"
	"time"
)

// signalled fails the test unless released signals within 5s.
func signalled(t *testing.T, released <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-released:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: no release signal within 5s", what)
	}
}

// TestOtherStoresReleaseSignals: a Store's waiters are signalled when
// another Store on the directory (another process) releases, or lets
// expire, a grant that refused them; a release nobody of the Store was
// refused stays unsignalled, as it costs no system call (issue 18, defect
// 21).
func TestOtherStoresReleaseSignals(t *testing.T) {
	dir := t.TempDir()
	holder, waiter := newStore(t, dir), newStore(t, dir)
	ctx := t.Context()
	refuse := func(key string, ttl time.Duration) <-chan struct{} {
		t.Helper()
		if g, err := holder.Acquire(ctx, []string{key}, "holder", ttl); err != nil || !g.OK {
			t.Fatalf("Acquire of %s: %+v, %v", key, g, err)
		}
		if g, err := waiter.Acquire(ctx, []string{key}, "waiter", time.Minute); err != nil || g.OK {
			t.Fatalf("Acquire of %s held by another Store: %+v, %v; want refused", key, g, err)
		}
		released, stop := waiter.NotifyRelease(key, "waiter")
		t.Cleanup(stop)
		return released
	}

	released := refuse("released", time.Minute)
	if err := holder.Release(ctx, []string{"released"}, "holder", 0); err != nil {
		t.Fatal(err)
	}
	signalled(t, released, "a release")

	expired := refuse("expired", 50*time.Millisecond)
	signalled(t, expired, "an expiry")

	// A release that refused nobody rings nothing. The watcher reads the
	// rings in order: once the next key's signal has come, this one's
	// would have too.
	if g, err := holder.Acquire(ctx, []string{"quiet"}, "holder", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	quiet, stop := waiter.NotifyRelease("quiet", "waiter")
	defer stop()
	if err := holder.Release(ctx, []string{"quiet"}, "holder", 0); err != nil {
		t.Fatal(err)
	}
	last := refuse("last", time.Minute)
	if err := holder.Release(ctx, []string{"last"}, "holder", 0); err != nil {
		t.Fatal(err)
	}
	signalled(t, last, "the last release")
	select {
	case <-quiet:
		t.Fatal("a release that refused nobody of the Store signalled it")
	default:
	}
}

// TestOtherProcessReleaseSignals: a waiter refused by another process's
// grant is signalled when that process releases it.
func TestOtherProcessReleaseSignals(t *testing.T) {
	dir := t.TempDir()
	s := newStore(t, dir)
	ctx := t.Context()
	c := startChild(t, dir)
	c.send(t, "granted", "acquire", "1m", "k")
	if g, err := s.Acquire(ctx, []string{"k"}, "parent", time.Minute); err != nil || g.OK {
		t.Fatalf("Acquire of a key another process holds: %+v, %v; want refused", g, err)
	}
	released, stop := s.NotifyRelease("k", "parent")
	defer stop()
	c.send(t, "released", "release", "k")
	signalled(t, released, "another process's release")
	if g, err := s.Acquire(ctx, []string{"k"}, "parent", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire after the signal: %+v, %v; want granted", g, err)
	}
}
