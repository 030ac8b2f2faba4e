//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package filestore_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/filestore"
)

// TestSharedAcrossProcesses: another process's holder counts towards a
// limit here, keeps an exclusive Acquire out (recording it as a waiting
// writer, which keeps new holders out), and its release
// signals this process's waiter and frees the key; a killed holder keeps
// its place until its TTL, not for good. Fences of either kind, in either
// process, come from one sequence.
func TestSharedAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	s := newStore(t, dir)
	ctx := t.Context()
	c := startChild(t, dir)
	held := fences(t, c.send(t, "granted", "share", "1", "1m", "k"))

	if g, err := s.AcquireShared(ctx, "k", "parent", 1, time.Minute); err != nil || g.OK || g.Wait <= 50*time.Second {
		t.Fatalf("AcquireShared under a limit of 1 held by another process: %+v, %v; want refused with Wait in (50s, 1m]", g, err)
	}
	g, err := s.AcquireShared(ctx, "k", "parent", 2, time.Minute)
	if err != nil || !g.OK {
		t.Fatalf("AcquireShared under a limit of 2 with one holder in another process: %+v, %v", g, err)
	}
	expectAbove(t, held, g.Fences, "a holder after another process's")
	if err := s.ReleaseShared(ctx, "k", "parent", 0); err != nil {
		t.Fatal(err)
	}

	released, stop := s.NotifyRelease("k", "writer")
	defer stop()
	g, err = s.Acquire(ctx, []string{"k"}, "writer", time.Minute)
	if err != nil || g.OK || !g.SharedHeld {
		t.Fatalf("Acquire of a key another process holds shared: %+v, %v; want refused with SharedHeld", g, err)
	}
	// The waiting writer keeps new holders out; the child's holder may
	// retry its grant.
	if g, err := s.AcquireShared(ctx, "k", "reader", 0, time.Minute); err != nil || g.OK {
		t.Fatalf("AcquireShared while a writer waits: %+v, %v; want refused", g, err)
	}
	held = fences(t, c.send(t, "granted", "share", "0", "1m", "k"))
	c.send(t, "released", "unshare", "k")
	if runtime.GOOS == "linux" { // elsewhere, nothing rings: waiters poll
		select {
		case <-released:
		case <-time.After(5 * time.Second):
			t.Fatal("no signal within 5s of the other process's shared release")
		}
	}
	g, err = s.Acquire(ctx, []string{"k"}, "writer", time.Minute)
	if err != nil || !g.OK {
		t.Fatalf("Acquire after the other process's holder left: %+v, %v", g, err)
	}
	expectAbove(t, held, g.Fences, "a writer after another process's holder")
	if got := c.send(t, "refused", "share", "0", "1m", "k"); len(got) != 1 {
		t.Fatalf("refusal %q", got)
	}
	if err := s.Release(ctx, []string{"k"}, "writer", 0); err != nil {
		t.Fatal(err)
	}

	// A killed holder's place lasts its TTL: the holders keep no flock.
	const ttl = 300 * time.Millisecond
	c.send(t, "granted", "share", "1", ttl.String(), "d")
	granted := time.Now()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
	if g, err := s.AcquireShared(ctx, "d", "parent", 1, time.Minute); err != nil || g.OK {
		t.Fatalf("AcquireShared of a place a killed process held: %+v, %v; want refused until its TTL", g, err)
	}
	poll(t, 5*time.Second, func() bool {
		g, err := s.AcquireShared(ctx, "d", "parent", 1, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return g.OK
	})
	if took := time.Since(granted); took < ttl-10*time.Millisecond {
		t.Fatalf("the killed holder's place was free after %v, its TTL %v", took, ttl)
	}
}

// poll calls ok every few milliseconds until it reports true, failing the
// test after limit.
func poll(t *testing.T, limit time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not done within %v", limit)
		}
		<-time.After(2 * time.Millisecond)
	}
}

// TestLimitAcrossStores: holders of four Stores on one directory (four open
// files of each key file, as four processes have) never exceed the limit
// together, and reach it; an exclusive grant of any Store never overlaps a
// holder.
func TestLimitAcrossStores(t *testing.T) {
	dir := t.TempDir()
	const limit, workers = 3, 12
	ss := make([]*filestore.Store, 4)
	for i := range ss {
		ss[i] = newStore(t, dir)
	}
	var (
		active, peak atomic.Int64
		writing      atomic.Bool
		wg           sync.WaitGroup
		errs         = make(chan error, workers+1)
		stop         = make(chan struct{})
	)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	for i := range workers {
		s := ss[i%len(ss)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				token := fmt.Sprintf("h%d-%d", i, n)
				g, err := s.AcquireShared(context.Background(), "k", token, limit, time.Minute)
				if err != nil {
					fail(err)
					return
				}
				if !g.OK {
					<-time.After(time.Millisecond)
					continue
				}
				a := active.Add(1)
				for p := peak.Load(); a > p && !peak.CompareAndSwap(p, a); p = peak.Load() {
				}
				if a > limit {
					fail(fmt.Errorf("%d holders at once, limit %d", a, limit))
				}
				if writing.Load() {
					fail(fmt.Errorf("holder %s granted while a writer holds the key", token))
				}
				<-time.After(2 * time.Millisecond)
				active.Add(-1)
				if err := s.ReleaseShared(context.Background(), "k", token, 0); err != nil {
					fail(err)
					return
				}
			}
		}()
	}
	end := time.Now().Add(time.Second)
	writes := 0
	for n := 0; time.Now().Before(end) || writes == 0; n++ {
		if time.Since(end) > 10*time.Second {
			t.Fatal("no writer was granted among the holders in 11s: starved")
		}
		<-time.After(50 * time.Millisecond)
		s := ss[n%len(ss)]
		token := "writer" + strconv.Itoa(n)
		// The writer tries every 5ms until granted, which its waiting
		// writer's record lets it be once the holders drain.
		var g stores.Grant
		for {
			var err error
			if g, err = s.Acquire(t.Context(), []string{"k"}, token, time.Minute); err != nil {
				t.Fatal(err)
			}
			if g.OK || !g.SharedHeld {
				break
			}
			<-time.After(5 * time.Millisecond)
		}
		if !g.OK {
			continue
		}
		writing.Store(true)
		if a := active.Load(); a != 0 {
			t.Errorf("a writer was granted while %d hold the key", a)
		}
		writes++
		<-time.After(2 * time.Millisecond)
		writing.Store(false)
		if err := s.Release(t.Context(), []string{"k"}, token, 0); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	if p := peak.Load(); p != limit {
		t.Fatalf("at most %d holders at once, want the limit %d reached", p, limit)
	}
	t.Logf("peak %d holders, %d writes", peak.Load(), writes)
}
