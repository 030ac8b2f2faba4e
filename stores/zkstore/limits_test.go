package zkstore_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
	"github.com/reqlock/reqlock/stores/zkstore"
)

// TestBounds: a Store's Bounds are the session timeout the server granted,
// whole milliseconds, and the longest key a request takes; Reason names the
// URL parameter. A session timeout beyond the server's maxSessionTimeout
// (60s for the test server) is what the server grants.
func TestBounds(t *testing.T) {
	s := newStore(t, zkstore.WithSessionTimeout(3*time.Second))
	b := s.Bounds()
	if b.MaxTTL != 3*time.Second || b.MinTTL != time.Millisecond {
		t.Fatalf("TTL bounds [%v, %v], want [1ms, 3s]", b.MinTTL, b.MaxTTL)
	}
	if b.MaxKeyBytes < 55_000 || b.MaxKeyBytes > 58_254 {
		t.Fatalf("MaxKeyBytes %d, want about 58,000 (1 MiB in 6 paths of 3 bytes per key byte)", b.MaxKeyBytes)
	}
	for _, want := range []string{"session timeout", "session=3s", "jute.maxbuffer"} {
		if !strings.Contains(b.Reason, want) {
			t.Errorf("Reason %q does not name %q", b.Reason, want)
		}
	}

	long := newStore(t, zkstore.WithSessionTimeout(100*time.Second))
	if b := long.Bounds(); b.MaxTTL != 60*time.Second || !strings.Contains(b.Reason, "granted") {
		t.Fatalf("asking 100s of a server whose maxSessionTimeout is 60s: MaxTTL %v, Reason %q; want 60s, granted", b.MaxTTL, b.Reason)
	}
}

// TestOutOfBoundsRefused (issue 18, defect 11): every duration out of the
// Store's range, math.MaxInt64 included, and every key too long is refused
// with ErrInvalid before anything changes; the Locker refuses them too,
// naming the session timeout.
func TestOutOfBoundsRefused(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	maxTTL := s.Bounds().MaxTTL
	keys := []string{"k"}
	if g, err := s.Acquire(ctx, keys, "t1", time.Second); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	tooLong := strings.Repeat("x", s.Bounds().MaxKeyBytes+1)
	for name, err := range map[string]error{
		"Acquire MaxInt64":      second(s.Acquire(ctx, []string{"free"}, "t", math.MaxInt64)),
		"Acquire above MaxTTL":  second(s.Acquire(ctx, []string{"free"}, "t", maxTTL+time.Millisecond)),
		"Acquire below MinTTL":  second(s.Acquire(ctx, []string{"free"}, "t", time.Microsecond)),
		"Acquire long key":      second(s.Acquire(ctx, []string{tooLong}, "t", time.Second)),
		"Refresh MaxInt64":      s.Refresh(ctx, keys, "t1", math.MaxInt64),
		"Refresh long key":      s.Refresh(ctx, []string{tooLong}, "t1", time.Second),
		"Release keep MaxInt64": s.Release(ctx, keys, "t1", math.MaxInt64),
		"Release long key":      s.Release(ctx, []string{tooLong}, "t1", 0),
		"AcquireFair ttl":       second(s.AcquireFair(ctx, "free", "t", math.MaxInt64, 0)),
		"AcquireFair lease":     second(s.AcquireFair(ctx, "free", "t", time.Second, math.MaxInt64)),
		"AcquireFair long key":  second(s.AcquireFair(ctx, tooLong, "t", time.Second, time.Second)),
		"LeaveFair long key":    s.LeaveFair(ctx, tooLong, "t"),
		"AcquireFair short ttl": second(s.AcquireFair(ctx, "free", "t", time.Nanosecond, 0)),
		"Release short keep":    s.Release(ctx, keys, "t1", time.Nanosecond),
	} {
		if !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
		if err != nil && len(err.Error()) > 1000 {
			t.Errorf("%s: a message of %d bytes quotes the key", name, len(err.Error()))
		}
	}
	if ch, stop := s.NotifyRelease(tooLong, "w"); ch != nil {
		stop()
		t.Error("NotifyRelease of a key too long: a channel, want nil")
	}
	// Nothing changed: the held key is still held for its TTL, the free one
	// is free.
	other := sameRootStore(t, s)
	if g, err := other.Acquire(ctx, keys, "t2", time.Second); err != nil || g.OK || g.Wait <= 0 || g.Wait > time.Second {
		t.Fatalf("Acquire of the held key: %+v, %v; want refused, with a Wait within its 1s TTL", g, err)
	}
	if g, err := other.Acquire(ctx, []string{"free"}, "t2", time.Second); err != nil || !g.OK {
		t.Fatalf("Acquire of the free key: %+v, %v", g, err)
	}

	locker, err := reqlock.New(s)
	if err != nil {
		t.Fatal(err)
	}
	_, err = locker.Obtain(ctx, "k", math.MaxInt64, 0)
	if !errors.Is(err, reqlock.ErrInvalid) || !strings.Contains(err.Error(), "session=10s") {
		t.Fatalf("Obtain with a TTL of math.MaxInt64: %v; want ErrInvalid naming session=10s", err)
	}
}

