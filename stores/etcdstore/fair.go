package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/reqlock/reqlock/stores"
)

// fairAttempts bounds the transactions of one AcquireFair that lose a race
// with another waiter's change; the next attempt goes on from there.
const fairAttempts = 3

// AcquireFair is one attempt of a fair waiter (see stores.FairStore and
// reqlock.WithFairness). The queue is the key's q/ directory in create
// revision order; a waiter's lease is the etcd lease its queue key is
// attached to, so a waiter that stops calling is dropped by etcd itself
// once it lapses, and the watch of NotifyRelease hears of it. Like a TTL,
// the lease is rounded up to whole seconds and to etcd's shortest lease (2s
// by default), so a dead waiter holds its place that long even under a
// Locker's shorter WithFairness lease.
//
// The first transaction grants when the key is free and nobody else is
// queued; otherwise it queues token, or renews its lease
// (the put keeps its create revision, so its place), and reads the holder
// and the queue. When token is then found at the head of the queue of a
// free key, or holding the key (a retry), a second transaction grants,
// comparing that nobody was queued ahead, or that the key is unchanged,
// meanwhile. A grant deletes token's queue key in
// the transaction that puts its holder key, and issues the fence by the
// revision, as Acquire does.
//
// A grant compares the holder key's absence, or its mod revision as read,
// so that an attempt that reaches etcd late never moves a key renewed
// meanwhile back to its own lease; and an attempt left in flight is undone
// as an abandoned Acquire is, its late copy then refused by its token's
// abandon marks.
//
// A refusal returns the caller's place as Ahead (-1 when not queued) and,
// as Wait, the TTL the holder was given or, when the key is free and another
// waiter heads the queue, that waiter's lease. A refusal that finds the key
// free and another waiter at the head signals that waiter's NotifyRelease
// subscribers in this Store, in case it has not heard. Errors are as
// Acquire's.
func (s *Store) AcquireFair(ctx context.Context, key, token string, ttl, lease time.Duration) (stores.FairGrant, error) {
	start, seq := s.begin()
	if err := args.CheckAcquireFair(ctx, key, ttl, lease); err != nil {
		return stores.FairGrant{}, err
	}
	errs := []error{checkToken(token), s.checkTTL("ttl", ttl), s.checkKeys([]string{key}, token, fairOccurrences)}
	if lease > 0 {
		errs = append(errs, s.checkTTL("lease", lease))
	}
	if err := errors.Join(errs...); err != nil {
		return stores.FairGrant{}, err
	}
	var g stores.FairGrant
	var fl flight
	err := s.detached(ctx, func(ctx context.Context) error {
		var err error
		g, err = s.acquireFair(ctx, start, seq, key, token, ttl, lease, &fl)
		return err
	}, func() *pendingUndo { return s.newUndo([]string{key}, token, true, &fl) })
	if err != nil {
		return stores.FairGrant{}, err
	}
	return g, nil
}

func (s *Store) acquireFair(ctx context.Context, start time.Time, seq uint64, key, token string, ttl, lease time.Duration, fl *flight) (stores.FairGrant, error) {
	dir := s.dir(key)
	h, q := holderKey(dir), queueDir(dir)
	qk := q + token
	// queued is set once a transaction answered has queued token: a later
	// failure then leaves the call's outcome unknown, whatever its cause.
	queued := false
	failed := func(err error) error {
		if queued {
			return failedAfterChange("fair acquire", []string{key}, err)
		}
		return s.failed("fair acquire", []string{key}, err)
	}
	grant := func(cmps ...clientv3.Cmp) (granted bool, rev int64, err error) {
		err = s.withLease(ctx, start, ttl, func(hl clientv3.LeaseID) error {
			fl.sending(hl)
			resp, err := s.kv.Txn(ctx).If(append(cmps, s.notAbandoned(token))...).Then(holdOps(h, qk, token, seq, ttl, hl)...).Commit()
			if err == nil {
				granted, rev = resp.Succeeded, resp.Header.Revision
			}
			return err
		})
		return granted, rev, err
	}
	granted := func(rev int64) stores.FairGrant {
		return stores.FairGrant{Grant: stores.Grant{OK: true, Fences: []int64{fence(rev)}}}
	}
	for range fairAttempts {
		var resp *clientv3.TxnResponse
		err := s.withLeases(ctx, start, []time.Duration{ttl, lease}, func(ids []clientv3.LeaseID) error {
			fl.sending(ids...)
			var err error
			resp, err = s.fairTxn(ctx, key, token, seq, ttl, lease, ids[0], ids[1]).Commit()
			return err
		})
		if err != nil {
			return stores.FairGrant{}, failed(err)
		}
		if !resp.Succeeded {
			if queued {
				return stores.FairGrant{}, failedAfterChange("fair acquire", []string{key}, errTokenAbandoned(token))
			}
			return stores.FairGrant{}, errTokenAbandoned(token)
		}
		if len(resp.Responses) != 1 || resp.Responses[0].GetResponseTxn() == nil {
			return stores.FairGrant{}, fmt.Errorf("%w: fair acquire of %s answered %d results", ErrUnexpectedReply, stores.KeyForMessage(key), len(resp.Responses))
		}
		inner := resp.Responses[0].GetResponseTxn()
		if inner.Succeeded {
			return granted(resp.Header.Revision), nil
		}
		queued = queued || lease > 0
		n := len(inner.Responses)
		if n < 2 {
			return stores.FairGrant{}, fmt.Errorf("%w: fair acquire of %s answered %d results", ErrUnexpectedReply, stores.KeyForMessage(key), n)
		}
		holder := inner.Responses[n-2].GetResponseRange().GetKvs()
		queue := inner.Responses[n-1].GetResponseRange().GetKvs()
		ahead, queued := place(queue, qk)
		if !queued {
			ahead = -1
		}
		var ok bool
		var rev int64
		switch {
		case len(holder) > 0 && string(holder[0].Key) != h:
			// Shared holders: the writer waits, and new ones wait for it.
			s.writerWaits(ctx, h, token)
			return stores.FairGrant{Grant: stores.Grant{Wait: longestTTL(holder), SharedHeld: true}, Ahead: ahead}, nil
		case len(holder) > 0 && holderToken(holder[0].Value) != token:
			return stores.FairGrant{Grant: stores.Grant{Wait: holderTTL(holder[0].Value)}, Ahead: ahead}, nil
		case len(holder) > 0:
			// A retry: granted again whoever is queued.
			ok, rev, err = grant(clientv3.Compare(clientv3.ModRevision(h), "=", holder[0].ModRevision))
		case ahead != 0 && len(queue) > 0:
			// The key is free, and another waiter heads the queue.
			head := queue[0]
			s.notify.nudge(key, string(head.Key[len(q):]))
			return stores.FairGrant{Grant: stores.Grant{Wait: parseMillis(head.Value)}, Ahead: ahead}, nil
		case queued:
			// The head of the queue of a free key, with waiters behind.
			myRev := queue[0].CreateRevision
			ok, rev, err = grant(unheld(h),
				clientv3.Compare(clientv3.CreateRevision(qk), "=", myRev),
				clientv3.Compare(clientv3.CreateRevision(q), ">", myRev-1).WithPrefix())
		}
		if err != nil {
			return stores.FairGrant{}, failed(err)
		}
		if ok {
			return granted(rev), nil
		}
		// The state changed between the reads and the grant: look again.
	}
	return stores.FairGrant{Ahead: -1}, nil
}

