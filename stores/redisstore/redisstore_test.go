package redisstore

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redisstore/internal/redistest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

func TestMain(m *testing.M) { os.Exit(testredis.Main(m)) }

func newStore(t testing.TB, client redis.Scripter, opts ...Option) *Store {
	t.Helper()
	s, err := New(client, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	// Registered after the client's cleanup, so it runs before it.
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestConformance runs the conformance suite on a single Redis, declaring
// release notification and fair mode, with its fault scenarios through a
// proxy in front of the Redis.
func TestConformance(t *testing.T) {
	runConformance(t, testredis.Client(t), func(t *testing.T) (redis.Scripter, []*faultproxy.Proxy) {
		p := faultproxy.New(t, testredis.Addr(t))
		c := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		return c, []*faultproxy.Proxy{p}
	})
}

// runConformance runs the conformance suite on stores of client (see
// redistest.Conformance).
func runConformance(t *testing.T, client redis.Scripter, proxied func(t *testing.T) (redis.Scripter, []*faultproxy.Proxy)) {
	redistest.Conformance(t, client, func(t testing.TB, c redis.Scripter) stores.Store { return newStore(t, c) }, proxied)
}

func TestNewRejectsInvalid(t *testing.T) {
	client := testredis.Client(t)
	tests := []struct {
		name   string
		client redis.Scripter
		opts   []Option
	}{
		{"nil client", nil, nil},
		{"typed nil client", (*redis.Client)(nil), nil},
		{"short retention", client, []Option{WithFenceRetention(59 * time.Second)}},
		{"negative retention", client, []Option{WithFenceRetention(-time.Hour)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.client, tt.opts...); !errors.Is(err, stores.ErrInvalid) {
				t.Fatalf("New: got %v, want ErrInvalid", err)
			}
		})
	}
	s := newStore(t, client, WithFenceRetention(MinFenceRetention))
	if s.fenceRetention != MinFenceRetention {
		t.Fatalf("fence retention %v, want %v", s.fenceRetention, MinFenceRetention)
	}
	if s := newStore(t, client); s.fenceRetention != DefaultFenceRetention {
		t.Fatalf("default fence retention %v, want %v", s.fenceRetention, DefaultFenceRetention)
	}
}

func TestInvalidTTL(t *testing.T) {
	s := newStore(t, testredis.Client(t))
	keys := []string{testredis.Prefix(t) + "k"}
	ctx := context.Background()
	if _, err := s.Acquire(ctx, keys, "t", 0); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("Acquire with ttl 0: got %v, want ErrInvalid", err)
	}
	if err := s.Refresh(ctx, keys, "t", -time.Second); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("Refresh with a negative ttl: got %v, want ErrInvalid", err)
	}
}

func TestSubMillisecondTTLRoundsUp(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want int64
	}{
		{time.Nanosecond, 1},
		{time.Millisecond, 1},
		{time.Millisecond + 1, 2},
		{1500 * time.Microsecond, 2},
		{time.Second, 1000},
	} {
		if got := milliseconds(tt.d); got != tt.want {
			t.Errorf("milliseconds(%v) = %d, want %d", tt.d, got, tt.want)
		}
	}
}

// serverMicros returns the Redis server clock (TIME) in microseconds, the
// clock the scripts issue fences from.
func serverMicros(t *testing.T, client redis.Cmdable) int64 {
	t.Helper()
	now, err := client.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now.UnixMicro()
}

// storedFence returns the fence that key's fence key holds.
func storedFence(t *testing.T, client redis.Cmdable, key string) int64 {
	t.Helper()
	raw, err := client.Get(context.Background(), fenceKey(key)).Result()
	if err != nil {
		t.Fatalf("GET fence key of %q: %v", key, err)
	}
	fence, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		t.Fatalf("fence key of %q holds %q, want a decimal fence", key, raw)
	}
	return fence
}

