package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores"
)

// TestOneRoundTripEach: every call, with one key or several, granted or
// refused, with or without keep, is one EVALSHA once the scripts are cached;
// refused arguments send nothing.
func TestOneRoundTripEach(t *testing.T) {
	client := testredis.Client(t)
	log := &commandLog{}
	client.AddHook(log)
	s := newStore(t, client)
	ctx := context.Background()
	if err := s.Load(ctx); err != nil { // what a warm store has: the scripts cached
		t.Fatalf("Load: %v", err)
	}
	p := testredis.Prefix(t)
	keys := []string{p + "{c}:a", p + "{c}:b", p + "{c}:c"}
	one := func(what string, op func() error) {
		t.Helper()
		log.take()
		if err := op(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := log.take(); !slices.Equal(got, []string{"evalsha"}) {
			t.Fatalf("%s sent %v, want one evalsha", what, got)
		}
	}
	wantGrant := func(want bool) func(stores.Grant, error) error {
		return func(g stores.Grant, err error) error {
			if err == nil && g.OK != want {
				return errors.New("grant " + strconv.FormatBool(g.OK) + ", want " + strconv.FormatBool(want))
			}
			return err
		}
	}
	notHeld := func(err error) error {
		if errors.Is(err, stores.ErrNotHeld) {
			return nil
		}
		return errors.New("want ErrNotHeld, got " + errString(err))
	}

	one("Acquire of 3 keys, granted", func() error { return wantGrant(true)(s.Acquire(ctx, keys, "t1", time.Minute)) })
	one("Acquire of 3 keys, retried", func() error { return wantGrant(true)(s.Acquire(ctx, keys, "t1", time.Minute)) })
	one("Acquire of 3 keys, refused", func() error { return wantGrant(false)(s.Acquire(ctx, keys, "t2", time.Minute)) })
	one("Refresh of 3 keys", func() error { return s.Refresh(ctx, keys, "t1", time.Minute) })
	one("Refresh of 3 keys, not held", func() error { return notHeld(s.Refresh(ctx, keys, "t2", time.Minute)) })
	one("Release of 3 keys with keep", func() error { return s.Release(ctx, keys, "t1", time.Minute) })
	one("Release of 3 keys", func() error { return s.Release(ctx, keys, "t1", 0) })
	one("Release of 3 keys, not held", func() error { return notHeld(s.Release(ctx, keys, "t1", 0)) })
	one("Acquire of one key, granted", func() error { return wantGrant(true)(s.Acquire(ctx, keys[:1], "t3", time.Minute)) })
	one("Acquire of one key, refused", func() error { return wantGrant(false)(s.Acquire(ctx, keys[:1], "t4", time.Minute)) })
	one("Refresh of one key", func() error { return s.Refresh(ctx, keys[:1], "t3", time.Minute) })
	one("Refresh of one key, not held", func() error { return notHeld(s.Refresh(ctx, keys[:1], "t4", time.Minute)) })
	one("Release of one key with keep", func() error { return s.Release(ctx, keys[:1], "t3", time.Minute) })
	one("Release of one key with keep, not held", func() error { return notHeld(s.Release(ctx, keys[:1], "t4", time.Minute)) })
	one("Release of one key", func() error { return s.Release(ctx, keys[:1], "t3", 0) })
	one("Release of one key, not held", func() error { return notHeld(s.Release(ctx, keys[:1], "t3", 0)) })

	// Refused arguments cost nothing.
	log.take()
	_, _ = s.Acquire(ctx, []string{keys[1], keys[0]}, "t1", time.Minute)
	_, _ = s.Acquire(ctx, nil, "t1", time.Minute)
	_, _ = s.Acquire(ctx, []string{keys[0], keys[0]}, "t1", time.Minute)
	_, _ = s.Acquire(ctx, keys, "t1", 0)
	_ = s.Release(ctx, nil, "t1", 0)
	_ = s.Release(ctx, []string{""}, "t1", 0)
	_ = s.Refresh(ctx, nil, "t1", time.Minute)
	_ = s.Refresh(ctx, keys, "t1", -time.Second)
	if got := log.take(); len(got) != 0 {
		t.Fatalf("invalid calls sent %v, want nothing", got)
	}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

func TestMultiAcquireFences(t *testing.T) {
	client := testredis.Client(t)
	const retention = time.Minute
	s := newStore(t, client, WithFenceRetention(retention))
	ctx := context.Background()
	p := testredis.Prefix(t)
	// Untagged and tagged keys: each has its own fence key, named as for
	// one key.
	keys := []string{p + "a", p + "b", p + "{t}:c"}
	t.Cleanup(func() { client.Del(ctx, withFenceKeys(keys)...) })
	const ahead = int64(1) << 52
	if err := client.Set(ctx, fenceKey(keys[1]), ahead, time.Minute).Err(); err != nil {
		t.Fatalf("SET fence key: %v", err)
	}
	before := serverMicros(t, client)
	g := mustAcquire(t, s, keys, "t", time.Minute)
	after := serverMicros(t, client)
	if g.Fences[1] != ahead+stores.FenceStride {
		t.Fatalf("fence of a key whose fence key is ahead of the clock: %d, want %d", g.Fences[1], ahead+stores.FenceStride)
	}
	for _, i := range []int{0, 2} {
		if g.Fences[i] < before || g.Fences[i] > after {
			t.Fatalf("first fence of %q is %d, want the server clock, in [%d, %d]", keys[i], g.Fences[i], before, after)
		}
	}
	for i, k := range keys {
		if stored := storedFence(t, client, k); stored != g.Fences[i] {
			t.Fatalf("fence key of %q holds %d, want %d", k, stored, g.Fences[i])
		}
		pttl := client.PTTL(ctx, fenceKey(k)).Val()
		if i == 1 {
			// Ahead of the clock: kept for the retention plus the lead.
			if least := retention + time.Duration(g.Fences[i]-after)*time.Microsecond - expirySlack; pttl < least {
				t.Fatalf("fence key of %q, ahead of the clock, has TTL %v, want at least %v", k, pttl, least)
			}
		} else if pttl <= 0 || pttl > retention {
			t.Fatalf("fence key of %q has TTL %v, want in (0, %v]", k, pttl, retention)
		}
		if pttl := client.PTTL(ctx, k).Val(); pttl <= 0 || pttl > time.Minute {
			t.Fatalf("%q has TTL %v, want in (0, 1m]", k, pttl)
		}
	}
	// A second grant steps every key by the stride.
	mustRelease(t, s, keys, "t")
	next := mustAcquire(t, s, keys, "t2", time.Minute)
	for i, k := range keys {
		expectStride(t, g.Fences[i], next.Fences[i], "second grant of "+k)
	}
	mustRelease(t, s, keys, "t2")
}

func TestMultiBadFenceKeyLeavesNoLock(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	ctx := context.Background()
	p := testredis.Prefix(t)
	keys := []string{p + "a", p + "b", p + "c"}
	// The last key's fence key is bad: the first two must not be set.
	if err := client.Set(ctx, fenceKey(keys[2]), "abc", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, keys, "t", time.Minute); err == nil || !strings.Contains(err.Error(), "does not hold a fence") {
		t.Fatalf("Acquire with a bad fence key: got %v, want the script's error", err)
	}
	if n := client.Exists(ctx, keys...).Val(); n != 0 {
		t.Fatalf("the failed Acquire left %d lock keys behind", n)
	}
	client.Del(ctx, withFenceKeys(keys)...)
}

// overwriteWithHash replaces key with another program's hash, as a key
// overwritten by mistake would be.
func overwriteWithHash(t *testing.T, client *redis.Client, key string) {
	t.Helper()
	ctx := context.Background()
	if err := client.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.HSet(ctx, key, "field", "value").Err(); err != nil {
		t.Fatal(err)
	}
}

// A key of a grant that another program overwrote with another type counts
// as not held: Release leaves it as it is, still ends the grant on the other
// keys and returns ErrNotHeld naming it, with or without keep, for several
// keys and for one. (Redis's WRONGTYPE used to fail the whole script, leaving
// every key locked until its TTL.) A fence key of another type no longer
// matters to Release, which does not touch fence keys since it records no
// last fence: the keys are released and the fence key is left as it is.
func TestReleaseWrongType(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	ctx := context.Background()
	for _, keep := range []time.Duration{0, 10 * time.Minute} {
		t.Run(fmt.Sprintf("LockKeyIsAHash/keep=%v", keep), func(t *testing.T) {
			p := testredis.Prefix(t)
			keys := []string{p + "{c}:a", p + "{c}:b", p + "{c}:c"}
			t.Cleanup(func() { client.Del(ctx, withFenceKeys(keys)...) })
			mustAcquire(t, s, keys, "t", time.Minute)
			overwriteWithHash(t, client, keys[1])

			err := s.Release(ctx, keys, "t", keep)
			if !errors.Is(err, stores.ErrNotHeld) || !strings.Contains(err.Error(), strconv.Quote(keys[1])) ||
				strings.Contains(err.Error(), strconv.Quote(keys[0])) || strings.Contains(err.Error(), strconv.Quote(keys[2])) {
				t.Fatalf("Release with %q of another type: got %v, want ErrNotHeld naming it alone", keys[1], err)
			}
			for _, k := range []string{keys[0], keys[2]} {
				if keep == 0 {
					if n := client.Exists(ctx, k).Val(); n != 0 {
						t.Errorf("%q was not released", k)
					}
				} else if pttl := client.PTTL(ctx, k).Val(); pttl <= time.Minute || pttl > keep {
					t.Errorf("%q has TTL %v after Release with keep %v, want in (1m, %v]", k, pttl, keep, keep)
				}
			}
			expectHash(t, client, keys[1], "Release of 3 keys")

			// The same key alone, through the one-key path.
			if err := s.Release(ctx, keys[1:2], "t", keep); !errors.Is(err, stores.ErrNotHeld) {
				t.Errorf("Release of one key of another type, keep %v: got %v, want ErrNotHeld", keep, err)
			}
			expectHash(t, client, keys[1], "Release of one key")
		})
		t.Run(fmt.Sprintf("FenceKeyIsAList/keep=%v", keep), func(t *testing.T) {
			p := testredis.Prefix(t)
			keys := []string{p + "{c}:a", p + "{c}:b", p + "{c}:c"}
			t.Cleanup(func() { client.Del(ctx, withFenceKeys(keys)...) })
			mustAcquire(t, s, keys, "t", time.Minute)
			fk := fenceKey(keys[1])
			client.Del(ctx, fk)
			if err := client.LPush(ctx, fk, "x").Err(); err != nil {
				t.Fatal(err)
			}
			if err := s.Release(ctx, keys, "t", keep); err != nil {
				t.Fatalf("Release with the fence key %q of another type: %v, want nil", fk, err)
			}
			for _, k := range keys {
				if keep == 0 {
					if n := client.Exists(ctx, k).Val(); n != 0 {
						t.Errorf("%q was not released", k)
					}
				} else if pttl := client.PTTL(ctx, k).Val(); pttl <= time.Minute || pttl > keep {
					t.Errorf("%q has TTL %v after Release with keep %v, want in (1m, %v]", k, pttl, keep, keep)
				}
			}
			if typ := client.Type(ctx, fk).Val(); typ != "list" {
				t.Errorf("%q is a %s after Release, want it left a list", fk, typ)
			}
		})
	}
}

// expectHash fails the test unless key is still the hash overwriteWithHash
// made, without a TTL.
func expectHash(t *testing.T, client *redis.Client, key, after string) {
	t.Helper()
	ctx := context.Background()
	if typ, v := client.Type(ctx, key).Val(), client.HGet(ctx, key, "field").Val(); typ != "hash" || v != "value" {
		t.Errorf("%q is a %s holding %q after %s, want the hash left as it was", key, typ, v, after)
	}
	if n := client.PTTL(ctx, key).Val(); n >= 0 {
		t.Errorf("the hash %q got TTL %v from %s, want none", key, n, after)
	}
}

// A key overwritten with another type does not hold the token, so Refresh
// changes nothing and returns ErrNotHeld naming it, for several keys and for
// one. (Redis's WRONGTYPE used to come back as a store error.)
func TestRefreshWrongTypeRefreshesNothing(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	ctx := context.Background()
	p := testredis.Prefix(t)
	keys := []string{p + "{c}:a", p + "{c}:b", p + "{c}:c"}
	t.Cleanup(func() { client.Del(ctx, withFenceKeys(keys)...) })
	mustAcquire(t, s, keys, "t", time.Minute)
	overwriteWithHash(t, client, keys[1])
	err := s.Refresh(ctx, keys, "t", 10*time.Minute)
	if !errors.Is(err, stores.ErrNotHeld) || !strings.Contains(err.Error(), strconv.Quote(keys[1])) {
		t.Fatalf("Refresh with a key of another type: got %v, want ErrNotHeld naming %q", err, keys[1])
	}
	for _, k := range []string{keys[0], keys[2]} {
		if pttl := client.PTTL(ctx, k).Val(); pttl <= 0 || pttl > time.Minute {
			t.Errorf("%q has TTL %v after the refused Refresh, want it unchanged, in (0, 1m]", k, pttl)
		}
	}
	expectHash(t, client, keys[1], "Refresh of 3 keys")

	// The same key alone, through the one-key path.
	if err := s.Refresh(ctx, keys[1:2], "t", 10*time.Minute); !errors.Is(err, stores.ErrNotHeld) {
		t.Errorf("Refresh of one key of another type: got %v, want ErrNotHeld", err)
	}
	expectHash(t, client, keys[1], "Refresh of one key")
}

// noNetwork returns client options' Dialer that counts its calls and never
// connects.
func noNetwork(dials *atomic.Int64) func(context.Context, string, string) (net.Conn, error) {
	return func(context.Context, string, string) (net.Conn, error) {
		dials.Add(1)
		return nil, errors.New("test: no network")
	}
}

// unusedAddr returns a loopback address nothing listens on.
func unusedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// multiCalls are the calls that take several keys at once, for the slot
// and shard checks.
func multiCalls(ctx context.Context, s *Store) map[string]func(keys []string) error {
	return map[string]func(keys []string) error{
		"Acquire": func(keys []string) error { _, err := s.Acquire(ctx, keys, "t", time.Second); return err },
		"Release": func(keys []string) error { return s.Release(ctx, keys, "t", 0) },
		"Release with keep": func(keys []string) error {
			return s.Release(ctx, keys, "t", time.Second)
		},
		"Refresh": func(keys []string) error { return s.Refresh(ctx, keys, "t", time.Second) },
	}
}

// oddPair returns two sorted keys that contain '}' but no hash tag, in one
// slot, whose fence keys (key + ":fence") are in another: keys a multi-key
// call must refuse on a Cluster for their fence keys alone.
func oddPair(t *testing.T) []string {
	t.Helper()
	first := make(map[uint16]string)
	for i := range 1 << 20 {
		k := "x{}{y}:" + strconv.Itoa(i)
		if slot(fenceKey(k)) == slot(k) {
			continue
		}
		if other, ok := first[slot(k)]; ok && slot(fenceKey(other)) != slot(k) {
			keys := []string{other, k}
			slices.Sort(keys)
			return keys
		}
		first[slot(k)] = k
	}
	t.Fatal("no two odd keys share a slot")
	return nil
}

func TestCrossSlotCheckedBeforeSending(t *testing.T) {
	var dials atomic.Int64
	cluster := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 []string{unusedAddr(t)},
		Dialer:                noNetwork(&dials),
		ContextTimeoutEnabled: true,
		MaxRedirects:          -1,
	})
	defer cluster.Close()
	log := &commandLog{}
	cluster.AddHook(log)
	s := newStore(t, cluster)
	ctx := context.Background()

	apart := []string{"cart:1:sku:a", "cart:1:sku:b"}
	if slot(apart[0]) == slot(apart[1]) {
		t.Fatal("test keys share a slot")
	}
	calls := multiCalls(ctx, s)
	for name, call := range calls {
		err := call(apart)
		if !errors.Is(err, ErrCrossSlot) || !errors.Is(err, stores.ErrInvalid) {
			t.Fatalf("%s of keys in two slots: got %v, want ErrCrossSlot and ErrInvalid", name, err)
		}
		msg := err.Error()
		for _, want := range []string{strconv.Quote(apart[0]), strconv.Quote(apart[1]), "hash tag", "first '{'", "cart:{<json:cart>}"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: error %q does not mention %s", name, msg, want)
			}
		}
	}
	// Keys with '}' and no hash tag, in one slot, have their fence keys in
	// another: Acquire, which writes fence keys, refuses them.
	odd := oddPair(t)
	if _, err := s.Acquire(ctx, odd, "t", time.Second); !errors.Is(err, ErrCrossSlot) || !errors.Is(err, stores.ErrInvalid) ||
		!strings.Contains(err.Error(), strconv.Quote(fenceKey(odd[0]))) {
		t.Fatalf("Acquire of keys whose fence keys are in another slot: got %v, want ErrCrossSlot and ErrInvalid naming a fence key", err)
	}
	// Invalid arguments are reported as such, before the slot check.
	if _, err := s.Acquire(ctx, []string{apart[1], apart[0]}, "t", time.Second); !errors.Is(err, stores.ErrInvalid) ||
		errors.Is(err, ErrCrossSlot) {
		t.Fatalf("Acquire of unsorted keys: got %v, want ErrInvalid, not ErrCrossSlot", err)
	}
	if n, got := dials.Load(), log.take(); n != 0 || len(got) != 0 {
		t.Fatalf("the slot check dialled %d times and sent %v; it must fire before any I/O", n, got)
	}

	// Keys with one hash tag pass the check and go to the network; so do
	// the odd keys to Release and Refresh, which touch no fence key.
	tagged := []string{"cart:{1}:sku:a", "cart:{1}:sku:b"}
	for name, call := range calls {
		if err := call(tagged); err == nil || errors.Is(err, ErrCrossSlot) {
			t.Fatalf("%s of tagged keys with no server: got %v, want a network error", name, err)
		}
		if name == "Acquire" {
			continue
		}
		if err := call(odd); err == nil || errors.Is(err, ErrCrossSlot) {
			t.Fatalf("%s of keys in one slot whose fence keys are not: got %v, want a network error", name, err)
		}
	}
	if dials.Load() == 0 {
		t.Fatal("calls with tagged keys never dialled")
	}
}

