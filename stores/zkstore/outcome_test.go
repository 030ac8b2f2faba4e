package zkstore_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
	"github.com/reqlock/reqlock/stores/zkstore"
)

// TestFairJoinThenUnreachable (issue 18, from review): an AcquireFair that
// queued its waiter (the server created the queue node and answered) and
// then lost its connection with no server to reconnect to fails with an
// unknown outcome, never ErrUnreachable ("nothing changed"), so that the
// Locker takes the waiter out of the queue. Before the fix, the call's last
// request, never sent, made the whole call ErrUnreachable.
func TestFairJoinThenUnreachable(t *testing.T) {
	holder := newStore(t)
	w, p := proxiedStore(t, zkstore.WithRoot(holder.Root()))
	ctx := t.Context()
	if g, err := holder.Acquire(ctx, []string{"k"}, "t1", 5*time.Second); err != nil || !g.OK {
		t.Fatalf("the holder's Acquire: %+v, %v", g, err)
	}
	// The queue node's name is in the reply that creates it: the client
	// gets that reply, then the connection is cut and refused.
	p.Refuse()
	p.CutWhen(faultproxy.ToClient, func(chunk []byte) bool { return strings.Contains(string(chunk), "q-tokW-") }, true)
	callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := w.AcquireFair(callCtx, "k", "tokW", 5*time.Second, 5*time.Second)
	if p.Armed() != 0 {
		t.Fatalf("the queue node was never created (AcquireFair: %v)", err)
	}
	if err == nil || errors.Is(err, stores.ErrUnreachable) || errors.Is(err, stores.ErrAbandoned) {
		t.Fatalf("AcquireFair that queued the waiter, then could reach no server: %v; want a store failure of unknown outcome", err)
	}
	if q := queueNodes(t, holder.Root()+"/k"); len(q) != 1 {
		t.Fatalf("queue nodes %q, want the waiter's", q)
	}
	p.Heal()
	pollUntil(t, 10*time.Second, "the waiter leaves the queue once the server is back", func() bool {
		return w.LeaveFair(ctx, "k", "tokW") == nil
	})
	if q := queueNodes(t, holder.Root()+"/k"); len(q) != 0 {
		t.Fatalf("queue nodes %q after LeaveFair", q)
	}
}

// TestUndoStopsOnLastingError (issue 18, from review): the clean-up of an
// abandoned Acquire that fails with an error trying again would not cure
// (here the server refuses the delete: the key's node has an ACL without
// the delete permission) stops and logs, instead of trying until the Store
// is closed. Before the fix, it tried every second until Close.
func TestUndoStopsOnLastingError(t *testing.T) {
	var logs logBuffer
	s, p := proxiedStore(t, zkstore.WithSessionTimeout(30*time.Second), // pings every 10s: the next reply is the Acquire's
		zkstore.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	raw := rawConn(t)
	acl := []zk.ACL{{Perms: zk.PermAll &^ zk.PermDelete, Scheme: "world", ID: "anyone"}}
	if _, err := raw.Create(s.Root()+"/nodelete", nil, 0, acl); err != nil {
		t.Fatal(err)
	}
	p.DelayNext(faultproxy.ToClient, time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	_, err := s.Acquire(ctx, []string{"nodelete"}, "t1", 10*time.Second)
	cancel()
	if !errors.Is(err, stores.ErrAbandoned) {
		t.Fatalf("Acquire with a late reply: %v, want ErrAbandoned", err)
	}
	pollUntil(t, 10*time.Second, "the clean-up stops", func() bool { return s.InFlight() == 0 })
	if !logs.contains("clean-up of an abandoned call failed") || !logs.contains("not authenticated") {
		t.Errorf("the failed clean-up is not logged with its cause: %q", logs.b.String())
	}
}