// mustAcquire acquires keys with token and fails the test unless granted.
func mustAcquire(t *testing.T, s *Store, keys []string, token string, ttl time.Duration) stores.Grant {
	t.Helper()
	g, err := s.Acquire(context.Background(), keys, token, ttl)
	if err != nil || !g.OK || len(g.Fences) != len(keys) {
		t.Fatalf("Acquire(%q, %q): %+v, %v; want granted with %d fences", keys, token, g, err, len(keys))
	}
	return g
}

// mustRelease releases keys with token (keep 0) and fails the test on an
// error.
func mustRelease(t *testing.T, s *Store, keys []string, token string) {
	t.Helper()
	if err := s.Release(context.Background(), keys, token, 0); err != nil {
		t.Fatalf("Release(%q, %q): %v", keys, token, err)
	}
}

// expectStride fails the test unless fence next is at least
// stores.FenceStride above prev, the fence of the key's previous grant.
func expectStride(t *testing.T, prev, next int64, what string) {
	t.Helper()
	if next-prev < stores.FenceStride {
		t.Fatalf("%s: fence %d after %d, a step of %d, want at least stores.FenceStride (%d)",
			what, next, prev, next-prev, stores.FenceStride)
	}
}

// waitServerClockPast polls the server clock until it is past fence, in
// microseconds.
func waitServerClockPast(t *testing.T, client redis.Cmdable, fence int64) {
	t.Helper()
	waitFor(t, signalWait, func() bool { return serverMicros(t, client) > fence },
		func() string { return "the server clock did not pass the fence " + strconv.FormatInt(fence, 10) })
}

func TestFenceKeyTTLAndFormat(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client, WithFenceRetention(time.Minute))
	ctx := context.Background()
	keys := []string{testredis.Prefix(t) + "k"}
	before := serverMicros(t, client)
	g := mustAcquire(t, s, keys, "t", time.Minute)
	after := serverMicros(t, client)
	pttl, err := client.PTTL(ctx, fenceKey(keys[0])).Result()
	if err != nil {
		t.Fatalf("PTTL: %v", err)
	}
	// A fresh key's fence is the clock, not ahead of it: no lead to add.
	if pttl <= 0 || pttl > time.Minute {
		t.Fatalf("fence key TTL %v, want in (0, 1m]", pttl)
	}
	if stored := storedFence(t, client, keys[0]); stored != g.Fences[0] {
		t.Fatalf("fence key holds %d, want the decimal fence %d", stored, g.Fences[0])
	}
	// A fresh key's first fence is the server clock in microseconds.
	if g.Fences[0] < before || g.Fences[0] > after {
		t.Fatalf("first fence %d, want the server clock, in [%d, %d]", g.Fences[0], before, after)
	}
}

