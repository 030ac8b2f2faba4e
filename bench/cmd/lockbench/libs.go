package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores/redisstore"
	"github.com/reqlock/reqlock/stores/redisstore/rueidisstore"
)

// Library names, as -lib takes them.
const (
	libReqlock   = "reqlock"
	libRueidis   = "reqlock-rueidis" // reqlock on rueidisstore
	libRedislock = "redislock"
	libRedsync   = "redsync"
)

// releaseTimeout bounds each release of the bsm/redislock and redsync
// adapters; reqlock bounds its own (2s by default).
const releaseTimeout = 5 * time.Second

// fairLease is the waiter lease of reqlock's fair mode in -fair runs.
const fairLease = 2 * time.Second

// locker is what the workloads see of a lock library. lock blocks until the
// lock on key is granted or ctx ends (ctx carries the wait limit); unlock
// releases it.
type locker interface {
	lock(ctx context.Context, key string) (unlock func() error, err error)
}

// newLocker returns the adapter of lib over client; reqlock-rueidis opens a
// rueidis client of its own (to cfg.Redis), which closeLocker closes.
func newLocker(lib string, client *redis.Client, cfg config) (locker, error) {
	switch lib {
	case libReqlock, libRueidis:
		var store *redisstore.Store
		var err error
		if lib == libRueidis {
			store, err = rueidisstore.Open(context.Background(), "redis://"+cfg.Redis)
		} else {
			store, err = redisstore.New(client)
		}
		if err != nil {
			return nil, err
		}
		var opts []reqlock.Option
		if cfg.Fair {
			opts = append(opts, reqlock.WithFairness(fairLease))
		}
		l, err := reqlock.New(store, opts...)
		if err != nil {
			_ = store.Close()
			return nil, err
		}
		return reqlockLocker{locker: l, ttl: cfg.TTL, wait: cfg.Wait, store: store}, nil
	case libRedislock:
		return redislockLocker{client: redislock.New(client), ttl: cfg.TTL,
			min: cfg.RedislockMin, max: cfg.RedislockMax}, nil
	case libRedsync:
		return redsyncLocker{rs: redsync.New(goredis.NewPool(client)), ttl: cfg.TTL}, nil
	}
	return nil, fmt.Errorf("unknown library %q", lib)
}

// libSettings describes how each library is configured, for the header of
// the report and the README.
func libSettings(lib string, cfg config) string {
	switch lib {
	case libReqlock:
		mode := "all defaults"
		if cfg.Fair {
			mode = fmt.Sprintf("WithFairness(%v) (no local handoff), other defaults", fairLease)
		}
		return fmt.Sprintf("reqlock.New(redisstore.New(client)), %s (backoff 5ms..200ms x2, jitter ±0.5); "+
			"Obtain(ctx, key, ttl %v, wait %v); Release", mode, cfg.TTL, cfg.Wait)
	case libRueidis:
		return "as reqlock, on rueidisstore.Open(\"redis://" + cfg.Redis + "\") (a rueidis client of its own: " +
			"one Redis, auto-pipelining, no client-side cache); its round trips are not counted"
	case libRedislock:
		return fmt.Sprintf("redislock.New(client).Obtain(ctx with %v deadline, key, ttl %v, "+
			"RetryStrategy: ExponentialBackoff(%v, %v), a new one per Obtain); Release",
			cfg.Wait, cfg.TTL, cfg.RedislockMin, cfg.RedislockMax)
	case libRedsync:
		return fmt.Sprintf("redsync.New(goredis.NewPool(client)).NewMutex(key, WithExpiry(%v), WithTries(MaxInt32)), "+
			"default retry delay rand[50ms,250ms), one mutex per acquisition; LockContext(ctx with %v deadline); "+
			"UnlockContext", cfg.TTL, cfg.Wait)
	}
	return ""
}

type reqlockLocker struct {
	locker    *reqlock.Locker
	ttl, wait time.Duration
	store     *redisstore.Store
}

// closeLocker closes what newLocker opened for lk: the Store of reqlock
// and reqlock-rueidis (and with it the rueidis client).
func closeLocker(lk locker) {
	if r, ok := lk.(reqlockLocker); ok {
		_ = r.store.Close()
	}
}

func (r reqlockLocker) lock(ctx context.Context, key string) (func() error, error) {
	l, err := r.locker.Obtain(ctx, key, r.ttl, r.wait)
	if err != nil {
		if errors.Is(err, reqlock.ErrWaitEnded) {
			return nil, errors.Join(errTimeout, err)
		}
		return nil, err
	}
	return func() error { return l.Release(context.Background()) }, nil
}

type redislockLocker struct {
	client   *redislock.Client
	ttl      time.Duration
	min, max time.Duration
}

func (r redislockLocker) lock(ctx context.Context, key string) (func() error, error) {
	// A retry strategy counts its attempts: one shared between goroutines
	// would make every waiter back off as if it had made all their attempts.
	// So each Obtain gets its own.
	opts := &redislock.Options{RetryStrategy: redislock.ExponentialBackoff(r.min, r.max)}
	l, err := r.client.Obtain(ctx, key, r.ttl, opts)
	if err != nil {
		if ctx.Err() != nil {
			return nil, errors.Join(errTimeout, err)
		}
		return nil, err
	}
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		return l.Release(ctx)
	}, nil
}

type redsyncLocker struct {
	rs  *redsync.Redsync
	ttl time.Duration
}

func (r redsyncLocker) lock(ctx context.Context, key string) (func() error, error) {
	// A Mutex keeps the value of its last lock: one per acquisition.
	m := r.rs.NewMutex(key, redsync.WithExpiry(r.ttl), redsync.WithTries(math.MaxInt32))
	if err := m.LockContext(ctx); err != nil {
		// redsync answers ErrFailed both when the context ends and when its
		// tries run out; with MaxInt32 tries only the context ends a wait.
		if ctx.Err() != nil {
			return nil, errors.Join(errTimeout, err)
		}
		return nil, err
	}
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		ok, err := m.UnlockContext(ctx)
		if err == nil && !ok {
			err = errors.New("redsync: unlock found the lock not held")
		}
		return err
	}, nil
}

// errTimeout marks a lock call that ended because its wait limit passed.
var errTimeout = errors.New("wait limit reached")
