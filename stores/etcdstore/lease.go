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
//
// The pool remembers every lease it granted until etcd confirms it gone: a
// lease whose every possible call's validity has passed (by the local
// clock) is revoked, a few at each new grant, rather than forgotten (and a
// hedged grant answered after another took its place, at once), since
// etcd may keep it longer (a leader change renews every lease) and a
// transaction in flight could still put a key on it. Close revokes the
// rest.
type leasePool struct {
	lease   clientv3.Lease
	timeout time.Duration // of a grant or a revocation
	bound   time.Duration // after which a grant unanswered is joined by another, at the least
	rtt     *roundTrip    // of the latest request answered, shared with the Store
	gone    func([]clientv3.LeaseID)
	seconds func(time.Duration) int64 // the lease's TTL for keys of a duration (leaseSeconds, recordLeaseSeconds)

	mu      sync.Mutex
	buckets map[int64]*pooledLease         // by requested seconds
	granted map[clientv3.LeaseID]time.Time // every lease etcd may still know, to when it surely serves no call any more
	closed  bool                           // no grant starts any more
	grants  sync.WaitGroup                 // grants in flight, and their revocations of spent leases
}

// pooledLease is one shared lease, or one being granted.
type pooledLease struct {
	ready      chan struct{} // closed once id, expires and err are set
	superseded chan struct{} // closed when an earlier grant answered first and took its place
	sent       time.Time     // when its grant was sent
	joined     bool          // another grant joined it; guarded by the pool's mu
	unused     bool          // answered after another took its place: no call takes it
	id         clientv3.LeaseID
	expires    time.Time // the earliest the lease may expire
	err        error
}

// newLeasePool returns a pool that grants leases through lease, of
// seconds(d) for keys of d, and tells gone (when not nil) of the leases it
// saw revoked or found gone.
func newLeasePool(lease clientv3.Lease, timeout, bound time.Duration, rtt *roundTrip, seconds func(time.Duration) int64, gone func([]clientv3.LeaseID)) *leasePool {
	return &leasePool{lease: lease, timeout: timeout, bound: bound, rtt: rtt, seconds: seconds, gone: gone,
		buckets: map[int64]*pooledLease{}, granted: map[clientv3.LeaseID]time.Time{}}
}

// maxLeaseSeconds is the longest lease etcd grants (its MaxLeaseTTL, 9e9
// seconds, about 285 years); it refuses longer ones with "too large lease
// TTL". As a time.Duration it is 9e18ns, within int64.
const maxLeaseSeconds = 9_000_000_000

// MaxTTL is the longest TTL, keep or fair lease the Store honours: 8e9
// seconds (about 253 years), so that its lease, an eighth longer to be
// shared between calls, is etcd's longest lease.
const MaxTTL = maxLeaseSeconds / 9 * 8 * time.Second

// spentRevocations bounds the spent leases one grant revokes: more than
// one, so that they cannot pile up while grants go on.
const spentRevocations = 4

// leaseSeconds is the TTL, in seconds, of the lease that serves keys of d,
// for d in (0, MaxTTL]: d plus an eighth, rounded up, and at most
// maxLeaseSeconds (which MaxTTL plus an eighth is). It adds whole and
// fractional seconds apart, since d plus an eighth overflows a
// time.Duration above about 260 years.
func leaseSeconds(d time.Duration) int64 {
	eighth := d / 8
	whole := int64(d/time.Second) + int64(eighth/time.Second)
	frac := d%time.Second + eighth%time.Second // below 2s
	return min(whole+int64((frac+time.Second-1)/time.Second), maxLeaseSeconds)
}

// leaseGets bounds the leases one get takes that do not serve its call: a
// lease whose grant was sent after the call started always serves it, so
// the second one does.
const leaseGets = 3

