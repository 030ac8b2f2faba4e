package redisstore

import (
	"context"
	"sync/atomic"
	"time"
)

// abandonedCleanupTimeout bounds the release of a grant whose caller left
// before its acquire call returned.
const abandonedCleanupTimeout = 2 * time.Second

// States of a scriptCall.
const (
	callRunning int32 = iota
	callReturned
	callAbandoned
)

// scriptCall is one acquire script in flight; see untilCancelled.
type scriptCall struct {
	state atomic.Int32
	done  chan struct{} // closed once reply and err are set, unless abandoned
	reply []int64
	err   error
}

// untilCancelled runs an acquire script and returns its reply, or ctx.Err()
// as soon as ctx is cancelled, even while the script is in flight: go-redis
// bounds a call by its context's deadline but not by its cancellation, so a
// waiter whose client left would otherwise sit out a stalled Redis until its
// deadline. The call goes on in the background, bounded by that deadline,
// and once it returns, undo gets its outcome, so that a grant nobody will
// use is released: never before, or the release could reach Redis ahead of
// the grant it undoes.
func untilCancelled(ctx context.Context, run func(ctx context.Context) ([]int64, error), undo func(reply []int64, err error)) ([]int64, error) {
	if ctx.Done() == nil {
		return run(ctx) // never cancelled
	}
	c := &scriptCall{done: make(chan struct{})}
	go c.run(ctx, run, undo)
	select {
	case <-c.done:
	case <-ctx.Done():
		if c.state.CompareAndSwap(callRunning, callAbandoned) {
			return nil, ctx.Err()
		}
		<-c.done // it returned as ctx ended
	}
	return c.reply, c.err
}

func (c *scriptCall) run(ctx context.Context, run func(ctx context.Context) ([]int64, error), undo func(reply []int64, err error)) {
	c.reply, c.err = run(ctx)
	if c.state.CompareAndSwap(callRunning, callReturned) {
		close(c.done)
		return
	}
	undo(c.reply, c.err) // the caller left
}

// cleanupContext is the context of an abandoned call's cleanup: it outlives
// the caller, bounded by abandonedCleanupTimeout.
func cleanupContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), abandonedCleanupTimeout)
}
