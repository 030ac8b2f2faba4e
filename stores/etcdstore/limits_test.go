package etcdstore_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/etcdstore"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// TestSlowRoundTripGrantsShortTTL (issue 18, defect 13): with a 300ms
// round trip to etcd, an Acquire of 1.77s is granted at once, and the key
// is held 1.77s from the call's start. Its fresh lease of 2s has less than
// 1.77s left once the grant has answered; judged from the answer, every
// new lease was too short, and a new one of the same size was requested
// until the call timed out.
func TestSlowRoundTripGrantsShortTTL(t *testing.T) {
	t.Parallel()
	s, p := proxiedStore(t)
	p.Delay(faultproxy.Both, 150*time.Millisecond)
	direct := newClient(t, testservers.EtcdEndpoints(t))
	const ttl = 1770 * time.Millisecond
	k := uniqueKey(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	start := time.Now()
	g, err := s.Acquire(ctx, []string{k}, "t1", ttl)
	took := time.Since(start)
	if err != nil || !g.OK {
		t.Fatalf("Acquire of %v over a 300ms round trip: %+v, %v after %v; want granted", ttl, g, err, took)
	}
	if took > 3*time.Second {
		t.Fatalf("Acquire of %v over a 300ms round trip took %v", ttl, took)
	}
	// The key is held until at least start + ttl: the Locker's validity.
	<-time.After(time.Until(start.Add(ttl - 50*time.Millisecond))) // the TTL's passing itself
	resp, err := direct.Get(t.Context(), etcdstore.DefaultPrefix+k+"/holder")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the key %v after the Acquire's start, within its TTL %v: %v, %d holder keys; want held", time.Since(start), ttl, err, len(resp.Kvs))
	}
	if err := s.Release(t.Context(), []string{k}, "t1", 0); err != nil {
		t.Fatal(err)
	}
}

// stalledStore returns a Store on the shared etcd through a proxy that is
// stalled both ways once the Store has made its first request: any later
// request hangs.
func stalledStore(t *testing.T, opts ...etcdstore.Option) *etcdstore.Store {
	t.Helper()
	s, p := proxiedStore(t, opts...)
	k := []string{uniqueKey(t) + ":warm"}
	if g, err := s.Acquire(t.Context(), k, "warm", time.Minute); err != nil || !g.OK {
		t.Fatalf("warm-up Acquire: %+v, %v", g, err)
	}
	if err := s.Release(t.Context(), k, "warm", 0); err != nil {
		t.Fatal(err)
	}
	p.Stall(faultproxy.Both)
	t.Cleanup(p.Heal) // before the Store's Close, which revokes its leases
	return s
}

// refusedAtOnce fails the test unless call, on a Store whose etcd is
// stalled, returns an error wrapping stores.ErrInvalid at once, without
// waiting for etcd, with a message of less than 1000 bytes that says want.
func refusedAtOnce(t *testing.T, what, want string, call func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	start := time.Now()
	err := call(ctx)
	if took := time.Since(start); took > time.Second {
		t.Errorf("%s: returned after %v with etcd stalled: it made a request", what, took)
	}
	if !errors.Is(err, stores.ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Fatalf("%s: %.300v; want stores.ErrInvalid saying %q", what, err, want)
	}
	if n := len(err.Error()); n > 1000 {
		t.Fatalf("%s: an error message of %d bytes: %.200s...", what, n, err)
	}
}

// What refusals say, by cause.
const (
	outOfRange = "out of the store's range"
	tooLong    = "longer than the store's limit"
	tooLarge   = "above etcd's limit"
)

