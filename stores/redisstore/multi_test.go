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

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testredis"
)

func TestMultiOneRoundTripEach(t *testing.T) {
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
	zero := make([]int64, len(keys))
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
	wantGrant := func(want bool) func(reqlock.MultiGrant, error) error {
		return func(g reqlock.MultiGrant, err error) error {
			if err == nil && g.OK != want {
				return errors.New("grant " + strconv.FormatBool(g.OK) + ", want " + strconv.FormatBool(want))
			}
			return err
		}
	}
	notHeld := func(err error) error {
		if errors.Is(err, reqlock.ErrNotHeld) {
			return nil
		}
		return errors.New("want ErrNotHeld, got " + errString(err))
	}

	one("AcquireAll, granted", func() error { return wantGrant(true)(s.AcquireAll(ctx, keys, "t1", time.Minute)) })
	one("AcquireAll, refused", func() error { return wantGrant(false)(s.AcquireAll(ctx, keys, "t2", time.Minute)) })
	one("RefreshAll", func() error { return s.RefreshAll(ctx, keys, "t1", time.Minute) })
	one("RefreshAll, not held", func() error { return notHeld(s.RefreshAll(ctx, keys, "t2", time.Minute)) })
	one("ReleaseAll with keep", func() error { return s.ReleaseAll(ctx, keys, "t1", zero, time.Minute) })
	one("ReleaseAll", func() error { return s.ReleaseAll(ctx, keys, "t1", zero, 0) })
	one("ReleaseAll, not held", func() error { return notHeld(s.ReleaseAll(ctx, keys, "t1", zero, 0)) })
	one("AcquireAll of one key", func() error { return wantGrant(true)(s.AcquireAll(ctx, keys[:1], "t3", time.Minute)) })
	one("ReleaseKeep", func() error { return s.ReleaseKeep(ctx, keys[0], "t3", 0, time.Minute) })
	one("ReleaseKeep, not held", func() error { return notHeld(s.ReleaseKeep(ctx, keys[0], "t4", 0, time.Minute)) })
	one("ReleaseKeep with keep 0", func() error { return s.ReleaseKeep(ctx, keys[0], "t3", 0, 0) })

	// Refused arguments cost nothing.
	log.take()
	_, _ = s.AcquireAll(ctx, []string{keys[1], keys[0]}, "t1", time.Minute)
	_ = s.ReleaseAll(ctx, keys, "t1", nil, 0)
	_ = s.RefreshAll(ctx, nil, "t1", time.Minute)
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

func TestAcquireAllFences(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client, WithFenceRetention(time.Minute))
	ctx := context.Background()
	p := testredis.Prefix(t)
	// Untagged and tagged keys: each has its own fence key, named as for
	// Acquire.
	keys := []string{p + "a", p + "b", p + "{t}:c"}
	const ahead = int64(1) << 52
	if err := client.Set(ctx, fenceKey(keys[1]), ahead, time.Minute).Err(); err != nil {
		t.Fatalf("SET fence key: %v", err)
	}
	serverNow, err := client.Time(ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	g, err := s.AcquireAll(ctx, keys, "t", time.Minute)
	if err != nil || !g.OK {
		t.Fatalf("AcquireAll: %+v, %v", g, err)
	}
	if g.Fences[1] != ahead+1 {
		t.Fatalf("fence of a key whose counter is ahead of the clock: %d, want %d", g.Fences[1], ahead+1)
	}
	for _, i := range []int{0, 2} {
		if d := time.UnixMicro(g.Fences[i]).Sub(serverNow); d < 0 || d > 10*time.Second {
			t.Fatalf("first fence of %q is %v after the server clock, want within [0, 10s]", keys[i], d)
		}
	}
	for i, k := range keys {
		raw, err := client.Get(ctx, fenceKey(k)).Result()
		if err != nil || raw != strconv.FormatInt(g.Fences[i], 10) {
			t.Fatalf("fence key of %q holds %q (%v), want %d", k, raw, err, g.Fences[i])
		}
		if pttl := client.PTTL(ctx, fenceKey(k)).Val(); pttl <= 0 || pttl > time.Minute {
			t.Fatalf("fence key of %q has TTL %v, want in (0, 1m]", k, pttl)
		}
		if pttl := client.PTTL(ctx, k).Val(); pttl <= 0 || pttl > time.Minute {
			t.Fatalf("%q has TTL %v, want in (0, 1m]", k, pttl)
		}
	}
	if err := s.ReleaseAll(ctx, keys, "t", make([]int64, len(keys)), 0); err != nil {
		t.Fatalf("ReleaseAll: %v", err)
	}
	client.Del(ctx, withFenceKeys(keys)...)
}

func TestAcquireAllBadFenceKeyLeavesNoLock(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	ctx := context.Background()
	p := testredis.Prefix(t)
	keys := []string{p + "a", p + "b", p + "c"}
	// The last key's fence key is bad: the first two must not be set.
	if err := client.Set(ctx, fenceKey(keys[2]), "abc", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AcquireAll(ctx, keys, "t", time.Minute); err == nil || !strings.Contains(err.Error(), "does not hold a fence") {
		t.Fatalf("AcquireAll with a bad fence key: got %v, want the script's error", err)
	}
	if n := client.Exists(ctx, keys...).Val(); n != 0 {
		t.Fatalf("the failed AcquireAll left %d lock keys behind", n)
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

// A key of a multi-key grant that another program overwrote with another
// type, or whose fence key it overwrote, counts as not held: ReleaseAll
// leaves it as it is, still releases the other keys and returns ErrNotHeld
// naming it, and so does ReleaseKeep for that key. (Redis's WRONGTYPE used to
// fail the whole script, leaving every key locked until its TTL.)
func TestReleaseAllWrongTypeReleasesTheOthers(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	ctx := context.Background()
	cases := map[string]struct {
		overwrite func(t *testing.T, key string) string // returns the key of another type
		typ       string
	}{
		"LockKeyIsAHash": {func(t *testing.T, key string) string {
			overwriteWithHash(t, client, key)
			return key
		}, "hash"},
		"FenceKeyIsAList": {func(t *testing.T, key string) string {
			fk := fenceKey(key)
			client.Del(ctx, fk)
			if err := client.LPush(ctx, fk, "x").Err(); err != nil {
				t.Fatal(err)
			}
			return fk
		}, "list"},
	}
	for name, tc := range cases {
		for _, keep := range []time.Duration{0, 10 * time.Minute} {
			t.Run(fmt.Sprintf("%s/keep=%v", name, keep), func(t *testing.T) {
				p := testredis.Prefix(t)
				keys := []string{p + "{c}:a", p + "{c}:b", p + "{c}:c"}
				t.Cleanup(func() { client.Del(ctx, withFenceKeys(keys)...) })
				g, err := s.AcquireAll(ctx, keys, "t", time.Minute)
				if err != nil || !g.OK {
					t.Fatalf("AcquireAll: %+v, %v", g, err)
				}
				bad := tc.overwrite(t, keys[1])

				// The grant's fences, as the Locker passes them: the
				// script reads every fence key before it writes.
				err = s.ReleaseAll(ctx, keys, "t", g.Fences, keep)
				if !errors.Is(err, reqlock.ErrNotHeld) || !strings.Contains(err.Error(), strconv.Quote(keys[1])) ||
					strings.Contains(err.Error(), strconv.Quote(keys[0])) || strings.Contains(err.Error(), strconv.Quote(keys[2])) {
					t.Fatalf("ReleaseAll with %s of another type: got %v, want ErrNotHeld naming %q alone", bad, err, keys[1])
				}
				for _, k := range []string{keys[0], keys[2]} {
					if keep == 0 {
						if n := client.Exists(ctx, k).Val(); n != 0 {
							t.Errorf("%q was not released", k)
						}
					} else if pttl := client.PTTL(ctx, k).Val(); pttl <= time.Minute || pttl > keep {
						t.Errorf("%q has TTL %v after ReleaseAll with keep %v, want in (1m, %v]", k, pttl, keep, keep)
					}
				}
				if typ := client.Type(ctx, bad).Val(); typ != tc.typ {
					t.Errorf("%q is a %s after ReleaseAll, want it left a %s", bad, typ, tc.typ)
				}
				if bad != keys[1] {
					// Its lock key still holds the token, with its TTL.
					if v := client.Get(ctx, keys[1]).Val(); v != "t" {
						t.Errorf("%q holds %q after ReleaseAll, want it left holding the token", keys[1], v)
					}
					if pttl := client.PTTL(ctx, keys[1]).Val(); pttl <= 0 || pttl > time.Minute {
						t.Errorf("%q has TTL %v after ReleaseAll, want it left in (0, 1m]", keys[1], pttl)
					}
				}

				if err := s.ReleaseKeep(ctx, keys[1], "t", g.Fences[1], 10*time.Minute); !errors.Is(err, reqlock.ErrNotHeld) {
					t.Fatalf("ReleaseKeep with %s of another type: got %v, want ErrNotHeld", bad, err)
				}
				if typ := client.Type(ctx, bad).Val(); typ != tc.typ {
					t.Errorf("%q is a %s after ReleaseKeep, want it left a %s", bad, typ, tc.typ)
				}
			})
		}
	}
}

// A key overwritten with another type does not hold the token, so
// RefreshAll changes nothing and returns ErrNotHeld naming it. (Redis's
// WRONGTYPE used to come back as a store error.)
func TestRefreshAllWrongTypeRefreshesNothing(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	ctx := context.Background()
	p := testredis.Prefix(t)
	keys := []string{p + "{c}:a", p + "{c}:b", p + "{c}:c"}
	t.Cleanup(func() { client.Del(ctx, withFenceKeys(keys)...) })
	if g, err := s.AcquireAll(ctx, keys, "t", time.Minute); err != nil || !g.OK {
		t.Fatalf("AcquireAll: %+v, %v", g, err)
	}
	overwriteWithHash(t, client, keys[1])
	err := s.RefreshAll(ctx, keys, "t", 10*time.Minute)
	if !errors.Is(err, reqlock.ErrNotHeld) || !strings.Contains(err.Error(), strconv.Quote(keys[1])) {
		t.Fatalf("RefreshAll with a key of another type: got %v, want ErrNotHeld naming %q", err, keys[1])
	}
	for _, k := range []string{keys[0], keys[2]} {
		if pttl := client.PTTL(ctx, k).Val(); pttl <= 0 || pttl > time.Minute {
			t.Errorf("%q has TTL %v after the refused RefreshAll, want it unchanged, in (0, 1m]", k, pttl)
		}
	}
	if typ, v := client.Type(ctx, keys[1]).Val(), client.HGet(ctx, keys[1], "field").Val(); typ != "hash" || v != "value" {
		t.Errorf("%q is a %s holding %q after RefreshAll, want the hash left as it was", keys[1], typ, v)
	}
	if n := client.PTTL(ctx, keys[1]).Val(); n >= 0 {
		t.Errorf("the hash %q got TTL %v from RefreshAll, want none", keys[1], n)
	}
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
	calls := map[string]func(keys []string) error{
		"AcquireAll": func(keys []string) error { _, err := s.AcquireAll(ctx, keys, "t", time.Second); return err },
		"ReleaseAll": func(keys []string) error { return s.ReleaseAll(ctx, keys, "t", make([]int64, len(keys)), 0) },
		"RefreshAll": func(keys []string) error { return s.RefreshAll(ctx, keys, "t", time.Second) },
	}
	for name, call := range calls {
		err := call(apart)
		if !errors.Is(err, ErrCrossSlot) || !errors.Is(err, reqlock.ErrInvalid) {
			t.Fatalf("%s of keys in two slots: got %v, want ErrCrossSlot and ErrInvalid", name, err)
		}
		msg := err.Error()
		for _, want := range []string{strconv.Quote(apart[0]), strconv.Quote(apart[1]), "hash tag", "first '{'", "cart:{<json:cart>}"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: error %q does not mention %s", name, msg, want)
			}
		}
	}
	// A key with '}' and no hash tag has its fence key in another slot.
	odd := []string{"x{}{y}"}
	if _, err := s.AcquireAll(ctx, odd, "t", time.Second); !errors.Is(err, ErrCrossSlot) || !errors.Is(err, reqlock.ErrInvalid) ||
		!strings.Contains(err.Error(), strconv.Quote(fenceKey(odd[0]))) {
		t.Fatalf("AcquireAll of a key whose fence key is in another slot: got %v, want ErrCrossSlot and ErrInvalid naming the fence key", err)
	}
	// Invalid arguments are reported as such, before the slot check.
	if _, err := s.AcquireAll(ctx, []string{apart[1], apart[0]}, "t", time.Second); !errors.Is(err, reqlock.ErrInvalid) {
		t.Fatalf("AcquireAll of unsorted keys: got %v, want ErrInvalid", err)
	}
	if n, got := dials.Load(), log.take(); n != 0 || len(got) != 0 {
		t.Fatalf("the slot check dialled %d times and sent %v; it must fire before any I/O", n, got)
	}

	// Keys with one hash tag pass the check and go to the network.
	tagged := []string{"cart:{1}:sku:a", "cart:{1}:sku:b"}
	for name, call := range calls {
		if err := call(tagged); err == nil || errors.Is(err, ErrCrossSlot) {
			t.Fatalf("%s of tagged keys with no server: got %v, want a network error", name, err)
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
	calls := map[string]func(keys []string) error{
		"AcquireAll": func(keys []string) error { _, err := s.AcquireAll(ctx, keys, "t", time.Second); return err },
		"ReleaseAll": func(keys []string) error { return s.ReleaseAll(ctx, keys, "t", make([]int64, len(keys)), 0) },
		"RefreshAll": func(keys []string) error { return s.RefreshAll(ctx, keys, "t", time.Second) },
	}
	for name, call := range calls {
		err := call(apart)
		if !errors.Is(err, ErrCrossSlot) || !errors.Is(err, reqlock.ErrInvalid) || !strings.Contains(err.Error(), "Ring") {
			t.Fatalf("%s of untagged keys on a Ring: got %v, want ErrCrossSlot and ErrInvalid about Ring shards", name, err)
		}
	}
	if n := dials.Load(); n != 0 {
		t.Fatalf("the shard check dialled %d times", n)
	}
	_, err := s.AcquireAll(ctx, []string{"cart:{1}:sku:a", "cart:{1}:sku:b"}, "t", time.Second)
	if errors.Is(err, ErrCrossSlot) {
		t.Fatalf("AcquireAll of tagged keys on a Ring: %v", err)
	}
}

// redisError is a reply error as go-redis returns it.
type redisError string

func (e redisError) Error() string { return string(e) }
func (redisError) RedisError()     {}

func TestCrossSlotReplyMapped(t *testing.T) {
	reply := redisError("CROSSSLOT Keys in request don't hash to the same slot")
	keys := []string{"cart:1:sku:a", "cart:1:sku:b"}
	err := mapCrossSlot(reply, keys, true)
	if !errors.Is(err, ErrCrossSlot) || !errors.Is(err, reqlock.ErrInvalid) || !errors.Is(err, reply) {
		t.Fatalf("mapped CROSSSLOT: got %v, want ErrCrossSlot and ErrInvalid wrapping the reply", err)
	}
	if msg := err.Error(); !strings.Contains(msg, strconv.Quote(keys[0])) || !strings.Contains(msg, strconv.Quote(keys[1])) ||
		!strings.Contains(msg, "hash tag") {
		t.Fatalf("mapped CROSSSLOT %q does not name the keys and the fix", msg)
	}
	// Keys that share a slot here (a proxy hashing otherwise): the error
	// still names keys of the call.
	tagged := []string{"cart:{1}:sku:a", "cart:{1}:sku:b"}
	if err := mapCrossSlot(reply, tagged, true); !errors.Is(err, ErrCrossSlot) || !errors.Is(err, reqlock.ErrInvalid) ||
		!errors.Is(err, reply) || !strings.Contains(err.Error(), tagged[0]) {
		t.Fatalf("mapped CROSSSLOT for one-slot keys: got %v", err)
	}
	// Other errors pass through as they are.
	for _, other := range []error{redisError("ERR something"), errors.New("CROSSSLOT but not from Redis"), context.Canceled} {
		if got := mapCrossSlot(other, keys, true); got != other {
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
		if err := colocationError(routeSlot, tt.keys, true); (err == nil) != tt.slot {
			t.Errorf("%q in one slot: got %v, want ok %v", tt.keys, err, tt.slot)
		}
		if err := colocationError(routeShard, tt.keys, true); (err == nil) != tt.shards {
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
		if err := colocationError(routeSlot, keys, true); err != nil {
			t.Fatalf("keys with one tag: %v", err)
		}
		if err := colocationError(routeShard, keys, true); err != nil {
			t.Fatalf("keys with one tag: %v", err)
		}
	})
}
