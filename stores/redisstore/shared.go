package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/reqlock/reqlock/stores"
)

var (
	//go:embed shared_lib.lua
	sharedLibSrc string
	//go:embed shared_acquire.lua
	sharedAcquireSrc string
	//go:embed shared_release.lua
	sharedReleaseSrc string
	//go:embed shared_refresh.lua
	sharedRefreshSrc string

	sharedAcquireScript = newScript(withSharedLib(sharedAcquireSrc))
	sharedReleaseScript = newScript(withSharedLib(sharedReleaseSrc))
	sharedRefreshScript = newScript(withSharedLib(sharedRefreshSrc))
)

// withSharedLib prepends the helpers of withLib and shared_lib.lua to a
// shared script's source.
func withSharedLib(src string) string { return withLib(sharedLibSrc + src) }

// writerWindowMS is stores.WriterWindow as the scripts take it.
var writerWindowMS = stores.WriterWindow.Milliseconds()

// strideArg and writerWindowArg are stores.FenceStride and writerWindowMS
// as script arguments, formatted and boxed once.
var (
	strideArg       any = strconv.Itoa(stores.FenceStride)
	writerWindowArg any = strconv.FormatInt(writerWindowMS, 10)
)

// AcquireShared makes token a holder of key for ttl, as stores.SharedStore
// describes, in one script and one round trip. While held shared, the lock
// key is a sorted set of its holders' tokens scored by their expiry (server
// milliseconds), its TTL the latest of them: Acquire and AcquireFair find
// it held, with the longest remaining TTL among the holders, and no holder
// token is its owner. Each call first drops the places that expired, so
// that each holder keeps its place for its own TTL, and counts the rest
// against limit in the script. The fence comes from the key's one fence
// key, as an exclusive grant's does.
//
// A refusal's Wait is the exclusive holder's remaining TTL, the longest
// remaining window among the waiting writers (a sorted set beside the key,
// see Writer preference in the package documentation), or the soonest
// expiry among the holders of a key that has limit holders or more. A
// refused call marks the key waited for, so that the release of a place
// publishes (see Release notification in the package documentation).
//
// Its errors, and what it does when ctx ends while the script is in flight,
// are Acquire's: a place it may have granted is released, owner-checked,
// with ReleaseShared. It returns an error wrapping stores.ErrInvalid for an
// empty key, a negative limit or a non-positive ttl.
func (s *Store) AcquireShared(ctx context.Context, key, token string, limit int, ttl time.Duration) (stores.Grant, error) {
	if err := args.CheckShared(ctx, key, limit); err != nil {
		return stores.Grant{}, err
	}
	if err := args.CheckTTL(ttl); err != nil {
		return stores.Grant{}, err
	}
	call := &scriptCall{store: s, script: sharedAcquireScript,
		keys: []string{key, fenceKey(key), writersKey(key), waitingKey(key), abandonKey(key, token)},
		args: []any{token, milliseconds(ttl), s.fenceRetention.Milliseconds(), stores.FenceStride, limit},
		undo: undoShared, undoKeys: []string{key}, undoToken: token, ttl: ttl}
	r, err := call.run(ctx)
	if err != nil {
		return stores.Grant{}, s.mapCrossSlot(err, []string{key}, true)
	}
	reply := r.Ints
	switch {
	case len(reply) == 2 && reply[0] == 1:
		return stores.Grant{OK: true, Fences: reply[1:]}, nil
	case len(reply) == 2 && reply[0] == 0:
		return stores.Grant{Wait: holderTTL(reply[1])}, nil
	}
	return stores.Grant{}, fmt.Errorf("%w: shared acquire %q answered %v", ErrUnexpectedReply, key, reply)
}

// ReleaseShared ends token's place among key's holders, in one script and
// one round trip: it frees the place and, when a caller was refused the key
// meanwhile, publishes on the channel named like the key, as Release does;
// with keep positive it keeps the place for keep from now instead. It
// returns an error wrapping stores.ErrNotHeld when token does not hold key
// (its place expired, or it never had one, or the key is held
// exclusively), the client's error as is, ctx.Err() without acting when ctx
// has ended, and an error wrapping stores.ErrInvalid for an empty key.
func (s *Store) ReleaseShared(ctx context.Context, key, token string, keep time.Duration) error {
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	var keepMS int64
	if keep > 0 {
		keepMS = milliseconds(keep)
	}
	return s.onPlace(ctx, "shared release", sharedReleaseScript, key, token, keepMS)
}

// RefreshShared resets the TTL of token's place among key's holders to ttl,
// in one script and one round trip. It returns an error wrapping
// stores.ErrNotHeld, having changed nothing, when token does not hold key,
// the client's error as is, ctx.Err() without acting when ctx has ended, and
// an error wrapping stores.ErrInvalid for an empty key or a non-positive
// ttl. As Refresh, it returns as soon as ctx is cancelled.
func (s *Store) RefreshShared(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := args.CheckShared(ctx, key, 0); err != nil {
		return err
	}
	if err := args.CheckTTL(ttl); err != nil {
		return err
	}
	return s.onPlace(ctx, "shared refresh", sharedRefreshScript, key, token, milliseconds(ttl))
}

// onPlace runs script, ReleaseShared's or RefreshShared's, on token's place
// among key's holders, with ms its keep or TTL, and maps its reply. Like
// Refresh, a refresh returns as soon as ctx is cancelled (see
// scriptCall.run); like Release, a release waits for its reply, bounded by
// ctx's deadline.
func (s *Store) onPlace(ctx context.Context, what string, script *Script, key, token string, ms int64) error {
	keys, args := []string{key, waitingKey(key)}, []any{token, ms}
	var r Reply
	var err error
	if script == sharedRefreshScript {
		r, err = (&scriptCall{store: s, script: script, keys: keys, args: args}).run(ctx)
	} else {
		r, err = s.run(ctx, script, keys, args...)
	}
	if err != nil {
		return s.mapCrossSlot(err, []string{key}, false)
	}
	switch {
	case r.Ints != nil:
	case r.Int == 1:
		return nil
	case r.Int == 0:
		return fmt.Errorf("%w: %q is not held shared by the token", stores.ErrNotHeld, key)
	}
	return fmt.Errorf("%w: %s %q answered %v", ErrUnexpectedReply, what, key, r)
}

// undoShared marks the shared call's acquisition abandoned, so that a late
// copy of it grants nothing, then releases the place it may have granted,
// owner-checked.
func undoShared(c *scriptCall, ctx context.Context) error {
	if err := c.store.markAbandoned(ctx, c); err != nil {
		return err
	}
	return landed(c.store.ReleaseShared(ctx, c.undoKeys[0], c.undoToken, 0))
}

// writersKey names key's waiting writers, a sorted set of tokens scored by
// the end of each one's window (server milliseconds), in the slot of key
// (see fenceKey).
func writersKey(key string) string { return siblingKey(key, ":writers") }

// writerMarkKey names token's writer mark on key, which stands while token
// has a record among key's writers, in the slot of key (see fenceKey): the
// acquire scripts find it with the EXISTS they make of the abandon mark, so
// that a grant to a token that was no waiting writer pays no command more.
func writerMarkKey(key, token string) string { return siblingKey(key, ":writer:"+token) }