// TestExtremeTTLs (issue 18, defect 14): a TTL, keep or fair lease above
// MaxTTL (whose lease, an eighth longer, is etcd's longest), math.MaxInt64
// among them, is refused with stores.ErrInvalid before any request (it
// overflowed the lease's margin and flooded etcd with leases until the
// call timed out); MaxTTL itself is honoured by etcd.
func TestExtremeTTLs(t *testing.T) {
	t.Parallel()
	s := stalledStore(t)
	if b := s.Bounds(); b.MaxTTL != etcdstore.MaxTTL || b.MinTTL != 0 {
		t.Fatalf("Bounds %+v; want MaxTTL %v and no MinTTL", b, etcdstore.MaxTTL)
	}
	k := uniqueKey(t)
	for _, d := range []time.Duration{etcdstore.MaxTTL + 1, math.MaxInt64} {
		refusedAtOnce(t, "Acquire with TTL "+d.String(), outOfRange, func(ctx context.Context) error {
			_, err := s.Acquire(ctx, []string{k}, "t1", d)
			return err
		})
		refusedAtOnce(t, "Refresh to TTL "+d.String(), outOfRange, func(ctx context.Context) error {
			return s.Refresh(ctx, []string{k}, "t1", d)
		})
		refusedAtOnce(t, "Release keeping for "+d.String(), outOfRange, func(ctx context.Context) error {
			return s.Release(ctx, []string{k}, "t1", d)
		})
		refusedAtOnce(t, "AcquireFair with TTL "+d.String(), outOfRange, func(ctx context.Context) error {
			_, err := s.AcquireFair(ctx, k, "t1", d, time.Second)
			return err
		})
		refusedAtOnce(t, "AcquireFair with lease "+d.String(), outOfRange, func(ctx context.Context) error {
			_, err := s.AcquireFair(ctx, k, "t1", time.Second, d)
			return err
		})
	}

	// MaxTTL, through a Store whose etcd answers.
	s = newStore(t)
	keys := []string{k}
	if g, err := s.Acquire(t.Context(), keys, "t1", etcdstore.MaxTTL); err != nil || !g.OK {
		t.Fatalf("Acquire with TTL MaxTTL: %+v, %v", g, err)
	}
	if g, err := s.Acquire(t.Context(), keys, "t2", time.Second); err != nil || g.OK || g.Wait != etcdstore.MaxTTL {
		t.Fatalf("Acquire of the key held for MaxTTL: %+v, %v; want refused with Wait %v", g, err, etcdstore.MaxTTL)
	}
	if g, err := s.AcquireFair(t.Context(), k, "w1", time.Second, etcdstore.MaxTTL); err != nil || g.OK || g.Ahead != 0 {
		t.Fatalf("AcquireFair with lease MaxTTL of the held key: %+v, %v; want queued", g, err)
	}
	if err := s.LeaveFair(t.Context(), k, "w1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Refresh(t.Context(), keys, "t1", etcdstore.MaxTTL); err != nil {
		t.Fatalf("Refresh to MaxTTL: %v", err)
	}
	if err := s.Release(t.Context(), keys, "t1", etcdstore.MaxTTL); err != nil {
		t.Fatalf("Release keeping the key for MaxTTL: %v", err)
	}
	if g, err := s.Acquire(t.Context(), keys, "t2", time.Second); err != nil || g.OK {
		t.Fatalf("Acquire of the key kept for MaxTTL: %+v, %v; want refused", g, err)
	}
	// Close revokes the Store's leases: the key goes with them.
}

