package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/reqlock/reqlock/stores"
)

// sharedKey is reader token's place among the shared holders of the key of
// holder key h: h, "/", and the token. A limited holder's place is a slot
// instead (see slotKey). The holder key and its shared holders are one
// range of etcd keys, [h, holdersEnd(h)), so that one comparison tells a
// free key from a held one, of either kind.
func sharedKey(h, token string) string { return h + "/" + token }

// holdersEnd is the end of the range of h and its shared holders: h and "0",
// the byte after '/'.
func holdersEnd(h string) string { return h + "0" }

// slotKey is slot i of the key of holder key h, a place for a holder under a
// limit above i: h, "/", a NUL byte and i in 16 hex digits, so that the
// slots sort by number, before every reader's place (a token has no NUL
// byte).
func slotKey(h string, i int) string { return fmt.Sprintf("%s/\x00%016x", h, i) }

// slotIndex returns the slot that k, a shared holder of the key of holder
// key h, takes; ok false for a reader's place.
func slotIndex(h, k string) (i int, ok bool) {
	rest, ok := strings.CutPrefix(k, h+"/\x00")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(rest, 16, 62)
	if err != nil {
		return 0, false
	}
	return int(n), true
}

// writersDir is the parent of the waiting writers' records of the key of
// holder key h, and writerKey token's record (see writerWaits).
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
// the key of holder key h. The record stands as long as it exists: it
// lives on a lease that lasts at least stores.WriterWindow from this call's
// start, which etcd rounds up to its shortest lease, so that it goes by
// itself after between WriterWindow and about 2.5s (see the package
// documentation), whatever the clocks of the Stores; an exclusive grant to
// token, or a Release by token, deletes it. Its value, the window's end in
// Unix milliseconds by the local clock, is for Stores of earlier versions,
// which compare it with their own; this one reads no clock. The record
// serves fairness, never safety: a failure to put it is ignored.
func (s *Store) writerWaits(ctx context.Context, h, token string) {
	until := strconv.FormatInt(time.Now().Add(stores.WriterWindow).UnixMilli(), 10)
	_ = s.withLease(ctx, time.Now(), stores.WriterWindow, func(lease clientv3.LeaseID) error {
		_, err := s.kv.Txn(ctx).Then(clientv3.OpPut(writerKey(h, token), until, clientv3.WithLease(lease))).Commit()
		return err
	})
}

// places remembers the place (a slot) that this Store last sent for each
// token's AcquireShared under a limit, so that its ReleaseShared and
// RefreshShared name it without a read; an entry goes at the token's
// release, or when its acquire ends holding nothing.
type places struct {
	mu sync.Mutex
	m  map[string]string // h, NUL, token: the place
}

func (p *places) get(h, token string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k, ok := p.m[h+"\x00"+token]
	return k, ok
}

func (p *places) set(h, token, place string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]string{}
	}
	p.m[h+"\x00"+token] = place
}

func (p *places) forget(h, token string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.m, h+"\x00"+token)
}

// onPlace runs op, a release or refresh, on token's place among the shared
// holders of h: the slot this Store sent for it, else its reader's place.
// When op answers stores.ErrNotHeld, it reads the holders and runs op again
// on the place that holds token, if another does (a slot set through
// another Store, say).
func (s *Store) onPlace(ctx context.Context, h, token string, op func(place string) error) error {
	place, ok := s.places.get(h, token)
	if !ok {
		place = sharedKey(h, token)
	}
	err := op(place)
	if !errors.Is(err, stores.ErrNotHeld) {
		return err
	}
	resp, rerr := s.kv.Get(ctx, h+"/", clientv3.WithRange(holdersEnd(h)))
	if rerr != nil {
		return err
	}
	for _, kv := range resp.Kvs {
		if holderToken(kv.Value) == token && string(kv.Key) != place {
			return op(string(kv.Key))
		}
	}
	return err
}

