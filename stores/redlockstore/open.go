package redlockstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/storeargs"
	"github.com/reqlock/reqlock/stores"
)

// Open returns a Store over the nodes rawURL names, with a *redis.Client of
// its own per node (ContextTimeoutEnabled set), which Close closes. It takes
// two forms:
//
//	redlock://[user:password@]host1:port,host2:port,host3:port[/db][?options]
//	redis://host1:port/0,redis://host2:port/0,rediss://host3:port/0[?options]
//
// The first gives every node the same credentials and database; the second
// is a comma list of go-redis URLs, one per node (query options of the
// go-redis URL form apply to their own node). The Store's options come from
// the query of the redlock:// URL, or of the last URL of the list:
// node_timeout, max_ttl and fence_retention (Go durations), drift (the
// factor, such as 0.01) and drift_fixed (a duration). Each client dials
// once and, unless the URL sets go-redis's max_retries, tries a command
// once: a dead node then fails its call at once, and the quorum of the
// others decides, where go-redis's defaults (3 retries, 5 dials 100ms apart)
// make every call to it, and the releases that wait for it, last hundreds
// of milliseconds (measured: throughput fell to 3% after 2 of 5 nodes died).
// New's callers should configure their clients alike.
//
// With connect=check, the default, Open sends PING to every node and fails
// unless a quorum answers within ctx, or DefaultConnectTimeout when ctx has
// no deadline, with an error wrapping stores.ErrUnreachable that names the
// nodes it could not reach: a Store without a quorum grants nothing. A
// minority of dead nodes does not stop it. With connect=lazy Open sends
// nothing: calls fail with store errors until a quorum answers, and then
// work. It returns an error wrapping stores.ErrInvalid that names the
// problem for a bad URL or option, such as a connect other than check or
// lazy.
func Open(ctx context.Context, rawURL string) (*Store, error) {
	nodes, query, err := parseNodes(rawURL)
	if err != nil {
		return nil, err
	}
	connect, err := args.ParseConnect(query)
	if err != nil {
		return nil, err
	}
	opts, err := parseOptions(query)
	if err != nil {
		return nil, err
	}
	clients := make([]*redis.Client, len(nodes))
	scripters := make([]redis.Scripter, len(nodes))
	for i, o := range nodes {
		o.ContextTimeoutEnabled = true
		if !strings.Contains(rawURL, "max_retries=") {
			o.MaxRetries = -1
		}
		o.DialerRetries = 1
		clients[i] = redis.NewClient(o)
		scripters[i] = clients[i]
	}
	s, err := New(scripters, opts...)
	if err != nil {
		for _, c := range clients {
			_ = c.Close()
		}
		return nil, err
	}
	s.owned = clients
	if connect == storeargs.ConnectCheck {
		if err := checkQuorum(ctx, clients, s.quorum); err != nil {
			_ = s.Close()
			return nil, err
		}
	}
	return s, nil
}

// DefaultConnectTimeout bounds Open's check that a quorum of nodes answers
// when its context has no deadline.
const DefaultConnectTimeout = storeargs.DefaultConnectTimeout

// checkQuorum sends PING to every node at once and returns an error naming
// those that did not answer unless at least quorum did, within ctx or
// DefaultConnectTimeout.
func checkQuorum(ctx context.Context, clients []*redis.Client, quorum int) error {
	ctx, cancel := storeargs.ConnectContext(ctx)
	defer cancel()
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() { errs[i] = c.Ping(ctx).Err() })
	}
	wg.Wait()
	var down, failures []string
	for i, err := range errs {
		if err != nil {
			down = append(down, clients[i].Options().Addr)
			failures = append(failures, (&NodeError{Node: clients[i].Options().Addr, Err: err}).Error())
		}
	}
	if len(clients)-len(down) >= quorum {
		return nil
	}
	return args.Unreachable(down, fmt.Errorf("%d of %d nodes answered, fewer than the quorum of %d: %s",
		len(clients)-len(down), len(clients), quorum, strings.Join(failures, "; ")))
}

