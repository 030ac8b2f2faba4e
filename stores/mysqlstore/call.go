package mysqlstore

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/reqlock/reqlock/stores"
)

// DefaultCallLimit is the call limit of a Store unless WithCallLimit sets
// another: it exceeds InnoDB's default innodb_lock_wait_timeout (50s), the
// longest a statement of this store waits for a row lock on a server with
// default settings.
const DefaultCallLimit = time.Minute

// errLeft ends an operation that saw its caller leave before it committed:
// it rolled back, so there is nothing to undo.
var errLeft = errors.New("mysqlstore: the caller left; rolled back")

// States of a call.
const (
	callRunning int32 = iota
	callReturned
	callAbandoned
)

// call is one store operation in flight; see detached.
type call[T any] struct {
	state atomic.Int32
	done  chan struct{} // closed once v and err are set, unless abandoned
	v     T
	err   error
}

// left reports whether the caller has left: the operation then runs for the
// abandoned hook alone, and should not commit what it can still roll back.
func (c *call[T]) left() bool { return c.state.Load() == callAbandoned }

// detached runs op and returns its outcome, or, as soon as ctx ends even
// while op waits for the server, ctx's error: joined with
// stores.ErrAbandoned when abandoned is not nil, for it undoes what op did.
//
// op does not run on ctx: with go-sql-driver/mysql a cancelled statement
// closes its connection, and the server may still apply the statement after
// that, too late for a release sent at once to undo it. op runs instead on
// a context without ctx's cancellation, bounded by the call limit, so it
// reaches its outcome; when the caller has left by then, abandoned (if not
// nil) gets that outcome, to undo it (see Store.owe for an outcome still
// unknown). op is given the call, so it can see that the caller left
// (call.left) and roll back instead of committing. A ctx that can never end
// runs op inline, bounded by the call limit.
//
// detached returns ErrClosed once Close has begun; Close waits for every op.
func detached[T any](s *Store, ctx context.Context, op func(context.Context, *call[T]) (T, error),
	abandoned func(T, error)) (T, error) {
	var zero T
	if !s.begin() {
		return zero, ErrClosed
	}
	if ctx.Done() == nil {
		defer s.calls.Done()
		bg, cancel := context.WithTimeout(ctx, s.callLimit)
		defer cancel()
		return op(bg, &call[T]{})
	}
	c := &call[T]{done: make(chan struct{})}
	go func() {
		defer s.calls.Done()
		bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.callLimit)
		defer cancel()
		c.v, c.err = op(bg, c)
		if c.state.CompareAndSwap(callRunning, callReturned) {
			close(c.done)
			return
		}
		if abandoned != nil && !errors.Is(c.err, errLeft) {
			abandoned(c.v, c.err)
		}
	}()
	select {
	case <-c.done:
	case <-ctx.Done():
		if c.state.CompareAndSwap(callRunning, callAbandoned) {
			if abandoned != nil {
				return zero, fmt.Errorf("%w: %w", stores.ErrAbandoned, ctx.Err())
			}
			return zero, ctx.Err()
		}
		<-c.done // it returned as ctx ended
	}
	return c.v, c.err
}

// attempt is what an acquire's statement leaves behind, for its undo.
type attempt struct {
	sess    session // of the connection that carried the statement
	unknown bool    // the statement may still apply: no answer came, and the connection is gone
	maybe   bool    // the statement returned a reply the Store could not read: it may have granted
}

// sent records in a that a statement on sess is on its way, or, once err
// is its outcome, whether that outcome is known: a server's error reply
// (the statement, or its transaction, changed nothing) and a connection
// that went bad before anything was written (driver.ErrBadConn) are.
func (a *attempt) sent(sess session, err error) {
	var me *mysql.MySQLError
	a.sess = sess
	a.unknown = err != nil && !errors.As(err, &me) && !errors.Is(err, driver.ErrBadConn)
}
