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
	"github.com/reqlock/reqlock/stores/storetest"
)

func TestMain(m *testing.M) { os.Exit(testredis.Main(m)) }

func newStore(t *testing.T, client redis.Scripter, opts ...Option) *Store {
	t.Helper()
	s, err := New(client, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	// Registered after the client's cleanup, so it runs before it.
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	client := testredis.Client(t)
	storetest.Run(t, func(t *testing.T) reqlock.Store { return newStore(t, client) })
}

func TestMultiConformance(t *testing.T) {
	client := testredis.Client(t)
	storetest.RunMulti(t, func(t *testing.T) reqlock.Store { return newStore(t, client) })
}

func TestKeepConformance(t *testing.T) {
	client := testredis.Client(t)
	storetest.RunKeep(t, func(t *testing.T) reqlock.Store { return newStore(t, client) })
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
			if _, err := New(tt.client, tt.opts...); !errors.Is(err, reqlock.ErrInvalid) {
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
	key := testredis.Prefix(t) + "k"
	ctx := context.Background()
	if _, err := s.Acquire(ctx, key, "t", 0); !errors.Is(err, reqlock.ErrInvalid) {
		t.Fatalf("Acquire with ttl 0: got %v, want ErrInvalid", err)
	}
	if err := s.Refresh(ctx, key, "t", -time.Second); !errors.Is(err, reqlock.ErrInvalid) {
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

func TestFenceKeyTTLAndFormat(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client, WithFenceRetention(time.Minute))
	ctx := context.Background()
	key := testredis.Prefix(t) + "k"
	serverNow, err := client.Time(ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	g, err := s.Acquire(ctx, key, "t", time.Minute)
	if err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	pttl, err := client.PTTL(ctx, fenceKey(key)).Result()
	if err != nil {
		t.Fatalf("PTTL: %v", err)
	}
	if pttl <= 0 || pttl > time.Minute {
		t.Fatalf("fence key TTL %v, want in (0, 1m]", pttl)
	}
	raw, err := client.Get(ctx, fenceKey(key)).Result()
	if err != nil {
		t.Fatalf("GET fence key: %v", err)
	}
	stored, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || stored != g.Fence {
		t.Fatalf("fence key holds %q, want the decimal fence %d", raw, g.Fence)
	}
	// A fresh key's first fence is the server clock in microseconds.
	if d := time.UnixMicro(g.Fence).Sub(serverNow); d < 0 || d > 10*time.Second {
		t.Fatalf("first fence %d is %v after the server clock, want within [0, 10s]", g.Fence, d)
	}
}

func TestFenceAfterFenceKeyExpires(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	ctx := context.Background()
	key := testredis.Prefix(t) + "k"
	var last int64
	for i := range 3 {
		g, err := s.Acquire(ctx, key, "t", time.Minute)
		if err != nil || !g.OK {
			t.Fatalf("cycle %d: Acquire: %+v, %v", i, g, err)
		}
		if g.Fence <= last {
			t.Fatalf("cycle %d: fence %d after the fence key was deleted, want > %d", i, g.Fence, last)
		}
		last = g.Fence
		if err := s.Release(ctx, key, "t", 0); err != nil {
			t.Fatalf("cycle %d: Release: %v", i, err)
		}
		// What retention does to an idle key: the counter is gone.
		if err := client.Del(ctx, fenceKey(key)).Err(); err != nil {
			t.Fatalf("DEL fence key: %v", err)
		}
	}
}

func TestFenceAboveClockKeepsCounting(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	ctx := context.Background()
	key := testredis.Prefix(t) + "k"
	// A counter ahead of the clock (as after a clock step back) still grows
	// by one; 2^52 also checks that large fences survive exactly.
	const ahead = int64(1) << 52
	if err := client.Set(ctx, fenceKey(key), ahead, time.Minute).Err(); err != nil {
		t.Fatalf("SET fence key: %v", err)
	}
	for i := range 2 {
		g, err := s.Acquire(ctx, key, "t", time.Minute)
		if err != nil || !g.OK {
			t.Fatalf("Acquire: %+v, %v", g, err)
		}
		if want := ahead + int64(i) + 1; g.Fence != want {
			t.Fatalf("fence %d, want %d", g.Fence, want)
		}
		if err := s.Release(ctx, key, "t", 0); err != nil {
			t.Fatalf("Release: %v", err)
		}
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
	key := testredis.Prefix(t) + "k"
	cycle := func() {
		t.Helper()
		if g, err := s.Acquire(ctx, key, "t", time.Minute); err != nil || !g.OK {
			t.Fatalf("Acquire: %+v, %v", g, err)
		}
		if err := s.Release(ctx, key, "t", 0); err != nil {
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
	if len(scripts) != 8 {
		t.Fatalf("allScripts lists %d scripts, want 8", len(scripts))
	}
	if got, want := log.take(), slices.Repeat([]string{"script load"}, len(scripts)); !slices.Equal(got, want) {
		t.Fatalf("Load sent %v, want %v", got, want)
	}
	hashes := make([]string, len(scripts))
	for i, script := range scripts {
		hashes[i] = script.Hash()
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
	if _, err := s.Acquire(context.Background(), "k", "t", time.Second); err == nil {
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
	g, err := s.Acquire(ctx, "k", "t", time.Second)
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
		if !errors.Is(err, reqlock.ErrInvalid) || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
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
	key := testredis.Prefix(t) + "k"
	for name, setup := range map[string]func() error{
		"wrong type":   func() error { return client.LPush(ctx, fenceKey(key), "x").Err() },
		"not a number": func() error { return client.Set(ctx, fenceKey(key), "abc", 0).Err() },
		"beyond 2^53":  func() error { return client.Set(ctx, fenceKey(key), "9007199254740993", 0).Err() },
	} {
		client.Del(ctx, key, fenceKey(key))
		if err := setup(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Acquire(ctx, key, "t", time.Minute); err == nil {
			t.Errorf("%s: Acquire succeeded", name)
		}
		if n := client.Exists(ctx, key).Val(); n != 0 {
			t.Errorf("%s: the failed Acquire left the lock key behind", name)
		}
	}
	client.Del(ctx, key, fenceKey(key))
}
