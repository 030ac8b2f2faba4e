package mysqlstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// poolCallLimit bounds each call of the capped-pool tests: far above what a
// call takes on a loaded machine, far below the minute a call left waiting
// for a connection would wait.
const poolCallLimit = 15 * time.Second

// TestPoolOfOne (issue 18, defect 16): every call needs at most one
// connection at a time and holds no shared lock while it waits for one. On a
// pool capped at one connection, a Store that has prepared nothing yet
// acquires, refreshes and releases several keys, and a Release of another
// key, sent while a Refresh of two keys runs, is not held up behind it. A
// call on several keys used to hold its transaction's connection and then
// prepare a statement on a second one, holding the statement cache's mutex,
// which every other call takes.
func TestPoolOfOne(t *testing.T) {
	db := openDB(t)
	db.SetMaxOpenConns(1)
	direct := newStore(t, openDB(t))
	keys, other := testKeys(2), testKeys(1)
	// Held by t1 and t2, set by a store on another pool: the capped store
	// has prepared nothing when it refreshes and releases them.
	mustAcquire(t, direct, keys, "t1", time.Minute)
	mustAcquire(t, direct, other, "t2", time.Minute)
	s := newStore(t, db)

	call := func(name string, f func(ctx context.Context) error) <-chan error {
		errc := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(t.Context(), poolCallLimit)
			defer cancel()
			if err := f(ctx); err != nil {
				errc <- fmt.Errorf("%s: %w", name, err)
				return
			}
			errc <- nil
		}()
		return errc
	}
	refresh := call("Refresh of 2 keys", func(ctx context.Context) error { return s.Refresh(ctx, keys, "t1", time.Minute) })
	release := call("Release of another key", func(ctx context.Context) error { return s.Release(ctx, other, "t2", 0) })
	for _, errc := range []<-chan error{refresh, release} {
		if err := <-errc; err != nil {
			t.Fatalf("on a pool of one connection: %v", err)
		}
	}
	if err := <-call("Release of 2 keys", func(ctx context.Context) error { return s.Release(ctx, keys, "t1", 0) }); err != nil {
		t.Fatalf("on a pool of one connection: %v", err)
	}
	fresh := testKeys(3)
	if err := <-call("Acquire of 3 keys", func(ctx context.Context) error {
		g, err := s.Acquire(ctx, fresh, "t3", time.Minute)
		if err == nil && !g.OK {
			err = fmt.Errorf("refused: %+v", g)
		}
		return err
	}); err != nil {
		t.Fatalf("on a pool of one connection: %v", err)
	}
	if err := <-call("Release of 3 keys", func(ctx context.Context) error { return s.Release(ctx, fresh, "t3", 0) }); err != nil {
		t.Fatalf("on a pool of one connection: %v", err)
	}
}

// TestPoolOfTen (issue 18, defect 16): on a pool capped at 10 connections,
// 40 concurrent Acquires of two keys each, by a Store that has prepared
// nothing yet, are all granted.
func TestPoolOfTen(t *testing.T) {
	const callers = 40
	db := openDB(t)
	db.SetMaxOpenConns(10)
	s := newStore(t, db)
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	start := make(chan struct{})
	for i := range callers {
		keys := testKeys(2)
		wg.Go(func() {
			<-start
			ctx, cancel := context.WithTimeout(t.Context(), poolCallLimit)
			defer cancel()
			g, err := s.Acquire(ctx, keys, "t1", time.Minute)
			if err == nil && !g.OK {
				err = fmt.Errorf("refused: %+v", g)
			}
			if err == nil {
				err = s.Release(ctx, keys, "t1", 0)
			}
			if err != nil {
				errs <- fmt.Errorf("caller %d: %w", i, err)
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		if failed == 0 {
			t.Errorf("on a pool of 10 connections: %v", err)
		}
		failed++
	}
	if failed > 0 {
		t.Fatalf("%d of %d concurrent 2-key Acquires and Releases failed on a pool of 10 connections", failed, callers)
	}
}
