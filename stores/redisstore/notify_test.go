package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores/redisstore/internal/redistest"
)

const signalWait = redistest.SignalWait

func TestNotifyStartsNothingUntilUsed(t *testing.T) {
	s := newStore(t, testredis.Client(t))
	key := testredis.Prefix(t) + "k"
	cycle(t, s, key, "t1")
	s.mu.Lock()
	ps := s.notify.pubsub
	s.mu.Unlock()
	if ps != nil {
		t.Fatal("a Store that never called NotifyRelease opened a pub/sub")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close of an unused Store: %v", err)
	}
	cycle(t, s, key, "t2") // locks work after Close
}

func TestNotifyCloseLeavesNoGoroutine(t *testing.T) {
	client := testredis.Client(t)
	if err := client.Ping(context.Background()).Err(); err != nil { // opens the pool
		t.Fatalf("PING: %v", err)
	}
	base := runtime.NumGoroutine()
	s := newStore(t, client)
	key := testredis.Prefix(t) + "k"
	ch, stop := s.NotifyRelease(key, "waiter")
	if ch == nil {
		t.Fatal("NotifyRelease: nil channel")
	}
	prime(t, s, key, ch)
	if n := runtime.NumGoroutine(); n <= base {
		t.Fatalf("%d goroutines while subscribed, %d before: the test cannot see a leak", n, base)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	stop() // a subscription from before Close can still be stopped
	stop()
	waitFor(t, signalWait, func() bool { return runtime.NumGoroutine() <= base },
		func() string {
			return fmt.Sprintf("%d goroutines after Close, %d before", runtime.NumGoroutine(), base)
		})

	ch, stop = s.NotifyRelease(key, "waiter")
	if ch != nil {
		t.Fatal("NotifyRelease after Close returned a channel")
	}
	stop()
	cycle(t, s, key, "after-close") // locks work after Close
	if err := client.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("Close closed the caller's client: %v", err)
	}
}

func TestNotifyReleaseFromAnotherProcess(t *testing.T) {
	waiter := newStore(t, testredis.Client(t))
	holder := newStore(t, testredis.Client(t)) // its own client and connections
	key := testredis.Prefix(t) + "k"
	ch, stop := waiter.NotifyRelease(key, "waiter")
	defer stop()
	if ch == nil {
		t.Fatal("NotifyRelease: nil channel")
	}
	prime(t, holder, key, ch)
}

// scripterOnly exposes only the redis.Scripter methods of a client.
type scripterOnly struct{ redis.Scripter }

// wrappedRing hides the type of a *redis.Ring but keeps its Subscribe.
type wrappedRing struct{ *redis.Ring }

func TestNotifyUnsupportedClients(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{
		Addrs:                 map[string]string{"a": testredis.Addr(t)},
		ContextTimeoutEnabled: true,
	})
	defer ring.Close()
	for name, client := range map[string]redis.Scripter{
		"scripter only": scripterOnly{testredis.Client(t)},
		"ring":          ring,
		"wrapped ring":  wrappedRing{ring},
	} {
		t.Run(name, func(t *testing.T) {
			s := newStore(t, client, WithClientTimeoutsOnly())
			key := testredis.Prefix(t) + "k"
			for range 2 {
				ch, stop := s.NotifyRelease(key, "waiter")
				if ch != nil {
					t.Fatal("NotifyRelease returned a channel for a client that cannot notify")
				}
				if stop == nil {
					t.Fatal("NotifyRelease returned a nil stop")
				}
				stop()
			}
			cycle(t, s, key, "t1") // locks still work; waiters poll
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
		})
	}
}

