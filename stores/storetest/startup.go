package storetest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// StartupTimeout is the bound of an Open that checks its server when its
// context has no deadline (every store's DefaultConnectTimeout).
const StartupTimeout = 5 * time.Second

// Opener opens a store whose servers are reached at addrs (faultproxy
// addresses, one per server), with connect=lazy in its URL when lazy;
// closing it is the caller's.
type Opener func(ctx context.Context, addrs []string, lazy bool) (stores.Store, error)

// Startup checks a store's start-up behaviour when its server cannot be
// reached, through proxies in front of its real servers (one per server):
//
//   - while every proxy refuses connections (a closed port), Open without
//     connect=lazy fails with an error wrapping stores.ErrUnreachable that
//     names every proxy's address, within StartupTimeout (plus a margin)
//     when ctx has no deadline, and within a shorter deadline of ctx;
//   - Open with connect=lazy succeeds, and an Acquire fails with a store
//     error (neither a grant, nor ErrInvalid, nor a refusal), in time;
//   - once the proxies heal, the same store grants, refreshes and releases a key,
//     with no reopening.
func Startup(t *testing.T, proxies []*faultproxy.Proxy, open Opener) {
	t.Helper()
	addrs := make([]string, len(proxies))
	for i, p := range proxies {
		p.Refuse()
		addrs[i] = p.Addr()
	}
	const margin = 3 * time.Second
	start := time.Now()
	s, err := open(context.Background(), addrs, false)
	took := time.Since(start)
	if err == nil {
		closeStore(s)
		t.Fatal("Open succeeded with its server unreachable")
	}
	for _, addr := range addrs {
		if !errors.Is(err, stores.ErrUnreachable) || !strings.Contains(err.Error(), addr) {
			t.Errorf("Open: got %v; want an error wrapping ErrUnreachable that names %s", err, addr)
		}
	}
	if errors.Is(err, stores.ErrInvalid) {
		t.Errorf("Open: an unreachable server is not a configuration error: %v", err)
	}
	if took > StartupTimeout+margin {
		t.Errorf("Open took %v to fail, more than %v", took, StartupTimeout+margin)
	}
	t.Logf("Open (check): %v after %v", err, took)

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	start = time.Now()
	s, err = open(ctx, addrs, false)
	took = time.Since(start)
	cancel()
	if err == nil {
		closeStore(s)
		t.Fatal("Open succeeded with its server unreachable")
	}
	if took > time.Second+margin {
		t.Errorf("Open with a 1s context took %v to fail", took)
	}

	s, err = open(context.Background(), addrs, true)
	if err != nil {
		t.Fatalf("Open with connect=lazy: %v", err)
	}
	t.Cleanup(func() { closeStore(s) })
	key := []string{"{storetest}:startup:" + strings.ReplaceAll(t.Name(), "/", ":")}
	callCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	start = time.Now()
	g, err := s.Acquire(callCtx, key, "startup-down", 10*time.Second)
	took = time.Since(start)
	cancel()
	switch {
	case err == nil && g.OK:
		t.Fatal("Acquire granted a key while the server was unreachable")
	case err == nil:
		t.Fatalf("Acquire refused the key as held (%+v) while the server was unreachable; want a store error", g)
	case errors.Is(err, stores.ErrInvalid) || errors.Is(err, stores.ErrNotHeld):
		t.Fatalf("Acquire: got %v; want a store error", err)
	case took > 2*time.Second+margin:
		t.Errorf("Acquire took %v to fail", took)
	}
	t.Logf("Acquire while unreachable: %v after %v", err, took)

	for _, p := range proxies {
		p.Heal()
	}
	healed := time.Now()
	deadline := healed.Add(30 * time.Second)
	for i := 0; ; i++ {
		callCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		token := "startup-up-" + time.Now().Format("150405.000000000")
		g, err = s.Acquire(callCtx, key, token, 10*time.Second)
		cancel()
		if err == nil && g.OK {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := s.Refresh(ctx, key, token, 10*time.Second); err != nil {
				t.Errorf("Refresh after the server came up: %v", err)
			}
			if err := s.Release(ctx, key, token, 0); err != nil {
				t.Errorf("Release after the server came up: %v", err)
			}
			cancel()
			t.Logf("granted %v after the server came up (%d tries)", time.Since(healed), i+1)
			return
		}
		if errors.Is(err, stores.ErrInvalid) {
			t.Fatalf("Acquire after the server came up: %v", err)
		}
		if err == nil {
			t.Fatalf("Acquire after the server came up refused the key as held: %+v", g)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no grant within 30s of the server coming up: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
}

// closeStore closes s when it has a Close method.
func closeStore(s stores.Store) {
	if c, ok := s.(interface{ Close() error }); ok {
		_ = c.Close()
	}
}