func TestCrossShardCheckedBeforeSending(t *testing.T) {
	var dials atomic.Int64
	ring := redis.NewRing(&redis.RingOptions{
		Addrs:                 map[string]string{"a": unusedAddr(t), "b": unusedAddr(t)},
		Dialer:                noNetwork(&dials),
		ContextTimeoutEnabled: true,
	})
	defer ring.Close()
	s := newStore(t, ring)
	ctx := context.Background()
	apart := []string{"cart:1:sku:a", "cart:1:sku:b"}
	for name, call := range multiCalls(ctx, s) {
		err := call(apart)
		if !errors.Is(err, ErrCrossSlot) || !errors.Is(err, stores.ErrInvalid) || !strings.Contains(err.Error(), "Ring") {
			t.Fatalf("%s of untagged keys on a Ring: got %v, want ErrCrossSlot and ErrInvalid about Ring shards", name, err)
		}
	}
	if n := dials.Load(); n != 0 {
		t.Fatalf("the shard check dialled %d times", n)
	}
	_, err := s.Acquire(ctx, []string{"cart:{1}:sku:a", "cart:{1}:sku:b"}, "t", time.Second)
	if errors.Is(err, ErrCrossSlot) {
		t.Fatalf("Acquire of tagged keys on a Ring: %v", err)
	}
}