func TestNotifyUnsubscribesWhenLastStops(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	prefix := testredis.Prefix(t)
	key := prefix + "k"
	ch1, stop1 := s.NotifyRelease(key, "w1")
	ch2, stop2 := s.NotifyRelease(key, "w2")
	prime(t, s, key, ch1)
	waitNumSub(t, client, key, 1) // one subscription for both subscribers

	stop1()
	stop1()
	// A subscription made after stop1 is reconciled after it too: once it
	// is live, stop1 has had its (lack of) effect.
	barrier := prefix + "barrier"
	chB, stopB := s.NotifyRelease(barrier, "waiter")
	prime(t, s, barrier, chB)
	stopB()
	if n := numSub(t, client, key); n != 1 {
		t.Fatalf("after one of two subscribers stopped: %d subscriptions to the key, want 1", n)
	}
	drain(ch2)
	cycle(t, s, key, "t1")
	expectSignal(t, ch2, "after the other subscriber stopped")

	stop2()
	stop2()
	waitNumSub(t, client, key, 0)
	waitNumSub(t, client, barrier, 0)
	waitFor(t, signalWait, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.notify.subs) == 0 && len(s.notify.dirty) == 0
	}, func() string { return "subscriber maps not empty after every stop" })
}

// TestNotifyReconcilesChurn subscribes and stops in a random order on a few
// keys, faster than Redis answers, and checks that each key ends subscribed
// exactly when it has a subscriber.
func TestNotifyReconcilesChurn(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	prefix := testredis.Prefix(t)
	keys := []string{prefix + "a", prefix + "b", prefix + "c"}
	rng := rand.New(rand.NewPCG(1, 2))
	stops := make(map[string][]func())
	for range 2000 {
		key := keys[rng.IntN(len(keys))]
		if len(stops[key]) > 0 && rng.IntN(2) == 0 {
			i := rng.IntN(len(stops[key]))
			stops[key][i]()
			stops[key] = append(stops[key][:i], stops[key][i+1:]...)
			continue
		}
		ch, stop := s.NotifyRelease(key, "waiter")
		if ch == nil {
			t.Fatal("NotifyRelease: nil channel")
		}
		stops[key] = append(stops[key], stop)
	}
	// End with one key stopped just after being subscribed, and one
	// subscribed just after being stopped.
	for _, stop := range stops[keys[0]] {
		stop()
	}
	stops[keys[0]] = nil
	_, stop := s.NotifyRelease(keys[0], "waiter")
	stop()
	for _, stop := range stops[keys[1]] {
		stop()
	}
	ch, stop := s.NotifyRelease(keys[1], "waiter")
	stops[keys[1]] = []func(){stop}
	for _, key := range keys {
		want := int64(0)
		if len(stops[key]) > 0 {
			want = 1
		}
		waitNumSub(t, client, key, want)
	}
	prime(t, s, keys[1], ch)
	for _, key := range keys {
		for _, stop := range stops[key] {
			stop()
		}
		waitNumSub(t, client, key, 0)
	}
}

// TestNotifyFlipsInOrder sends SUBSCRIBE, UNSUBSCRIBE and SUBSCRIBE of one
// key in quick succession, many times: the key must end subscribed.
func TestNotifyFlipsInOrder(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	prefix := testredis.Prefix(t)
	taken := func() bool { // the dispatcher has taken every change
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.notify.dirty) == 0
	}
	noMsg := func() string { return "the dispatcher did not take a change" }
	for i := range 50 {
		key := prefix + strconv.Itoa(i)
		_, stop1 := s.NotifyRelease(key, "waiter")
		waitFor(t, signalWait, taken, noMsg)
		stop1()
		waitFor(t, signalWait, taken, noMsg)
		ch, stop2 := s.NotifyRelease(key, "waiter")
		waitFor(t, signalWait, taken, noMsg)
		waitNumSub(t, client, key, 1)
		prime(t, s, key, ch)
		stop2()
		waitNumSub(t, client, key, 0)
	}
}