// get returns a lease that lasts until at least start plus d, start being
// the time the calling Store method began. It returns ErrClosed once the
// pool is closed.
//
// Callers share a grant in flight, but not for long: a grant that etcd has
// not answered within the pool's attempt bound (or twice the latest
// request's round trip, when longer: see copyBound) is joined by another, while it goes on;
// the callers then take whichever answers first. A grant sent while the
// cluster elects a leader is never answered when a follower forwarded it
// to the leader that died, so that one stuck grant holds no call up for
// longer than the bound. A grant that failed transiently (no leader yet)
// is sent again after a short pause, so calls are served as soon as the
// cluster has a leader again.
func (p *leasePool) get(ctx context.Context, start time.Time, d time.Duration) (clientv3.LeaseID, error) {
	secs := p.seconds(d)
	pause := retryPauseMin
	for stale := 0; ; {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return 0, ErrClosed
		}
		bound := p.rtt.bound(p.bound)
		l := p.buckets[secs]
		if l == nil || (!l.answered() && time.Since(l.sent) >= bound) {
			if l != nil {
				l.joined = true
			}
			l = &pooledLease{ready: make(chan struct{}), superseded: make(chan struct{}), sent: time.Now()}
			p.buckets[secs] = l
			p.grants.Add(1)
			// On a context of its own: other callers wait for it too.
			go p.grant(secs, l)
		}
		p.mu.Unlock()
		hedge := time.NewTimer(time.Until(l.sent.Add(bound)))
		select {
		case <-l.ready:
			hedge.Stop()
		case <-l.superseded:
			hedge.Stop()
			continue // an earlier grant answered first
		case <-hedge.C:
			continue // another grant joins this one
		case <-ctx.Done():
			hedge.Stop()
			return 0, ctx.Err()
		}
		if l.unused {
			continue // revoked: another took its place
		}
		if l.err == nil && !start.Add(d).After(l.expires) {
			return l.id, nil
		}
		p.drop(secs, l)
		switch {
		case l.err == nil:
			if stale++; stale == leaseGets {
				return 0, fmt.Errorf("%w: no lease of %ds lasted from the call's start for %v in %d grants", ErrUnexpectedReply, secs, d, leaseGets)
			}
		case !transient(l.err):
			return 0, l.err
		default:
			select {
			case <-time.After(pause):
			case <-ctx.Done():
				return 0, errors.Join(ctx.Err(), l.err)
			}
			pause = min(2*pause, retryPauseMax)
		}
	}
}

// answered reports whether etcd answered l's grant (or it failed).
func (l *pooledLease) answered() bool {
	select {
	case <-l.ready:
		return true
	default:
		return false
	}
}

// grant asks etcd for the lease l of secs seconds, and then revokes a few
// spent leases, and l itself when another grant took its place before it
// was answered: no call takes it (those waiting for it go on to the
// other), and etcd would keep it for its whole TTL.
func (p *leasePool) grant(secs int64, l *pooledLease) {
	defer p.grants.Done()
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	resp, err := p.lease.Grant(ctx, secs)
	if err != nil {
		l.err = err
		close(l.ready)
		return
	}
	l.id = clientv3.LeaseID(resp.ID)
	l.expires = l.sent.Add(time.Duration(resp.TTL) * time.Second)
	p.mu.Lock()
	now := time.Now()
	p.rtt.observe(now.Sub(l.sent), p.bound)
	// A later grant that joined this one and is still unanswered gives
	// its place to this one, and its callers take this one.
	if b := p.buckets[secs]; l.joined && b != nil && b != l && !b.answered() && b.sent.After(l.sent) {
		p.buckets[secs] = l
		close(b.superseded)
	}
	l.unused = p.buckets[secs] != l
	// No call's validity outlasts the lease's earliest expiry; a second
	// more covers the time the grant took to answer.
	p.granted[l.id] = now.Add(time.Duration(resp.TTL)*time.Second + time.Second)
	var spent []clientv3.LeaseID
	if l.unused {
		spent = append(spent, l.id)
	}
	for id, until := range p.granted {
		if len(spent) == spentRevocations {
			break
		}
		if !until.After(now) && id != l.id {
			spent = append(spent, id)
		}
	}
	p.mu.Unlock()
	close(l.ready)
	if len(spent) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), p.timeout) // the grant's may be nearly spent
		defer cancel()
		p.revoke(ctx, spent)
	}
}

