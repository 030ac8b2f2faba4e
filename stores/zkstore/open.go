package zkstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/reqlock/reqlock/internal/storeargs"
	"github.com/reqlock/reqlock/stores"
)

// Open returns a Store from a URL of the form
//
//	zk://host:port[,host:port...]/root/path?session=10s&connect=check
//
// The path is the Store's root (DefaultRoot when empty or "/"); session is
// the session timeout (DefaultSessionTimeout when absent), a Go duration of
// at least 1s. With connect=check, the default, Open waits for a session as
// New does, and fails naming the servers when none answers in time; with
// connect=lazy (WithLazyConnect) it returns at once, and the Store works
// once a server answers. Open returns an error wrapping stores.ErrInvalid,
// naming the problem, for any other scheme, a missing host, a user, a
// fragment, an unknown parameter (also wrapping stores.ErrUnknownOption) or
// a connect other than check or lazy; and
// New's errors.
func Open(ctx context.Context, rawURL string) (*Store, error) {
	servers, opts, err := parseURL(rawURL)
	if errors.Is(err, stores.ErrInvalid) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("%w: zkstore: %w", stores.ErrInvalid, err)
	}
	return New(ctx, servers, opts...)
}

// parseURL parses Open's URL into New's arguments.
func parseURL(rawURL string) ([]string, []Option, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("bad URL: %w", err)
	}
	switch {
	case u.Scheme != "zk":
		return nil, nil, fmt.Errorf("URL scheme %q is not zk", u.Scheme)
	case u.Opaque != "":
		return nil, nil, fmt.Errorf("URL %q has no //host", rawURL)
	case u.Host == "":
		return nil, nil, errors.New("URL has no host:port")
	case u.User != nil:
		return nil, nil, errors.New("URL has a user: ZooKeeper authentication is not supported")
	case u.Fragment != "":
		return nil, nil, fmt.Errorf("URL has a fragment %q", u.Fragment)
	}
	var servers []string
	for _, h := range strings.Split(u.Host, ",") {
		if h == "" || !strings.Contains(h, ":") {
			return nil, nil, fmt.Errorf("server %q is not host:port", h)
		}
		servers = append(servers, h)
	}
	var opts []Option
	if p := u.Path; p != "" && p != "/" {
		opts = append(opts, WithRoot(p))
	}
	query := u.Query()
	connect, err := args.ParseConnect(query)
	if err != nil {
		return nil, nil, err
	}
	if connect == storeargs.ConnectLazy {
		opts = append(opts, WithLazyConnect())
	}
	if err := args.CheckOptions(query, storeargs.ConnectParam, "session"); err != nil {
		return nil, nil, err
	}
	if values, ok := query["session"]; ok {
		d, err := time.ParseDuration(values[len(values)-1])
		if err != nil {
			return nil, nil, fmt.Errorf("session %q is not a duration", values[len(values)-1])
		}
		opts = append(opts, WithSessionTimeout(d))
	}
	return servers, opts, nil
}