func TestNotifyResubscribesAfterReconnect(t *testing.T) {
	name := "reqlock-test-" + strconv.FormatUint(rand.Uint64(), 36)
	client := redis.NewClient(&redis.Options{
		Addr:                  testredis.Addr(t),
		ClientName:            name,
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = client.Close() })
	s := newStore(t, client)
	key := testredis.Prefix(t) + "k"
	ch, stop := s.NotifyRelease(key, "waiter")
	defer stop()
	prime(t, s, key, ch)

	admin := testredis.Client(t)
	ctx := context.Background()
	list, err := admin.ClientList(ctx).Result()
	if err != nil {
		t.Fatalf("CLIENT LIST: %v", err)
	}
	var id string
	for line := range strings.SplitSeq(list, "\n") {
		fields := clientFields(line)
		if fields["name"] == name && fields["sub"] == "1" {
			id = fields["id"]
		}
	}
	if id == "" {
		t.Fatalf("no pub/sub connection named %s in CLIENT LIST:\n%s", name, list)
	}
	if err := admin.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err != nil {
		t.Fatalf("CLIENT KILL ID %s: %v", id, err)
	}
	drain(ch)
	// go-redis reconnects and subscribes again; releases meanwhile are lost.
	prime(t, s, key, ch)
}

func TestNotifyClientClosedFirst(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: testredis.Addr(t), ContextTimeoutEnabled: true})
	s, err := New(client)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	key := testredis.Prefix(t) + "k"
	ch, stop := s.NotifyRelease(key, "waiter")
	prime(t, s, key, ch)
	if err := client.Close(); err != nil {
		t.Fatalf("closing the client: %v", err)
	}
	// The pub/sub notices and the Store stops offering channels.
	waitFor(t, signalWait, func() bool {
		ch, stop := s.NotifyRelease(key, "waiter")
		stop()
		return ch == nil
	}, func() string { return "NotifyRelease still returns channels after the client was closed" })
	stop()
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	timer := time.NewTimer(signalWait)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.Fatalf("Close after the client was closed did not return within %v", signalWait)
	}
}

func TestNotifyDoesNotWaitForRedis(t *testing.T) {
	client := redis.NewClient(&redis.Options{
		Addr:                  testredis.StalledAddr(t),
		ReadTimeout:           300 * time.Millisecond,
		WriteTimeout:          300 * time.Millisecond,
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = client.Close() })
	s := newStore(t, client)
	key := testredis.Prefix(t) + "k"
	start := time.Now()
	for i := range 10 {
		ch, stop := s.NotifyRelease(key+strconv.Itoa(i), "waiter")
		if ch == nil {
			t.Fatal("NotifyRelease: nil channel")
		}
		stop()
	}
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Fatalf("NotifyRelease on a stalled Redis took %v; it must not wait for Redis", d)
	}
	start = time.Now()
	if err := s.Close(); err != nil {
		t.Logf("Close: %v", err) // the stalled connection may report its failure
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Close on a stalled Redis took %v", d)
	}
}

// clientFields parses one line of CLIENT LIST.
func clientFields(line string) map[string]string {
	fields := make(map[string]string)
	for field := range strings.FieldsSeq(line) {
		if k, v, ok := strings.Cut(field, "="); ok {
			fields[k] = v
		}
	}
	return fields
}

// numSub returns PUBSUB NUMSUB of channel.
func numSub(t *testing.T, client *redis.Client, channel string) int64 {
	t.Helper()
	counts, err := client.PubSubNumSub(context.Background(), channel).Result()
	if err != nil {
		t.Fatalf("PUBSUB NUMSUB: %v", err)
	}
	return counts[channel]
}

// waitNumSub waits until channel has want subscribers in Redis.
func waitNumSub(t *testing.T, client *redis.Client, channel string, want int64) {
	t.Helper()
	var got int64
	waitFor(t, signalWait, func() bool {
		got = numSub(t, client, channel)
		return got == want
	}, func() string { return fmt.Sprintf("PUBSUB NUMSUB %s is %d, want %d", channel, got, want) })
}

