package etcdstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/etcdstore"
	"github.com/reqlock/reqlock/stores/storetest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// hostPorts returns the shared etcd's endpoints as Open's host list.
func hostPorts(t *testing.T) string {
	t.Helper()
	var hps []string
	for _, e := range testservers.EtcdEndpoints(t) {
		hps = append(hps, strings.TrimPrefix(e, "http://"))
	}
	return strings.Join(hps, ",")
}

// uniqueKey returns a key of the test's own.
func uniqueKey(t *testing.T) string {
	return t.Name() + ":" + time.Now().Format("150405.000000000")
}

func TestOpen(t *testing.T) {
	t.Parallel()
	hosts := hostPorts(t)
	a, err := etcdstore.Open(t.Context(), "etcd://"+hosts+"/tenant-a?timeout=3s&dial-timeout=2s&max-request-bytes=3145728")
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = a.Close() })
	b, err := etcdstore.Open(t.Context(), "etcd://"+hosts+"/tenant-b")
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	a2, err := etcdstore.Open(t.Context(), "etcd://"+hosts+"/tenant-a/")
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = a2.Close() })

	if got, want := a.Bounds().MaxKeyBytes, b.Bounds().MaxKeyBytes; got <= want {
		t.Fatalf("MaxKeyBytes %d with max-request-bytes=3145728, %d without; want more", got, want)
	}
	k := []string{uniqueKey(t)}
	if g, err := a.Acquire(t.Context(), k, "t1", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire on tenant-a: %+v, %v", g, err)
	}
	if g, err := b.Acquire(t.Context(), k, "t2", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire of the same key on tenant-b: %+v, %v; want granted (another prefix)", g, err)
	}
	if g, err := a2.Acquire(t.Context(), k, "t3", time.Minute); err != nil || g.OK {
		t.Fatalf("Acquire on tenant-a/ (the same prefix): %+v, %v; want refused", g, err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestOpenUnreachable: Open fails at start-up when no member can be reached,
// naming the endpoints, unless connect=lazy; a lazy Store works once etcd
// answers (issue 19 item 6).
func TestOpenUnreachable(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, strings.Split(hostPorts(t), ",")[0])
	storetest.Startup(t, []*faultproxy.Proxy{p}, func(ctx context.Context, addrs []string, lazy bool) (stores.Store, error) {
		u := "etcd://" + addrs[0] + "/startup"
		if lazy {
			u += "?connect=lazy"
		}
		return etcdstore.Open(ctx, u)
	})
}

func TestOpenInvalid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ url, want string }{
		{"etcd://127.0.0.1:2379/%zz", "malformed prefix"},
		{"127.0.0.1:2379", "no scheme"},
		{"redis://127.0.0.1:2379", `scheme "redis"`},
		{"etcd:///prefix", "no endpoint"},
		{"etcd://127.0.0.1/prefix", `endpoint "127.0.0.1" is not host:port`},
		{"etcd://127.0.0.1:2379,/prefix", `endpoint "" is not host:port`},
		{"etcd://127.0.0.1:2379,:2380/prefix", `endpoint ":2380" is not host:port`},
		{"etcd://127.0.0.1:2379/p?ttl=10s", "parameter ttl"},
		{"etcd://127.0.0.1:2379/p?colour=red", `unknown URL option "colour"`},
		{"etcd://127.0.0.1:2379/p?timeout=0s", `timeout="0s" is not a positive duration`},
		{"etcd://127.0.0.1:2379/p?dial-timeout=soon", `dial-timeout="soon" is not a positive duration`},
		{"etcd://127.0.0.1:2379/p?timeout=1s&timeout=2s", "timeout given 2 times"},
		{"etcd://127.0.0.1:2379/p?max-request-bytes=1000", `max-request-bytes="1000" is not a number of bytes`},
		{"etcd://127.0.0.1:2379/p?connect=soon", `connect="soon": want check`},
	} {
		s, err := etcdstore.Open(t.Context(), tc.url)
		if s != nil {
			_ = s.Close()
		}
		if !errors.Is(err, stores.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q): %v; want stores.ErrInvalid naming %q", tc.url, err, tc.want)
		}
	}
	if _, err := etcdstore.Open(t.Context(), "etcd://u:secret@127.0.0.1/p"); !errors.Is(err, stores.ErrInvalid) || strings.Contains(err.Error(), "secret") {
		t.Errorf("Open with a password and a bad endpoint: %v; want an error without the password", err)
	}
}

