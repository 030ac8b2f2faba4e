package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/storeargs"
	"github.com/reqlock/reqlock/stores"
)

// Open returns a Store over a *redis.Client of its own, which Close closes,
// from a go-redis URL:
//
//	redis://[user:password@]host:port[/db][?connect=check|lazy&...]
//
// (rediss:// for TLS, unix:///path/to/redis.sock for a socket). Every
// parameter but connect is go-redis's (dial_timeout, read_timeout,
// max_retries, ...); the client has ContextTimeoutEnabled set, and dials once
// per try (go-redis's 5 dials 100ms apart make every call to a dead Redis
// last half a second). opts are New's.
//
// With connect=check, the default, Open sends PING and fails unless Redis
// answers within ctx, or DefaultConnectTimeout when ctx has no deadline: it
// returns an error wrapping stores.ErrUnreachable that names the address.
// With connect=lazy it sends nothing: until Redis answers, calls fail with
// store errors (stores.ErrUnreachable while no connection can be made), and
// then work, with no restart. It returns an error wrapping stores.ErrInvalid
// that names the problem for a URL it cannot use, also wrapping
// stores.ErrUnknownOption for a parameter neither Open nor go-redis knows.
func Open(ctx context.Context, rawURL string, opts ...Option) (*Store, error) {
	o, lazy, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	o.ContextTimeoutEnabled = true
	o.DialerRetries = 1
	client := redis.NewClient(o)
	s, err := New(client, append(opts, WithClientClose(client.Close))...)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	if !lazy {
		ping := func(ctx context.Context) error { return client.Ping(ctx).Err() }
		if err := CheckConnect(ctx, []string{o.Network + " " + o.Addr}, ping); err != nil {
			_ = s.Close()
			return nil, err
		}
	}
	return s, nil
}

// ParseURL parses a URL of the form Open takes into go-redis options, and
// reports whether it asks connect=lazy. Open builds its client from them,
// and other drivers' Open (such as rueidisstore's) theirs. It returns
// Open's errors for a URL it cannot use.
func ParseURL(rawURL string) (o *redis.Options, lazy bool, err error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // without the URL, which may hold a password
		}
		return nil, false, fmt.Errorf("%w: redisstore: URL: %v", stores.ErrInvalid, err)
	}
	q := u.Query()
	connect, err := args.ParseConnect(q)
	if err != nil {
		return nil, false, err
	}
	u.RawQuery = q.Encode()
	o, err = redis.ParseURL(u.String())
	if names, ok := strings.CutPrefix(fmt.Sprint(err), goRedisUnknown); ok {
		name, _, _ := strings.Cut(names, ", ")
		return nil, false, args.UnknownOption(name, storeargs.ConnectParam, "go-redis's (see redis.ParseURL)")
	}
	if err != nil {
		return nil, false, fmt.Errorf("%w: redisstore: URL %s: %s", stores.ErrInvalid, u.Redacted(),
			strings.ReplaceAll(err.Error(), rawURL, u.Redacted()))
	}
	return o, connect == storeargs.ConnectLazy, nil
}

// CheckConnect is Open's start-up check for connect=check, for other
// drivers' Open to share: it calls ping and returns an error wrapping
// stores.ErrUnreachable that names addrs unless ping succeeds within ctx,
// or DefaultConnectTimeout when ctx has no deadline.
func CheckConnect(ctx context.Context, addrs []string, ping func(context.Context) error) error {
	checkCtx, cancel := storeargs.ConnectContext(ctx)
	defer cancel()
	if err := ping(checkCtx); err != nil {
		return args.Unreachable(addrs, err)
	}
	return nil
}

// goRedisUnknown starts go-redis's error for URL parameters it does not
// know, which Open turns into the error every store's Open returns for them.
const goRedisUnknown = "redis: unexpected option: "

// DefaultConnectTimeout bounds Open's check that Redis answers when its
// context has no deadline.
const DefaultConnectTimeout = storeargs.DefaultConnectTimeout
