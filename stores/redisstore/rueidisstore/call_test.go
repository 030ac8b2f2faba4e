package rueidisstore

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redisstore/internal/redistest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// stacks returns the stacks of every goroutine.
func stacks() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

// TestNoGoroutinePerCall: acquires in flight to a stalled Redis wait in
// rueidis on their callers' goroutines, with no goroutine of the Store's
// per call (redisstore's scriptCall.inBackground, which a Driver that does
// not honour cancellation needs), and return as soon as their callers
// leave, abandoned (the Store undoes them).
func TestNoGoroutinePerCall(t *testing.T) {
	const calls = 20
	p := faultproxy.New(t, testredis.Addr(t))
	s := newStore(t, newClient(t, p.Addr(), true))
	prefix := testredis.Prefix(t)
	redistest.Cycle(t, s, prefix+"warm", "t") // scripts cached, connections open
	p.Stall(faultproxy.Both)
	t.Cleanup(p.Heal)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, calls)
	for i := range calls {
		go func() {
			_, err := s.Acquire(ctx, []string{prefix + strconv.Itoa(i)}, "t", time.Minute)
			errs <- err
		}()
	}
	var all string
	redistest.WaitFor(t, redistest.SignalWait, func() bool {
		all = stacks()
		return strings.Count(all, "rueidisstore.(*driver).Eval(") >= calls
	}, func() string {
		return "the acquires are not all waiting in the driver:\n" + all
	})
	if strings.Contains(all, "inBackground") {
		t.Fatalf("a goroutine per call runs the script:\n%s", all)
	}
	cancel()
	timer := time.NewTimer(redistest.SignalWait)
	defer timer.Stop()
	for range calls {
		select {
		case err := <-errs:
			if !errors.Is(err, stores.ErrAbandoned) || !errors.Is(err, context.Canceled) {
				t.Errorf("Acquire left by its caller: %v, want ErrAbandoned and context.Canceled", err)
			}
		case <-timer.C:
			t.Fatalf("Acquire did not return within %v of its caller leaving, while Redis stalls", redistest.SignalWait)
		}
	}
}
