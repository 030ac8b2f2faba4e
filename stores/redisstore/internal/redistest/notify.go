package redistest

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
)

const (
	// SignalWait bounds the wait for a release signal.
	SignalWait = 5 * time.Second
	// primeRound is the pause between Prime's releases.
	primeRound = 50 * time.Millisecond
)

// Prime releases key until ch gets a signal, which shows that the
// subscription is live.
func Prime(t *testing.T, s stores.Store, key string, ch <-chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(SignalWait)
	timer := time.NewTimer(primeRound)
	defer timer.Stop()
	for i := 0; ; i++ {
		Cycle(t, s, key, "prime"+strconv.Itoa(i))
		timer.Reset(primeRound)
		select {
		case <-ch:
			return
		case <-timer.C:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no signal on %q within %v of releasing it every %v", key, SignalWait, primeRound)
		}
	}
}

// Cycle acquires key with token, has a waiter refused it (so that the
// release publishes) and releases it.
func Cycle(t *testing.T, s stores.Store, key, token string) {
	t.Helper()
	ctx := context.Background()
	if g, err := s.Acquire(ctx, []string{key}, token, time.Minute); err != nil || !g.OK {
		t.Fatalf("Acquire(%q, %q): %+v, %v", key, token, g, err)
	}
	if g, err := s.Acquire(ctx, []string{key}, "waiter", time.Minute); err != nil || g.OK {
		t.Fatalf("Acquire(%q) of a waiter: %+v, %v; want a refusal", key, g, err)
	}
	if err := s.Release(ctx, []string{key}, token, 0); err != nil {
		t.Fatalf("Release(%q, %q): %v", key, token, err)
	}
}

// WaitFor polls cond until it holds or limit passes, then fails with msg().
func WaitFor(t testing.TB, limit time.Duration, cond func() bool, msg func() string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	ticker := time.NewTicker(5 * time.Millisecond)
	defer ticker.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(msg())
		}
		<-ticker.C
	}
}