// prime releases key until ch gets a signal (see redistest.Prime).
func prime(t *testing.T, s *Store, key string, ch <-chan struct{}) {
	t.Helper()
	redistest.Prime(t, s, key, ch)
}

// cycle acquires key, has a waiter refused it and releases it (see
// redistest.Cycle).
func cycle(t *testing.T, s *Store, key, token string) {
	t.Helper()
	redistest.Cycle(t, s, key, token)
}

func drain(ch <-chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

func expectSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	timer := time.NewTimer(signalWait)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		t.Fatalf("no signal %s within %v", what, signalWait)
	}
}

// waitFor polls cond until it holds (see redistest.WaitFor).
func waitFor(t *testing.T, limit time.Duration, cond func() bool, msg func() string) {
	t.Helper()
	redistest.WaitFor(t, limit, cond, msg)
}

// TestReleasePublishesOnlyWhenWaitedFor: a release publishes only for the
// keys a caller was refused while they were held (the waiting key marks
// them), and deletes the mark; an uncontended lock publishes nothing.
func TestReleasePublishesOnlyWhenWaitedFor(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	ctx := t.Context()
	prefix := testredis.Prefix(t)
	ps := client.PSubscribe(ctx, prefix+"*")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil { // the subscription is live
		t.Fatalf("PSUBSCRIBE: %v", err)
	}
	barrier := 0
	// expectChannels receives the next messages and checks their channels,
	// then publishes a barrier and expects it next: no other message came.
	expectChannels := func(want ...string) {
		t.Helper()
		barrier++
		want = append(want, prefix+"barrier"+strconv.Itoa(barrier))
		for i, ch := range want {
			if i == len(want)-1 {
				if err := client.Publish(ctx, ch, "barrier").Err(); err != nil {
					t.Fatalf("PUBLISH: %v", err)
				}
			}
			msg, err := ps.ReceiveTimeout(ctx, signalWait)
			if err != nil {
				t.Fatalf("waiting for a message on %q: %v", ch, err)
			}
			if m, ok := msg.(*redis.Message); !ok || m.Channel != ch {
				t.Fatalf("got %v, want a message on %q", msg, ch)
			}
		}
	}
	a, b := prefix+"{t}a", prefix+"{t}b"
	acquire := func(keys []string, token string, want bool) {
		t.Helper()
		if g, err := s.Acquire(ctx, keys, token, time.Minute); err != nil || g.OK != want {
			t.Fatalf("Acquire(%q, %q): %+v, %v; want OK %v", keys, token, g, err, want)
		}
	}
	release := func(keys []string, token string) {
		t.Helper()
		if err := s.Release(ctx, keys, token, 0); err != nil {
			t.Fatalf("Release(%q, %q): %v", keys, token, err)
		}
	}

	acquire([]string{a}, "t1", true)
	release([]string{a}, "t1")
	expectChannels() // uncontended: nothing published

	acquire([]string{a}, "t2", true)
	acquire([]string{a}, "waiter", false)
	pttl := client.PTTL(ctx, waitingKey(a)).Val()
	if pttl <= time.Minute-time.Second || pttl > time.Minute+time.Second {
		t.Fatalf("the waiting mark's TTL is %v, want the holder's minute plus up to a second", pttl)
	}
	release([]string{a}, "t2")
	expectChannels(a)
	if n := client.Exists(ctx, waitingKey(a)).Val(); n != 0 {
		t.Fatal("the release left the waiting mark behind")
	}
	acquire([]string{a}, "t3", true)
	release([]string{a}, "t3")
	expectChannels() // the mark went with the last release

	// Several keys: only the one a waiter was refused publishes.
	both := []string{a, b}
	acquire(both, "t4", true)
	acquire([]string{b}, "waiter", false)
	release(both, "t4")
	expectChannels(b)
	acquire(both, "t5", true)
	acquire(both, "waiter", false) // refused at the first held key, a
	release(both, "t5")
	expectChannels(a)
}
