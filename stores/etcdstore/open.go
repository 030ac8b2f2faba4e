package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/reqlock/reqlock/internal/storeargs"
	"github.com/reqlock/reqlock/stores"
)

// DefaultDialTimeout bounds Open's first connection unless the URL's
// dial-timeout says otherwise.
const DefaultDialTimeout = 5 * time.Second

// Sizes of the client's and etcd's gRPC limits: the client sends requests
// up to 2 MiB by default, and etcd takes gRPC messages up to its
// --max-request-bytes plus 512 KiB.
const (
	defaultMaxCallSendMsgSize = 2 << 20
	grpcOverheadBytes         = 512 << 10
)

// Open connects to etcd and returns a Store that owns the client (Close
// closes it). rawURL has the form
//
//	etcd://[user:password@]host:port[,host:port...][/prefix][?connect=check&timeout=5s&dial-timeout=5s&max-request-bytes=1572864]
//
// with the client endpoints of the cluster's members (plain HTTP; the
// client spreads requests over them and moves on when one fails), the key
// prefix (default DefaultPrefix; a '/' is added when it does not end in
// one), the request timeout (WithRequestTimeout), how long Open waits
// for a first connection, and the cluster's --max-request-bytes
// (WithMaxRequestBytes; Open raises the client's send limit to match). There is no ttl parameter: every lock's TTL is
// the one the Locker asks for, and no session lease outlives it.
//
// With connect=check, the default, Open fails unless a member answers
// within the dial timeout (DefaultDialTimeout) or ctx, whichever ends
// first, with an error wrapping stores.ErrUnreachable that names the
// endpoints. With connect=lazy it sends nothing: the client connects in the
// background, calls fail with store errors until a member answers, and
// then work, with no restart. Open returns an error wrapping
// stores.ErrInvalid that names the problem for a malformed URL, another
// scheme, no endpoint, an endpoint without a port, an unknown parameter (also
// wrapping stores.ErrUnknownOption), a
// connect other than check or lazy, a duration that is not positive or a
// size below 64 KiB.
func Open(ctx context.Context, rawURL string) (*Store, error) {
	cfg, opts, connect, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	cfg.Context = ctx
	client, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: open %s: %w", redacted(rawURL), err)
	}
	// clientv3.New does not wait for a connection: check that a member
	// answers, so that a wrong address fails here and not on a request.
	if connect == storeargs.ConnectCheck {
		dialCtx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
		defer cancel()
		if _, err := client.Get(dialCtx, "health", clientv3.WithSerializable(), clientv3.WithCountOnly()); err != nil {
			_ = client.Close()
			addrs := make([]string, len(cfg.Endpoints))
			for i, e := range cfg.Endpoints {
				addrs[i] = strings.TrimPrefix(e, "http://")
			}
			return nil, args.Unreachable(addrs, fmt.Errorf("no member answered: %w", err))
		}
	}
	s, err := New(client, opts...)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	s.ownsClient = true
	return s, nil
}

// parseURL parses Open's URL into a client configuration and Store options.
// The host list is split by hand: net/url takes "a:1,b:2" for one host
// with a bad port.
func parseURL(rawURL string) (clientv3.Config, []Option, storeargs.Connect, error) {
	invalid := func(format string, a ...any) (clientv3.Config, []Option, storeargs.Connect, error) {
		return clientv3.Config{}, nil, 0, fmt.Errorf("%w: etcdstore: URL %s: %s", stores.ErrInvalid, redacted(rawURL), fmt.Sprintf(format, a...))
	}
	scheme, rest, ok := strings.Cut(rawURL, "://")
	switch {
	case !ok:
		return invalid("no scheme, want etcd://host:port[,host:port...]/prefix")
	case scheme != "etcd":
		return invalid("scheme %q, want etcd", scheme)
	}
	end := strings.IndexAny(rest, "/?")
	if end < 0 {
		end = len(rest)
	}
	authority, tail := rest[:end], rest[end:]
	cfg := clientv3.Config{DialTimeout: DefaultDialTimeout, Logger: zap.NewNop()}
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		user, password, _ := strings.Cut(authority[:at], ":")
		var err1, err2 error
		cfg.Username, err1 = url.PathUnescape(user)
		cfg.Password, err2 = url.PathUnescape(password)
		if err := errors.Join(err1, err2); err != nil {
			return invalid("malformed user or password")
		}
		authority = authority[at+1:]
	}
	if authority == "" {
		return invalid("no endpoint (etcd://host:port[,host:port...])")
	}
	for _, hp := range strings.Split(authority, ",") {
		host, port, err := net.SplitHostPort(hp)
		if err != nil || host == "" || port == "" {
			return invalid("endpoint %q is not host:port", hp)
		}
		cfg.Endpoints = append(cfg.Endpoints, "http://"+hp)
	}
	u, err := url.Parse("etcd://endpoints" + tail)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // without the URL, which may hold a password
		}
		return invalid("malformed prefix or parameters: %v", err)
	}
	var opts []Option
	if prefix := strings.TrimPrefix(u.Path, "/"); prefix != "" {
		if !strings.HasSuffix(prefix, "/") {
			prefix += "/"
		}
		opts = append(opts, WithPrefix(prefix))
	}
	query := u.Query()
	connect, err := args.ParseConnect(query)
	if err != nil {
		return clientv3.Config{}, nil, 0, err
	}
	if query.Has("ttl") {
		return invalid("parameter ttl: each lock has the TTL the Locker asks for, and the store keeps no session lease; remove it")
	}
	if err := args.CheckOptions(query, storeargs.ConnectParam, "timeout", "dial-timeout", "max-request-bytes"); err != nil {
		return clientv3.Config{}, nil, 0, err
	}
	for name, values := range query {
		if len(values) != 1 {
			return invalid("parameter %s given %d times", name, len(values))
		}
		duration := func() (time.Duration, error) {
			d, err := time.ParseDuration(values[0])
			if err != nil || d <= 0 {
				return 0, fmt.Errorf("parameter %s=%q is not a positive duration", name, values[0])
			}
			return d, nil
		}
		switch name {
		case "timeout":
			d, err := duration()
			if err != nil {
				return invalid("%v", err)
			}
			opts = append(opts, WithRequestTimeout(d))
		case "dial-timeout":
			d, err := duration()
			if err != nil {
				return invalid("%v", err)
			}
			cfg.DialTimeout = d
		case "max-request-bytes":
			n, err := strconv.Atoi(values[0])
			if err != nil || n < 64<<10 {
				return invalid("parameter %s=%q is not a number of bytes of at least 65536", name, values[0])
			}
			opts = append(opts, WithMaxRequestBytes(n))
			// The client must send what etcd takes: up to etcd's own gRPC
			// limit, the request size plus its gRPC allowance, of which
			// etcd refuses what exceeds n (stores.ErrInvalid).
			if n+grpcOverheadBytes > defaultMaxCallSendMsgSize {
				cfg.MaxCallSendMsgSize = n + grpcOverheadBytes
			}
		}
	}
	return cfg, opts, connect, nil
}

// redacted is rawURL with its password, if any, masked, for messages.
func redacted(rawURL string) string {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return rawURL
	}
	end := strings.IndexAny(rest, "/?")
	if end < 0 {
		end = len(rest)
	}
	at := strings.LastIndex(rest[:end], "@")
	if at < 0 {
		return rawURL
	}
	user, _, hasPassword := strings.Cut(rest[:at], ":")
	if !hasPassword {
		return rawURL
	}
	return scheme + "://" + user + ":xxxxx" + rest[at:]
}