// fairTxn is the first transaction of acquireFair: unless token has an
// abandon mark, it grants key on lease hl when the key is free and nobody
// else is queued, or else queues token (when lease is positive) or renews
// its place on lease ql, and reads the holder and the queue. The attempt
// is nested under the mark's check, so that a late copy of it neither
// grants nor queues.
func (s *Store) fairTxn(ctx context.Context, key, token string, seq uint64, ttl, lease time.Duration, hl, ql clientv3.LeaseID) clientv3.Txn {
	dir := s.dir(key)
	h, q := holderKey(dir), queueDir(dir)
	qk := q + token
	var orElse []clientv3.Op
	if lease > 0 {
		orElse = append(orElse, clientv3.OpPut(qk, millis(lease), clientv3.WithLease(ql)))
	}
	orElse = append(orElse, getHolders(h),
		clientv3.OpGet(q, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)))
	attempt := clientv3.OpTxn(append(othersAbsent(q, qk), unheld(h)), holdOps(h, qk, token, seq, ttl, hl), orElse)
	return s.kv.Txn(ctx).If(s.notAbandoned(token)).Then(attempt).Else(s.countAbandoned(token))
}

// holdOps grants key, of holder key h and queue key qk, to token on lease
// hl: it puts the holder key, takes token out of the queue and ends its
// wait as a writer (see writerWaits).
func holdOps(h, qk, token string, seq uint64, ttl time.Duration, hl clientv3.LeaseID) []clientv3.Op {
	return []clientv3.Op{clientv3.OpPut(h, holderValue(token, seq, ttl), clientv3.WithLease(hl)), clientv3.OpDelete(qk), clientv3.OpDelete(writerKey(h, token))}
}

// place returns how many waiters of queue, in create revision order, are
// ahead of the queue key qk, and whether qk is queued at all.
func place(queue []*mvccpb.KeyValue, qk string) (ahead int, queued bool) {
	for i, kv := range queue {
		if string(kv.Key) == qk {
			return i, true
		}
	}
	return len(queue), false
}

// LeaveFair takes token out of key's queue by deleting its queue key; a
// token not queued is not an error. When token headed the queue and the key
// is free, the delete wakes the new head through NotifyRelease, in every
// process. It returns an error wrapping stores.ErrInvalid for an empty key
// or token, and ctx.Err() without acting when ctx has ended.
func (s *Store) LeaveFair(ctx context.Context, key, token string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if key == "" {
		return fmt.Errorf("%w: etcdstore: empty key", stores.ErrInvalid)
	}
	if err := errors.Join(checkToken(token), s.checkKeys([]string{key}, token, keyOccurrences)); err != nil {
		return err
	}
	if s.isClosed() {
		return ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if _, err := s.kv.Txn(ctx).Then(clientv3.OpDelete(queueDir(s.dir(key)) + token)).Commit(); err != nil {
		return s.failed("leave", []string{key}, err)
	}
	return nil
}
