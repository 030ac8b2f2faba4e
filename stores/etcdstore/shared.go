package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/reqlock/reqlock/stores"
)

// sharedKey is token's place among the shared holders of the key of holder
// key h: h, "/", and the token. The holder key and its shared holders are
// one range of etcd keys, [h, holdersEnd(h)), so that one comparison tells
// a free key from a held one, of either kind.
func sharedKey(h, token string) string { return h + "/" + token }

// holdersEnd is the end of the range of h and its shared holders: h and "0",
// the byte after '/'.
func holdersEnd(h string) string { return h + "0" }

// writersDir is the parent of the waiting writers' records of the key of
// holder key h, and writerKey token's record: its value is the end of the
// writer's window, in Unix milliseconds.
func writersDir(h string) string       { return strings.TrimSuffix(h, "holder") + "writer/" }
func writerKey(h, token string) string { return writersDir(h) + token }

// longestTTL and soonestTTL are the longest and shortest TTL that holders
// were given (upper bounds of what they have left).
func longestTTL(holders []*mvccpb.KeyValue) time.Duration {
	var d time.Duration
	for _, kv := range holders {
		d = max(d, holderTTL(kv.Value))
	}
	return d
}

func soonestTTL(holders []*mvccpb.KeyValue) time.Duration {
	d := time.Duration(-1)
	for _, kv := range holders {
		if t := holderTTL(kv.Value); d < 0 || t < d {
			d = t
		}
	}
	return max(d, 0)
}

// writerWaits records token as a writer waiting for the shared holders of
// the key of holder key h to drain: its window ends stores.WriterWindow
// from now, by the local clock, which AcquireShared compares with its own.
// The record lives on a lease of the window (which etcd rounds up to its
// shortest lease), so that it goes by itself; an exclusive grant to token,
// or a Release by token, deletes it. The record serves fairness, never
// safety: a failure to put it is ignored.
func (s *Store) writerWaits(ctx context.Context, h, token string) {
	until := strconv.FormatInt(time.Now().Add(stores.WriterWindow).UnixMilli(), 10)
	_ = s.withLease(ctx, time.Now(), stores.WriterWindow, func(lease clientv3.LeaseID) error {
		_, err := s.kv.Txn(ctx).Then(clientv3.OpPut(writerKey(h, token), until, clientv3.WithLease(lease))).Commit()
		return err
	})
}

// writerLeft returns the longest window among the writer records ws has
// left, by the local clock; zero or less when all have passed.
func writerLeft(ws []*mvccpb.KeyValue) time.Duration {
	var left time.Duration
	for _, w := range ws {
		if ms, err := strconv.ParseInt(string(w.Value), 10, 64); err == nil {
			left = max(left, time.Until(time.UnixMilli(ms)))
		}
	}
	return left
}

// AcquireShared makes token a holder of key for at least ttl, as
// stores.SharedStore describes. A holder is an etcd key of its own beside
// the key's holder key (see sharedKey), on a lease that lasts ttl from the
// call's start as Acquire's does, so that each expires at its own TTL; its
// value is a holder key's.
//
// The first transaction grants when the key has no holder of either kind
// (with limit 0, no exclusive holder) and no writer record; otherwise it
// reads the holders and the writer records, and a second transaction
// grants when fewer than limit hold the key and no writer's window stands,
// comparing that no holder key was created since the reads, so that the
// holders are at most those read (a limit is counted atomically, without
// a counter; with limit 0, that the key has no exclusive holder), and that
// no writer record was written since. A token that holds the key is granted again,
// comparing its place unchanged. When the holders change under each of
// its transactions (4), it refuses, with a Wait of 10ms. Every grant's
// fence is its transaction's revision, as for Acquire, and every
// transaction compares that token was not abandoned; an AcquireShared left
// in flight is undone as an abandoned Acquire is (see the package
// documentation).
//
// A refusal's Wait is the TTL the exclusive holder was given, the longest
// window left among the writers, or the shortest TTL given to a holder of
// a full key. Errors are as Acquire's, and a negative limit is refused
// with stores.ErrInvalid.
func (s *Store) AcquireShared(ctx context.Context, key, token string, limit int, ttl time.Duration) (stores.Grant, error) {
	start, seq := s.begin()
	if err := args.CheckShared(ctx, key, limit); err != nil {
		return stores.Grant{}, err
	}
	if err := errors.Join(checkToken(token), s.checkTTL("ttl", ttl), s.checkKeys([]string{key}, token, sharedOccurrences)); err != nil {
		return stores.Grant{}, err
	}
	var g stores.Grant
	var fl flight
	err := s.detached(ctx, func(ctx context.Context) error {
		var err error
		g, err = s.acquireShared(ctx, start, seq, key, token, limit, ttl, &fl)
		return err
	}, func() *pendingUndo { return s.newSharedUndo(key, token, &fl) })
	if err != nil {
		return stores.Grant{}, err
	}
	return g, nil
}

// sharedAttempts bounds the transactions of one AcquireShared: each after
// the first follows a read that the holders' changes made stale.
const sharedAttempts = 4

// contendedWait is the Wait of an AcquireShared refused because the
// holders changed under each of its transactions.
const contendedWait = 10 * time.Millisecond

