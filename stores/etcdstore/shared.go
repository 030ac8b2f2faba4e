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

// writerKey is the waiting writer's record of the key of holder key h: its
// value is the end of the writer's window, in Unix milliseconds.
func writerKey(h string) string { return strings.TrimSuffix(h, "holder") + "writer" }

// sharedValue is the value of a shared holder key: a holderValue, a NUL
// byte, and the limit the holder was granted under.
func sharedValue(limit int) func(string, uint64, time.Duration) string {
	return func(token string, seq uint64, ttl time.Duration) string {
		return holderValue(token, seq, ttl) + "\x00" + strconv.Itoa(limit)
	}
}

// holderLimit reads the limit of a sharedValue; -1 when there is none.
func holderLimit(v []byte) int {
	i := strings.LastIndexByte(string(v), 0)
	n, err := strconv.Atoi(string(v[i+1:]))
	if err != nil || strings.Count(string(v), "\x00") != 3 {
		return -1
	}
	return n
}

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

// writerWaits records a writer waiting for the shared holders of the key of
// holder key h to drain: its window ends stores.WriterWindow from now, by
// the local clock, which AcquireShared compares with its own. The record
// lives on a lease of the window (which etcd rounds up to its shortest
// lease), so that it goes by itself; an exclusive grant deletes it. The
// record serves fairness, never safety: a failure to put it is ignored.
func (s *Store) writerWaits(ctx context.Context, h string) {
	until := strconv.FormatInt(time.Now().Add(stores.WriterWindow).UnixMilli(), 10)
	_ = s.withLease(ctx, time.Now(), stores.WriterWindow, func(lease clientv3.LeaseID) error {
		_, err := s.kv.Txn(ctx).Then(clientv3.OpPut(writerKey(h), until, clientv3.WithLease(lease))).Commit()
		return err
	})
}

// writerLeft returns how long the window of a writer record w has left, by
// the local clock; zero or less when it has passed.
func writerLeft(w *mvccpb.KeyValue) time.Duration {
	ms, err := strconv.ParseInt(string(w.Value), 10, 64)
	if err != nil {
		return 0
	}
	return time.Until(time.UnixMilli(ms))
}

// AcquireShared makes token a holder of key for at least ttl, as
// stores.SharedStore describes. A holder is an etcd key of its own beside
// the key's holder key (see sharedKey), on a lease that lasts ttl from the
// call's start as Acquire's does, so that each expires at its own TTL; its
// value is a holder key's, with the limit after it.
//
// The first transaction grants when the key has no holder of either kind
// and no writer waits; otherwise it reads the holders and the writer's
// record, and a second transaction grants when the reads allow it,
// comparing that no holder key was created since the reads (so that the
// holders are at most those read, all of the same limit: a limit is
// counted atomically, without a counter) and that the writer's record is
// unchanged. A token that holds the key is granted again, comparing its
// place unchanged. When the holders change under each of its transactions
// (4), it refuses, with a Wait of 10ms. Every grant's fence is its transaction's revision, as
// for Acquire, and every transaction compares that token was not
// abandoned; an AcquireShared left in flight is undone as an abandoned
// Acquire is (see the package documentation).
//
// A refusal's Wait is the TTL the exclusive holder was given, the writer's
// remaining window, the shortest TTL given to a holder of a full key, or
// the longest given to holders of another limit. Errors are as Acquire's,
// and a negative limit is refused with stores.ErrInvalid.
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

