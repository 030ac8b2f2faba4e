// Package callctx holds what the Redis-based stores (redisstore and
// redlockstore) share about the contexts of their server calls: when a
// call's context has ended, the error of a call left in flight, and whether
// a go-redis client honours context deadlines.
package callctx

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/stores"
)

// Ended reports whether ctx has ended, or its deadline has passed (ctx may
// report it a moment later).
func Ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// Abandoned returns the error of a call left in flight when ctx ended:
// ctx's error, marked stores.ErrAbandoned when the store undoes the call.
func Abandoned(ctx context.Context, undone bool) error {
	err := ctx.Err()
	if err == nil {
		err = context.DeadlineExceeded // the deadline passed; ctx reports it a moment later
	}
	if undone {
		return fmt.Errorf("%w: %w", stores.ErrAbandoned, err)
	}
	return err
}

// ContextTimeoutEnabled reports whether client honours context deadlines,
// when its type tells.
func ContextTimeoutEnabled(client redis.Scripter) (enabled, known bool) {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled, true
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled, true
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled, true
	}
	return false, false
}
