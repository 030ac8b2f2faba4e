package zkstore_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
)

// rawConn returns a plain go-zookeeper connection to the shared ZooKeeper,
// with a session of its own, closed when the test ends.
func rawConn(t *testing.T) *zk.Conn {
	t.Helper()
	conn, _, err := zk.Connect([]string{testservers.ZooKeeperAddr(t)}, 10*time.Second, zk.WithLogger(discard{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	return conn
}

// deleteTree deletes the node at path and its children, as the server does
// when their session ends and then reaps the empty container.
func deleteTree(t *testing.T, conn *zk.Conn, path string) {
	t.Helper()
	children, _, err := conn.Children(path)
	if err != nil {
		t.Fatalf("children of %s: %v", path, err)
	}
	for _, c := range children {
		if err := conn.Delete(path+"/"+c, -1); err != nil {
			t.Fatalf("delete %s/%s: %v", path, c, err)
		}
	}
	if err := conn.Delete(path, -1); err != nil {
		t.Fatalf("delete %s: %v", path, err)
	}
}

// TestStaleHolderCannotTouchNextGrant (issue 18, defect 8): a Store whose
// grant's nodes went away on the server without its knowing (its session
// expired or was closed by another party, and the server reaped the key's
// empty container) gets ErrNotHeld from Refresh and Release once another
// Store has been granted the key, which is untouched. The nodes are created
// anew with the versions of the first grant; before the fix, the stale
// Store's record of them (node versions) matched, and its Refresh and
// Release succeeded, the Release deleting the next holder's lock node.
func TestStaleHolderCannotTouchNextGrant(t *testing.T) {
	stale := newStore(t)
	next := sameRootStore(t, stale)
	raw := rawConn(t)
	keys := []string{"k"}
	ttl := stale.Bounds().MaxTTL
	if g, err := stale.Acquire(t.Context(), keys, "t1", ttl); err != nil || !g.OK {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	deleteTree(t, raw, stale.Root()+"/k")
	if g, err := next.Acquire(t.Context(), keys, "t2", ttl); err != nil || !g.OK {
		t.Fatalf("the next holder's Acquire: %+v, %v", g, err)
	}
	if err := stale.Refresh(t.Context(), keys, "t1", ttl); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("the stale holder's Refresh: %v, want ErrNotHeld", err)
	}
	if err := stale.Release(t.Context(), keys, "t1", time.Second); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("the stale holder's Release with keep: %v, want ErrNotHeld", err)
	}
	if err := stale.Release(t.Context(), keys, "t1", 0); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("the stale holder's Release: %v, want ErrNotHeld", err)
	}
	data, _, err := raw.Get(stale.Root() + "/k/lock")
	if err != nil || !strings.HasSuffix(string(data), "\nt2") {
		t.Fatalf("the next holder's lock node: %q, %v; want its grant, untouched", data, err)
	}
	if err := next.Refresh(t.Context(), keys, "t2", ttl); err != nil {
		t.Fatalf("the next holder's Refresh: %v", err)
	}
	if err := next.Release(t.Context(), keys, "t2", 0); err != nil {
		t.Fatalf("the next holder's Release: %v", err)
	}
}