func second[T any](_ T, err error) error { return err }

// TestLongKeysServeOthers (issue 18, defect 10): a key too long for a
// ZooKeeper request (600 KB), and keys that together are, are refused with
// ErrInvalid before any request, so the connection stays up and every other
// key's calls go on; a key of MaxKeyBytes whose every byte is escaped works
// through every call, a fair grant that takes over an expired grant
// included (the largest request). Before the fix, the server closed the
// connection on the 600 KB key's request, failing every call in flight.
func TestLongKeysServeOthers(t *testing.T) {
	s, p := proxiedStore(t)
	ctx := t.Context()

	// Other keys' calls, all through the test.
	stop := make(chan struct{})
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed []error
	)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key, token := fmt.Sprintf("other-%d", w), fmt.Sprintf("t%d-%d", w, i)
				g, err := s.Acquire(ctx, []string{key}, token, time.Second)
				if err == nil && g.OK {
					err = s.Release(ctx, []string{key}, token, 0)
				} else if err == nil {
					err = fmt.Errorf("refused: %+v", g)
				}
				if err != nil {
					mu.Lock()
					failed = append(failed, err)
					mu.Unlock()
				}
			}
		})
	}

	huge := strings.Repeat("k", 600_000)
	checkInvalid := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", what, err)
		}
	}
	checkInvalid("Acquire of a 600 KB key", second(s.Acquire(ctx, []string{huge}, "t", time.Second)))
	checkInvalid("Refresh of a 600 KB key", s.Refresh(ctx, []string{huge}, "t", time.Second))
	checkInvalid("Release of a 600 KB key", s.Release(ctx, []string{huge}, "t", 0))
	checkInvalid("AcquireFair of a 600 KB key", second(s.AcquireFair(ctx, huge, "t", time.Second, time.Second)))

	// Keys each within MaxKeyBytes whose sum is not.
	max := s.Bounds().MaxKeyBytes
	var many []string
	for i := range 10 {
		many = append(many, fmt.Sprintf("%d-%s", i, strings.Repeat("m", max-10)))
	}
	checkInvalid("Acquire of 10 keys of MaxKeyBytes", second(s.Acquire(ctx, many, "t", time.Second)))
	checkInvalid("Release of 10 keys of MaxKeyBytes", s.Release(ctx, many, "t", 0))

	// The longest key, every byte escaped (%FF): every call works.
	longest := strings.Repeat("\xff", max)
	other := sameRootStore(t, s)
	if g, err := other.Acquire(ctx, []string{longest}, "expired", time.Second); err != nil || !g.OK {
		t.Fatalf("Acquire of the longest key: %+v, %v", g, err)
	}
	if g, err := s.AcquireFair(ctx, longest, "fair", time.Second, time.Second); err != nil || g.OK || g.Ahead != 0 {
		t.Fatalf("AcquireFair of the longest key, held: %+v, %v; want queued at the head", g, err)
	}
	pollUntil(t, 5*time.Second, "the fair waiter takes the expired grant over", func() bool {
		g, err := s.AcquireFair(ctx, longest, "fair", time.Second, time.Second)
		if err != nil {
			t.Fatalf("AcquireFair of the longest key: %v", err)
		}
		return g.OK
	})
	if err := s.Refresh(ctx, []string{longest}, "fair", time.Second); err != nil {
		t.Fatalf("Refresh of the longest key: %v", err)
	}
	if err := s.Release(ctx, []string{longest}, "fair", 0); err != nil {
		t.Fatalf("Release of the longest key: %v", err)
	}
	if g, err := s.Acquire(ctx, []string{"a", longest}, "multi", time.Second); err != nil || !g.OK {
		t.Fatalf("Acquire of the longest key and another: %+v, %v", g, err)
	}
	if err := s.Release(ctx, []string{"a", longest}, "multi", time.Second); err != nil {
		t.Fatalf("Release with keep of the longest key and another: %v", err)
	}

	close(stop)
	wg.Wait()
	if len(failed) > 0 {
		t.Errorf("%d calls on other keys failed, the first: %v", len(failed), failed[0])
	}
	if n := p.Accepted(); n != 1 {
		t.Errorf("%d connections to the server, want 1: the server closed one", n)
	}
}