func (s *Store) acquireShared(ctx context.Context, start time.Time, seq uint64, key, token string, limit int, ttl time.Duration, fl *flight) (stores.Grant, error) {
	h := holderKey(s.dir(key))
	mine, w := sharedKey(h, token), writerKey(h)
	conds := []clientv3.Cmp{unheld(h), absent(w)}
	val := sharedValue(limit)(token, seq, ttl)
	for range sharedAttempts {
		var resp *clientv3.TxnResponse
		err := s.withLease(ctx, start, ttl, func(lease clientv3.LeaseID) error {
			fl.sending(lease)
			var err error
			resp, err = s.kv.Txn(ctx).If(append(conds, s.notAbandoned(token))...).
				Then(clientv3.OpPut(mine, val, clientv3.WithLease(lease))).
				Else(getHolders(h), clientv3.OpGet(w), s.countAbandoned(token)).Commit()
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
		writer := resp.Responses[1].GetResponseRange().GetKvs()
		if len(holders) > 0 && string(holders[0].Key) == h {
			return stores.Grant{Wait: holderTTL(holders[0].Value)}, nil // held exclusively
		}
		var own *mvccpb.KeyValue
		for _, kv := range holders {
			if string(kv.Key) == mine {
				own = kv
			}
		}
		for _, kv := range holders {
			if holderLimit(kv.Value) != limit {
				return stores.Grant{Wait: longestTTL(holders)}, nil
			}
		}
		switch {
		case own != nil:
			// A retry: granted again, whatever the count and the writer.
			conds = []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(mine), "=", own.ModRevision)}
			continue
		case len(writer) > 0 && writerLeft(writer[0]) > 0:
			return stores.Grant{Wait: min(writerLeft(writer[0]), stores.WriterWindow)}, nil
		case limit > 0 && len(holders) >= limit:
			return stores.Grant{Wait: soonestTTL(holders)}, nil
		}
		// No holder created since the reads (the holder key neither): the
		// holders are at most those read.
		conds = []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(h), "<", resp.Header.Revision+1).WithRange(holdersEnd(h))}
		if len(writer) == 0 {
			conds = append(conds, absent(w))
		} else {
			conds = append(conds, clientv3.Compare(clientv3.ModRevision(w), "=", writer[0].ModRevision))
		}
	}
	// Holders come and go faster than the reads: a refusal, tried again
	// by the caller as any other.
	return stores.Grant{Wait: contendedWait}, nil
}

// contendedWait is the Wait of an AcquireShared refused because the
// holders changed under each of its transactions.
const contendedWait = 10 * time.Millisecond

// ReleaseShared ends token's place among key's holders, as Release ends a
// grant: it deletes token's holder key when it holds token, in one
// transaction, which signals waiters (see NotifyRelease); with keep
// positive it moves it to a lease that lasts keep from the call's start
// instead, acting only on a place set by a call of token that started
// before it, after a read of its limit. It returns an error wrapping
// stores.ErrNotHeld when token does not hold key; otherwise its errors, and
// what it does while etcd does not answer or after its caller left, are
// Release's.
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
		value := holderValue // unused without keep
		if keep > 0 {
			limit, err := s.sharedLimit(ctx, mine[0], token)
			if err != nil {
				return fmt.Errorf("etcdstore: shared release %s with keep %v: %w", stores.KeyForMessage(key), keep, err)
			}
			value = sharedValue(limit)
		}
		return s.release(ctx, start, seq, keys, mine, token, keep, value)
	}, overflow)
}

// RefreshShared moves token's place among key's holders to a lease that
// lasts ttl from the call's start, after a read of its limit, as Refresh
// does a key: only while it holds token and was set by a call of token
// that started before this one. It returns an error wrapping
// stores.ErrNotHeld, having changed nothing, when token does not hold key;
// its other errors are Refresh's.
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
	mine := sharedKey(holderKey(s.dir(key)), token)
	limit, err := s.sharedLimit(ctx, mine, token)
	if err != nil {
		return fmt.Errorf("etcdstore: shared refresh %s: %w", stores.KeyForMessage(key), err)
	}
	return s.refresh(ctx, start, seq, []string{key}, []string{mine}, token, ttl, sharedValue(limit))
}

// sharedLimit reads the limit of token's shared holder key mine; an error
// wrapping stores.ErrNotHeld when it does not hold token.
func (s *Store) sharedLimit(ctx context.Context, mine, token string) (int, error) {
	resp, err := s.kv.Txn(ctx).Then(clientv3.OpGet(mine)).Commit()
	if err != nil {
		return 0, s.failed("read", nil, err)
	}
	if len(resp.Responses) != 1 {
		return 0, fmt.Errorf("%w: a read answered %d results", ErrUnexpectedReply, len(resp.Responses))
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 || holderToken(kvs[0].Value) != token || holderLimit(kvs[0].Value) < 0 {
		return 0, fmt.Errorf("%w: not held shared by the token", stores.ErrNotHeld)
	}
	return holderLimit(kvs[0].Value), nil
}
