// Package storeargs checks the arguments of the stores under stores/, so that
// every store refuses the same arguments with the same errors. Every error it
// returns wraps stores.ErrInvalid (CheckHeldToken's, stores.ErrNotHeld) and
// starts with the store's name.
package storeargs

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// Checker checks the arguments of one store; its value is the store's name,
// the prefix of its messages ("memstore", "redisstore").
type Checker string

// CheckTTL returns an error unless ttl is positive.
func (c Checker) CheckTTL(ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("%w: %s: ttl %v is not positive", stores.ErrInvalid, c, ttl)
	}
	return nil
}

// CheckAcquireFair checks the arguments of AcquireFair: it returns ctx.Err()
// when ctx has ended, and an error for an empty key, a non-positive ttl or a
// negative lease.
func (c Checker) CheckAcquireFair(ctx context.Context, key string, ttl, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if key == "" {
		return fmt.Errorf("%w: %s: empty key", stores.ErrInvalid, c)
	}
	if ttl <= 0 || lease < 0 {
		return fmt.Errorf("%w: %s: ttl %v must be positive and lease %v not negative", stores.ErrInvalid, c, ttl, lease)
	}
	return nil
}

// CheckShared checks the key and limit of AcquireShared, RefreshShared and
// ReleaseShared (pass limit 0 where there is none): it returns ctx.Err()
// when ctx has ended, and an error for an empty key or a negative limit.
func (c Checker) CheckShared(ctx context.Context, key string, limit int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	switch {
	case key == "":
		return fmt.Errorf("%w: %s: empty key", stores.ErrInvalid, c)
	case limit < 0:
		return fmt.Errorf("%w: %s: limit %d is negative", stores.ErrInvalid, c, limit)
	}
	return nil
}

// CheckAcquire checks the arguments of Acquire and Refresh: it returns
// ctx.Err() when ctx has ended, and an error for a non-positive ttl, no keys,
// an empty key, or a duplicate or unsorted key, in that order.
func (c Checker) CheckAcquire(ctx context.Context, keys []string, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.CheckTTL(ttl); err != nil {
		return err
	}
	return c.CheckKeys(keys)
}

// CheckRelease checks the arguments of Release: it returns ctx.Err() when
// ctx has ended, and an error for no keys, an empty key, or a duplicate or
// unsorted key.
func (c Checker) CheckRelease(ctx context.Context, keys []string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return c.CheckKeys(keys)
}

// CheckKeys returns an error unless keys holds at least one key, none
// empty, sorted without duplicates.
func (c Checker) CheckKeys(keys []string) error {
	if len(keys) == 0 {
		return fmt.Errorf("%w: %s: no keys", stores.ErrInvalid, c)
	}
	if keys[0] == "" {
		return fmt.Errorf("%w: %s: empty key", stores.ErrInvalid, c)
	}
	for i := 1; i < len(keys); i++ {
		switch strings.Compare(keys[i-1], keys[i]) {
		case 0:
			return fmt.Errorf("%w: %s: key %s appears twice", stores.ErrInvalid, c, stores.KeyForMessage(keys[i]))
		case 1:
			return fmt.Errorf("%w: %s: keys are not sorted: %s before %s", stores.ErrInvalid, c,
				stores.KeyForMessage(keys[i-1]), stores.KeyForMessage(keys[i]))
		}
	}
	return nil
}

// CheckGrantToken returns an error unless token is free of reserved at its
// start: reserved starts the values a store keeps in a key's token place
// for itself (a finished record, a marker of shared holders), so no lock or
// claim is granted to a token that could equal one. Acquire, AcquireFair
// and ClaimRecord check it before they act.
func (c Checker) CheckGrantToken(token, reserved string) error {
	if strings.HasPrefix(token, reserved) {
		return fmt.Errorf("%w: %s: a token that starts with %q is reserved for the store's own values", stores.ErrInvalid, c, reserved)
	}
	return nil
}

// CheckHeldToken returns an error wrapping stores.ErrNotHeld, naming keys,
// when token starts with reserved: such a token holds no key (see
// CheckGrantToken), and a Release or Refresh of it must not act on a value
// of the store's that it equals. Release and Refresh check it before they
// act.
func (c Checker) CheckHeldToken(keys []string, token, reserved string) error {
	if strings.HasPrefix(token, reserved) {
		return fmt.Errorf("%w: %s: %s: a token that starts with %q holds no key", stores.ErrNotHeld, c, stores.KeyForMessage(keys[0]), reserved)
	}
	return nil
}

// CheckBounds returns an error unless every key and every positive
// duration is within b: the check a stores.Bounded store makes before it
// acts, for callers that skip the Locker's. A zero duration is skipped: a
// Release without keep, a try-once AcquireFair without lease.
func (c Checker) CheckBounds(b stores.Bounds, keys []string, durations ...time.Duration) error {
	for _, k := range keys {
		if err := b.CheckKey(k); err != nil {
			return c.rewrap(err)
		}
	}
	for _, d := range durations {
		if d == 0 {
			continue
		}
		if err := b.CheckTTL("duration", d); err != nil {
			return c.rewrap(err)
		}
	}
	return nil
}

