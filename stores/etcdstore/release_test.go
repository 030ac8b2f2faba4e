package etcdstore_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/etcdstore"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// TestReleaseReplyLostIsNotNotHeld: a Release whose transaction etcd
// applied but whose reply was lost (the chunk dropped on its way back) is
// sent again; the copy finds the key already released by the first and
// is refused. Release must then report a store failure (outcome unknown),
// never stores.ErrNotHeld, which would say the caller's grant was lost.
func TestReleaseReplyLostIsNotNotHeld(t *testing.T) {
	releaseReplyLost(t, []string{"k"})
}

// TestMultiKeyReleaseReplyLostIsNotNotHeld is
// TestReleaseReplyLostIsNotNotHeld with two keys (one nested transaction
// per key).
func TestMultiKeyReleaseReplyLostIsNotNotHeld(t *testing.T) {
	releaseReplyLost(t, []string{"a", "b"})
}

// releaseReplyLost acquires keys, drops the next chunk etcd sends back
// during their Release (the reply, most times), and fails when Release
// says ErrNotHeld.
func releaseReplyLost(t *testing.T, keys []string) {
	s, p := proxiedStore(t, etcdstore.WithPrefix("reqlock-test/"+t.Name()+"/"+time.Now().Format("150405.000000000")+"/"))
	ctx := t.Context()
	for i := range 5 { // warm the connection and the lease
		tok := fmt.Sprintf("warm%d", i)
		if g, err := s.Acquire(ctx, keys, tok, 5*time.Second); err != nil || !g.OK {
			t.Fatalf("warm-up Acquire: %+v, %v", g, err)
		}
		if err := s.Release(ctx, keys, tok, 0); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 5 { // the dropped chunk is not always the reply
		tok := fmt.Sprintf("tok%d", round)
		if g, err := s.Acquire(ctx, keys, tok, 5*time.Second); err != nil || !g.OK {
			t.Fatalf("round %d: Acquire: %+v, %v", round, g, err)
		}
		p.DropNext(faultproxy.ToClient, 1)
		err := s.Release(ctx, keys, tok, 0)
		t.Logf("round %d: Release: %v", round, err)
		if errors.Is(err, stores.ErrNotHeld) {
			t.Fatalf("round %d: a Release whose own copy freed the keys reports ErrNotHeld: %v", round, err)
		}
		if err != nil { // outcome unknown: free the keys for the next round
			if err := s.Release(ctx, keys, tok, 0); err != nil && !errors.Is(err, stores.ErrNotHeld) {
				t.Fatalf("round %d: Release again: %v", round, err)
			}
		}
		// The keys are free: the Release did end the grant.
		g, err := s.Acquire(ctx, keys, "other", 5*time.Second)
		if err != nil || !g.OK {
			t.Fatalf("round %d: Acquire by another after the Release: %+v, %v", round, g, err)
		}
		if err := s.Release(ctx, keys, "other", 0); err != nil {
			t.Fatal(err)
		}
	}
}