// TestUnreadableNodes (issue 18, defect 11): lock and queue nodes whose
// data this Store cannot read (another version's, or a TTL that overflowed)
// are held, by a token nobody has, for as long as they stand: a refusal,
// never a store failure; a lock node without a holder node (another
// version's grant) is taken over once expired. Before the fix, every call
// on such a key failed.
func TestUnreadableNodes(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	ttl := time.Second
	for i, data := range []string{"-9223372036854\nx", "garbage", "", "99999999999999999999\nx", "60000\n"} {
		key := fmt.Sprintf("bad-%d", i)
		owner := rawConn(t)
		if _, err := owner.Create(s.Root()+"/"+key, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
		if _, err := owner.Create(s.Root()+"/"+key+"/lock", []byte(data), zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
		if g, err := s.Acquire(ctx, []string{key}, "t", ttl); err != nil || g.OK {
			t.Errorf("Acquire of a key whose lock node holds %q: %+v, %v; want refused", data, g, err)
		}
		if err := s.Refresh(ctx, []string{key}, "t", ttl); !errors.Is(err, stores.ErrNotHeld) {
			t.Errorf("Refresh of a key whose lock node holds %q: %v, want ErrNotHeld", data, err)
		}
		if err := s.Release(ctx, []string{key}, "t", 0); !errors.Is(err, stores.ErrNotHeld) {
			t.Errorf("Release of a key whose lock node holds %q: %v, want ErrNotHeld", data, err)
		}
		if g, err := s.AcquireFair(ctx, key, "f", ttl, ttl); err != nil || g.OK {
			t.Errorf("AcquireFair of a key whose lock node holds %q: %+v, %v; want refused", data, g, err)
		}
		if err := s.LeaveFair(ctx, key, "f"); err != nil {
			t.Errorf("LeaveFair: %v", err)
		}
		owner.Close() // its session ends: the node goes
		pollUntil(t, 10*time.Second, "the key is granted once the node's session ended", func() bool {
			g, err := s.Acquire(ctx, []string{key}, "t", ttl)
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			return g.OK
		})
	}

	// A queue node whose lease is unreadable heads the queue: a waiter
	// behind it is refused, not failed.
	owner := rawConn(t)
	if _, err := owner.Create(s.Root()+"/q", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Create(s.Root()+"/q/q-other-", []byte("soon"), zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if g, err := s.AcquireFair(ctx, "q", "f", ttl, ttl); err != nil || g.OK || g.Ahead != 1 {
		t.Fatalf("AcquireFair behind a queue node with an unreadable lease: %+v, %v; want refused, 1 ahead", g, err)
	}

	// A lock node without a holder node, expired: taken over.
	if _, err := owner.Create(s.Root()+"/bare", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Create(s.Root()+"/bare/lock", []byte("1\nold"), zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 5*time.Second, "the expired grant without a holder node is taken over", func() bool {
		g, err := s.Acquire(ctx, []string{"bare"}, "t", ttl)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		return g.OK
	})
	if err := s.Release(ctx, []string{"bare"}, "t", 0); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// TestUndoOutlastsLostConnection: an Acquire abandoned while its reply is
// late, whose clean-up's first try is cut off with its connection, is
// still undone once the Store reconnects, not left for its TTL.
func TestUndoOutlastsLostConnection(t *testing.T) {
	s, p := proxiedStore(t, zkstore.WithSessionTimeout(30*time.Second)) // pings every 10s: the next reply is the Acquire's
	other := sameRootStore(t, s)
	key := "undo-" + strings.Repeat("u", 8)
	// The key's parent node exists: the Acquire is one request.
	if g, err := s.Acquire(t.Context(), []string{key}, "t0", time.Second); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	if err := s.Release(t.Context(), []string{key}, "t0", 0); err != nil {
		t.Fatal(err)
	}
	p.DelayNext(faultproxy.ToClient, time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	_, err := s.Acquire(ctx, []string{key}, "t1", 30*time.Second)
	cancel()
	if !errors.Is(err, stores.ErrAbandoned) {
		t.Fatalf("Acquire with a late reply: %v, want ErrAbandoned", err)
	}
	// The undo's first request (the only one naming the key) is cut off.
	p.CutWhen(faultproxy.ToServer, func(chunk []byte) bool { return strings.Contains(string(chunk), key) }, false)
	pollUntil(t, 5*time.Second, "the abandoned grant is undone", func() bool {
		g, err := other.Acquire(t.Context(), []string{key}, "t2", time.Second)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		return g.OK
	})
	pollUntil(t, 5*time.Second, "the undo finishes", func() bool { return s.InFlight() == 0 })
	if p.Accepted() < 2 {
		t.Fatal("the undo's first request was not cut off")
	}
}

// TestLapsedWaitersAheadOfLongKey: on a key of MaxKeyBytes, the lapsed
// waiters ahead of a fair waiter are too long to drop in the transaction
// that grants it the key, which would exceed ZooKeeper's request limit: it
// drops them in transactions of their own, and is then granted the key.
func TestLapsedWaitersAheadOfLongKey(t *testing.T) {
	s := newStore(t)
	holder := sameRootStore(t, s)
	lapsing := sameRootStore(t, s)
	ctx := t.Context()
	key := strings.Repeat("\xff", s.Bounds().MaxKeyBytes)
	const ttl, lease = 3 * time.Second, time.Second
	if g, err := holder.Acquire(ctx, []string{key}, "holder", ttl); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	for _, w := range []string{"w1", "w2"} {
		if g, err := lapsing.AcquireFair(ctx, key, w, ttl, lease); err != nil || g.OK {
			t.Fatalf("AcquireFair of %s: %+v, %v; want queued", w, g, err)
		}
	}
	if g, err := s.AcquireFair(ctx, key, "me", ttl, ttl); err != nil || g.OK || g.Ahead != 2 {
		t.Fatalf("AcquireFair behind two waiters: %+v, %v; want queued, 2 ahead", g, err)
	}
	// No attempt until the holder's TTL has passed (the scenario itself):
	// then the key is free, and each lapsed waiter is dropped once it heads
	// the queue (a waiter is aged from when it is first read), the last of
	// them by the attempt that is granted the key.
	<-time.After(ttl)
	pollUntil(t, 10*time.Second, "the waiter is granted the key past the lapsed ones", func() bool {
		g, err := s.AcquireFair(ctx, key, "me", ttl, ttl)
		if err != nil {
			t.Fatalf("AcquireFair past the holder's TTL: %v", err)
		}
		return g.OK
	})
	if q := queueNodes(t, s.Root()+"/"+strings.Repeat("%FF", len(key))); len(q) != 0 {
		t.Fatalf("%d queue nodes left", len(q))
	}
}
