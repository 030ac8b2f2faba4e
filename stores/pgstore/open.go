package pgstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reqlock/reqlock/internal/storeargs"
	"github.com/reqlock/reqlock/stores"
)

// Open returns a Store over a pool of its own, from a URL of the form
//
//	postgres://user:pass@host:port/db?sslmode=disable&table=reqlock_locks
//
// (scheme postgres or postgresql; a Unix socket directory goes in a host
// parameter: postgres:///db?host=/run/postgresql). The store's own
// parameters, table (see WithTable; default DefaultTable) and call_limit (a
// duration such as 2s; see WithCallLimit), are taken out of the URL; the
// rest is pgx's connection string, which accepts libpq's parameters (sslmode,
// connect_timeout, ...) and pgxpool's (pool_max_conns, default the larger of
// 4 and the number of CPUs, ...), and of the server's run-time parameters
// application_name, client_encoding, options and search_path (others go in
// options, as -c name=value). Every connection runs at READ COMMITTED
// whatever the server's default. Close closes the pool.
//
// With connect=check, the default, Open creates the table when missing
// within ctx, or DefaultConnectTimeout when ctx has no deadline: it returns
// an error wrapping stores.ErrUnreachable that names the address when the
// server cannot be reached in that time, and the server's error when the
// table cannot be created. With connect=lazy (WithLazyConnect) Open sends
// nothing: calls fail with store errors until the server answers, and the
// first call that reaches it creates the table. Open returns an error
// wrapping stores.ErrInvalid that names the problem for a URL it cannot use,
// such as a connect other than check or lazy; for a parameter that neither
// Open nor pgx takes, the error also wraps stores.ErrUnknownOption.
func Open(ctx context.Context, rawURL string) (*Store, error) {
	config, opts, redacted, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, config)
	if err != nil {
		return nil, fmt.Errorf("%w: pgstore: URL %q: %v", stores.ErrInvalid, redacted, err)
	}
	checkCtx, cancel := storeargs.ConnectContext(ctx)
	defer cancel()
	s, err := New(checkCtx, pool, opts...)
	if err != nil {
		pool.Close()
		if errors.Is(err, stores.ErrUnreachable) || (checkCtx.Err() != nil && ctx.Err() == nil) {
			return nil, args.Unreachable([]string{hostPort(config.ConnConfig.Host, config.ConnConfig.Port)}, err)
		}
		return nil, err
	}
	s.ownsPool = true
	return s, nil
}

// parseURL parses Open's URL into pgx's pool configuration and the Store's
// options, and returns the URL as error messages quote it (without the
// password, the store's own parameters taken out). Its errors are Open's for
// a URL it cannot use.
func parseURL(rawURL string) (*pgxpool.Config, []Option, string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, nil, "", fmt.Errorf("%w: pgstore: URL does not parse: %v", stores.ErrInvalid, redact(err))
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return nil, nil, "", fmt.Errorf("%w: pgstore: URL scheme %q, want postgres:// or postgresql://", stores.ErrInvalid, u.Scheme)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, nil, "", fmt.Errorf("%w: pgstore: URL parameters do not parse: %v", stores.ErrInvalid, err)
	}
	if u.Host == "" && !q.Has("host") { // a socket directory goes in ?host=
		return nil, nil, "", fmt.Errorf("%w: pgstore: URL %q names no host", stores.ErrInvalid, u.Redacted())
	}
	connect, err := args.ParseConnect(q)
	if err != nil {
		return nil, nil, "", err
	}
	var opts []Option
	if connect == storeargs.ConnectLazy {
		opts = append(opts, WithLazyConnect())
	}
	if q.Has("table") {
		opts = append(opts, WithTable(q.Get("table")))
		q.Del("table")
	}
	if q.Has("call_limit") {
		d, err := time.ParseDuration(q.Get("call_limit"))
		if err != nil || d <= 0 {
			return nil, nil, "", fmt.Errorf("%w: pgstore: URL parameter call_limit=%q is not a positive duration", stores.ErrInvalid, q.Get("call_limit"))
		}
		opts = append(opts, WithCallLimit(d))
		q.Del("call_limit")
	}
	u.RawQuery = q.Encode()
	config, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return nil, nil, "", fmt.Errorf("%w: pgstore: URL %q: %v", stores.ErrInvalid, u.Redacted(), err)
	}
	// pgx sends the parameters it does not know to the server as run-time
	// parameters: a typo would reach the server, or pass unseen. Only those
	// of serverParams are taken.
	for name := range config.ConnConfig.RuntimeParams {
		if !slices.Contains(serverParams, name) {
			return nil, nil, "", unknownOption(config.ConnConfig.RuntimeParams, name)
		}
	}
	config.ConnConfig.RuntimeParams["default_transaction_isolation"] = "read committed"
	return config, opts, u.Redacted(), nil
}

// serverParams are the server run-time parameters a URL may set; others
// go in options (options=-c%20name%3Dvalue), as with libpq.
var serverParams = []string{"application_name", "client_encoding", "options", "search_path"}

// unknownOption returns the error for the first (sorted) parameter of
// params that is not in serverParams; name is one of them.
func unknownOption(params map[string]string, name string) error {
	for n := range params {
		if !slices.Contains(serverParams, n) && n < name {
			name = n
		}
	}
	known := append([]string{storeargs.ConnectParam, "table", "call_limit"}, serverParams...)
	return args.UnknownOption(name, append(known, "pgx's connection parameters (see pgxpool.ParseConfig)")...)
}

// DefaultConnectTimeout bounds Open's check that the server answers when
// its context has no deadline.
const DefaultConnectTimeout = storeargs.DefaultConnectTimeout

// hostPort names the server of a connection, for messages: host:port, or a
// socket directory and its port.
func hostPort(host string, port uint16) string {
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// redact returns err without the URL it may quote, which may hold a
// password.
func redact(err error) error {
	if uerr, ok := err.(*url.Error); ok {
		return uerr.Err
	}
	return err
}