func TestNewInvalid(t *testing.T) {
	t.Parallel()
	c := newClient(t, testservers.EtcdEndpoints(t))
	for name, tc := range map[string]struct {
		opt  etcdstore.Option
		want string
	}{
		"empty prefix":  {etcdstore.WithPrefix(""), "empty prefix"},
		"zero timeout":  {etcdstore.WithRequestTimeout(0), "WithRequestTimeout: 0s is not positive"},
		"small request": {etcdstore.WithMaxRequestBytes(1000), "WithMaxRequestBytes: 1000 is below 64 KiB"},
		"long prefix":   {etcdstore.WithPrefix(strings.Repeat("p", 200<<10)), "leaves no room for a key"},
	} {
		if _, err := etcdstore.New(c, tc.opt); !errors.Is(err, stores.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New: %v; want stores.ErrInvalid naming %q", name, err, tc.want)
		}
	}
	if _, err := etcdstore.New(nil); !errors.Is(err, stores.ErrInvalid) {
		t.Errorf("New(nil): %v; want stores.ErrInvalid", err)
	}
	s := newStore(t)
	ctx := t.Context()
	if _, err := s.Acquire(ctx, []string{"k"}, "", time.Second); !errors.Is(err, stores.ErrInvalid) {
		t.Errorf("Acquire with an empty token: %v; want stores.ErrInvalid", err)
	}
	many := make([]string, etcdstore.MaxKeys+1)
	for i := range many {
		many[i] = "k" + string(rune('a'+i/26)) + string(rune('a'+i%26))
	}
	if _, err := s.Acquire(ctx, many, "t", time.Second); !errors.Is(err, stores.ErrInvalid) {
		t.Errorf("Acquire of %d keys: %v; want stores.ErrInvalid", len(many), err)
	}
	if err := s.LeaveFair(ctx, "", "t"); !errors.Is(err, stores.ErrInvalid) {
		t.Errorf("LeaveFair of an empty key: %v; want stores.ErrInvalid", err)
	}
}

// TestKeysThatNestDoNotCollide: keys that would nest as etcd directories
// ("a" and "a/h/x", or keys with '%') are distinct locks.
func TestKeysThatNestDoNotCollide(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	base := uniqueKey(t)
	keys := []string{base, base + "/h/t2", base + "%2Fh%2Ft3", base + "/"}
	for i, k := range keys {
		tok := "t" + string(rune('1'+i))
		if g, err := s.Acquire(t.Context(), []string{k}, tok, time.Minute); err != nil || !g.OK {
			t.Fatalf("Acquire(%q) with %d other keys held: %+v, %v; want granted", k, i, g, err)
		}
	}
	for i, k := range keys {
		if err := s.Release(t.Context(), []string{k}, "t"+string(rune('1'+i)), 0); err != nil {
			t.Fatalf("Release(%q): %v", k, err)
		}
	}
}

// TestStaleReleaseSameLease: two acquisitions of one key by one Store share
// its etcd lease; a late retry of the first one's release finds the second
// one's grant and leaves it alone (etcd issue 22082: concurrency.Mutex
// identifies its owner by session, so a stale retry deletes a newer lock).
func TestStaleReleaseSameLease(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	c := newClient(t, testservers.EtcdEndpoints(t))
	k := uniqueKey(t)
	ctx := t.Context()
	if g, err := s.Acquire(ctx, []string{k}, "first", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	first := leaseOf(t, c, etcdstore.DefaultPrefix, k, "first")
	if err := s.Release(ctx, []string{k}, "first", 0); err != nil {
		t.Fatal(err)
	}
	if g, err := s.Acquire(ctx, []string{k}, "second", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	if second := leaseOf(t, c, etcdstore.DefaultPrefix, k, "second"); second != first {
		t.Fatalf("the two grants have leases %x and %x; the test needs one shared lease", first, second)
	}
	if err := s.Release(ctx, []string{k}, "first", 0); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("stale Release: %v; want stores.ErrNotHeld", err)
	}
	if err := s.Refresh(ctx, []string{k}, "first", time.Minute); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("stale Refresh: %v; want stores.ErrNotHeld", err)
	}
	if g, err := s.Acquire(ctx, []string{k}, "third", time.Minute); err != nil || g.OK {
		t.Fatalf("Acquire after the stale Release: %+v, %v; want refused, the second grant holds", g, err)
	}
}