// TestFencesStrideOnRedis checks the stride rule where Redis keeps it: in
// the fence key, which outlives releases and expiries, and in the server
// clock, which takes over once the fence key is gone.
func TestFencesStrideOnRedis(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	ctx := context.Background()

	t.Run("BackToBack", func(t *testing.T) {
		// Grants far faster than one per stride of microseconds: the fence
		// runs ahead of the clock and still steps by the stride.
		keys := []string{testredis.Prefix(t) + "k"}
		var last int64
		for i := range 200 {
			token := "t" + strconv.Itoa(i)
			g := mustAcquire(t, s, keys, token, time.Minute)
			if i > 0 {
				expectStride(t, last, g.Fences[0], "grant "+strconv.Itoa(i))
			}
			if stored := storedFence(t, client, keys[0]); stored != g.Fences[0] {
				t.Fatalf("grant %d: fence key holds %d, want the fence %d", i, stored, g.Fences[0])
			}
			last = g.Fences[0]
			mustRelease(t, s, keys, token)
		}
	})

	t.Run("AfterExpiry", func(t *testing.T) {
		// A lock that expires unreleased leaves its fence key, so the next
		// grant steps from its fence. The fence key starts an hour ahead
		// of the clock, so that the time the expiry takes cannot make up
		// the step.
		keys := []string{testredis.Prefix(t) + "k"}
		t.Cleanup(func() { client.Del(ctx, withFenceKeys(keys)...) })
		last := serverMicros(t, client) + time.Hour.Microseconds()
		if err := client.Set(ctx, fenceKey(keys[0]), last, time.Hour).Err(); err != nil {
			t.Fatalf("SET fence key: %v", err)
		}
		for i := range 3 {
			token := "t" + strconv.Itoa(i)
			g := mustAcquire(t, s, keys, token, 20*time.Millisecond)
			expectStride(t, last, g.Fences[0], "grant "+strconv.Itoa(i)+" (the previous one expired)")
			last = g.Fences[0]
			waitFor(t, signalWait, func() bool { return client.Exists(ctx, keys[0]).Val() == 0 },
				func() string { return "the lock did not expire" })
		}
		if err := s.Release(ctx, keys, "t2", 0); !errors.Is(err, stores.ErrNotHeld) {
			t.Fatalf("Release of an expired lock: got %v, want ErrNotHeld", err)
		}
	})

	t.Run("AfterFenceKeyDeleted", func(t *testing.T) {
		// What retention does to an idle key: the fence key is gone and
		// the server clock takes over. Retention ends no earlier than the
		// clock passed the last fence (see TestFenceAheadOfClockExtendsFenceKey),
		// so the key is deleted only then, by the same rule.
		keys := []string{testredis.Prefix(t) + "k"}
		var last int64
		for i := range 3 {
			token := "t" + strconv.Itoa(i)
			before := serverMicros(t, client)
			g := mustAcquire(t, s, keys, token, time.Minute)
			after := serverMicros(t, client)
			if i > 0 {
				expectStride(t, last, g.Fences[0], "grant "+strconv.Itoa(i)+" after the fence key was deleted")
				if g.Fences[0] < before || g.Fences[0] > after {
					t.Fatalf("grant %d without a fence key: fence %d, want the server clock, in [%d, %d]",
						i, g.Fences[0], before, after)
				}
			}
			last = g.Fences[0]
			mustRelease(t, s, keys, token)
			waitServerClockPast(t, client, last+stores.FenceStride)
			if err := client.Del(ctx, fenceKey(keys[0])).Err(); err != nil {
				t.Fatalf("DEL fence key: %v", err)
			}
		}
	})
}

// expirySlack is how far a key's PTTL may stray from what TIME, read around
// the script that set it, predicts: Redis counts expiries in milliseconds,
// from a cached clock that may lag TIME a little.
const expirySlack = 10 * time.Millisecond

// TestFenceAheadOfClockExtendsFenceKey: when the fence key holds a fence
// ahead of the server clock, a grant steps it by the stride and keeps the
// fence key for the retention plus that lead, so that it cannot expire (and
// hand fences back to the clock) before the clock has caught up.
func TestFenceAheadOfClockExtendsFenceKey(t *testing.T) {
	client := testredis.Client(t)
	const retention = time.Minute
	s := newStore(t, client, WithFenceRetention(retention))
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		ahead func(now int64) int64
	}{
		{"OneHour", func(now int64) int64 { return now + time.Hour.Microseconds() }},
		// 2^52 also checks that large fences survive exactly.
		{"TwoToThe52", func(int64) int64 { return 1 << 52 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys := []string{testredis.Prefix(t) + "k"}
			// A fence key far ahead lives as long: do not leave it in a
			// shared Redis (REQLOCK_REDIS_ADDR).
			t.Cleanup(func() { client.Del(ctx, withFenceKeys(keys)...) })
			last := tc.ahead(serverMicros(t, client))
			if err := client.Set(ctx, fenceKey(keys[0]), last, time.Minute).Err(); err != nil {
				t.Fatalf("SET fence key: %v", err)
			}
			for i := range 2 {
				before := serverMicros(t, client)
				g := mustAcquire(t, s, keys, "t", time.Minute)
				pttl, err := client.PTTL(ctx, fenceKey(keys[0])).Result()
				if err != nil {
					t.Fatalf("PTTL: %v", err)
				}
				after := serverMicros(t, client)
				if want := last + stores.FenceStride; g.Fences[0] != want {
					t.Fatalf("grant %d: fence %d, want %d (the stride above the fence key)", i, g.Fences[0], want)
				}
				if stored := storedFence(t, client, keys[0]); stored != g.Fences[0] {
					t.Fatalf("grant %d: fence key holds %d, want %d", i, stored, g.Fences[0])
				}
				// The script kept the fence key for retention plus the
				// lead of the fence over its clock, which lies in
				// [before, after]; PTTL has counted down since, by at
				// most after's distance from the script. Allow
				// expirySlack either side.
				least := retention + time.Duration(g.Fences[0]-after)*time.Microsecond - expirySlack
				most := retention + time.Duration(g.Fences[0]-before)*time.Microsecond + expirySlack
				if pttl < least || pttl > most {
					t.Fatalf("grant %d: fence key TTL %v, want retention %v plus the lead, in [%v, %v]",
						i, pttl, retention, least, most)
				}
				last = g.Fences[0]
				mustRelease(t, s, keys, "t")
			}
		})
	}
}