// TestLongKeys (issue 18, defect 15): a key longer than MaxKeyBytes (600
// KB here, which failed as an unknown-outcome store failure quoting the
// whole key), or keys that together make a request too large for etcd,
// are refused with stores.ErrInvalid before any request, in a short
// message; a key of MaxKeyBytes, every byte of it escaped to three, with a
// token of 1 KiB, works in every call against the real etcd.
func TestLongKeys(t *testing.T) {
	t.Parallel()
	s := stalledStore(t)
	maxKey := s.Bounds().MaxKeyBytes
	if maxKey != 35<<10 {
		t.Fatalf("MaxKeyBytes %d with the default prefix and request size; want 35 KiB", maxKey)
	}
	base := uniqueKey(t)
	for _, n := range []int{maxKey + 1, 600 << 10} {
		long := base + strings.Repeat("x", n-len(base))
		what := "a key of " + byteCount(n)
		refusedAtOnce(t, what+": Acquire", tooLong, func(ctx context.Context) error {
			_, err := s.Acquire(ctx, []string{long}, "t1", time.Minute)
			return err
		})
		refusedAtOnce(t, what+": Refresh", tooLong, func(ctx context.Context) error {
			return s.Refresh(ctx, []string{long}, "t1", time.Minute)
		})
		refusedAtOnce(t, what+": Release", tooLong, func(ctx context.Context) error {
			return s.Release(ctx, []string{long}, "t1", 0)
		})
		refusedAtOnce(t, what+": AcquireFair", tooLong, func(ctx context.Context) error {
			_, err := s.AcquireFair(ctx, long, "t1", time.Minute, time.Second)
			return err
		})
		refusedAtOnce(t, what+": LeaveFair", tooLong, func(ctx context.Context) error {
			return s.LeaveFair(ctx, long, "t1")
		})
		if ch, stop := s.NotifyRelease(long, "t1"); ch != nil {
			stop()
			t.Fatalf("NotifyRelease of %s: a channel; want nil", what)
		}
	}
	// Keys each within MaxKeyBytes, too many bytes together.
	many := make([]string, etcdstore.MaxKeys)
	for i := range many {
		many[i] = base + string(rune('A'+i/26)) + string(rune('a'+i%26)) + strings.Repeat("/", maxKey-len(base)-2)
	}
	refusedAtOnce(t, "64 keys of MaxKeyBytes: Acquire", tooLarge, func(ctx context.Context) error {
		_, err := s.Acquire(ctx, many, "t1", time.Minute)
		return err
	})
	refusedAtOnce(t, "a key with a 1 MiB token: Acquire", tooLarge, func(ctx context.Context) error {
		_, err := s.Acquire(ctx, []string{base}, strings.Repeat("t", 1<<20), time.Minute)
		return err
	})

	// The longest key, and the worst to escape, through an etcd that
	// answers: every call fits its request.
	s = newStore(t)
	longest := base + strings.Repeat("/", maxKey-len(base))
	token, other := strings.Repeat("a", 1<<10), strings.Repeat("b", 1<<10)
	keys := []string{longest}
	if g, err := s.Acquire(t.Context(), keys, token, time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire of the longest key: %+v, %v", g, err)
	}
	released, stop := s.NotifyRelease(longest, other)
	defer stop()
	if g, err := s.AcquireFair(t.Context(), longest, other, time.Minute, time.Minute); err != nil || g.OK || g.Ahead != 0 {
		t.Fatalf("AcquireFair of the held longest key: %+v, %v; want queued first", g, err)
	}
	if err := s.Refresh(t.Context(), keys, token, time.Minute); err != nil {
		t.Fatalf("Refresh of the longest key: %v", err)
	}
	if err := s.Release(t.Context(), keys, token, 0); err != nil {
		t.Fatalf("Release of the longest key: %v", err)
	}
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Fatal("no release signal for the longest key within 10s")
	}
	if g, err := s.AcquireFair(t.Context(), longest, other, time.Minute, time.Minute); err != nil || !g.OK {
		t.Fatalf("AcquireFair of the longest key on its turn: %+v, %v; want granted", g, err)
	}
	if err := s.Release(t.Context(), keys, other, time.Second); err != nil {
		t.Fatalf("Release keeping the longest key: %v", err)
	}
	if err := s.LeaveFair(t.Context(), longest, other); err != nil {
		t.Fatal(err)
	}
}

// TestLongKeyFailureMessage: a store failure on a long key names it by a
// short prefix only, as every error of the Store does.
func TestLongKeyFailureMessage(t *testing.T) {
	t.Parallel()
	s, p := proxiedStore(t, etcdstore.WithRequestTimeout(time.Second))
	long := uniqueKey(t) + strings.Repeat("x", 30<<10)
	p.Blackhole(faultproxy.Both)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	err := s.Refresh(ctx, []string{long}, "t1", time.Minute)
	if err == nil || errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("Refresh of a 30 KB key through a blackhole: %v; want a store failure", err)
	}
	if n := len(err.Error()); n > 1000 {
		t.Fatalf("Refresh's failure: a message of %d bytes: %.200s...", n, err)
	}
}

