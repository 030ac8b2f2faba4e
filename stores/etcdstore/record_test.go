package etcdstore_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/etcdstore"
)

// TestRecordOutlivesClose: a record stays after the Store that wrote it
// closes (Close revokes the leases of locks, not of records), on a lease
// that etcd ends at its retention plus at most a minute and a second, so
// that etcd removes it by itself; the claim it replaced went with its
// lease at Close, as any lock of the Store.
func TestRecordOutlivesClose(t *testing.T) {
	t.Parallel()
	a, err := etcdstore.New(newClient(t, testservers.EtcdEndpoints(t)))
	if err != nil {
		t.Fatal(err)
	}
	b := newStore(t)
	c := newClient(t, testservers.EtcdEndpoints(t))
	k := uniqueKey(t)
	const retention = 10 * time.Minute
	g, _, err := a.ClaimRecord(t.Context(), k, "a", time.Minute)
	if err != nil || !g.OK {
		t.Fatalf("ClaimRecord: %+v, %v", g, err)
	}
	rec := stores.Record{Fingerprint: "fp", Response: []byte("201 created"), Fence: g.Fences[0]}
	if err := a.FinishRecord(t.Context(), k, "a", rec, retention); err != nil {
		t.Fatalf("FinishRecord: %v", err)
	}
	other := uniqueKey(t) + "-claim"
	if g, _, err := a.ClaimRecord(t.Context(), other, "a2", time.Minute); err != nil || !g.OK {
		t.Fatalf("ClaimRecord of another key: %+v, %v", g, err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	_, got, err := b.ClaimRecord(t.Context(), k, "b", time.Minute)
	if err != nil || got == nil || got.Fingerprint != rec.Fingerprint || string(got.Response) != string(rec.Response) || got.Fence != rec.Fence {
		t.Fatalf("ClaimRecord after the writer's Close: record %+v, %v; want %+v", got, err, rec)
	}
	if g, rec, err := b.ClaimRecord(t.Context(), other, "b2", time.Minute); err != nil || !g.OK || rec != nil {
		t.Fatalf("ClaimRecord of the key the closed Store claimed: %+v, record %+v, %v; want granted (the claim's lease revoked)", g, rec, err)
	}

	resp, err := c.Get(t.Context(), etcdstore.DefaultPrefix+k+"/holder")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("Get of the record's holder key: %v, %d keys", err, len(resp.Kvs))
	}
	ttl, err := c.TimeToLive(t.Context(), clientv3.LeaseID(resp.Kvs[0].Lease))
	if err != nil {
		t.Fatalf("TimeToLive of the record's lease: %v", err)
	}
	granted := time.Duration(ttl.GrantedTTL) * time.Second
	if granted < retention || granted > retention+time.Minute+time.Second {
		t.Fatalf("the record's lease was granted %v, want within [%v, %v]", granted, retention, retention+time.Minute+time.Second)
	}
}

// TestRecordBounds: Bounds states the largest record from etcd's request
// size limit (1498 KiB with the defaults, more with a larger
// --max-request-bytes) and MaxTTL as the longest retention; a record that
// fits the bound but, with a key far longer than the Locker's, would make
// a request above the limit is refused with ErrInvalid before the Store
// acts: the claim stays.
func TestRecordBounds(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	b := s.Bounds()
	if b.MaxRecordBytes != 1498<<10 || b.MaxRetention != etcdstore.MaxTTL {
		t.Fatalf("Bounds: MaxRecordBytes %d, MaxRetention %v; want %d, %v", b.MaxRecordBytes, b.MaxRetention, 1498<<10, etcdstore.MaxTTL)
	}
	if big := newStore(t, etcdstore.WithMaxRequestBytes(3<<20)).Bounds().MaxRecordBytes; big <= b.MaxRecordBytes {
		t.Fatalf("MaxRecordBytes %d with a request limit of 3 MiB, %d with the default; want more", big, b.MaxRecordBytes)
	}

	k := uniqueKey(t) + strings.Repeat("/", 30<<10) // escaped to three bytes each
	g, _, err := s.ClaimRecord(t.Context(), k, "a", time.Minute)
	if err != nil || !g.OK {
		t.Fatalf("ClaimRecord of a long key: %+v, %v", g, err)
	}
	rec := stores.Record{Fingerprint: "fp", Response: make([]byte, b.MaxRecordBytes-2), Fence: g.Fences[0]}
	if err := s.FinishRecord(t.Context(), k, "a", rec, time.Minute); !errors.Is(err, stores.ErrInvalid) || !strings.Contains(err.Error(), "--max-request-bytes") {
		t.Fatalf("FinishRecord of %d bytes on a key of %d bytes: %v; want stores.ErrInvalid naming --max-request-bytes", rec.Size(), len(k), err)
	}
	if err := s.Refresh(t.Context(), []string{k}, "a", time.Minute); err != nil {
		t.Fatalf("Refresh of the claim after the refused finish: %v (the Store acted)", err)
	}
	rec.Response = rec.Response[:1<<10]
	if err := s.FinishRecord(t.Context(), k, "a", rec, time.Minute); err != nil {
		t.Fatalf("FinishRecord of a small record on the long key: %v", err)
	}
}

// TestRecordRefusesLocks: a key that holds a record refuses a plain Acquire,
// reporting the record's retention as Wait, and AcquireShared.
func TestRecordRefusesLocks(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	k := uniqueKey(t)
	const retention = 3 * time.Minute
	g, _, err := s.ClaimRecord(t.Context(), k, "a", time.Minute)
	if err != nil || !g.OK {
		t.Fatalf("ClaimRecord: %+v, %v", g, err)
	}
	if err := s.FinishRecord(t.Context(), k, "a", stores.Record{Fingerprint: "fp", Fence: g.Fences[0]}, retention); err != nil {
		t.Fatalf("FinishRecord: %v", err)
	}
	if g, err := s.Acquire(t.Context(), []string{k}, "x", time.Minute); err != nil || g.OK || g.Wait != retention {
		t.Fatalf("Acquire of a record's key: %+v, %v; want refused with Wait %v", g, err, retention)
	}
	if g, err := s.AcquireShared(t.Context(), k, "y", 0, time.Minute); err != nil || g.OK {
		t.Fatalf("AcquireShared of a record's key: %+v, %v; want refused", g, err)
	}
	if _, rec, err := s.ClaimRecord(t.Context(), k, "z", time.Minute); err != nil || rec == nil {
		t.Fatalf("ClaimRecord after the refused locks: record %+v, %v; want the record", rec, err)
	}
}