func (s *Store) acquireShared(ctx context.Context, start time.Time, seq uint64, key, token string, limit int, ttl time.Duration, fl *flight) (stores.Grant, error) {
	h := holderKey(s.dir(key))
	mine, ws := sharedKey(h, token), writersDir(h)
	wsEnd := clientv3.GetPrefixRangeEnd(ws)
	// A reader (limit 0) needs no count: the key not held exclusively is
	// enough, whatever holders come and go meanwhile.
	free := unheld(h)
	if limit == 0 {
		free = absent(h)
	}
	conds := []clientv3.Cmp{free, clientv3.Compare(clientv3.CreateRevision(ws), "=", 0).WithRange(wsEnd)}
	val := holderValue(token, seq, ttl)
	for range sharedAttempts {
		var resp *clientv3.TxnResponse
		err := s.withLease(ctx, start, ttl, func(lease clientv3.LeaseID) error {
			fl.sending(lease)
			var err error
			resp, err = s.kv.Txn(ctx).If(append(conds, s.notAbandoned(token))...).
				Then(clientv3.OpPut(mine, val, clientv3.WithLease(lease))).
				Else(getHolders(h), clientv3.OpGet(ws, clientv3.WithRange(wsEnd)), s.countAbandoned(token)).Commit()
			return err
		})
		if err != nil {
			return stores.Grant{}, s.failed("shared acquire", []string{key}, err)
		}
		if resp.Succeeded {
			return stores.Grant{OK: true, Fences: []int64{fence(resp.Header.Revision)}}, nil
		}
		if len(resp.Responses) != 3 {
			return stores.Grant{}, fmt.Errorf("%w: shared acquire answered %d results", ErrUnexpectedReply, len(resp.Responses))
		}
		if resp.Responses[2].GetResponseRange().GetCount() > 0 {
			return stores.Grant{}, errTokenAbandoned(token)
		}
		holders := resp.Responses[0].GetResponseRange().GetKvs()
		writers := resp.Responses[1].GetResponseRange().GetKvs()
		if len(holders) > 0 && string(holders[0].Key) == h {
			return stores.Grant{Wait: holderTTL(holders[0].Value)}, nil // held exclusively
		}
		var own *mvccpb.KeyValue
		for _, kv := range holders {
			if string(kv.Key) == mine {
				own = kv
			}
		}
		switch left := writerLeft(writers); {
		case own != nil:
			// A retry: granted again, whatever the count and the writers.
			conds = []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(mine), "=", own.ModRevision)}
			continue
		case left > 0:
			return stores.Grant{Wait: min(left, stores.WriterWindow)}, nil
		case limit > 0 && len(holders) >= limit:
			return stores.Grant{Wait: soonestTTL(holders)}, nil
		}
		// No holder created since the reads (the holder key neither): the
		// holders are at most those read; no writer record written since.
		// A reader only compares that the holder key is still absent.
		next := resp.Header.Revision + 1
		free = clientv3.Compare(clientv3.CreateRevision(h), "<", next).WithRange(holdersEnd(h))
		if limit == 0 {
			free = absent(h)
		}
		conds = []clientv3.Cmp{free, clientv3.Compare(clientv3.ModRevision(ws), "<", next).WithRange(wsEnd)}
	}
	// Holders come and go faster than the reads: a refusal, tried again
	// by the caller as any other.
	return stores.Grant{Wait: contendedWait}, nil
}

// ReleaseShared ends token's place among key's holders, as Release ends a
// grant: it deletes token's holder key when it holds token, in one
// transaction, which signals waiters (see NotifyRelease); with keep
// positive it moves it to a lease that lasts keep from the call's start
// instead, acting only on a place set by a call of token that started
// before it. It returns an error wrapping stores.ErrNotHeld when token
// does not hold key; otherwise its errors, and what it does while etcd
// does not answer or after its caller left, are Release's.
func (s *Store) ReleaseShared(ctx context.Context, key, token string, keep time.Duration) error {
	start, seq := s.begin()
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	if err := errors.Join(checkToken(token), s.checkKeys([]string{key}, token, keyOccurrences)); err != nil {
		return err
	}
	if keep > 0 {
		if err := s.checkTTL("keep", keep); err != nil {
			return err
		}
	}
	keys, mine := []string{key}, []string{sharedKey(holderKey(s.dir(key)), token)}
	var overflow func()
	if keep == 0 {
		overflow = func() { s.undos.add(&pendingUndo{token: token, release: true, keys: mine}) }
	}
	return s.goOn(ctx, "shared release", keys, func(ctx context.Context) error {
		return s.release(ctx, start, seq, keys, mine, false, token, keep)
	}, overflow)
}

// RefreshShared moves token's place among key's holders to a lease that
// lasts ttl from the call's start, as Refresh does a key: only while it
// holds token and was set by a call of token that started before this one.
// It returns an error wrapping stores.ErrNotHeld, having changed nothing,
// when token does not hold key; its other errors are Refresh's.
func (s *Store) RefreshShared(ctx context.Context, key, token string, ttl time.Duration) error {
	start, seq := s.begin()
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	if err := errors.Join(checkToken(token), s.checkTTL("ttl", ttl), s.checkKeys([]string{key}, token, keyOccurrences)); err != nil {
		return err
	}
	if s.isClosed() {
		return ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.refresh(ctx, start, seq, []string{key}, []string{sharedKey(holderKey(s.dir(key)), token)}, token, ttl)
}
