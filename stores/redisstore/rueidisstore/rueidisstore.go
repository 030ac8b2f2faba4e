// Package rueidisstore runs redisstore's Store on rueidis
// (github.com/redis/rueidis), a Redis client that pipelines the commands of
// concurrent calls onto shared connections: the commands of many requests
// go out in one write and their replies come back in one read, where
// go-redis spends a round trip and a pooled connection on each.
//
// It is a Driver under the same *redisstore.Store, so everything the
// redisstore package documentation says of the store holds here: the
// scripts, fences, release notification, fair mode, multi-key calls, Redis
// Cluster hash tags and Sentinel. Only the client differs:
//
//   - New takes a rueidis.Client of any mode: one Redis, a Cluster
//     (several InitAddress, or one node of a Cluster) or Sentinel
//     (ClientOption.Sentinel). Open builds one from a redis:// URL.
//   - A call returns as soon as its context is cancelled, on the caller's
//     goroutine: rueidis abandons the reply. An acquire so left is undone in
//     the background, as with go-redis. rueidis honours cancellation on a
//     connection that pipelines (its default with client-side caching on,
//     and always with ClientOption.AlwaysPipelining, which Open sets); on a
//     connection that does not, an idle call with a deadline returns by
//     that deadline only. Nor does it while a call waits for a connection
//     to be opened: rueidis opens its pipeline connections to a server
//     (ClientOption.PipelineMultiplex of them) on first use, and again after
//     one broke, and the calls sent to that connection wait for its dial
//     and handshake, bounded by ClientOption.Dialer.Timeout (5s by
//     default; Open takes it from the URL's dial_timeout), however their
//     contexts end. A server that accepts connections but does not answer
//     (a paused Redis) holds such waiters that long.
//   - rueidis does not retry a script (EVALSHA is not read-only), so each
//     call is one attempt; it fails with an error wrapping
//     stores.ErrUnreachable when no connection could be dialled for it.
//     rueidis answers a call that it wrote with its connection's error
//     (EOF, a reset, a timeout): the Store undoes such an acquire and
//     answers stores.ErrAbandoned. The exception is
//     ClientOption.ConnLifetime: rueidis sends a call whose expired
//     connection broke before the reply again on a new connection, and
//     answers the dial error when that cannot be made, for a call Redis may
//     have run. Wrap such a client with ExpiringConns.
//   - Release signals come through one dedicated rueidis connection per
//     Store with pub/sub hooks, opened by the first NotifyRelease. When that
//     connection breaks, the Store dials a new one (on a Sentinel client, to
//     the current master; on a Cluster, to any node, since classic pub/sub
//     reaches every node) and subscribes every key again: releases while it
//     is down are lost, and the waiters' fallback poll covers them, as with
//     go-redis. rueidis does not close a dedicated connection with its
//     client: a Store whose client is closed first keeps its pub/sub until
//     Close or until Redis drops it, and stops notifying then.
//
// NewRedlock runs redlockstore's Store (Redlock over independent masters)
// on rueidis nodes: each node's calls go through this package's Driver, so
// what is said above of errors, cancellation and ConnLifetime holds per
// node.
//
// This package is a Go module of its own, so that users of reqlock who do
// not use rueidis do not inherit it.
package rueidisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// New returns a Store over client. It starts nothing: the pub/sub
// connection for NotifyRelease opens on first use. The caller owns client
// and closes it after the Store. A client with ClientOption.ConnLifetime
// set must come wrapped by ExpiringConns. It returns an error wrapping
// stores.ErrInvalid when client is nil or an option is invalid.
func New(client rueidis.Client, opts ...redisstore.Option) (*redisstore.Store, error) {
	if e, ok := client.(expiring); client == nil || ok && e.Client == nil {
		return nil, fmt.Errorf("%w: rueidisstore: client is nil", stores.ErrInvalid)
	}
	return redisstore.NewWithDriver(NewDriver(client), opts...)
}

// NewDriver returns the redisstore.Driver over client, for
// redisstore.NewWithDriver. A client with ClientOption.ConnLifetime set must
// come wrapped by ExpiringConns.
func NewDriver(client rueidis.Client) redisstore.Driver {
	e, resends := client.(expiring)
	if resends {
		client = e.Client
	}
	return &driver{client: client, cluster: client.Mode() == rueidis.ClientModeCluster, resends: resends}
}

// ExpiringConns marks client, for New and NewDriver, as one whose
// ClientOption.ConnLifetime is set. rueidis then sends a call whose expired
// connection broke before the reply again, on a new connection, and answers
// the dial error when that cannot be made: the error no longer says that
// Redis never saw the call. The Store then treats a dial error as any other
// failure of unknown outcome: it undoes an acquire that failed so, in the
// background until it lands or the acquisition's TTL has passed, and
// answers stores.ErrAbandoned, not stores.ErrUnreachable.
func ExpiringConns(client rueidis.Client) rueidis.Client { return expiring{client} }

// expiring is a client marked by ExpiringConns.
type expiring struct{ rueidis.Client }

// driver is the redisstore.Driver over a rueidis client.
type driver struct {
	client  rueidis.Client
	cluster bool
	resends bool // the client has ConnLifetime: see ExpiringConns
}

// errCrossSlot is what Eval returns for keys that a Cluster client refuses
// to send together, in the words of Redis's own CROSSSLOT reply, which
// ReplyError reports, so that the Store maps it to redisstore.ErrCrossSlot.
var errCrossSlot = errors.New("CROSSSLOT Keys in request don't hash to the same slot (refused by rueidis before sending)")