// AcquireShared makes token a holder of key for at least ttl, as
// stores.SharedStore describes. A holder is an etcd key of its own beside
// the key's holder key, on a lease that lasts ttl from the call's start as
// Acquire's does, so that each expires at its own TTL; its value is a
// holder key's. A reader (limit 0) holds its token's place (see
// sharedKey), a holder under a limit N a slot below N (see slotKey).
//
// A reader is granted, in one transaction, while the key has no exclusive
// holder and no writer record. A caller under a limit N first tries a slot
// picked at random below N (or the one it last tried): granted when that
// slot is free, no holder stands outside the slots below N and no writer
// record stands. Otherwise the transaction reads the holders and the
// writer records, and unless they refuse it the next one tries a free slot
// i below k, comparing that slot i is still free and that no holder of the
// slots from k on, or reader, was created since the read; k is the largest
// number such that k plus the holders read from slot k on (readers
// included) is at most N. So at the grant at most k-1 hold the slots below
// k and at most N-k the rest: fewer than N, counted atomically without a
// counter. When every caller of the key uses one limit N and none reads,
// k is N, and only a caller that took the same slot meanwhile, a real
// competitor for that place, makes it try again; with mixed limits or
// readers, so does a new holder outside the caller's slots. A token that
// holds the key is granted again, comparing its place unchanged. It tries
// again until it is granted or refused, or its caller's context ends (the
// request timeout bounds it too). Every grant's fence is its transaction's
// revision, as for Acquire, and every transaction compares that token was
// not abandoned; an AcquireShared left in flight is undone as an abandoned
// Acquire is (see the package documentation).
//
// A refusal's Wait is the TTL the exclusive holder was given, the
// shortest TTL given to a holder of a full key, or stores.WriterWindow
// while a writer record stands. Errors are as Acquire's, and a negative
// limit is refused with stores.ErrInvalid.
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
	var sent []string // the places its transactions may have set
	h := holderKey(s.dir(key))
	err := s.detached(ctx, func(opCtx context.Context) error {
		var err error
		g, err = s.acquireShared(opCtx, ctx, start, seq, h, key, token, limit, ttl, &fl, &sent)
		return err
	}, func() *pendingUndo {
		s.places.forget(h, token)
		return newSharedUndo(token, sent, &fl)
	})
	if err != nil {
		return stores.Grant{}, err
	}
	return g, nil
}

