package rueidisstore

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores/redisstore/internal/redistest"
)

// TestNotifyResubscribesAfterReconnect: when Redis drops the pub/sub
// connection, the Store dials a new one and subscribes the key again.
func TestNotifyResubscribesAfterReconnect(t *testing.T) {
	s := newStore(t, newClient(t, testredis.Addr(t), true))
	key := testredis.Prefix(t) + "k"
	ch, stop := s.NotifyRelease(key, "waiter")
	defer stop()
	redistest.Prime(t, s, key, ch)
	admin := testredis.Client(t)
	killed, err := admin.Do(context.Background(), "CLIENT", "KILL", "TYPE", "pubsub").Int64()
	if err != nil || killed == 0 {
		t.Fatalf("CLIENT KILL TYPE pubsub: %d killed, %v; want the Store's connection killed", killed, err)
	}
	select {
	case <-ch:
	default:
	}
	// Releases until the new connection subscribed are lost.
	redistest.Prime(t, s, key, ch)
}

// TestNotifyClientClosedFirst: a Store whose client the caller closed
// first still closes at once, and its calls fail with rueidis.ErrClosing.
// (rueidis does not close a dedicated connection with its client, so the
// Store's pub/sub lives on until Close or until Redis drops it; its
// waiters poll meanwhile, as they do when it is down.)
func TestNotifyClientClosedFirst(t *testing.T) {
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{testredis.Addr(t)}})
	if err != nil {
		t.Fatalf("rueidis.NewClient: %v", err)
	}
	s, err := New(client)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	key := testredis.Prefix(t) + "k"
	ch, stop := s.NotifyRelease(key, "waiter")
	redistest.Prime(t, s, key, ch)
	client.Close()
	if _, err := s.Acquire(context.Background(), []string{key}, "t", time.Minute); !errors.Is(err, rueidis.ErrClosing) {
		t.Fatalf("Acquire after the client was closed: %v, want rueidis.ErrClosing", err)
	}
	stop()
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	timer := time.NewTimer(redistest.SignalWait)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.Fatalf("Close after the client was closed did not return within %v", redistest.SignalWait)
	}
}

// TestNotifyCloseLeavesNoGoroutine: Close stops the goroutine that keeps
// the pub/sub connection, and closes that connection.
func TestNotifyCloseLeavesNoGoroutine(t *testing.T) {
	s := newStore(t, newClient(t, testredis.Addr(t), true))
	key := testredis.Prefix(t) + "k"
	for i := range 16 { // keys of many slots dial every pipelining connection
		redistest.Cycle(t, s, key+strconv.Itoa(i), "warm")
	}
	base := runtime.NumGoroutine()
	ch, stop := s.NotifyRelease(key, "waiter")
	redistest.Prime(t, s, key, ch)
	if n := runtime.NumGoroutine(); n <= base {
		t.Fatalf("%d goroutines while subscribed, %d before: the test cannot see a leak", n, base)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	stop()
	redistest.WaitFor(t, redistest.SignalWait, func() bool { return runtime.NumGoroutine() <= base },
		func() string {
			return fmt.Sprintf("%d goroutines after Close, %d before", runtime.NumGoroutine(), base)
		})
	if ch, _ := s.NotifyRelease(key, "waiter"); ch != nil {
		t.Fatal("NotifyRelease after Close returned a channel")
	}
	redistest.Cycle(t, s, key, "after-close") // locks work after Close
}