// commandLog records the name of every command a client sends.
type commandLog struct {
	mu    sync.Mutex
	names []string
}

func (l *commandLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *commandLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		l.add(cmd)
		return next(ctx, cmd)
	}
}

func (l *commandLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		l.add(cmds...)
		return next(ctx, cmds)
	}
}

func (l *commandLog) add(cmds ...redis.Cmder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, cmd := range cmds {
		name := cmd.Name()
		if name == "script" && len(cmd.Args()) > 1 {
			name += " " + cmd.Args()[1].(string)
		}
		l.names = append(l.names, name)
	}
}

func (l *commandLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	names := l.names
	l.names = nil
	return names
}

func TestUncontendedLockCostsTwoCommands(t *testing.T) {
	client := testredis.Client(t)
	log := &commandLog{}
	client.AddHook(log)
	s := newStore(t, client)
	ctx := context.Background()
	keys := []string{testredis.Prefix(t) + "k"}
	cycle := func() {
		t.Helper()
		if g, err := s.Acquire(ctx, keys, "t", time.Minute); err != nil || !g.OK {
			t.Fatalf("Acquire: %+v, %v", g, err)
		}
		if err := s.Release(ctx, keys, "t", 0); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	cycle() // warm-up: the connection is open and the scripts cached
	log.take()
	cycle()
	if got, want := log.take(), []string{"evalsha", "evalsha"}; !slices.Equal(got, want) {
		t.Fatalf("acquire+release sent %v, want %v", got, want)
	}
}

func TestLoadCachesScripts(t *testing.T) {
	client := testredis.Client(t)
	log := &commandLog{}
	client.AddHook(log)
	s := newStore(t, client)
	ctx := context.Background()
	if err := client.Ping(ctx).Err(); err != nil { // opens the connection
		t.Fatalf("PING: %v", err)
	}
	log.take()
	if err := s.Load(ctx); err != nil {
		t.Fatalf("Load: %v", err)
	}
	scripts := allScripts()
	if len(scripts) != 14 {
		t.Fatalf("allScripts lists %d scripts, want 14", len(scripts))
	}
	if got, want := log.take(), slices.Repeat([]string{"script load"}, len(scripts)); !slices.Equal(got, want) {
		t.Fatalf("Load sent %v, want %v", got, want)
	}
	hashes := make([]string, len(scripts))
	for i, script := range scripts {
		hashes[i] = script.SHA1()
	}
	exists, err := client.ScriptExists(ctx, hashes...).Result()
	if err != nil {
		t.Fatalf("SCRIPT EXISTS: %v", err)
	}
	if !slices.Equal(exists, slices.Repeat([]bool{true}, len(scripts))) {
		t.Fatalf("after Load, scripts cached: %v, want all", exists)
	}
	if err := newStore(t, testredis.DownClient(t)).Load(ctx); err == nil {
		t.Fatal("Load on a down store succeeded")
	}
}

func TestStoreDown(t *testing.T) {
	s := newStore(t, testredis.DownClient(t))
	start := time.Now()
	if _, err := s.Acquire(context.Background(), []string{"k"}, "t", time.Second); err == nil {
		t.Fatal("Acquire on a down store succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Acquire on a down store took %v", d)
	}
	locker, err := reqlock.New(s)
	if err != nil {
		t.Fatalf("reqlock.New: %v", err)
	}
	if _, err := locker.Obtain(context.Background(), "k", time.Second, 0); !errors.Is(err, reqlock.ErrStore) {
		t.Fatalf("Obtain on a down store: got %v, want ErrStore", err)
	}
}

func TestStoreStalled(t *testing.T) {
	client := redis.NewClient(&redis.Options{
		Addr:                  testredis.StalledAddr(t),
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
	})
	defer client.Close()
	s := newStore(t, client)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	g, err := s.Acquire(ctx, []string{"k"}, "t", time.Second)
	if err == nil || g.OK {
		t.Fatalf("Acquire on a stalled store: %+v, %v; want an error", g, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Acquire on a stalled store took %v, want about the 100ms deadline", d)
	}
}

func TestNewRefusesClientsThatIgnoreDeadlines(t *testing.T) {
	addr := testredis.Addr(t)
	plain := redis.NewClient(&redis.Options{Addr: addr})
	defer plain.Close()
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}})
	defer cluster.Close()
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}})
	defer ring.Close()
	for name, client := range map[string]redis.Scripter{"client": plain, "cluster": cluster, "ring": ring} {
		_, err := New(client)
		if !errors.Is(err, stores.ErrInvalid) || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
			t.Errorf("%s: err = %v, want ErrInvalid naming ContextTimeoutEnabled", name, err)
		}
		if _, err := New(client, WithClientTimeoutsOnly()); err != nil {
			t.Errorf("%s with WithClientTimeoutsOnly: %v", name, err)
		}
	}
}

