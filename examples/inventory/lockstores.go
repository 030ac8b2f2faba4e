package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/etcdstore"
	"github.com/reqlock/reqlock/stores/filestore"
	"github.com/reqlock/reqlock/stores/memstore"
	"github.com/reqlock/reqlock/stores/mysqlstore"
	"github.com/reqlock/reqlock/stores/pgstore"
	"github.com/reqlock/reqlock/stores/redisstore/rueidisstore"
	"github.com/reqlock/reqlock/stores/redlockstore"
	"github.com/reqlock/reqlock/stores/zkstore"
)

// openedStore is a lock store the service opened from a -store URL.
type openedStore struct {
	store stores.Store
	desc  string       // where the locks live, for the start-up line
	close func() error // releases what opening it took; nil when nothing
}

// storeOpener opens the lock store a -store URL names.
type storeOpener func(ctx context.Context, u *url.URL, raw string) (openedStore, error)

// storeOpeners are the -store URL schemes, one per store.
var storeOpeners = map[string]storeOpener{
	"memory":     openMemory,
	"redis":      openRedisLocks,
	"rediss":     openRedisLocks,
	"mysql":      opener("mysqlstore", mysqlstore.Open),
	"mariadb":    opener("mysqlstore", mysqlstore.Open),
	"zk":         opener("zkstore", zkstore.Open),
	"redlock":    opener("redlockstore", redlockstore.Open),
	"etcd":       opener("etcdstore", etcdstore.Open),
	"postgres":   opener("pgstore", pgstore.Open),
	"postgresql": opener("pgstore", pgstore.Open),
	"file":       opener("filestore", filestore.Open),
}

// closingStore is a store that holds resources until Close.
type closingStore interface {
	stores.Store
	Close() error
}

// opener adapts a store package's Open(ctx, rawURL) to a storeOpener; name
// is the package, for the start-up line.
func opener[S closingStore](name string, open func(context.Context, string) (S, error)) storeOpener {
	return func(ctx context.Context, u *url.URL, raw string) (openedStore, error) {
		s, err := open(ctx, raw)
		if err != nil {
			return openedStore{}, err
		}
		return openedStore{store: s, desc: name + " (" + u.Redacted() + ")", close: s.Close}, nil
	}
}

// storeSchemes lists the -store URL schemes, for messages.
func storeSchemes() string {
	schemes := make([]string, 0, len(storeOpeners))
	for s := range storeOpeners {
		schemes = append(schemes, s+"://")
	}
	slices.Sort(schemes)
	return strings.Join(schemes, ", ")
}

// parseStoreURL checks a -store URL's form, without connecting.
func parseStoreURL(raw string) (*url.URL, storeOpener, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse quotes the URL, password included: name only its scheme.
		scheme, _, _ := strings.Cut(raw, ":")
		return nil, nil, fmt.Errorf("not a URL (scheme %q): %w", scheme, errors.Unwrap(err))
	}
	open, ok := storeOpeners[u.Scheme]
	if !ok {
		return nil, nil, fmt.Errorf("unknown store %q (want one of %s)", u.Scheme, storeSchemes())
	}
	return u, open, nil
}

// openLockStore opens the lock store of a -store URL.
func openLockStore(ctx context.Context, raw string) (openedStore, error) {
	u, open, err := parseStoreURL(raw)
	if err != nil {
		return openedStore{}, err
	}
	return open(ctx, u, raw)
}

// openMemory is memory://: memstore, this process only.
func openMemory(ctx context.Context, _ *url.URL, raw string) (openedStore, error) {
	s, err := memstore.Open(ctx, raw)
	if err != nil {
		return openedStore{}, err
	}
	return openedStore{store: s, desc: "memstore (in memory)"}, nil
}

// openRedisLocks is redis:// and rediss://: redisstore's Store on rueidis
// (rueidisstore, which pipelines the lock calls of concurrent requests onto
// shared connections) on that Redis, with a client of its own with the
// service's timeouts (those the URL does not set). rueidisstore.Open fails
// unless Redis answers, or the URL says connect=lazy.
func openRedisLocks(ctx context.Context, u *url.URL, _ string) (openedStore, error) {
	withGrace := *u
	q := withGrace.Query()
	for _, name := range []string{"dial_timeout", "read_timeout", "write_timeout"} {
		if !q.Has(name) {
			q.Set(name, redisGrace.String())
		}
	}
	withGrace.RawQuery = q.Encode()
	rs, err := rueidisstore.Open(ctx, withGrace.String())
	if err != nil {
		return openedStore{}, err
	}
	return openedStore{store: rs, desc: "rueidisstore (" + redisWhere(u) + ")", close: rs.Close}, nil
}

// lockParamsOnly returns the -redis URL u without the parameters that
// configure the stock's go-redis client only (pool_size, max_retries, ...),
// which the lock store's rueidis client has not: rueidisstore.Open refuses
// them in a -store URL, where they can only be a mistake.
func lockParamsOnly(u *url.URL) *url.URL {
	q := u.Query()
	for name := range q {
		if !slices.Contains(rueidisstore.URLParams(), name) {
			q.Del(name)
		}
	}
	only := *u
	only.RawQuery = q.Encode()
	return &only
}

// newRedisClient returns a client of the Redis a URL names, with the
// timeouts the service needs, and says where it points. The URL's connect
// parameter is for the lock store (openRedisLocks): the client drops it.
func newRedisClient(raw string) (*redis.Client, string, error) {
	opts, err := redis.ParseURL(withoutConnect(raw))
	if err != nil {
		return nil, "", fmt.Errorf("invalid Redis URL: %w", err)
	}
	// Let a request's lock wait deadline, and its stock budget, bound a
	// stalled Redis too; and bound each call without a deadline. go-redis
	// retries a failed dial 5 times 100ms apart within each try of a call:
	// one dial a try is enough. It would also resend a call whose
	// connection dropped before the reply (max_retries, 3 by default): a
	// deduction script that ran would then run again and deduct twice
	// (HINCRBY under the same fence). The client never resends: such a
	// call fails, and the request answers 503 "outcome unknown".
	if opts.MaxRetries > 0 {
		return nil, "", fmt.Errorf("max_retries=%d: the stock client must not resend a deduction whose reply was lost "+
			"(it would deduct twice); drop max_retries", opts.MaxRetries)
	}
	opts.MaxRetries = -1
	opts.ContextTimeoutEnabled = true
	for _, d := range []*time.Duration{&opts.ReadTimeout, &opts.WriteTimeout, &opts.DialTimeout} {
		if *d == 0 {
			*d = redisGrace
		}
	}
	opts.DialerRetries = 1
	return redis.NewClient(opts), fmt.Sprintf("Redis %s db %d", opts.Addr, opts.DB), nil
}

// redisWhere says where a Redis URL points, for the start-up line.
func redisWhere(u *url.URL) string {
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" {
		db = "0"
	}
	return "Redis " + u.Host + " db " + db
}

// withoutConnect returns a Redis URL without its connect parameter, which is
// the lock store's (rueidisstore.Open) and which go-redis does not know.
func withoutConnect(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || !u.Query().Has("connect") {
		return raw
	}
	q := u.Query()
	q.Del("connect")
	u.RawQuery = q.Encode()
	return u.String()
}