// Eval sends EVALSHA, then EVAL when Redis has not cached the script.
func (d *driver) Eval(ctx context.Context, script *redisstore.Script, keys []string, args []any) (redisstore.Reply, error) {
	cmd, err := d.build(false, script, keys, args)
	if err != nil {
		return redisstore.Reply{}, err
	}
	resp := d.client.Do(ctx, cmd)
	if re, ok := rueidis.IsRedisErr(resp.Error()); ok && re.IsNoScript() {
		if cmd, err = d.build(true, script, keys, args); err != nil {
			return redisstore.Reply{}, err
		}
		resp = d.client.Do(ctx, cmd)
	}
	msg, err := resp.ToMessage()
	if err != nil {
		if !d.resends && neverSent(err) {
			err = fmt.Errorf("%w: %w", stores.ErrUnreachable, err)
		}
		return redisstore.Reply{}, err
	}
	if msg.IsInt64() {
		n, _ := msg.AsInt64()
		return redisstore.Reply{Int: n}, nil
	}
	if msg.IsString() {
		b, err := msg.AsBytes()
		if err != nil {
			return redisstore.Reply{}, fmt.Errorf("%w: %w", redisstore.ErrUnexpectedReply, err)
		}
		if b == nil {
			b = []byte{}
		}
		return redisstore.Reply{Bulk: b}, nil
	}
	if msg.IsArray() {
		ints, err := msg.AsIntSlice()
		if err != nil {
			return redisstore.Reply{}, fmt.Errorf("%w: %w", redisstore.ErrUnexpectedReply, err)
		}
		return redisstore.Reply{Ints: ints}, nil
	}
	return redisstore.Reply{}, fmt.Errorf("%w: %s", redisstore.ErrUnexpectedReply, msg.String())
}

// build returns the EVALSHA (or, with eval, EVAL) command of script. A
// Cluster client's builder panics on keys of different slots, which build
// returns as errCrossSlot.
func (d *driver) build(eval bool, script *redisstore.Script, keys []string, args []any) (cmd rueidis.Completed, err error) {
	if d.cluster {
		defer func() {
			if r := recover(); r != nil {
				if s, ok := r.(string); ok && strings.Contains(s, "slot") {
					err = errCrossSlot
					return
				}
				panic(r)
			}
		}()
	}
	// The arguments are appended one by one: no slice of them is made.
	b := d.client.B()
	if eval {
		c := b.Eval().Script(script.Source()).Numkeys(int64(len(keys))).Key(keys...).Arg()
		for _, a := range args {
			s, err := strArg(a)
			if err != nil {
				return cmd, err
			}
			c = c.Arg(s)
		}
		return c.Build(), nil
	}
	c := b.Evalsha().Sha1(script.SHA1()).Numkeys(int64(len(keys))).Key(keys...).Arg()
	for _, a := range args {
		s, err := strArg(a)
		if err != nil {
			return cmd, err
		}
		c = c.Arg(s)
	}
	return c.Build(), nil
}

// strArg returns a script argument as Redis takes it: a string or an
// int64.
func strArg(a any) (string, error) {
	switch v := a.(type) {
	case string:
		return v, nil
	case int64:
		return strconv.FormatInt(v, 10), nil
	case int:
		return strconv.Itoa(v), nil
	}
	return "", fmt.Errorf("%w: rueidisstore: script argument %v of type %T", stores.ErrInvalid, a, a)
}

// neverSent reports whether err says that the call never reached Redis: no
// connection could be dialled for it.
//
// rueidis (v1.0.79) sends a command on a connection of its own mux, dialled
// when the command needs it; when the dial fails, the command goes to a
// dead connection that answers the dial error at once, unsent. A command
// that it wrote gets its connection's first error (a read or write error,
// ErrClosing) or its context's. rueidis sends a script once (it is not
// read-only), again only after a MOVED or ASK reply (which ran nothing) or
// after its connection expired (ConnLifetime, see ExpiringConns). So, but
// with ConnLifetime, a dial error says that Redis never saw the call.
func neverSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// Load sends SCRIPT LOAD of every script to every node.
func (d *driver) Load(ctx context.Context, scripts []*redisstore.Script) error {
	for _, node := range d.client.Nodes() {
		for _, script := range scripts {
			if err := node.Do(ctx, node.B().ScriptLoad().Script(script.Source()).Build()).Error(); err != nil {
				return err
			}
		}
	}
	return nil
}

// Routing is by slot on a Cluster client, else one server.
func (d *driver) Routing() redisstore.Routing {
	if d.cluster {
		return redisstore.RouteSlot
	}
	return redisstore.RouteOne
}

// HonoursCancel is true: rueidis returns at once when a call's context is
// cancelled (see the package documentation).
func (d *driver) HonoursCancel() bool { return true }

func (d *driver) ReplyError(err error) (string, bool) {
	if errors.Is(err, errCrossSlot) {
		return errCrossSlot.Error(), true
	}
	var re *rueidis.RedisError
	if errors.As(err, &re) {
		return re.Error(), true
	}
	return "", false
}

// Closed reports whether err is rueidis.ErrClosing and the client is
// closed: rueidis also answers ErrClosing for a call on a connection that
// broke meanwhile, which a retry may get through.
func (d *driver) Closed(err error) bool {
	return errors.Is(err, rueidis.ErrClosing) && clientClosed(d.client)
}

// clientClosed reports whether client was closed: a closed rueidis client
// answers every command with ErrClosing at once, where a Redis it cannot
// reach gets a dial error.
func clientClosed(client rueidis.Client) bool {
	ctx, cancel := context.WithTimeout(context.Background(), closedCheckTimeout)
	defer cancel()
	return errors.Is(client.Do(ctx, client.B().Ping().Build()).Error(), rueidis.ErrClosing)
}

// closedCheckTimeout bounds clientClosed's PING.
const closedCheckTimeout = time.Second