// revoke revokes ids, forgets those etcd confirmed gone (revoked now, or
// before), tells p.gone of them, and returns them with the first other
// error.
func (p *leasePool) revoke(ctx context.Context, ids []clientv3.LeaseID) ([]clientv3.LeaseID, error) {
	const parallel = 16
	errs := make([]error, len(ids))
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i, id := range ids {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := p.lease.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
				errs[i] = err
			}
		})
	}
	wg.Wait()
	var gone []clientv3.LeaseID
	p.mu.Lock()
	for i, id := range ids {
		if errs[i] == nil {
			gone = append(gone, id)
			delete(p.granted, id)
			p.dropLocked(id)
		}
	}
	p.mu.Unlock()
	if len(gone) > 0 && p.gone != nil {
		p.gone(gone)
	}
	return gone, errors.Join(errs...)
}

// drop forgets l, which is stale or failed, unless another took its place.
func (p *leasePool) drop(secs int64, l *pooledLease) {
	p.mu.Lock()
	if p.buckets[secs] == l {
		delete(p.buckets, secs)
	}
	p.mu.Unlock()
}

// dropID stops sharing the lease id, which etcd may no longer know. It
// stays among the leases granted, which Close revokes, since it may be
// alive (a transaction on several leases cannot tell which it missed).
func (p *leasePool) dropID(id clientv3.LeaseID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropLocked(id)
}

func (p *leasePool) dropLocked(id clientv3.LeaseID) {
	for secs, l := range p.buckets {
		select {
		case <-l.ready:
			if l.id == id {
				delete(p.buckets, secs)
			}
		default:
		}
	}
}

// close stops new grants, waits until the grants in flight have ended or
// ctx has, and then revokes every lease etcd may still know. It returns
// the leases etcd confirmed gone, and an error when it could not revoke
// them all.
func (p *leasePool) close(ctx context.Context) ([]clientv3.LeaseID, error) {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	granting := make(chan struct{})
	go func() {
		p.grants.Wait()
		close(granting)
	}()
	var errInFlight error
	select {
	case <-granting:
	case <-ctx.Done():
		errInFlight = fmt.Errorf("etcdstore: close: a lease grant still in flight after %v: its lease may be missed", p.timeout)
	}
	p.mu.Lock()
	ids := make([]clientv3.LeaseID, 0, len(p.granted))
	for id := range p.granted {
		ids = append(ids, id)
	}
	p.mu.Unlock()
	gone, err := p.revoke(ctx, ids)
	if err != nil {
		err = fmt.Errorf("etcdstore: close: %d of %d leases not revoked: %w", len(ids)-len(gone), len(ids), err)
	}
	return gone, errors.Join(errInFlight, err)
}

// stop stops new grants and waits until the grants in flight have ended or
// ctx has, revoking nothing: the pool of records' leases, whose records
// outlive the Store (see FinishRecord).
func (p *leasePool) stop(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	granting := make(chan struct{})
	go func() {
		p.grants.Wait()
		close(granting)
	}()
	select {
	case <-granting:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("etcdstore: close: a record lease's grant still in flight after %v", p.timeout)
	}
}

// withLeases calls f with a lease for each of ds, that lasts until at
// least start plus d (NoLease for d not positive) and, when etcd no longer
// knows one of them (it expired while the request travelled, or was
// revoked), once more with new ones.
func (s *Store) withLeases(ctx context.Context, start time.Time, ds []time.Duration, f func([]clientv3.LeaseID) error) error {
	return s.withPoolLeases(ctx, s.leases, start, ds, f)
}

// withPoolLeases is withLeases with leases of pool.
func (s *Store) withPoolLeases(ctx context.Context, pool *leasePool, start time.Time, ds []time.Duration, f func([]clientv3.LeaseID) error) error {
	ids := make([]clientv3.LeaseID, len(ds))
	for attempt := 0; ; attempt++ {
		for i, d := range ds {
			ids[i] = clientv3.NoLease
			if d > 0 {
				id, err := pool.get(ctx, start, d)
				if err != nil {
					return err
				}
				ids[i] = id
			}
		}
		err := f(ids)
		if attempt == 0 && errors.Is(err, rpctypes.ErrLeaseNotFound) {
			for _, id := range ids {
				pool.dropID(id)
			}
			continue
		}
		return err
	}
}

// withLease is withLeases for one lease.
func (s *Store) withLease(ctx context.Context, start time.Time, d time.Duration, f func(clientv3.LeaseID) error) error {
	return s.withLeases(ctx, start, []time.Duration{d}, func(ids []clientv3.LeaseID) error { return f(ids[0]) })
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
