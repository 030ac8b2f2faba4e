// Package storeargs checks the arguments of the stores under stores/, so that
// memstore and redisstore refuse the same arguments with the same errors.
// Every error it returns wraps reqlock.ErrInvalid and starts with the
// store's name.
package storeargs

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/reqlock/reqlock"
)

// Checker checks the arguments of one store; its value is the store's name,
// the prefix of its messages ("memstore", "redisstore").
type Checker string

// CheckTTL returns an error unless ttl is positive.
func (c Checker) CheckTTL(ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("%w: %s: ttl %v is not positive", reqlock.ErrInvalid, c, ttl)
	}
	return nil
}

// CheckAcquireFair checks the arguments of AcquireFair: it returns ctx.Err()
// when ctx has ended, and an error for a non-positive ttl or a negative
// lease.
func (c Checker) CheckAcquireFair(ctx context.Context, ttl, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ttl <= 0 || lease < 0 {
		return fmt.Errorf("%w: %s: ttl %v must be positive and lease %v not negative", reqlock.ErrInvalid, c, ttl, lease)
	}
	return nil
}

// CheckAcquireAll checks the arguments of AcquireAll and RefreshAll: it
// returns ctx.Err() when ctx has ended, and an error for a non-positive ttl,
// no keys, or a duplicate or unsorted key, in that order.
func (c Checker) CheckAcquireAll(ctx context.Context, keys []string, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.CheckTTL(ttl); err != nil {
		return err
	}
	return c.checkKeys(keys)
}

// CheckReleaseAll checks the arguments of ReleaseAll: it returns ctx.Err()
// when ctx has ended, and an error for no keys, a duplicate or unsorted key,
// or len(lastFences) != len(keys), in that order.
func (c Checker) CheckReleaseAll(ctx context.Context, keys []string, lastFences []int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.checkKeys(keys); err != nil {
		return err
	}
	if len(lastFences) != len(keys) {
		return fmt.Errorf("%w: %s: %d last fences for %d keys", reqlock.ErrInvalid, c, len(lastFences), len(keys))
	}
	return nil
}

// checkKeys returns an error unless keys holds at least one key and is sorted
// without duplicates.
func (c Checker) checkKeys(keys []string) error {
	if len(keys) == 0 {
		return fmt.Errorf("%w: %s: no keys", reqlock.ErrInvalid, c)
	}
	for i := 1; i < len(keys); i++ {
		switch strings.Compare(keys[i-1], keys[i]) {
		case 0:
			return fmt.Errorf("%w: %s: key %q appears twice", reqlock.ErrInvalid, c, keys[i])
		case 1:
			return fmt.Errorf("%w: %s: keys are not sorted: %q before %q", reqlock.ErrInvalid, c, keys[i-1], keys[i])
		}
	}
	return nil
}