// redisError is a reply error as go-redis returns it.
type redisError string

func (e redisError) Error() string { return string(e) }
func (redisError) RedisError()     {}

func TestCrossSlotReplyMapped(t *testing.T) {
	goRedisStore := &Store{driver: newGoRedis(testredis.Client(t))}
	reply := redisError("CROSSSLOT Keys in request don't hash to the same slot")
	keys := []string{"cart:1:sku:a", "cart:1:sku:b"}
	err := goRedisStore.mapCrossSlot(reply, keys, true)
	if !errors.Is(err, ErrCrossSlot) || !errors.Is(err, stores.ErrInvalid) || !errors.Is(err, reply) {
		t.Fatalf("mapped CROSSSLOT: got %v, want ErrCrossSlot and ErrInvalid wrapping the reply", err)
	}
	if msg := err.Error(); !strings.Contains(msg, strconv.Quote(keys[0])) || !strings.Contains(msg, strconv.Quote(keys[1])) ||
		!strings.Contains(msg, "hash tag") {
		t.Fatalf("mapped CROSSSLOT %q does not name the keys and the fix", msg)
	}
	// Keys that share a slot here (a proxy hashing otherwise): the error
	// still names keys of the call.
	tagged := []string{"cart:{1}:sku:a", "cart:{1}:sku:b"}
	if err := goRedisStore.mapCrossSlot(reply, tagged, true); !errors.Is(err, ErrCrossSlot) || !errors.Is(err, stores.ErrInvalid) ||
		!errors.Is(err, reply) || !strings.Contains(err.Error(), tagged[0]) {
		t.Fatalf("mapped CROSSSLOT for one-slot keys: got %v", err)
	}
	// Other errors pass through as they are.
	for _, other := range []error{redisError("ERR something"), errors.New("CROSSSLOT but not from Redis"), context.Canceled} {
		if got := goRedisStore.mapCrossSlot(other, keys, true); got != other {
			t.Fatalf("mapCrossSlot(%v) = %v, want it unchanged", other, got)
		}
	}
}

