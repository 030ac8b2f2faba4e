package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/reqlock/reqlock/stores"
)

// Driver is the Redis client under a Store: the few operations the store's
// logic (its scripts, fences, wake-ups, fair mode, multi-key calls) needs,
// so that one Store runs on more than one client library. New wraps a
// go-redis client in one; package
// github.com/reqlock/reqlock/stores/redisstore/rueidisstore has one on
// rueidis, which pipelines concurrent calls onto shared connections. A
// Driver is safe for concurrent use.
type Driver interface {
	// Eval runs script with keys and args (each a string or an int64) on
	// the node that serves the keys: EVALSHA of script.SHA1(), and EVAL of
	// script.Source() when Redis answers that it has not cached it. It
	// returns the script's integer reply in Reply.Int, its array of
	// integers in Reply.Ints, or its string reply in Reply.Bulk. An error wraps stores.ErrUnreachable when no
	// attempt of the call can have reached Redis; a Driver that retries a
	// call makes its attempts inside Eval.
	Eval(ctx context.Context, script *Script, keys []string, args []any) (Reply, error)

	// Load caches scripts with SCRIPT LOAD, on every node of a Cluster.
	Load(ctx context.Context, scripts []*Script) error

	// PubSub opens a pub/sub connection subscribed to no channel, which
	// calls onMessage with the channel of every message it receives
	// (without blocking for long: the Store only signals its waiters), and
	// onBroken once should it stop receiving for good, not by its Close.
	// It returns nil when the client cannot hear every release on one
	// connection (a go-redis Ring). It is called at most once per Store.
	PubSub(onMessage func(channel string), onBroken func()) PubSub

	// Routing tells how the client spreads keys over servers.
	Routing() Routing

	// HonoursCancel reports whether Eval returns as soon as its context is
	// cancelled. When it does, the Store calls Eval on the caller's
	// goroutine; when it does not, the Store runs each call that its caller
	// may leave on a goroutine of its own, so that it can return at once.
	// Either way the Store undoes what a left call may have granted.
	HonoursCancel() bool

	// ReplyError reports whether err is, or wraps, an error reply of Redis,
	// and its text ("CROSSSLOT ...").
	ReplyError(err error) (msg string, ok bool)

	// Closed reports whether err says the client was closed, so that no
	// retry can succeed.
	Closed(err error) bool
}

// PubSub is a Driver's pub/sub connection. Subscribe and Unsubscribe are
// called from one goroutine at a time. While the connection is down, the
// Driver keeps the channels subscribed and subscribes them again once it
// reconnects; a failed Subscribe or Unsubscribe is not retried by the
// Store.
type PubSub interface {
	Subscribe(ctx context.Context, channels ...string) error
	Unsubscribe(ctx context.Context, channels ...string) error
	// Close closes the connection; once it returns, onMessage and onBroken
	// are not called any more.
	Close() error
}

// Routing is how a client spreads keys over servers.
type Routing int

const (
	// RouteOne is one server (or a failover pair) that holds every key.
	RouteOne Routing = iota
	// RouteSlot is Redis Cluster: keys go by hash slot.
	RouteSlot
	// RouteShard is a go-redis Ring: keys go by the hash of their hash
	// tag, or of the whole key.
	RouteShard
)

// Script is one of the Store's Lua scripts, for a Driver to run.
type Script struct {
	src, sha string
}

// NewScript returns the script with Lua source src, for a Driver's Eval:
// for a store of another package that runs its own scripts on a Driver
// (redlockstore's nodes).
func NewScript(src string) *Script { return newScript(src) }

// newScript returns the script with source src.
func newScript(src string) *Script {
	sum := sha1.Sum([]byte(src))
	return &Script{src: src, sha: hex.EncodeToString(sum[:])}
}

// Source returns the script's Lua source, for EVAL and SCRIPT LOAD.
func (s *Script) Source() string { return s.src }

// SHA1 returns the hex SHA1 digest of the source, for EVALSHA.
func (s *Script) SHA1() string { return s.sha }

// Reply is what a script answered: an integer in Int, an array of integers
// in Ints (never nil then), or a string in Bulk (never nil then, even when
// empty).
type Reply struct {
	Int  int64
	Ints []int64
	Bulk []byte
}

// NewWithDriver returns a Store over d, as New does over a go-redis client.
// It returns an error wrapping stores.ErrInvalid when d is nil or an option
// is invalid.
func NewWithDriver(d Driver, opts ...Option) (*Store, error) {
	if d == nil {
		return nil, fmt.Errorf("%w: redisstore: driver is nil", stores.ErrInvalid)
	}
	s := &Store{driver: d, routing: d.Routing(), fenceRetention: DefaultFenceRetention, maxRecordBytes: DefaultMaxRecordBytes}
	for _, opt := range opts {
		opt(s)
	}
	if s.fenceRetention < MinFenceRetention {
		return nil, fmt.Errorf("%w: redisstore: fence retention %v is below %v",
			stores.ErrInvalid, s.fenceRetention, MinFenceRetention)
	}
	if s.maxRecordBytes < 1 || s.maxRecordBytes > MaxRecordBytesLimit {
		return nil, fmt.Errorf("%w: redisstore: max record bytes %d is out of [1, %d]",
			stores.ErrInvalid, s.maxRecordBytes, MaxRecordBytesLimit)
	}
	s.retentionArg = strconv.FormatInt(s.fenceRetention.Milliseconds(), 10)
	return s, nil
}

// WithClientClose has the Store call closeClient last in its Close: for a
// constructor that makes the client (as Open does), so that the Store owns
// it.
func WithClientClose(closeClient func() error) Option {
	return func(s *Store) { s.closeClient = closeClient }
}