// TestRequestTooLargeForEtcd: a Store told that etcd takes larger requests
// than it does (WithMaxRequestBytes) gets etcd's refusal, or its client's,
// as stores.ErrInvalid, with nothing changed and the Store still serving.
func TestRequestTooLargeForEtcd(t *testing.T) {
	t.Parallel()
	s := newStore(t, etcdstore.WithMaxRequestBytes(64<<20))
	base := uniqueKey(t)
	for _, n := range []int{570 << 10, 1 << 20} { // by etcd (1.5 MiB), by the client (2 MiB)
		long := base + strings.Repeat("x", n-len(base))
		_, err := s.Acquire(t.Context(), []string{long}, "t1", time.Minute)
		if !errors.Is(err, stores.ErrInvalid) {
			t.Fatalf("Acquire of a key of %s: %v; want stores.ErrInvalid", byteCount(n), err)
		}
		if len(err.Error()) > 1000 {
			t.Fatalf("Acquire of a key of %s: a message of %d bytes", byteCount(n), len(err.Error()))
		}
	}
	if g, err := s.Acquire(t.Context(), []string{base}, "t1", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire of a short key after the refusals: %+v, %v", g, err)
	}
	if err := s.Release(t.Context(), []string{base}, "t1", 0); err != nil {
		t.Fatal(err)
	}
}

// byteCount writes n in bytes.
func byteCount(n int) string { return strconv.Itoa(n) + " bytes" }

// TestOpenSendsWhatBoundsAdmits (issue 18, from review): a Store opened
// with max-request-bytes of 4 MiB sends a fair attempt on a key of its
// MaxKeyBytes, every byte escaped to three (a request of about 4 MB), to
// etcd, instead of its client refusing it at the client's default send
// limit of 2 MiB. The shared etcd takes less (1.5 MiB), so it refuses the
// request; what matters is that it was sent.
func TestOpenSendsWhatBoundsAdmits(t *testing.T) {
	t.Parallel()
	s, err := etcdstore.Open(t.Context(), "etcd://"+hostPorts(t)+"/"+uniqueKey(t)+"?max-request-bytes=4194304")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	base := uniqueKey(t)
	long := base + strings.Repeat("/", s.Bounds().MaxKeyBytes-len(base))
	_, err = s.AcquireFair(t.Context(), long, "t1", time.Minute, time.Minute)
	if err == nil {
		t.Fatal("the shared etcd took a request of about 4 MB; the test needs its default --max-request-bytes")
	}
	if strings.Contains(err.Error(), "trying to send message larger than max") {
		t.Fatalf("AcquireFair of a key of MaxKeyBytes: %.300v; the client refused to send it", err)
	}
}

// TestReplyTooLargeIsUnknownOutcome (issue 18, from review): a reply
// larger than the client takes (its MaxCallRecvMsgSize, here 100 KiB: a
// fair attempt reads the whole queue, which grows with waiters of long
// keys) comes after etcd acted: the attempt queued its token, so its
// failure is an unknown outcome, not stores.ErrInvalid ("refused before
// acting", after which the Locker does not leave the queue).
func TestReplyTooLargeIsUnknownOutcome(t *testing.T) {
	t.Parallel()
	c, err := clientv3.New(clientv3.Config{Endpoints: testservers.EtcdEndpoints(t), DialTimeout: 5 * time.Second,
		Logger: zap.NewNop(), MaxCallRecvMsgSize: 100 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	prefix := "reqlock-test/" + uniqueKey(t) + "/"
	s, err := etcdstore.New(c, etcdstore.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := t.Context()
	key := strings.Repeat("x", 20<<10)
	if g, err := s.Acquire(ctx, []string{key}, "holder", time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	for i := range 8 {
		tok := "w" + strconv.Itoa(i)
		_, err := s.AcquireFair(ctx, key, tok, time.Minute, time.Minute)
		if err == nil {
			continue
		}
		q, qerr := c.Get(ctx, prefix+key+"/q/"+tok, clientv3.WithCountOnly())
		if qerr != nil {
			t.Fatal(qerr)
		}
		if errors.Is(err, stores.ErrInvalid) || errors.Is(err, stores.ErrUnreachable) {
			t.Fatalf("AcquireFair of waiter %d, whose reply was too large: %.200v (queued: %v); want an unknown outcome", i, err, q.Count == 1)
		}
		return
	}
	t.Fatal("no reply was too large for the client; the test needs one")
}
