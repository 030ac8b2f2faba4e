package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// leasePool shares etcd leases between the keys the Store attaches to them.
// A lease granted for d lasts d plus an eighth, rounded up to seconds (etcd
// may raise it to its minimum), and serves every call that needs d or less,
// started early enough that the lease outlives the call's start plus d:
// the lease's clock starts when its grant was sent at the earliest (etcd
// starts it later, never earlier), and a call's validity counts from the
// call's start. So a key never expires before its TTL, counted as the
// Locker counts it, and outlives it by the rounding at most; and a lease
// requested for a call, after it started, always serves it, however long
// the grant took.
type leasePool struct {
	lease   clientv3.Lease
	timeout time.Duration // of a grant

	mu      sync.Mutex
	buckets map[int64]*pooledLease         // by requested seconds
	granted map[clientv3.LeaseID]time.Time // every lease granted, to its latest possible expiry, for Close
}

// pooledLease is one shared lease, or one being granted.
type pooledLease struct {
	ready   chan struct{} // closed once id, expires and err are set
	id      clientv3.LeaseID
	expires time.Time // the earliest the lease may expire
	err     error
}

func newLeasePool(lease clientv3.Lease, timeout time.Duration) *leasePool {
	return &leasePool{lease: lease, timeout: timeout, buckets: map[int64]*pooledLease{}, granted: map[clientv3.LeaseID]time.Time{}}
}

// maxLeaseSeconds is the longest lease etcd grants (its MaxLeaseTTL, 9e9
// seconds, about 285 years); it refuses longer ones with "too large lease
// TTL". As a time.Duration it is 9e18ns, within int64.
const maxLeaseSeconds = 9_000_000_000

// MaxTTL is the longest TTL, keep or fair lease the Store honours: etcd's
// longest lease, about 285 years.
const MaxTTL = maxLeaseSeconds * time.Second

// leaseSeconds is the TTL, in seconds, of the lease that serves keys of d,
// for d in (0, MaxTTL]: d plus an eighth, rounded up, and at most
// maxLeaseSeconds (so the longest TTLs get less of a margin to share).
// It adds whole and fractional seconds apart, since d plus an eighth
// overflows a time.Duration above about 260 years.
func leaseSeconds(d time.Duration) int64 {
	eighth := d / 8
	whole := int64(d/time.Second) + int64(eighth/time.Second)
	frac := d%time.Second + eighth%time.Second // below 2s
	return min(whole+int64((frac+time.Second-1)/time.Second), maxLeaseSeconds)
}

// leaseGets bounds the leases one get waits for: a lease whose grant was
// sent after the call started always serves it, so the second one does,
// unless it failed.
const leaseGets = 3

// get returns a lease that lasts until at least start plus d, start being
// the time the calling Store method began.
func (p *leasePool) get(ctx context.Context, start time.Time, d time.Duration) (clientv3.LeaseID, error) {
	secs := leaseSeconds(d)
	for range leaseGets {
		p.mu.Lock()
		l := p.buckets[secs]
		if l == nil {
			l = &pooledLease{ready: make(chan struct{})}
			p.buckets[secs] = l
			p.mu.Unlock()
			// On a context of its own: other callers wait for it too.
			go p.grant(secs, l)
		} else {
			p.mu.Unlock()
		}
		select {
		case <-l.ready:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		if l.err == nil && !start.Add(d).After(l.expires) {
			return l.id, nil
		}
		p.drop(secs, l)
		if l.err != nil {
			return 0, l.err
		}
	}
	return 0, fmt.Errorf("%w: no lease of %ds lasted from the call's start for %v in %d grants", ErrUnexpectedReply, secs, d, leaseGets)
}

// grant asks etcd for the lease l of secs seconds.
func (p *leasePool) grant(secs int64, l *pooledLease) {
	defer close(l.ready)
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	sent := time.Now()
	resp, err := p.lease.Grant(ctx, secs)
	if err != nil {
		l.err = err
		return
	}
	l.id = clientv3.LeaseID(resp.ID)
	l.expires = sent.Add(time.Duration(resp.TTL) * time.Second)
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	for id, until := range p.granted {
		if !until.After(now) {
			delete(p.granted, id) // surely expired
		}
	}
	// etcd may expire it up to its sweep interval late, and the grant may
	// have taken until now to start.
	p.granted[l.id] = now.Add(time.Duration(resp.TTL)*time.Second + time.Second)
}

// drop forgets l, which is stale or failed, unless another took its place.
func (p *leasePool) drop(secs int64, l *pooledLease) {
	p.mu.Lock()
	if p.buckets[secs] == l {
		delete(p.buckets, secs)
	}
	p.mu.Unlock()
}

// dropID forgets the lease id, which etcd no longer knows.
func (p *leasePool) dropID(id clientv3.LeaseID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for secs, l := range p.buckets {
		select {
		case <-l.ready:
			if l.id == id {
				delete(p.buckets, secs)
			}
		default:
		}
	}
	delete(p.granted, id)
}

// revokeAll revokes every lease granted that may still be alive, and
// returns the first error other than a lease already gone.
func (p *leasePool) revokeAll(ctx context.Context) error {
	p.mu.Lock()
	now := time.Now()
	var ids []clientv3.LeaseID
	for id, until := range p.granted {
		if until.After(now) {
			ids = append(ids, id)
		}
	}
	p.granted = map[clientv3.LeaseID]time.Time{}
	p.buckets = map[int64]*pooledLease{}
	p.mu.Unlock()
	var first error
	for _, id := range ids {
		if _, err := p.lease.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) && first == nil {
			first = err
		}
	}
	return first
}

// latestExpiry returns the latest time any of ids may still be alive, by
// what the pool knows of their grants; the zero time when it knows none of
// them alive (a lease etcd extends at a leader change may live longer).
func (p *leasePool) latestExpiry(ids []clientv3.LeaseID) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var latest time.Time
	for _, id := range ids {
		if until, ok := p.granted[id]; ok && until.After(latest) {
			latest = until
		}
	}
	return latest
}

// withLease calls f with a lease that lasts until at least start plus d (0
// when d is not positive) and, when etcd no longer knows that lease (it
// expired while the request travelled, or was revoked), once more with a
// new one.
func (s *Store) withLease(ctx context.Context, start time.Time, d time.Duration, f func(clientv3.LeaseID) error) error {
	if d <= 0 {
		return f(clientv3.NoLease)
	}
	for attempt := 0; ; attempt++ {
		id, err := s.leases.get(ctx, start, d)
		if err != nil {
			return err
		}
		err = f(id)
		if attempt == 0 && errors.Is(err, rpctypes.ErrLeaseNotFound) {
			s.leases.dropID(id)
			continue
		}
		return err
	}
}

// alive returns those of ids that etcd still knows.
func (p *leasePool) alive(ctx context.Context, ids []clientv3.LeaseID) ([]clientv3.LeaseID, error) {
	var alive []clientv3.LeaseID
	for _, id := range ids {
		resp, err := p.lease.TimeToLive(ctx, id)
		if err != nil {
			return nil, err
		}
		if resp.TTL >= 0 { // -1: not found
			alive = append(alive, id)
		}
	}
	return alive, nil
}