func TestColocatedKeys(t *testing.T) {
	tests := []struct {
		keys         []string
		slot, shards bool // whether the keys fit one slot, one Ring shard
	}{
		{[]string{"a"}, true, true},
		{[]string{"{u1}:a", "{u1}:b", "x{u1}y"}, true, true},
		{[]string{"cart:{42}:sku:1", "cart:{42}:sku:2", "cart:{42}:sku:ключ"}, true, true},
		{[]string{"cart:{42}:sku:1", "cart:{43}:sku:1"}, false, false},
		{[]string{"a", "b"}, false, false},
		{[]string{"{a}:x", "a"}, true, true},     // same hashed part, "a"
		{[]string{"x{}{y}"}, false, false},       // the fence key lands elsewhere
		{[]string{"{}a", "{}b"}, false, false},   // empty tag: whole key hashed
		{[]string{"{{a}", "{{a}:b"}, true, true}, // tag "{a"
	}
	for _, tt := range tests {
		if err := colocationError(RouteSlot, tt.keys, true); (err == nil) != tt.slot {
			t.Errorf("%q in one slot: got %v, want ok %v", tt.keys, err, tt.slot)
		}
		if err := colocationError(RouteShard, tt.keys, true); (err == nil) != tt.shards {
			t.Errorf("%q on one shard: got %v, want ok %v", tt.keys, err, tt.shards)
		}
	}
}

func FuzzColocatedTaggedKeys(f *testing.F) {
	f.Add("42", "sku:1", "sku:2")
	f.Add("ключ", "", "}")
	f.Fuzz(func(t *testing.T, tag, a, b string) {
		if tag == "" || strings.ContainsAny(tag, "{}") || strings.ContainsAny(a+b, "{") {
			t.Skip() // not one valid tag leading every key
		}
		keys := []string{"cart:{" + tag + "}:" + a, "cart:{" + tag + "}:" + b}
		slices.Sort(keys)
		keys = slices.Compact(keys)
		if err := colocationError(RouteSlot, keys, true); err != nil {
			t.Fatalf("keys with one tag: %v", err)
		}
		if err := colocationError(RouteShard, keys, true); err != nil {
			t.Fatalf("keys with one tag: %v", err)
		}
	})
}
