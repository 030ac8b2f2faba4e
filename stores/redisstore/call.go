package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/reqlock/reqlock/internal/callctx"
	"github.com/reqlock/reqlock/stores"
)

// States of a scriptCall.
const (
	callRunning int32 = iota
	callReturned
	callAbandoned
)

// scriptCall is one acquire script in flight; see run.
type scriptCall struct {
	state  atomic.Int32
	done   chan struct{} // closed once reply and err are set, unless abandoned
	store  *Store
	script *Script
	keys   []string // the script's keys
	args   []any

	// keyBuf and argBuf hold keys and args of a single-key acquire, so
	// that they take no allocation of their own.
	keyBuf [6]string
	argBuf [5]any
	reply  Reply
	err    error

	// undo, unless nil, releases what the script may have granted once it
	// returned to a caller that left; undoKeys and undoToken say what, and
	// ttl is the TTL the call asked for. It returns nil once the clean-up
	// has landed.
	undo      func(c *scriptCall, ctx context.Context) error
	undoKeys  []string
	undoToken string
	ttl       time.Duration
}

// run runs the script and returns its reply, or ctx.Err() as soon as ctx is
// cancelled, even while the script is in flight.
//
// On a Driver that honours cancellation, the script runs on the caller's
// goroutine: a call whose context ended before it returned has an unknown
// outcome, and undo runs in the background. undo first marks the token
// abandoned, which every acquire script refuses, so it may run while the
// script is still on its way: the script then grants nothing, or grants
// before the mark and undo releases it.
//
// go-redis bounds a call by its context's deadline but not by its
// cancellation, so a waiter whose client left would otherwise sit out a
// stalled Redis until its deadline. On such a Driver the script runs on a
// goroutine of its own, bounded by that deadline, and once it returns undo
// releases what it may have granted (when it says so, or its reply was
// lost).
func (c *scriptCall) run(ctx context.Context) (Reply, error) {
	if ctx.Done() == nil || c.store.driver.HonoursCancel() {
		c.reply, c.err = c.call(ctx)
		return c.result(ctx)
	}
	c.done = make(chan struct{})
	go c.inBackground(ctx)
	select {
	case <-c.done:
	case <-ctx.Done():
		if c.state.CompareAndSwap(callRunning, callAbandoned) {
			// inBackground undoes what the script may grant.
			return Reply{}, callctx.Abandoned(ctx, c.undo != nil)
		}
		<-c.done // it returned as ctx ended
	}
	return c.result(ctx)
}

// result returns the call's reply once it returned to a caller that waited.
//
// A call that failed after it may have reached Redis is undone by the store
// (its token marked abandoned, then released), not left to the caller:
//   - it failed as its context ended (go-redis times a call out by the
//     deadline a moment before the context reports it; a Driver that
//     honours cancellation returns at once);
//   - its connection broke (EOF, a reset), or any failure other than an
//     error reply of Redis: Redis may still run the request it had read,
//     after the caller's own release of the token found nothing, and the
//     grant would stand for its TTL with no owner; the mark makes such a
//     late run grant nothing.
func (c *scriptCall) result(ctx context.Context) (Reply, error) {
	if c.err == nil || c.undo == nil || errors.Is(c.err, stores.ErrUnreachable) || errors.Is(c.err, stores.ErrInvalid) {
		return c.reply, c.err
	}
	if callctx.Ended(ctx) {
		go c.cleanUp()
		return Reply{}, callctx.Abandoned(ctx, true)
	}
	if _, reply := c.store.driver.ReplyError(c.err); reply || c.store.driver.Closed(c.err) {
		// Redis answered (a script error, CROSSSLOT): the request ran and
		// will not run again; or the client is closed: no clean-up can be
		// sent.
		return c.reply, c.err
	}
	go c.cleanUp()
	return Reply{}, fmt.Errorf("%w: %w", stores.ErrAbandoned, c.err)
}

// call runs the script and returns its reply.
func (c *scriptCall) call(ctx context.Context) (Reply, error) {
	return c.store.run(ctx, c.script, c.keys, c.args...)
}

// granted reports whether the call's reply says it granted.
func (c *scriptCall) granted() bool { return len(c.reply.Ints) > 0 && c.reply.Ints[0] == 1 }

func (c *scriptCall) inBackground(ctx context.Context) {
	c.reply, c.err = c.call(ctx)
	if c.state.CompareAndSwap(callRunning, callReturned) {
		close(c.done)
		return
	}
	// The caller left: undo in its stead, when the script may have granted.
	if c.undo == nil || errors.Is(c.err, stores.ErrUnreachable) {
		return // it never reached Redis: nothing to undo
	}
	if c.err != nil || c.granted() || c.isFair() {
		c.cleanUp()
	}
}

// isFair reports whether the call was a fair attempt, which may have queued
// the token even when it did not grant.
func (c *scriptCall) isFair() bool { return c.script == fairAcquireScript }