// invalidURL returns an error wrapping stores.ErrInvalid about rawURL.
func invalidURL(format string, a ...any) error {
	return fmt.Errorf("%w: redlockstore: URL: %s", stores.ErrInvalid, fmt.Sprintf(format, a...))
}

// parseNodes returns the client options of each node and the Store's query.
func parseNodes(rawURL string) ([]*redis.Options, url.Values, error) {
	if strings.HasPrefix(rawURL, "redlock://") {
		u, err := url.Parse(rawURL)
		if err != nil {
			return nil, nil, invalidURL("%v", err)
		}
		var nodes []*redis.Options
		for h := range strings.SplitSeq(u.Host, ",") {
			if _, _, err := net.SplitHostPort(h); err != nil || h == "" {
				return nil, nil, invalidURL("node %q is not host:port", h)
			}
			nu := url.URL{Scheme: "redis", User: u.User, Host: h, Path: u.Path}
			o, err := redis.ParseURL(nu.String())
			if err != nil {
				return nil, nil, invalidURL("node %q: %v", h, err)
			}
			nodes = append(nodes, o)
		}
		return nodes, u.Query(), nil
	}
	parts := strings.Split(rawURL, ",")
	if !strings.HasPrefix(rawURL, "redis://") && !strings.HasPrefix(rawURL, "rediss://") {
		return nil, nil, invalidURL("%q: want redlock://host:port,host:port,... or a comma list of redis:// URLs", rawURL)
	}
	last, err := url.Parse(parts[len(parts)-1])
	if err != nil {
		return nil, nil, invalidURL("%v", err)
	}
	query := last.Query()
	var nodes []*redis.Options
	for i, p := range parts {
		if i == len(parts)-1 {
			u := *last
			q := u.Query()
			for _, k := range storeOptions {
				q.Del(k)
			}
			u.RawQuery = q.Encode()
			p = u.String()
		}
		o, err := redis.ParseURL(p)
		if err != nil {
			return nil, nil, invalidURL("node %d %q: %v", i, p, err)
		}
		nodes = append(nodes, o)
	}
	return nodes, query, nil
}

// storeOptions are the query parameters that configure the Store.
var storeOptions = []string{storeargs.ConnectParam, "node_timeout", "max_ttl", "fence_retention", "drift", "drift_fixed"}

// parseOptions turns the query into options, refusing unknown parameters.
func parseOptions(q url.Values) ([]Option, error) {
	var opts []Option
	duration := func(name string) (time.Duration, bool, error) {
		v := q.Get(name)
		if v == "" {
			return 0, false, nil
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			return 0, false, invalidURL("%s=%q is not a duration", name, v)
		}
		return d, true, nil
	}
	if err := args.CheckOptions(q, storeOptions...); err != nil {
		return nil, err
	}
	var errs []error
	if d, ok, err := duration("node_timeout"); err != nil {
		errs = append(errs, err)
	} else if ok {
		opts = append(opts, WithNodeTimeout(d))
	}
	if d, ok, err := duration("max_ttl"); err != nil {
		errs = append(errs, err)
	} else if ok {
		opts = append(opts, WithMaxTTL(d))
	}
	if d, ok, err := duration("fence_retention"); err != nil {
		errs = append(errs, err)
	} else if ok {
		opts = append(opts, WithFenceRetention(d))
	}
	factor, fixed := DefaultDriftFactor, DefaultDriftFixed
	if v := q.Get("drift"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			errs = append(errs, invalidURL("drift=%q is not a number", v))
		}
		factor = f
	}
	if d, ok, err := duration("drift_fixed"); err != nil {
		errs = append(errs, err)
	} else if ok {
		fixed = d
	}
	opts = append(opts, WithDrift(factor, fixed))
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return opts, nil
}