// acquireShared is AcquireShared's work, on ctx; caller is its caller's
// context, which ends its tries. It appends to sent each place it is
// about to send.
func (s *Store) acquireShared(ctx, caller context.Context, start time.Time, seq uint64, h, key, token string, limit int, ttl time.Duration, fl *flight, sent *[]string) (stores.Grant, error) {
	ws := writersDir(h)
	wsEnd := clientv3.GetPrefixRangeEnd(ws)
	noWriter := clientv3.Compare(clientv3.CreateRevision(ws), "=", 0).WithRange(wsEnd)
	place := sharedKey(h, token)
	conds := []clientv3.Cmp{absent(h), noWriter}
	if limit > 0 {
		place = s.firstSlot(h, token, limit)
		conds = []clientv3.Cmp{absent(h), absent(place), noWriter,
			clientv3.Compare(clientv3.CreateRevision(slotKey(h, limit)), "=", 0).WithRange(holdersEnd(h))}
	}
	val := holderValue(token, seq, ttl)
	refused := func(g stores.Grant) (stores.Grant, error) {
		s.places.forget(h, token) // it holds no place
		return g, nil
	}
	for {
		if limit > 0 {
			s.places.set(h, token, place)
		}
		if !slices.Contains(*sent, place) {
			*sent = append(*sent, place)
		}
		var resp *clientv3.TxnResponse
		err := s.withLease(ctx, start, ttl, func(lease clientv3.LeaseID) error {
			fl.sending(lease)
			var err error
			resp, err = s.kv.Txn(ctx).If(append(conds, s.notAbandoned(token))...).
				Then(clientv3.OpPut(place, val, clientv3.WithLease(lease))).
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
			s.places.forget(h, token)
			return stores.Grant{}, errTokenAbandoned(token)
		}
		holders := resp.Responses[0].GetResponseRange().GetKvs()
		writers := resp.Responses[1].GetResponseRange().GetKvs()
		if len(holders) > 0 && string(holders[0].Key) == h {
			return refused(stores.Grant{Wait: holderTTL(holders[0].Value)}) // held exclusively
		}
		var own *mvccpb.KeyValue
		for _, kv := range holders {
			if holderToken(kv.Value) == token {
				own = kv
			}
		}
		switch {
		case own != nil:
			// A retry: granted again, whatever the count and the writers.
			place = string(own.Key)
			conds = []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(place), "=", own.ModRevision)}
			continue
		case len(writers) > 0:
			return refused(stores.Grant{Wait: stores.WriterWindow})
		case limit > 0 && len(holders) >= limit:
			return refused(stores.Grant{Wait: soonestTTL(holders)})
		}
		if err := caller.Err(); err != nil {
			return stores.Grant{}, fmt.Errorf("etcdstore: shared acquire %s: %w", stores.KeyForMessage(key), err)
		}
		if limit == 0 {
			conds = []clientv3.Cmp{absent(h), noWriter}
			continue
		}
		// The holders read from slot k on are all there may be at the
		// grant: none created since the read (next is the revision after).
		k, i := pickSlot(h, holders, limit)
		place = slotKey(h, i)
		next := resp.Header.Revision + 1
		conds = []clientv3.Cmp{absent(h), absent(place), noWriter,
			clientv3.Compare(clientv3.CreateRevision(slotKey(h, k)), "<", next).WithRange(holdersEnd(h))}
	}
}

// firstSlot is the slot that a caller under limit tries first, before any
// read: the one this Store last tried for token, while below limit (a
// retry, whose own place the transaction then finds), else one at random.
func (s *Store) firstSlot(h, token string, limit int) string {
	if p, ok := s.places.get(h, token); ok {
		if i, ok := slotIndex(h, p); ok && i < limit {
			return p
		}
	}
	return slotKey(h, rand.IntN(limit))
}

// pickSlot returns, for a caller under limit n that read holders (fewer
// than n, none its own), the largest k such that k plus the holders read
// from slot k on (readers included) is at most n, and a free slot i below
// k, picked at random. Since fewer than n hold the key, k is n minus those
// holders and some slot below it is free.
func pickSlot(h string, holders []*mvccpb.KeyValue, n int) (k, i int) {
	taken := map[int]bool{}
	var slots []int
	readers := 0
	for _, kv := range holders {
		if j, ok := slotIndex(h, string(kv.Key)); ok {
			taken[j] = true
			slots = append(slots, j)
		} else {
			readers++
		}
	}
	k = n
	for {
		above := readers
		for _, j := range slots {
			if j >= k {
				above++
			}
		}
		if k+above <= n {
			break
		}
		k = n - above
	}
	i = rand.IntN(k)
	for taken[i] {
		i = (i + 1) % k
	}
	return k, i
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
	keys, h := []string{key}, holderKey(s.dir(key))
	err := s.onPlace(ctx, h, token, func(place string) error {
		mine := []string{place}
		var overflow func()
		if keep == 0 {
			overflow = func() { s.undos.add(&pendingUndo{token: token, release: true, keys: mine}) }
		}
		return s.goOn(ctx, "shared release", keys, func(ctx context.Context) error {
			return s.release(ctx, start, seq, keys, mine, false, token, keep)
		}, overflow)
	})
	if err == nil || errors.Is(err, stores.ErrNotHeld) {
		s.places.forget(h, token)
	}
	return err
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
	return s.onPlace(ctx, holderKey(s.dir(key)), token, func(place string) error {
		return s.refresh(ctx, start, seq, []string{key}, []string{place}, token, ttl)
	})
}
