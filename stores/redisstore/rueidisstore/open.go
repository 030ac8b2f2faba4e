package rueidisstore

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"slices"

	"github.com/redis/rueidis"

	"github.com/reqlock/reqlock/internal/storeargs"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// args names this package in the errors of its URL checks.
const args storeargs.Checker = "rueidisstore"

// urlParams are the go-redis URL parameters that Open maps onto rueidis
// options; connect is redisstore's own. The others configure go-redis's
// connection pool and retries, which rueidis has not: Open refuses them.
var urlParams = []string{"connect", "db", "protocol", "client_name", "dial_timeout", "read_timeout", "write_timeout", "skip_verify"}

// URLParams returns the URL parameters Open takes; it refuses the others.
func URLParams() []string { return slices.Clone(urlParams) }

// Open returns a Store over a rueidis client of its own, which Close
// closes, from the URL that redisstore.Open takes (parsed by
// redisstore.ParseURL):
//
//	redis://[user:password@]host:port[/db][?connect=check|lazy&...]
//
// (rediss:// for TLS, unix:///path/to/redis.sock for a socket). Of the
// go-redis parameters it takes db, protocol, client_name, dial_timeout,
// read_timeout and write_timeout (the longer is rueidis's ConnWriteTimeout,
// which bounds a write and the wait for its reply) and skip_verify; it
// refuses the others, which configure go-redis's pool and
// retries, with an error wrapping stores.ErrUnknownOption. The client talks
// to one Redis (ClientOption.ForceSingleClient), pipelines every call
// (AlwaysPipelining, so that a cancelled call returns at once) and keeps no
// client-side cache. For a Cluster or Sentinel, build the rueidis client and
// call New. opts are New's.
//
// connect=check (the default) and connect=lazy work as for redisstore.Open.
func Open(ctx context.Context, rawURL string, opts ...redisstore.Option) (*redisstore.Store, error) {
	if u, err := url.Parse(rawURL); err == nil {
		if err := args.CheckOptions(u.Query(), urlParams...); err != nil {
			return nil, err
		}
	}
	o, lazy, err := redisstore.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	co := rueidis.ClientOption{
		InitAddress:       []string{o.Addr},
		Username:          o.Username,
		Password:          o.Password,
		SelectDB:          o.DB,
		ClientName:        o.ClientName,
		TLSConfig:         o.TLSConfig,
		AlwaysRESP2:       o.Protocol == 2,
		ForceSingleClient: true,
		AlwaysPipelining:  true,
		DisableCache:      true,
		Dialer:            net.Dialer{Timeout: o.DialTimeout},
		ConnWriteTimeout:  max(o.ReadTimeout, o.WriteTimeout, 0),
	}
	if o.Network == "unix" {
		co.DialCtxFn = func(ctx context.Context, _ string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
			return d.DialContext(ctx, "unix", o.Addr)
		}
	}
	client, err := rueidis.NewClient(co)
	if client == nil {
		// Not for an unreachable Redis: with ForceSingleClient rueidis
		// returns a client then, and the check below names the address.
		return nil, fmt.Errorf("%w: rueidisstore: %w", stores.ErrInvalid, err)
	}
	closeClient := func() error { client.Close(); return nil }
	s, err := New(client, append(opts, redisstore.WithClientClose(closeClient))...)
	if err != nil {
		client.Close()
		return nil, err
	}
	if !lazy {
		ping := func(ctx context.Context) error { return client.Do(ctx, client.B().Ping().Build()).Error() }
		if err := redisstore.CheckConnect(ctx, []string{o.Network + " " + o.Addr}, ping); err != nil {
			_ = s.Close()
			return nil, err
		}
	}
	return s, nil
}