func TestBadFenceKeyLeavesNoLock(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	ctx := context.Background()
	key := testredis.Prefix(t) + "{k}a"
	other := testredis.Prefix(t) + "{k}b"
	acquires := map[string]func() error{
		"one key": func() error {
			_, err := s.Acquire(ctx, []string{key}, "t", time.Minute)
			return err
		},
		"several keys": func() error {
			_, err := s.Acquire(ctx, []string{key, other}, "t", time.Minute)
			return err
		},
		"fair": func() error {
			_, err := s.AcquireFair(ctx, key, "t", time.Minute, time.Second)
			return err
		},
	}
	for name, setup := range map[string]func() error{
		"wrong type":   func() error { return client.LPush(ctx, fenceKey(key), "x").Err() },
		"not a number": func() error { return client.Set(ctx, fenceKey(key), "abc", time.Hour).Err() },
		"nan":          func() error { return client.Set(ctx, fenceKey(key), "nan", time.Hour).Err() },
		"beyond 2^53":  func() error { return client.Set(ctx, fenceKey(key), "9007199254740993", time.Hour).Err() },
	} {
		for how, acquire := range acquires {
			client.Del(ctx, withFenceKeys([]string{key, other})...)
			if err := setup(); err != nil {
				t.Fatal(err)
			}
			before, _ := client.Dump(ctx, fenceKey(key)).Result()
			hadTTL := client.PTTL(ctx, fenceKey(key)).Val() > 0
			if err := acquire(); err == nil {
				t.Errorf("%s, %s: Acquire succeeded", name, how)
			}
			if n := client.Exists(ctx, key, other).Val(); n != 0 {
				t.Errorf("%s, %s: the failed Acquire left a lock key behind", name, how)
			}
			if after, _ := client.Dump(ctx, fenceKey(key)).Result(); after != before {
				t.Errorf("%s, %s: the fence key's value changed", name, how)
			}
			if pttl := client.PTTL(ctx, fenceKey(key)).Val(); hadTTL && pttl < 0 {
				t.Errorf("%s, %s: the fence key lost its TTL (PTTL %v)", name, how, pttl)
			}
		}
	}
	client.Del(ctx, withFenceKeys([]string{key, other})...)
}