// TestCloseRevokesLeases: Close frees the Store's locks at once, not at
// their TTL (etcd issue 17470: a lease kept alive after its client left).
func TestCloseRevokesLeases(t *testing.T) {
	t.Parallel()
	a, err := etcdstore.New(newClient(t, testservers.EtcdEndpoints(t)))
	if err != nil {
		t.Fatal(err)
	}
	b := newStore(t)
	k := []string{uniqueKey(t)}
	if g, err := a.Acquire(t.Context(), k, "a", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if g, err := b.Acquire(t.Context(), k, "b", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire right after the holder's Store closed: %+v, %v; want granted", g, err)
	}
	other := []string{uniqueKey(t) + "-free"}
	if _, err := a.Acquire(t.Context(), other, "a2", time.Minute); !errors.Is(err, etcdstore.ErrClosed) || !errors.Is(err, stores.ErrUnreachable) {
		t.Fatalf("Acquire of a free key on a closed Store: %v; want etcdstore.ErrClosed (stores.ErrUnreachable)", err)
	}
	if err := a.Release(t.Context(), k, "a", 0); !errors.Is(err, etcdstore.ErrClosed) {
		t.Fatalf("Release on a closed Store: %v; want etcdstore.ErrClosed", err)
	}
	if ch, stop := a.NotifyRelease(k[0], "w"); ch != nil {
		stop()
		t.Fatal("NotifyRelease on a closed Store returned a channel")
	}
}

// TestLostLeaseEndsTheLock: when the holder's lease is gone (revoked here,
// as after an expiry in a partition), Refresh says ErrNotHeld, and a
// Locker's lock context ends with ErrLockLost at its next renewal (etcd
// issue 19597: a holder that went on after its session expired).
func TestLostLeaseEndsTheLock(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	c := newClient(t, testservers.EtcdEndpoints(t))
	locker, err := reqlock.New(s)
	if err != nil {
		t.Fatal(err)
	}
	k := uniqueKey(t)
	lock, err := locker.Obtain(t.Context(), k, 3*time.Second, 0)
	if err != nil {
		t.Fatalf("Obtain: %v", err)
	}
	ctx := lock.KeepAlive(t.Context())
	// The Locker's default key prefix is "reqlock:".
	if _, err := c.Revoke(t.Context(), leaseOf(t, c, etcdstore.DefaultPrefix, "reqlock:"+k, lock.Token())); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	select {
	case <-ctx.Done():
		if !errors.Is(context.Cause(ctx), reqlock.ErrLockLost) {
			t.Fatalf("lock context ended with %v, want reqlock.ErrLockLost", context.Cause(ctx))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the lock context did not end within 5s of its lease's loss")
	}
	if err := s.Refresh(t.Context(), []string{k}, lock.Token(), time.Second); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("Refresh after the lease's loss: %v; want stores.ErrNotHeld", err)
	}
}

// TestFairWaitersWakeInTurn: waiters queued in one Store are woken one at
// a time, in queue order: a release signals only the head.
func TestFairWaitersWakeInTurn(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	k := uniqueKey(t)
	ctx := t.Context()
	if g, err := s.Acquire(ctx, []string{k}, "holder", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	const n = 4
	chs := make([]<-chan struct{}, n)
	for i := range n {
		tok := "w" + string(rune('0'+i))
		var stop func()
		chs[i], stop = s.NotifyRelease(k, tok)
		t.Cleanup(stop)
		if g, err := s.AcquireFair(ctx, k, tok, time.Minute, time.Minute); err != nil || g.OK || g.Ahead != i {
			t.Fatalf("AcquireFair(%s): %+v, %v; want refused with %d ahead", tok, g, err, i)
		}
	}
	prev := "holder"
	for i := range n {
		if err := s.Release(ctx, []string{k}, prev, 0); err != nil {
			t.Fatal(err)
		}
		select {
		case <-chs[i]:
		case <-time.After(5 * time.Second):
			t.Fatalf("waiter %d not signalled within 5s of its turn", i)
		}
		for j := i + 1; j < n; j++ {
			select {
			case <-chs[j]:
				t.Fatalf("waiter %d signalled on waiter %d's turn", j, i)
			default:
			}
		}
		prev = "w" + string(rune('0'+i))
		if g, err := s.AcquireFair(ctx, k, prev, time.Minute, time.Minute); err != nil || !g.OK {
			t.Fatalf("AcquireFair(%s) on its turn: %+v, %v", prev, g, err)
		}
	}
}