// CheckRecord returns an error unless rec and retention are within b (see
// stores.Bounds.CheckRecord): the check a stores.RecordStore makes before
// FinishRecord acts. The zero Bounds still refuses a non-positive
// retention.
func (c Checker) CheckRecord(b stores.Bounds, rec stores.Record, retention time.Duration) error {
	if err := b.CheckRecord(rec, retention); err != nil {
		return c.rewrap(err)
	}
	return nil
}

// rewrap puts the store's name after ErrInvalid in err's message, as in the
// Checker's other errors.
func (c Checker) rewrap(err error) error {
	detail := strings.TrimPrefix(err.Error(), stores.ErrInvalid.Error()+": ")
	return fmt.Errorf("%w: %s: %s", stores.ErrInvalid, c, detail)
}

// Millis returns a duration of ms milliseconds, as a server answers a
// remaining TTL: zero for a negative ms, and the longest Duration for one
// too long to fit, instead of an overflow.
func Millis(ms int64) time.Duration {
	const most = int64(math.MaxInt64 / time.Millisecond)
	switch {
	case ms <= 0:
		return 0
	case ms > most:
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// ConnectParam is the URL parameter, the same in every store's Open, that
// says whether Open checks that the store's server answers: connect=check
// (the default) or connect=lazy.
const ConnectParam = "connect"

// DefaultConnectTimeout bounds how long Open waits for its server in check
// mode when its context has no deadline of its own.
const DefaultConnectTimeout = 5 * time.Second

// Connect says what Open does when the store's server cannot be reached.
type Connect int

const (
	// ConnectCheck: Open fails, naming the store and the addresses it
	// tried, when its server does not answer within the connect bound.
	ConnectCheck Connect = iota
	// ConnectLazy: Open succeeds without reaching the server; the store's
	// calls fail with store errors until the server answers, and then work.
	ConnectLazy
)

// String returns the parameter's value for c.
func (c Connect) String() string {
	if c == ConnectLazy {
		return "lazy"
	}
	return "check"
}

// ParseConnect reads the connect parameter from q and deletes it, so that
// the rest of q can go to a driver. It returns ConnectCheck when q has none,
// and an error wrapping stores.ErrInvalid for any value other than check or
// lazy, or for the parameter given more than once.
func (c Checker) ParseConnect(q url.Values) (Connect, error) {
	values, ok := q[ConnectParam]
	if !ok {
		return ConnectCheck, nil
	}
	q.Del(ConnectParam)
	if len(values) != 1 {
		return ConnectCheck, fmt.Errorf("%w: %s: URL parameter %s given %d times", stores.ErrInvalid, c, ConnectParam, len(values))
	}
	switch values[0] {
	case "check":
		return ConnectCheck, nil
	case "lazy":
		return ConnectLazy, nil
	}
	return ConnectCheck, fmt.Errorf("%w: %s: URL parameter %s=%q: want check (fail at start-up when the server cannot be reached) or lazy (start anyway)",
		stores.ErrInvalid, c, ConnectParam, values[0])
}

// ConnectContext returns ctx bounded by DefaultConnectTimeout unless ctx
// has a deadline of its own: the bound of Open's check.
func ConnectContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, DefaultConnectTimeout)
}

// Unreachable returns Open's error for a server that did not answer: it
// wraps stores.ErrUnreachable and err, and names the store, the addresses
// it tried and the way to start anyway.
func (c Checker) Unreachable(addrs []string, err error) error {
	return fmt.Errorf("%w: %s: cannot reach %s (add %s=lazy to the URL to start anyway): %w",
		stores.ErrUnreachable, c, strings.Join(addrs, ", "), ConnectParam, err)
}

// UnknownOptionError is the error of every store's Open for a URL parameter
// the store does not know. It wraps stores.ErrInvalid and
// stores.ErrUnknownOption.
type UnknownOptionError struct {
	Store  Checker  // the store's package, such as "memstore"
	Option string   // the parameter's name
	Known  []string // the parameters the store knows, or a description of them
}

// Error says which store refused which parameter, and what it takes.
func (e *UnknownOptionError) Error() string {
	known := "none"
	if len(e.Known) > 0 {
		known = strings.Join(e.Known, ", ")
	}
	return fmt.Sprintf("%v: %s: unknown URL option %q (known: %s)", stores.ErrInvalid, e.Store, e.Option, known)
}

// Unwrap returns stores.ErrInvalid and stores.ErrUnknownOption.
func (e *UnknownOptionError) Unwrap() []error {
	return []error{stores.ErrInvalid, stores.ErrUnknownOption}
}

// UnknownOption returns the error for the URL parameter name, unknown to
// the store, which knows the parameters known.
func (c Checker) UnknownOption(name string, known ...string) error {
	return &UnknownOptionError{Store: c, Option: name, Known: known}
}

// CheckOptions returns UnknownOption's error for the first parameter of q
// (in sorted order) that is not in known, or nil.
func (c Checker) CheckOptions(q url.Values, known ...string) error {
	names := make([]string, 0, len(q))
	for name := range q {
		if !slices.Contains(known, name) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	return c.UnknownOption(names[0], known...)
}
